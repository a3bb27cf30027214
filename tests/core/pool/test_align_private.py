"""A private hybrid pool under mamba_cache_mode align (core/pool/hybrid_private.py) does what the stepping operations
did before align was private: GroupedPagedPolicy's decode and chunk growth through free_skipped_many, append_many_need
and grow_private_many (a chunk of more than a block jumps over state pages: weighted.state_jump, the page it resumes
from held past the table, HybridLayout._resume, until the sequence's next step), allocate and release. Hypothesis
drives both pools through the same random lifetimes — appends of up to 4 blocks at once (jumps), checked or not, with
or without their own frees credited — and compares, after every operation, everything but block ids: each table's
shape, fills and references, the pages held past the tables (index, fill), the counters, and state_slack against a
walk over every held page."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.accounting import ReleaseReason
from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid import HybridPool
from kvcalc.core.pool.store import PoolExhaustedError

B = 4
LAYOUTS = {
    "full+state": (PoolGroup("full"), PoolGroup("state")),
    # the state kind's rows not adjacent, two of them
    "state between full": (PoolGroup("state"), PoolGroup("full"), PoolGroup("state"), PoolGroup("full")),
    "sliding+state": (PoolGroup("full"), PoolGroup("sliding", 6), PoolGroup("state")),
}


def view(pool: HybridPool) -> dict:
    """Everything but block ids (see the module docstring)."""
    store = pool.store
    tables = {}
    for g, p in enumerate(pool.pools):
        for seq_id, seq in p.seqs.items():
            held = seq.table[seq.num_skipped : seq.num_blocks]
            tables[g, seq_id] = (seq.num_blocks, seq.num_skipped, seq.num_tokens, store.fill[held].tolist(),
                                 store.ref[held].tolist())
    past = {(seq_id, g): (at, int(store.fill[block]), int(store.ref[block]))
            for seq_id, pages in pool._resumed.items() for g, (at, block) in pages.items()}
    return {"tables": tables, "past": past, "used": store.num_used, "useful": store.useful_tokens,
            "free": len(store.queue), "logical": [(p.logical_blocks, p.logical_tokens) for p in pool.pools],
            "stats": {**pool.stats().__dict__, "allocated_blocks": None}, "slack": pool.state_slack()}


def walked_slack(pool: HybridPool) -> int:
    """B − fill over every page the state groups hold, in their tables and past them."""
    store, slack = pool.store, 0
    for g, (group, p) in enumerate(zip(pool.groups, pool.pools, strict=True)):
        if group.kind == "state":
            blocks = [*(s.blocks for s in p.seqs.values()), np.array(
                [block for pages in pool._resumed.values() for h, (_, block) in pages.items() if h == g], np.int64)]
            held = np.concatenate(blocks) if blocks else np.zeros(0, np.int64)
            slack += int(len(held) * B - store.fill[held].sum())
    return slack


def stepped(slow: HybridPool, ids: list, n: int, check: bool, credit: bool) -> bool | None:
    """GroupedPagedPolicy._grow_many's stepping path of a uniform growth (as before align was private)."""
    if check and not credit and slow.append_many_need(ids, n) > slow.num_free_blocks:
        return None  # (its frees not counted: nothing done, the caller grows request by request)
    slow.free_skipped_many(ids)
    if check and slow.append_many_need(ids, n) > slow.num_free_blocks:
        return False
    slow.grow_private_many(ids, n)
    return True


ops = st.lists(st.tuples(st.sampled_from(["add", "add", "run", "chunk", "check", "release"]), st.integers(0, 4),
                         st.integers(1, 16), st.integers(0, 30), st.booleans()), min_size=1, max_size=30)


@pytest.mark.parametrize("name", list(LAYOUTS))
@settings(max_examples=60, deadline=None)
@given(steps=ops, blocks=st.integers(12, 60))
def test_align_private_operations_leave_what_stepping_leaves(name, steps, blocks):
    groups = LAYOUTS[name]
    fast = HybridPool(blocks, B, groups, enable_prefix_caching=False, state_mode="align")
    slow = HybridPool(blocks, B, groups, enable_prefix_caching=False, state_mode="align")
    assert fast.private
    for op, seq, n, computed, flag in steps:
        live = fast.has_seq(seq)
        if op == "add" and not live:
            computed = min(computed, n - 1)
            need = fast.allocate_private_need(n, computed)
            assert (need <= len(fast.store.queue)) == slow.can_allocate(n, computed_tokens=computed)
            if need <= len(fast.store.queue):
                assert fast.allocate_private(seq, n, computed) == slow.allocate(seq, n, computed_tokens=computed) == 0
        elif op == "run" and live:  # a run of decode steps found to fit (chunk 1, unchecked)
            ids = [s for s in fast.seq_ids if s <= seq]
            before = copy.deepcopy(slow)
            try:
                for _ in range(n):
                    stepped(slow, ids, 1, False, True)
            except PoolExhaustedError:
                slow = before
                continue
            fast.advance_private(ids, n, 1, check=False)
        elif op in ("chunk", "check") and live:  # one append of n tokens each (a jump past a block), checked
            ids = [s for s in fast.seq_ids if s <= seq]
            if computed % 2:  # an append that ends on a boundary (of `seq`): a jump that keeps only its last page
                n = -fast.num_tokens(seq) % B + B * (1 + n % 3)
            check, credit = op == "check", flag or len(ids) == 1
            before = copy.deepcopy(slow)
            try:
                expected = stepped(slow, ids, n, check, credit)
            except PoolExhaustedError:
                slow = before
                continue
            assert fast.advance_private(ids, n, n, check, credit=credit) == expected
        elif op == "release" and live:
            fast.release_private(seq, ReleaseReason.CANCELLED)
            slow.release(seq, ReleaseReason.CANCELLED)
        fast.check_invariants()
        slow.check_invariants()
        assert view(fast) == view(slow)
        assert fast.state_slack() == walked_slack(fast)


def test_a_jump_holds_the_page_it_resumed_from_until_the_next_step():
    # full + state, B 4, 20 blocks: a prompt of 5 tokens holds ceil(5 / 4) = 2 blocks in each group (align from
    # nothing computed: 5 % 4 and 5 > 4, so the state group holds page 5 // 4 − 1 = 0 and the last, 1): 4 used
    pool = HybridPool(20, B, (PoolGroup("full"), PoolGroup("state")), enable_prefix_caching=False, state_mode="align")
    pool.allocate_private("a", 5)
    assert pool.num_used == 4
    # 11 tokens more in one chunk: 16 tokens, 4 blocks; the state group resumes from page (5 − 1) // 4 = 1 and jumps
    # (last page 15 // 4 = 3 > 1 + 1; 16 % 4 = 0, so it keeps page 3 only): page 0 freed, page 1 held past the table
    # (fill 1), page 3 fresh (fill 4); the full group 2 fresh blocks: 4 + 2 + 1 − 1 = 6 used
    assert pool.advance_private(["a"], 11, 11)
    assert pool.num_used == 6 and pool._resumed["a"].keys() == {1}
    assert pool._resumed["a"][1][0] == 1 and pool.store.fill[pool._resumed["a"][1][1]] == 1
    # state slack: the page held past (4 − 1 = 3) and the table's (−16 mod 4 = 0)
    assert pool.state_slack() == 3
    # the next decode step lets it go (first, as HybridLayout._skip) and opens block 4 in both groups: 6 − 1 + 2 = 7
    assert pool.advance_private(["a"], 1, 1)
    assert pool.num_used == 7 and not pool._resumed
    pool.release_private("a")
    assert pool.num_used == 0
