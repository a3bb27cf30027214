"""A step of many sequences in one pass (core/pool/hybrid_ordered.py: skip_ordered, append_ordered) leaves the pool
exactly as the per-sequence loop of `kvcalc sim` with prefix caching does (free_skipped of each sequence, then
append_fitting of each): the same block ids in every table, the same reference counts, fills and versions, the same
free-queue order (plain stack and LRU), the same prefix-cache entries and the same copies, in the same order.

Hypothesis drives both pools through the same random lifetimes: prompts of a few families (so that they hit each
other's cached blocks), forks (shared partial last blocks: copy-on-write inside a batch), releases, and steps in
which each sequence adds its own count of tokens, with the keys of the prompt blocks it completes (a later prefill
chunk) or none (decode). Pools small enough that hand-outs evict cached blocks; every kind of group and state mode.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid import HybridPool
from kvcalc.core.pool.hybrid_ordered import append_ordered, held_blocks, label, need_ordered, ordered, skip_ordered
from kvcalc.core.pool.store import PoolExhaustedError

B = 4
LAYOUTS = {
    "sliding+chunked": (PoolGroup("full"), PoolGroup("sliding", 6), PoolGroup("sliding", 6), PoolGroup("chunked", 8)),
    "narrow window": (PoolGroup("sliding", 2), PoolGroup("full"), PoolGroup("sliding", 2)),
    "state": (PoolGroup("full"), PoolGroup("state"), PoolGroup("sliding", 5)),
}
PROMPT = 16  # tokens of each family's prompt: keys for its 4 full blocks


def family_keys(family: int) -> np.ndarray:
    """The content keys of a family's prompt blocks (int64, as the sim's): families 0 and 1 share their first 2."""
    return np.array([1000 * min(family, 1 if i < 2 else family) + i for i in range(PROMPT // B)], dtype=np.int64)


def state(pool: HybridPool) -> dict:
    """The whole pool: tables (ids included), per-block arrays, free-queue order, cache entries, counters."""
    store = pool.store
    hashes, blocks = store.index.items()
    order = np.argsort(blocks)
    return {
        "tables": {(g, s): (t.table[: t.num_blocks].tolist(), t.num_skipped, t.num_tokens, t.num_hashed, t.last_hash)
                   for g, p in enumerate(pool.pools) for s, t in p.seqs.items()},
        "arrays": [a.tolist() for a in (store.state, store.ref, store.version, store.fill, store.key,
                                        store.klass, store.parent_klass)],
        "queue": store.queue.order(), "index": (blocks[order].tolist(), hashes[order].tolist()),
        "counts": (store.num_used, store.useful_tokens, dict(store.counters)),
        "logical": [(p.logical_blocks, p.logical_tokens) for p in pool.pools],
    }


def keys_of(pool: HybridPool, families: dict, seq: int, add: int) -> np.ndarray | None:
    """The keys of the prompt blocks that `add` more tokens of `seq` complete (the sim's _completed_keys): none
    past the prompt's full blocks (decode)."""
    family, prompt = families[seq]
    keys, old = family_keys(family)[: prompt // B], pool.num_tokens(seq)
    return None if old // B >= len(keys) else keys[old // B : min((old + add) // B, len(keys))]


ops = st.lists(st.tuples(st.sampled_from(["add", "add", "step", "step", "step", "step", "fork", "release"]),
                         st.integers(0, 7), st.integers(0, 3),
                         st.lists(st.sampled_from([1, 1, 1, 1, 2, 0, 6]), min_size=8, max_size=8)),
               min_size=1, max_size=50)


@pytest.mark.parametrize("mode", ["none", "align", "all"])
@pytest.mark.parametrize("name", list(LAYOUTS))
@settings(max_examples=40, deadline=None)
@given(steps=ops)
def test_a_step_in_one_pass_is_the_per_sequence_loop(name, mode, steps):
    groups = LAYOUTS[name]
    if mode == "all" and name != "state":
        return
    fast = HybridPool(28, B, groups, state_mode=mode)
    slow = HybridPool(28, B, groups, state_mode=mode)
    families: dict[int, int] = {}
    copies_fast: list = []
    copies_slow: list = []
    for op, seq, family, adds in steps:
        live = slow.has_seq(seq)
        if op == "add" and not live:
            n = 3 + 3 * family  # the first chunk of the prompt: a hit on the family's cached blocks
            keys = family_keys(family)[: n // B]
            refused = [not pool.can_allocate(n, keys) for pool in (slow, fast)]  # both: a look-up interns keys
            assert refused[0] == refused[1]
            if refused[0]:
                continue
            families[seq] = (family, n + 4 * (family % 2))  # its prompt: the first chunk, then 0 or 4 tokens
            assert fast.allocate(seq, n, keys) == slow.allocate(seq, n, keys)
            label(fast, seq)  # as the sim's admission does: held_blocks then counts from labels
        elif op == "fork" and live and not slow.has_seq(seq + 8):
            families[seq + 8] = families[seq]
            fast.fork(seq, seq + 8)
            slow.fork(seq, seq + 8)
        elif op == "release" and live:
            fast.release(seq)
            slow.release(seq)
        elif op == "step" and slow.seq_ids:
            assert ordered(fast)
            ids = slow.seq_ids
            for s in ids:  # the loop of GroupedPagedPolicy.grow_many
                slow.free_skipped(s)
            skip_ordered(fast, ids)
            assert state(fast) == state(slow)
            add = [adds[i % 8] for i in range(len(ids))]
            assert need_ordered(fast, ids, add) == slow.append_need_many(ids, add)
            if slow.append_need_many(ids, add) > slow.num_free_blocks:  # preempt the newest, as the scheduler
                fast.release(ids[-1])
                slow.release(ids[-1])
                continue
            keys = [keys_of(slow, families, s, a) if a else None for s, a in zip(ids, add, strict=True)]
            for s, a, k in zip(ids, add, keys, strict=True):
                if a:
                    copies_slow += slow.append_fitting(s, a, k)
            copies_fast += append_ordered(fast, ids, add, keys)
        assert state(fast) == state(slow)
        assert copies_fast == copies_slow
        assert held_blocks(fast) == [u.held_blocks for u in slow.group_usage()]
        for f in range(4):  # a kept look-up (prefix_lookup.probe) is the look-up the index gives now
            keys, extra = family_keys(f), (fast.anchor, None)  # the full group's chains
            kept, now = fast.prefix.probe(PROMPT, keys, extra), fast.prefix._probe_now(PROMPT, keys, extra)
            assert all(np.array_equal(a, b) for a, b in zip(kept, now, strict=True))
        fast.check_invariants()


def test_a_block_two_tables_skip_drops_at_its_last_holder():
    """Two forks of one sequence skip the same sliding blocks: the loop drops each when the second table lets
    go of it (ref 2 -> 1 -> 0), so the blocks enter the free queue then, in the second table's order."""
    groups = (PoolGroup("full"), PoolGroup("sliding", 4))
    pools = [HybridPool(40, B, groups) for _ in range(2)]
    keys = np.array([7, 8, 9, 10])
    for pool in pools:
        pool.allocate("a", 18, keys)
        pool.fork("a", "b")
        pool.allocate("c", 18, np.array([1, 2, 3, 4]))
    ids = ["a", "c", "b"]
    for s in ids:
        pools[1].free_skipped(s)
    freed = skip_ordered(pools[0], ids)
    # each table frees blocks 0..3 of its sliding group (first kept: (18 - 4 + 1) // 4 = 3): a, c, b
    assert freed == 3 * 3
    assert state(pools[0]) == state(pools[1])
    sliding_a = pools[0].pools[1].seqs["a"].table[:3].tolist()
    # c's three blocks drop at c's skip, a's (shared with b) at b's: each run tail first
    c = pools[0].pools[1].seqs["c"].table[:3].tolist()
    assert pools[0].store.queue.order()[-6:] == c[::-1] + sliding_a[::-1]


def test_append_ordered_refuses_nothing_it_was_not_asked():
    """A step that does not fit raises before any change (batch.append_many checks first)."""
    pool = HybridPool(6, B, (PoolGroup("full"), PoolGroup("sliding", 4)))
    pool.allocate("a", 8, np.array([1, 2]))
    before = state(pool)
    with pytest.raises(PoolExhaustedError):
        append_ordered(pool, ["a"], [40], [None])
    assert state(pool) == before
