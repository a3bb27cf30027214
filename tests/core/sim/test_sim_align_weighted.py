"""mamba_cache_mode align on weighted tables (core/pool/weighted.py: the ideal layout, a state of thousands of the
layout's units): a state group keeps align's pages there as on unit tables (weighted.state_jump: the page a step
resumes from and the step's last one; a state saved where a step ends on a block boundary is cached whole, at its
weight). Checked against the same run on unit tables (a group of weight k as k tables of weight 1, the oracle),
and by hand on Granite-4.0-H-Small."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from real_configs import real_config

from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid import HybridPool
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.record import COMPLETED
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.setup import build

B = 16


def trace(tmp_path, rows: list[tuple[int, int, list[int]]]) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": p, "output_length": 40, "hash_ids": ids})
                            + "\n" for t, p, ids in rows))
    return str(path)


def granite(tmp_path, path: str, **kw):
    folder = tmp_path / "granite"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(real_config("GRANITE_4_H_SMALL")))
    return build(SimOptions(config=str(folder), layout="ideal", gpu="H200", trace=("mooncake", path),
                            mamba_cache_mode="align", **kw))


def shared_prefix_rows(gap_ms: int = 300) -> list[tuple[int, int, list[int]]]:
    # 16 requests gap_ms apart, 4 conversations of 4 turns: turn k of conversation f repeats turn k − 1's ids and adds
    # one (2 + k ids, 512 · (2 + k) − 40 − 3 · i tokens), so its prompt starts with the earlier turn's whole prompt,
    # where (align) the earlier turn saved its state: at its last block boundary, or where a chunk of it ended
    rows = []
    for i in range(16):
        family, turn = i % 4, i // 4
        rows.append((gap_ms * i, 512 * (2 + turn) - 40 - 3 * i, [100 * family + k for k in range(2 + turn)]))
    return rows


def unit_tables(groups: tuple[PoolGroup, ...]) -> tuple[PoolGroup, ...]:
    """The same groups as unit tables: a group of weight k is k tables of weight 1."""
    return tuple(g for group in groups for g in [PoolGroup(group.kind, group.window, group.label)] * group.weight)


@pytest.mark.parametrize("budget", [8192, 1000])  # prompts in one chunk each (cut at the last boundary), or many
def test_weighted_align_is_the_unit_tables_run_where_nothing_is_evicted(tmp_path, budget):
    # Granite's real weights (37,755 and 128 units) would be 37,883 unit tables: the oracle runs small weights, a
    # state 5 units and a full block 2, in a pool that never evicts (every prompt's blocks and states fit at once)
    setup = granite(tmp_path, trace(tmp_path, shared_prefix_rows()), max_batched_tokens=budget)
    assert setup.sim.state_mode == "align"
    weighted = (PoolGroup("state", label="state", weight=5), PoolGroup("full", label="full", weight=2))
    records = [run_policy(setup.workload, "paged", replace(setup.sim, groups=groups, capacity_blocks=400_000),
                          record_timeline=True)
               for groups in (weighted, unit_tables(weighted))]
    a, b = records
    assert (a.status == COMPLETED).all() and (b.status == COMPLETED).all()
    assert a.prefix.hit_tokens == b.prefix.hit_tokens > 0
    assert a.steps == b.steps and a.peak_running == b.peak_running
    assert np.array_equal(a.first_token_s, b.first_token_s) and np.array_equal(a.finish_s, b.finish_s)
    # units of the weighted pool are the unit tables' blocks, slot for slot, at every moment
    assert a.memory_slot_s == pytest.approx(b.memory_slot_s, rel=1e-12)
    # a timeline row ends with each table's blocks: weighted (state, full), unit tables 5 state then 2 full tables
    assert [row[:10] for row in a.timeline] == [row[:10] for row in b.timeline]
    assert [(5 * row[10], 2 * row[11]) for row in a.timeline] == [(sum(row[10:15]), sum(row[15:17]))
                                                                  for row in b.timeline]


def test_granite_align_hit_by_hand(tmp_path):
    # Granite-4.0-H-Small, ideal layout, block 16: a state 37,755 units, a full block 128 (test_sim_weighted).
    # r0: 1,100 tokens (ids 1, 2, 3), budget 8,192: one chunk, cut at the last boundary 1,088 = 68 · 16 (vLLM's
    # block-aligned split), then 12 tokens: the state after token 1,087 is saved (page 67) and cached when r0 ends.
    # r1 at 10 s repeats ids 1, 2 and goes on (1,100 tokens, ids 1, 2, 9): its full blocks 0..63 (1,024 tokens,
    # keyed by ids 1, 2) hit in the full group, but the state group holds a state only at 1,088, a boundary whose key
    # (id 3, the id holding token 1,087) r1 does not have: no hit (the hit needs every group). r2 at 20 s repeats r0
    # whole: the full group hits 68 blocks and the state at 1,088 is there: 1,088 tokens hit, 12 computed.
    rows = [(0, 1100, [1, 2, 3]), (10_000, 1100, [1, 2, 9]), (20_000, 1100, [1, 2, 3])]
    setup = granite(tmp_path, trace(tmp_path, rows))
    assert [(g.kind, g.weight) for g in setup.sim.groups] == [("state", 37_755), ("full", 128)]
    record = run_policy(setup.workload, "paged", setup.sim)
    assert (record.status == COMPLETED).all()
    assert record.prefix.hit_tokens == 1_088
    # each group's own longest hit: the state group r2's 1,088 (r1's boundary 1,088 has another key); the full
    # group r1's 1,024 and r2's 1,088
    assert record.prefix.group_hit_tokens == [1_088, 1_024 + 1_088]


@pytest.mark.parametrize(("units", "gap_ms"), [(700, 300), (700, 20), (1_500, 20)])  # evictions, preemptions
def test_weighted_align_under_pressure_ends_whole(tmp_path, units, gap_ms):
    # the same conversations in a pool that evicts cached states whole (w units each, never in part) and preempts:
    # every request ends and the pool is whole at the end (run_policy checks it: units, ids, references, hashes)
    setup = granite(tmp_path, trace(tmp_path, shared_prefix_rows(gap_ms)), max_batched_tokens=1000)
    weighted = (PoolGroup("state", label="state", weight=5), PoolGroup("full", label="full", weight=2))
    record = run_policy(setup.workload, "paged", replace(setup.sim, groups=weighted, capacity_blocks=units))
    assert (record.status == COMPLETED).all()
    # 700 units hold two prompts at most (a 2,500-token prompt: 157 · 2 + 2 · 5 = 324 units): cached blocks and
    # states are evicted (at this writing 2,928 tokens hit at 0.3 s, 17,664 with 1,500 units), and at 20 ms requests
    # are preempted by recompute and readmitted
    assert record.preemptions.sum() > 0 if gap_ms == 20 and units == 700 else record.preemptions.sum() == 0
    assert record.prefix.hit_tokens > 0



@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7), st.integers(1, 14)), max_size=30))
@settings(max_examples=60, deadline=None)
def test_weighted_align_pool_is_the_unit_tables_with_jumps(ops):
    # the pool under the sim: appends of up to 14 tokens with B = 4 (a state group's step jumps over up to 3 pages,
    # taking only its last and holding the one it resumed from past the table, on both kinds of tables alike), with
    # prefix keys; nothing is evicted (4,000 units), so used and free units, hits and held blocks agree after every
    # operation (test_weighted_pool.py checks appends of one page boundary at most, in every mode)
    B4 = 4
    groups = (PoolGroup("full", weight=2), PoolGroup("sliding", 6, weight=3), PoolGroup("state", weight=4))
    pools = [HybridPool(4_000, B4, g, state_mode="align") for g in (groups, unit_tables(groups))]
    live: list[int] = []
    for n, (op, pick, size) in enumerate(ops):
        keys = list(range(pick % 3, pick % 3 + size // B4))  # prompts sharing prefixes: hits
        hits = []
        for pool in pools:
            if op == 0 or not live:
                hits.append(pool.allocate(n, size, keys))
            elif op == 1:
                seq = live[pick % len(live)]
                old = pool.num_tokens(seq)  # the keys of the blocks the append completes
                pool.append(seq, size, [pick % 3 + j for j in range(old // B4, (old + size) // B4)])
            elif op == 2:
                pool.fork(live[pick % len(live)], n)
            else:
                pool.release(live[pick % len(live)])
        assert pools[0].num_used == pools[1].num_used and pools[0].num_free_blocks == pools[1].num_free_blocks
        assert len(set(hits)) <= 1, f"allocate hit {hits[0]} tokens weighted, {hits[-1]} on unit tables"
        if op in (0, 2) or not live:
            live.append(n)
        elif op == 3:
            live.remove(live[pick % len(live)])
        for seq in live:
            held, units = pools[1].held_blocks(seq), pools[0].held_blocks(seq)  # unit tables' blocks, weighted blocks
            assert [2 * units[0], 3 * units[1], 4 * units[2]] == [sum(held[:2]), sum(held[2:5]), sum(held[5:])]
        assert pools[0].hit_tokens(12, [0, 1, 2]) == pools[1].hit_tokens(12, [0, 1, 2])
        pools[0].check_invariants()
        pools[1].check_invariants()
