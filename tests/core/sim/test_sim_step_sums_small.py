"""A step of few chunks has its windowed excess summed in plain integers (step_sums.SMALL): the same values as the
numpy sums over the same chunks, for sliding windows and chunked attention, chunks from scratch or after cached
tokens (decode steps are chunks of 1)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.sim import step_sums


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 3000)), min_size=1, max_size=step_sums.SMALL),
       st.integers(1, 4096), st.sampled_from(["sliding", "chunked"]))
def test_the_plain_integer_sums_equal_numpys(chunks, window, kind) -> None:
    start = np.array([s for s, _ in chunks], dtype=np.int64)
    count = np.array([m for _, m in chunks], dtype=np.int64)
    excess = step_sums.chunked_chunk_excess if kind == "chunked" else step_sums.sliding_chunk_excess
    small = excess(start, count, window)
    # the same chunks twice over the threshold: numpy's sums, then halved (each sum is over the chunks)
    tiled = excess(np.tile(start, step_sums.SMALL + 1), np.tile(count, step_sums.SMALL + 1), window)
    assert tuple(v * (step_sums.SMALL + 1) for v in small) == tiled
    assert all(isinstance(v, int) for v in small)


def test_by_hand() -> None:
    # sliding W = 4: a chunk of 6 from 0 has queries 1..6 beyond the window by 0,0,0,0,1,2 = 3, and reads nothing
    # dropped (start 0); a decode step at 9 cached (query 10) is 6 beyond, its 9 cached reads drop 10 - 4 = 6
    assert step_sums.sliding_chunk_excess(np.array([0, 9]), np.array([6, 1]), 4) == (3 + 6, 0 + 6)
    # chunked C = 4: queries 1..6 attend their own chunk: (q - 1) mod 4 + 1, so 4 * floor((q - 1) / 4) excess each:
    # 0,0,0,0,4,4 = 8; a decode step at 9 cached: query 10, 4 * floor(9 / 4) = 8, reads drop 4 * floor(9 / 4) = 8
    assert step_sums.chunked_chunk_excess(np.array([0, 9]), np.array([6, 1]), 4) == (8 + 8, 0 + 8)
