"""Weighted tables (core/pool/weighted.py): a group whose block costs k units is one table, not k.

Hand-worked unit counts (the arithmetic in comments), the same pool run as k identical unit tables (the
replicated layout: the old code path) as an oracle where nothing is evicted, a planted mutation caught, and the
store's size when units number in millions. The random operations with check_invariants() after each are in
test_hybrid_pool_stateful.py (WeightedPoolMachine).
"""

from __future__ import annotations

import numpy as np
import pytest
from hand_specs import granite_h_small
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.model.kv_groups import kv_layout, plan_blocks
from kvcalc.core.pool import weighted
from kvcalc.core.pool.groups import PoolGroup, pool_groups
from kvcalc.core.pool.hybrid import HybridPool
from kvcalc.core.pool.weighted import WeightedStore, cached_units

B = 4


def test_units_of_a_growing_sequence():
    # full blocks cost 2 units, a state page 5; 20 units, mode none (one state page, moved in place)
    pool = HybridPool(20, B, (PoolGroup("full", weight=2), PoolGroup("state", weight=5)), state_mode="none",
                      enable_prefix_caching=False)
    assert isinstance(pool.store, WeightedStore) and pool.num_blocks == 20
    pool.allocate(0, 10)  # full ceil(10/4) = 3 blocks · 2 = 6; state: the page of token 9, 9 // 4 = 2: 1 · 5 -> 11
    assert (pool.num_used, pool.num_free_blocks, pool.held_blocks(0)) == (11, 9, [3, 1])
    assert not pool.can_allocate(10)  # another 11 units > 9 free
    pool.append(0, 2)  # tokens 10, 11: full block 2 filled (4 tokens), state still page 2 -> 11
    assert pool.num_used == 11
    pool.append(0, 1)  # token 12: full block 3 (+2), the state page moves from block 2 to 3 in place (+0) -> 13
    assert (pool.num_used, pool.num_free_blocks, pool.held_blocks(0)) == (13, 7, [4, 1])
    pool.free_skipped(0)  # nothing left to free
    assert (pool.num_used, pool.num_free_blocks) == (13, 7)
    # 7 free units: 3 full blocks (6 units) fit, a fourth (8) does not; the state page takes none
    assert pool.append_need(0, 12) == 6 and pool.append_need(0, 16) == 8
    pool.check_invariants()
    pool.release(0)
    assert (pool.num_used, pool.num_free_blocks) == (0, 20)


def test_an_evicted_cached_state_frees_all_its_units():
    # 12 units: full 1 a block, state (mode all: a page at every block boundary) 5 a page
    pool = HybridPool(12, B, (PoolGroup("full"), PoolGroup("state", weight=5)), state_mode="all")
    pool.allocate(0, 8, [1, 2])  # full 2 blocks (2 units) + 2 state pages (10 units) = 12
    assert pool.num_free_blocks == 0
    pool.release(0)  # all four hashed: cached, in release order (full group first, each table tail first)
    assert (pool.num_used, cached_units(pool.store), pool.num_free_blocks) == (0, 12, 12)
    # another prompt of 4 tokens: full 1 block + state 1 page = 6 units. The full block evicts the oldest cached
    # block (full block 1, 1 unit); the state page is 5 units short: full block 0 (1) then state page 1 (5)
    pool.allocate(1, 4, [9])
    assert pool.stats().evictions == 3
    assert (pool.num_used, cached_units(pool.store), pool.num_free_blocks) == (6, 5, 6)  # state page 0 still cached
    assert pool.hit_tokens(8, [1, 2]) == 0  # its full blocks went first: no hit
    pool.check_invariants()


def test_a_hit_revives_a_cached_state_and_counts_its_units():
    pool = HybridPool(40, B, (PoolGroup("full", weight=2), PoolGroup("state", weight=5)), state_mode="all")
    pool.allocate(0, 9, [1, 2])  # full 3 · 2 = 6, state pages 0..2 · 5 = 15 -> 21
    assert pool.num_used == 21
    pool.release(0)  # the two full blocks and the two states at boundaries 4, 8 are cached: 2 · 2 + 2 · 5 = 14
    assert cached_units(pool.store) == 14 and pool.num_free_blocks == 40
    # hits 8 tokens: full blocks 0, 1 revived (4 units), block 2 new (2); the state group reads only the page at the
    # hit's boundary (vLLM's MambaManager: get_num_skipped_tokens(8) = 7, so entry 7 // 4 = 0 is null): page 1
    # revived (5), page 2 new (5): 4 + 2 + 5 + 5 = 16 used, page 0 (the state at 4) still cached (5)
    assert pool.allocate(1, 9, [1, 2]) == 8
    assert (pool.num_used, cached_units(pool.store)) == (16, 5)
    pool.check_invariants()


def replicated(groups: tuple[PoolGroup, ...]) -> tuple[PoolGroup, ...]:
    """The same groups as unit tables: a group of weight k is k tables of weight 1 (the old layout)."""
    return tuple(g for group in groups for g in [PoolGroup(group.kind, group.window)] * group.weight)


@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7), st.integers(1, 9)), max_size=30),
       mode=st.sampled_from(["none", "align", "all"]))
@settings(max_examples=60, deadline=None)
def test_weighted_is_the_unit_tables_when_nothing_is_evicted(ops, mode):
    # with room for everything no block is evicted, so k identical unit tables hold exactly the units of one
    # table of weight k: used units, free units and hits agree after every operation (appends of at most B tokens:
    # a longer one makes a weighted state group jump over the pages it would not keep, test_state_jump_*)
    groups = (PoolGroup("full", weight=2), PoolGroup("sliding", 6, weight=3), PoolGroup("state", weight=4))
    pools = [HybridPool(4_000, B, g, state_mode=mode) for g in (groups, replicated(groups))]
    live: list[int] = []
    for n, (op, pick, size) in enumerate(ops):
        keys = list(range(pick % 3, pick % 3 + size // B))  # prompts sharing prefixes: hits
        hits = []
        for pool in pools:
            if op == 0 or not live:
                hits.append(pool.allocate(n, size, keys))
            elif op == 1:
                pool.append(live[pick % len(live)], min(size, B))  # one page boundary at most: no state jump
            elif op == 2:
                pool.fork(live[pick % len(live)], n)
            else:
                pool.release(live[pick % len(live)])
        assert pools[0].num_used == pools[1].num_used and pools[0].num_free_blocks == pools[1].num_free_blocks
        assert len(set(hits)) <= 1, f"allocate hit {hits[0]} tokens weighted, {hits[-1]} on unit tables"
        if op in (0, 2) or not live:  # a new sequence (allocated or forked)
            live.append(n)
        elif op == 3:
            live.remove(live[pick % len(live)])
        assert pools[0].hit_tokens(9, [0, 1]) == pools[1].hit_tokens(9, [0, 1])
        pools[0].check_invariants()


def test_a_planted_mutation_is_caught(monkeypatch):
    # a freed block that gives back k − 1 of its k units: the units no longer add up
    plain = weighted.WeightedQueue.push_plain

    def gives_back_less(self, block_ids):
        plain(self, block_ids)
        self.plain_units -= len(block_ids)

    monkeypatch.setattr(weighted.WeightedQueue, "push_plain", gives_back_less)
    pool = HybridPool(20, B, (PoolGroup("full", weight=2), PoolGroup("state", weight=5)), enable_prefix_caching=False)
    pool.allocate(0, 10)
    pool.check_invariants()  # nothing freed yet
    pool.release(0)
    with pytest.raises(AssertionError, match=r"free-queue length|plain units"):
        pool.check_invariants()


def test_a_block_counted_once_not_k_times_is_caught(monkeypatch):
    # a hand-out that counts one unit per block instead of k
    def counts_once(self, n, num_tokens):
        blocks = self._store.hand_out_group(self._group, n)[0]
        store = self._store
        store.ref[blocks], store.num_used = 1, store.num_used + n
        store.fill[blocks] = store.block_size
        store.fill[blocks[-1]] = num_tokens - (n - 1) * store.block_size
        store.useful_tokens += num_tokens
        return blocks

    monkeypatch.setattr(weighted.GroupStore, "take", counts_once)
    pool = HybridPool(20, B, (PoolGroup("full", weight=2), PoolGroup("state", weight=5)), enable_prefix_caching=False)
    pool.allocate(0, 10)
    with pytest.raises(AssertionError, match="USED blocks, counter says"):
        pool.check_invariants()


def test_granite_in_40_gib_counts_units_not_unit_ids():
    # Granite-4.0-H-Small, ideal layout, block 16: unit = gcd(262,144, 77,322,240) = 2,048 B; 40 GiB = 20,971,520
    # units. Ids: 20,971,520 // 128 = 163,840 attention blocks + 20,971,520 // 37,755 = 555 states = 164,395
    layout = kv_layout(granite_h_small(), 16, 16, "ideal")
    groups = pool_groups(layout, weighted=True)
    assert groups is not None and [g.weight for g in groups] == [128, 37_755]
    units = plan_blocks(layout, 40 * 2**30)
    assert units == 20_971_520
    pool = HybridPool(units, 16, groups, state_mode="none", enable_prefix_caching=False)
    assert pool.store.num_blocks == 164_395 and len(pool.store.state) == 164_395
    # one 32,769-token sequence: ceil(32,769 / 16) = 2,049 blocks · 128 = 262,272 units + 1 state · 37,755 = 300,027
    pool.allocate(0, 32_769)
    assert pool.num_used == 300_027
    assert pool.num_used * layout.page_bytes == 2_049 * 262_144 + 77_322_240
    count = 1  # concurrency: floor(20,971,520 / 300,027) = 69 (69 · 300,027 = 20,701,863; 70 · = 21,001,890)
    while pool.can_allocate(32_769):
        pool.allocate(count, 32_769)
        count += 1
    assert count == 69 and pool.num_free_blocks == 20_971_520 - 69 * 300_027
    pool.check_invariants()


def test_unweighted_pools_keep_the_plain_store():
    pool = HybridPool(40, B, (PoolGroup("full"), PoolGroup("state")))
    assert type(pool.store).__name__ == "BlockStore" and all(p.store is pool.store for p in pool.pools)
    assert not pool.weighted and np.array_equal(pool.store.queue.order()[:3], [0, 1, 2])


def test_state_jump_takes_only_the_pages_it_keeps():
    # B 4, full 2 units a block, state 7 a page, mode none: 4 tokens then a chunk of 8 (to 12). Mode none holds one
    # page a request (state_pages.roll_page), weighted or not: the page moves to the last entry in place
    groups = (PoolGroup("full", weight=2), PoolGroup("state", weight=7))
    pool = HybridPool(100, B, groups, state_mode="none", enable_prefix_caching=False)
    pool.allocate(0, 4)  # 1 block (2) + the page of token 3 (7) = 9
    resume = int(pool.block_tables(0)[1][0])
    assert pool.append_need(0, 8) == 2 * 2 + 0  # 2 more blocks; the page moves (unit tables alike: no page taken)
    moves = pool.append(0, 8)
    full, state = pool.block_tables(0)
    assert len(full) == 3 and state.tolist() == [-1, -1, resume]  # pages 1 and 2 never taken: the one page moved
    assert moves == [] and pool.num_used == 3 * 2 + 7
    pool.check_invariants()
    # forked: both branches hold the one page; the first to grow copies it (7 units), the last holder moves it
    pool.fork(0, 1)
    pool.append(0, 8)
    pool.append(1, 8)
    assert [pool.held_blocks(s) for s in (0, 1)] == [[5, 1], [5, 1]]
    assert pool.num_used == (3 + 2 + 2) * 2 + 2 * 7  # 3 shared blocks, 2 own each; a page each (one a copy)
    pool.check_invariants()
    # mode align jumps (weighted.state_jump): the chunk takes page 12 // 4 − 1 = 2 only (page 1 never taken) and
    # keeps page 0, the state it resumes from, until the next step (vLLM's last_state_block_idx): 3 · 2 + 2 · 7 =
    # 20 units. A token more: remove_skipped_blocks(12) frees page 0 (0 < cdiv(12, 4) − 1 = 2), page 3 is taken:
    # 4 · 2 + 2 · 7 = 22
    pool = HybridPool(100, B, groups, state_mode="align", enable_prefix_caching=False)
    pool.allocate(0, 4)
    resume = int(pool.block_tables(0)[1][0])
    assert pool.append_need(0, 8) == 2 * 2 + 7
    moves = pool.append(0, 8)
    full, state = pool.block_tables(0)
    assert state.tolist()[:2] == [resume, -1] and moves == [(resume, int(state[2]))] and pool.num_used == 3 * 2 + 2 * 7
    pool.check_invariants()
    pool.append(0, 1)
    assert pool.block_tables(0)[1].tolist()[:3] == [-1, -1, int(state[2])] and pool.num_used == 4 * 2 + 2 * 7
    pool.check_invariants()
