"""frag's state rows (core/paged_bytes.py) count the state pages the hybrid pool holds (core/pool/groups.py
PoolGroup.first_block, vLLM v1's MambaManager: the pages from the one the last step resumed from on), checked
against closed forms written here and against the pool's own held_blocks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.paged_bytes import _state_page_total, state_pages
from kvcalc.core.pool.groups import PoolGroup


def _closed_form(n: int, B: int, mode: str, extra: int) -> int:
    """Pages a state table holds at the step from n − 1 to n + extra, derived by hand: none one page; all the
    pages (n − 2) // B .. (n + extra − 1) // B (from 0 when n = 1: nothing to resume from)."""
    if mode == "none":
        return 1
    assert mode == "all"
    return (n + extra - 1) // B - max(0, n - 2) // B + 1


def test_state_pages_by_hand() -> None:
    # B = 16. align and all, no speculation: pages (n − 2) // 16 .. (n − 1) // 16
    # n = 1: first page only (nothing resumed) -> 1; n = 16: 0 .. 0 -> 1; n = 17: 0 .. 1 -> 2 (the step from 16
    # crossed into page 1, page 0 is freed at the next step); n = 18: 1 .. 1 -> 1; n = 33: 1 .. 2 -> 2
    for mode in ("align", "all"):
        assert [state_pages(n, 16, mode) for n in (1, 16, 17, 18, 33)] == [1, 1, 2, 1, 2]
    assert [state_pages(n, 16, "none") for n in (1, 16, 17, 18, 33)] == [1] * 5
    # speculative step 16 -> 17 + 40 (n = 17, extra = 40): all pages 0 .. 56 // 16 = 3 -> 4; align jumps past
    # page 1 (its last page 3 > 0 + 1): the page of the last boundary it passes, 57 // 16 − 1 = 2, and page 3 -> 2
    assert state_pages(17, 16, "all", 40) == 4
    assert state_pages(17, 16, "align", 40) == 2


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.sampled_from(["none", "align", "all"]), st.integers(0, 40))
def test_state_pages_are_the_pools(n: int, mode: str, extra: int) -> None:
    B = 16
    pages = state_pages(n, B, mode, extra)
    if extra == 0:  # the pool's closed form for a sequence decoding its token n − 1
        assert pages == PoolGroup("state").held_blocks(n, B, mode)
    if mode == "align":
        assert 1 <= pages <= 2
        if extra == 0:
            assert pages == 1 + (n > 1 and (n - 1) % B == 0)
    else:
        assert pages == _closed_form(n, B, mode, extra)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.integers(1, 70), st.integers(1, 1 << 40)), min_size=1, max_size=60),
       st.sampled_from([1, 8, 16, 32]), st.sampled_from(["none", "align", "all"]), st.integers(0, 20))
def test_total_over_lengths_is_the_sum_per_sequence(lengths: list[int], B: int, mode: str, extra: int) -> None:
    # the residue classes (n − B − 2) mod B above B + 2 must give exactly the sum of the pool's rule sequence by
    # sequence, short and very long sequences alike
    tokens = np.array(lengths, dtype=np.int64)
    assert _state_page_total(tokens, B, mode, extra) == sum(state_pages(n, B, mode, extra) for n in lengths)
