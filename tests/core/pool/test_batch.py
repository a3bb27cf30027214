"""append_many, fork_many and release_many against the same operations one sequence at a time: identical
pools after every call (block ids, ref counts, fills, versions, hash index, free-queue order, counters),
with prefix-cached blocks, evictions, forks of forks, deferred frees inside steps and exhausted pools."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.block_pool import BlockPool, PoolExhaustedError, ReleaseReason


def pool_state(pool: BlockPool) -> dict:
    store = pool.store
    return {
        "state": store.state.tolist(), "ref": store.ref.tolist(), "version": store.version.tolist(),
        "fill": store.fill.tolist(), "slot": store.block_slot.tolist(), "index": store.index.vals.tolist(),
        "queue": pool.free_queue_order(), "stats": pool.stats(), "usage": pool.usage(),
        "tables": {s: (pool.block_table(s).tolist(), pool.num_tokens(s)) for s in pool.seqs},
    }


def one_by_one(pool: BlockPool, op: str, ids: list, arg) -> list[tuple[int, int]]:
    """The batch operation as single-sequence calls, in order; the copies of every append."""
    copies: list[tuple[int, int]] = []
    if op == "append":
        for s in ids:
            copies += pool.append(s, arg)
    elif op == "fork":
        for parent, child in zip(ids, arg, strict=True):
            pool.fork(parent, child)
    else:
        for s in ids:
            pool.release(s, arg)
    return copies


OPS = st.lists(
    st.tuples(st.sampled_from(["alloc", "alloc", "append", "append", "append", "fork", "fork", "release", "step"]),
              st.integers(0, 10**6)),
    min_size=8, max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(OPS, st.sampled_from([1, 2, 4]), st.integers(6, 40))
def test_batch_operations_equal_one_at_a_time(ops: list[tuple[str, int]], block_size: int, num_blocks: int) -> None:
    batch, single = BlockPool(num_blocks, block_size), BlockPool(num_blocks, block_size)
    next_id = 0
    for op, seed in ops:
        rng = np.random.default_rng(seed)
        live = list(batch.seqs)
        if op == "step":
            for pool in (batch, single):
                pool.end_step() if pool._in_step else pool.begin_step()
        elif op == "alloc":
            tokens = int(rng.integers(0, 4 * block_size))
            keys = [(int(k),) for k in rng.integers(0, 3, tokens // block_size)]  # shared prefixes: hits
            outcomes = []
            for pool in (batch, single):
                try:
                    outcomes.append(pool.allocate(next_id, tokens, keys))
                except PoolExhaustedError:
                    outcomes.append("exhausted")
            assert outcomes[0] == outcomes[1]
            next_id += 1
        elif live:
            picked = [live[i] for i in rng.permutation(len(live))[: int(rng.integers(1, len(live) + 1))]]
            if op == "append":
                n = int(rng.integers(0, 2 * block_size + 2))
                try:
                    copies = batch.append_many(picked, n)
                except PoolExhaustedError:
                    assert pool_state(batch) == pool_state(single)  # nothing changed
                    with pytest.raises(PoolExhaustedError):  # ... and one at a time they do not fit either
                        one_by_one(copy.deepcopy(single), "append", picked, n)
                else:
                    assert one_by_one(single, "append", picked, n) == copies
            elif op == "fork":
                parents = [live[i] for i in rng.integers(0, len(live), int(rng.integers(1, 4)))]
                children = list(range(next_id, next_id + len(parents)))
                next_id += len(parents)
                batch.fork_many(parents, children)
                one_by_one(single, "fork", parents, children)
            else:
                reason = list(ReleaseReason)[seed % 4]
                batch.release_many(picked, reason)
                one_by_one(single, "release", picked, reason)
        batch.check_invariants()
        assert pool_state(batch) == pool_state(single)


def test_append_many_copies_a_shared_block_once_per_other_holder() -> None:
    pool = BlockPool(16, 4)
    pool.allocate("a", 6)  # blocks 0, 1; block 1 holds 2 tokens
    pool.fork_many(["a", "a"], ["b", "c"])  # block 1 is held by 3 tables
    assert pool.store.ref[[0, 1]].tolist() == [3, 3]
    # a and b copy block 1 (ref 3 -> 2 -> 1); c, its last holder, writes in place
    assert pool.append_many(["a", "b", "c"], 1) == [(1, 2), (1, 3)]
    assert [pool.block_table(s).tolist() for s in "abc"] == [[0, 2], [0, 3], [0, 1]]
    assert pool.store.fill[[1, 2, 3]].tolist() == [3, 3, 3] and pool.stats().cow_copies == 2
    # only b and c write next: b's block is its own now, so nobody copies
    assert pool.append_many(["b", "c"], 2) == []
    # b: 3 + 2 = 5 tokens -> a new block 4; c: 5 tokens -> a new block 5
    assert [pool.block_table(s).tolist() for s in "bc"] == [[0, 3, 4], [0, 1, 5]]
    pool.release_many(["a", "b", "c"], ReleaseReason.CANCELLED)
    pool.check_invariants()
    # every table back tail first, a block when its last holder goes: a [2], b [4, 3], c [5, 1, 0], each at the
    # free queue's tail after the never-used 6..15
    assert pool.free_queue_order() == [*range(6, 16), 2, 4, 3, 5, 1, 0]
    assert pool.stats().released_cancelled == 3


def test_batch_calls_check_first() -> None:
    pool = BlockPool(4, 4)
    pool.allocate("a", 3)
    pool.allocate("b", 3)
    before = pool_state(pool)
    with pytest.raises(PoolExhaustedError):
        pool.append_many(["a", "b"], 6)  # 9 tokens each: 2 more blocks each, 2 free
    with pytest.raises(ValueError, match="named twice"):
        pool.append_many(["a", "a"], 1)
    with pytest.raises(ValueError, match="not live"):
        pool.release_many(["a", "zzz"])
    with pytest.raises(ValueError, match="new id"):
        pool.fork_many(["a"], ["b"])
    with pytest.raises(ValueError, match="one parent per child"):
        pool.fork_many(["a"], ["x", "y"])
    with pytest.raises(ValueError, match="release reason"):
        pool.release_many(["a"], "vanished")
    assert pool_state(pool) == before
