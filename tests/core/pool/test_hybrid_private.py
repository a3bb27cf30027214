"""A private hybrid pool's many-sequence operations (core/pool/hybrid_private.py) leave every table, counter and fill
that the one-sequence operations leave (allocate, append one token or one chunk at a time, release), on every kind
of group; only the block ids differ. Hypothesis drives both pools through the same random lifetimes."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.accounting import ReleaseReason
from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid import HybridPool
from kvcalc.core.pool.hybrid_private import first_blocks
from kvcalc.core.pool.store import PoolExhaustedError

B = 4
LAYOUTS = {
    # a full group, two sliding tables (W 6) and a chunked one (C 8): rows 1-2 adjacent, one kind
    "sliding+chunked": (PoolGroup("full"), PoolGroup("sliding", 6), PoolGroup("sliding", 6), PoolGroup("chunked", 8)),
    # a window smaller than a block: a run frees blocks it has just grown
    "narrow window": (PoolGroup("sliding", 2), PoolGroup("full"), PoolGroup("sliding", 2)),
    # state pages between full tables: the kind's rows are not adjacent
    "state": (PoolGroup("state"), PoolGroup("full"), PoolGroup("state"), PoolGroup("full")),
}


def view(pool: HybridPool) -> dict:
    """Everything but block ids: per group and sequence the table's shape and the fills of the blocks it holds."""
    store = pool.store
    tables = {}
    for g, p in enumerate(pool.pools):
        for seq_id, seq in p.seqs.items():
            held = seq.table[seq.num_skipped : seq.num_blocks]
            tables[g, seq_id] = (seq.num_blocks, seq.num_skipped, seq.num_tokens, store.fill[held].tolist(),
                                 store.ref[held].tolist())
    return {"tables": tables, "used": store.num_used, "useful": store.useful_tokens, "free": len(store.queue),
            "logical": [(p.logical_blocks, p.logical_tokens) for p in pool.pools],
            # every counter but the hand-outs: a run hands out no block that it frees again before it ends
            "stats": {**pool.stats().__dict__, "allocated_blocks": None}}


ops = st.lists(st.tuples(st.sampled_from(["add", "run", "chunk", "release"]), st.integers(0, 5),
                         st.integers(1, 40), st.integers(0, 30)), min_size=1, max_size=25)


@pytest.mark.parametrize("mode", ["none", "align"])
@pytest.mark.parametrize("name", list(LAYOUTS))
@settings(max_examples=30, deadline=None)
@given(steps=ops)
def test_private_operations_leave_what_one_sequence_operations_leave(name, mode, steps):
    groups = LAYOUTS[name]
    fast = HybridPool(60, B, groups, enable_prefix_caching=False, state_mode=mode)
    slow = HybridPool(60, B, groups, enable_prefix_caching=False, state_mode=mode)
    for op, seq, n, computed in steps:
        live = fast.has_seq(seq)
        if op == "add" and not live:
            computed = min(computed, n - 1)
            need = fast.allocate_private_need(n, computed)
            assert (need <= len(fast.store.queue)) == slow.can_allocate(n, computed_tokens=computed)
            if need > len(fast.store.queue):
                with pytest.raises(PoolExhaustedError):
                    fast.allocate_private(seq, n, computed)
                continue
            assert fast.allocate_private(seq, n, computed) == slow.allocate(seq, n, computed_tokens=computed) == 0
        elif op in ("run", "chunk") and live:
            ids = [s for s in fast.seq_ids if s <= seq]
            chunk = 1 if op == "run" else n
            before = copy.deepcopy(slow)
            try:  # the one-sequence appends, each step of every sequence in turn
                for _ in range(n // chunk):
                    for s in ids:
                        slow.append(s, chunk)
            except PoolExhaustedError:  # a step does not fit: the caller (the sim) never asks for such a run
                slow = before
                continue
            fast.advance_private(ids, n, chunk, check=False)  # it fits whenever every step does
        elif op == "release" and live:
            fast.release_private(seq, ReleaseReason.CANCELLED)
            slow.release(seq, ReleaseReason.CANCELLED)
        fast.check_invariants()
        slow.check_invariants()
        assert view(fast) == view(slow)


def test_a_refused_growth_frees_what_the_groups_let_go():
    # a full group and a sliding one (W 2), 8 blocks of 4: a prompt of 9 tokens takes ceil(9 / 4) = 3 blocks in each
    # (allocated from nothing computed: the sliding group holds them all), 6 used, 2 free
    pool = HybridPool(8, B, (PoolGroup("full"), PoolGroup("sliding", 2)), enable_prefix_caching=False)
    pool.allocate_private("a", 9, 0)
    assert pool.num_used == 6
    # 12 tokens more in one append: the sliding group first lets blocks 0, 1 go (the next token, 9, reads 8..9:
    # max(0, 9 − 2 + 1) // 4 = 2), then each group needs ceil(21 / 4) − 3 = 3 blocks: 6 > 2 + 2 free
    assert not pool.advance_private(["a"], 12, 12, check=True)
    assert pool.num_used == 4 and pool.pools[1].seqs["a"].num_skipped == 2 and pool.num_tokens("a") == 9
    pool.check_invariants()
    with pytest.raises(PoolExhaustedError):  # unchecked, it raises and changes nothing
        pool.advance_private(["a"], 12, 12, check=False)
    assert pool.num_used == 4
    assert pool.advance_private(["a"], 8, 8)  # ceil(17 / 4) − 3 = 2 blocks each: 4 = the 4 free
    assert pool.num_used == 8 and pool.num_free_blocks == 0
    pool.check_invariants()


def test_first_blocks_is_first_block_of_a_decode_step_element_by_element():
    # first_blocks(c): what a table keeps through the decode step from c to c + 1 tokens. Every group but a state
    # group of mode none frees before growth (first_block_before_growth(c)); mode none's one page moves to the
    # block of token c: c // B (B = 4: c = 4 -> 1, where the old rule kept page 0 for that step)
    computed = np.arange(0, 70)
    for group in (PoolGroup("full"), PoolGroup("sliding", 5), PoolGroup("chunked", 8), PoolGroup("state")):
        for mode in ("none", "align", "all"):
            got = np.broadcast_to(first_blocks(group, computed, B, mode), computed.shape)
            assert got.tolist() == [group.first_block(int(c), int(c) + 1, B, mode) for c in computed]
            if group.kind != "state" or mode != "none":
                assert got.tolist() == [group.first_block_before_growth(int(c), B, mode) for c in computed]
    assert first_blocks(PoolGroup("state"), np.array([3, 4, 7, 8]), 4, "none").tolist() == [0, 1, 1, 2]
