"""HybridPool.group_usage and append_need_many against independent counts: each group's distinct held blocks are
np.unique over its live tables (what it computed before it marked blocks by group), a step's need the sum of
append_need one sequence at a time, on random pools with prefix-cache hits, forks, appends, releases and every kind
of group."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.group_hits import first_needed, first_needed_at
from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid import HybridPool
from kvcalc.core.pool.store import PoolExhaustedError

B = 4
GROUPS = (PoolGroup("full"), PoolGroup("sliding", 6), PoolGroup("chunked", 8), PoolGroup("state"))


def unique_counts(pool: HybridPool) -> list[int]:
    """Distinct blocks per group, counted one group at a time."""
    out = []
    for p in pool.pools:
        held = [s.blocks for s in p.seqs.values()]
        out.append(len(np.unique(np.concatenate(held))) if held else 0)
    return out


OPS = st.lists(st.tuples(st.sampled_from(["alloc", "append", "fork", "release"]), st.integers(0, 5),
                         st.integers(1, 30)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, mode=st.sampled_from(["align", "all"]))
def test_group_usage_counts_each_groups_distinct_blocks(ops, mode):
    pool = HybridPool(64, B, GROUPS, state_mode=mode)
    prompt = list(range(200))  # every prompt a prefix of one text: hits across sequences
    next_id = 0
    for op, pick, n in ops:
        live = pool.seq_ids
        try:
            if op == "alloc":
                keys = [tuple(prompt[i * B : (i + 1) * B]) for i in range(n // B)]
                pool.allocate(next_id, n, keys)
                next_id += 1
            elif live and op == "append":
                pool.append(live[pick % len(live)], n % 5 + 1)
            elif live and op == "fork":
                pool.fork(live[pick % len(live)], next_id)
                next_id += 1
            elif live and op == "release":
                pool.release(live[pick % len(live)])
        except PoolExhaustedError:
            pass
        live = pool.seq_ids
        adds = [(i * 7 + n) % 19 for i in range(len(live))]  # 0 (no growth) .. 18 tokens each
        for seq_id in live:
            pool.free_skipped(seq_id)
        assert pool.append_need_many(live, adds) == sum(map(pool.append_need, live, adds))
        usage = pool.group_usage()
        assert [u.held_blocks for u in usage] == unique_counts(pool)
        assert [u.table_entries for u in usage] == [sum(s.num_blocks for s in p.seqs.values()) for p in pool.pools]
    pool.check_invariants()


def test_group_usage_of_two_sequences_sharing_a_prefix():
    # full + sliding (window 6, blocks of 4): "a" allocates 12 tokens (3 blocks per group before the window frees
    # any: tokens 0..11, the next token 12 reads 7..12, so the sliding group frees block 0), "b" hits 8 tokens
    # (2 blocks) of it and takes 1 more block per group: the full group holds 3 + 1 distinct blocks in 3 + 3 entries
    pool = HybridPool(32, B, (PoolGroup("full"), PoolGroup("sliding", 6)))
    keys = [(i,) for i in range(3)]
    pool.allocate("a", 12, keys)
    assert pool.allocate("b", 12, keys) == 8
    full, sliding = pool.group_usage()
    assert (full.held_blocks, full.table_entries) == (4, 6)
    assert full.held_blocks == unique_counts(pool)[0]
    assert sliding.held_blocks == unique_counts(pool)[1]


def test_first_needed_at_is_first_needed_of_one_hit():
    # the scalar form the hit plan's fast path takes, against the array form at every hit up to 700 blocks
    for group in (PoolGroup("full"), PoolGroup("sliding", 6), PoolGroup("sliding", 1024), PoolGroup("chunked", 8),
                  PoolGroup("chunked", 8192), PoolGroup("state")):
        for block in (1, 4, 16, 544):
            hits = np.arange(700)
            assert first_needed(group, hits, block).tolist() == [first_needed_at(group, h, block) for h in range(700)]
    # by hand: sliding window 1,024, blocks of 16, a hit of 100 blocks (1,600 tokens): the next token (1,600) reads
    # 577..1,600, so blocks from 577 // 16 = 36 on
    assert first_needed_at(PoolGroup("sliding", 1024), 100, 16) == 36
