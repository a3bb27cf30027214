"""Nemotron-H-56B in `kvcalc sim` under mamba_cache_mode none (vLLM without prefix caching): one state page per
running request in each of its 6 state groups, and the memory breakdown counts a state page as a whole state (all
its slots useful), so tail fragmentation is only the attention blocks' unused slots. Figures worked by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvcalc.core.pool.groups import PoolGroup, peak_blocks
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.paged_groups import GroupedPagedPolicy
from kvcalc.core.sim.setup import build

B = 4128  # Nemotron-H-56B's block under vLLM's layout: 16 · ceil(16,900,096 / 65,536) tokens
NUM_BLOCKS = 902  # an H200 pair (--tp 2) at the defaults


def nemotron_policy(prefix_keys: bool = False) -> GroupedPagedPolicy:
    setup = build(SimOptions(model="Nemotron-H-56B", gpu="H200", tp=2, requests=3))
    sim = setup.sim
    # the plan's 902 blocks less vLLM's null block; the policy below takes all 902 (the figures are worked for it)
    assert (setup.plan.num_blocks, sim.capacity_blocks, sim.block_size, sim.state_mode) == (
        NUM_BLOCKS, NUM_BLOCKS - 1, B, "none")
    assert sim.groups is not None and [g.kind for g in sim.groups] == ["full"] + ["state"] * 6
    keys = [np.arange(8, dtype=np.int64) + 100 * i for i in range(3)] if prefix_keys else None
    return GroupedPagedPolicy(NUM_BLOCKS, B, sim.groups, "none", 3, keys, page_bytes=sim.page_bytes)


@pytest.mark.parametrize("prefix_keys", [False, True])  # the private fast path, and the pool's usage()
def test_nemotron_h_memory_parts_by_hand(prefix_keys: bool) -> None:
    pol = nemotron_policy(prefix_keys)
    for rid, n in enumerate((1000, 5000, 4128)):
        assert pol.admit(rid, 0, n)
    parts, _ = pol.parts(np.array([1000, 5000, 4128]), None)
    # attention blocks ceil(1,000 / 4,128) + ceil(5,000 / 4,128) + 1 = 1 + 2 + 1 = 4; state pages 3 · 6 = 18: 22 used
    # useful: the tokens 1,000 + 5,000 + 4,128 = 10,128 and 18 whole states of 4,128 slots: 10,128 + 74,304 = 84,432
    # tail: 4 · 4,128 − 10,128 = 6,384 = (4,128 − 1,000) + (8,256 − 5,000) + 0; free (902 − 22) · 4,128 = 3,632,640
    assert pol.pool.num_used == 22
    assert parts.tolist() == [84_432, 6_384, 0, 0, 0, 3_632_640]
    assert int(parts.sum()) == NUM_BLOCKS * B == 3_723_456
    # request 1 grows across its block boundary to 8,257 tokens: a third attention block (8,257 > 2 · 4,128) and its
    # state page moves from block 1 to block 2 in place (vLLM: one state block a request): 1 + 3 + 1 + 18 = 23 used
    assert pol.grow(1, 8257)
    assert pol.pool.num_used == 23 and pol.group_blocks() == [5] + [3] * 6
    parts, _ = pol.parts(np.array([1000, 8257, 4128]), None)
    # useful 1,000 + 8,257 + 4,128 + 74,304 = 87,689; tail 5 · 4,128 − 13,385 = 7,255 = 3,128 + (12,384 − 8,257) + 0
    assert parts.tolist() == [87_689, 7_255, 0, 0, 0, (NUM_BLOCKS - 23) * B]
    pol.pool.check_invariants()


def test_nemotron_h_decode_run_holds_one_state_page_each() -> None:
    # a decode run of 10 steps across request 2's boundary at 4,128 tokens: its state page moves in place, so
    # the pool holds 1 + 2 + 2 attention blocks and 3 · 6 state pages after it (the old rule: 6 more, for a step)
    pol = nemotron_policy()
    for rid, n in enumerate((1000, 5000, 4120)):
        assert pol.admit(rid, 0, n)
    for step in range(1, 11):
        assert pol.grow_many(np.array([0, 1, 2]), np.array([1000, 5000, 4120]) + step)
        assert pol.group_blocks()[1:] == [3] * 6, step
    assert pol.pool.num_used == 5 + 18
    assert peak_blocks(pol.groups, 4130, B, "none", 8192) == 2 + 6  # ceil(4,130 / 4,128) + one page a group


def test_nemotron_h_sim_tail_is_attention_slots_only(run_cli) -> None:
    doc = run_cli("sim", "--model", "Nemotron-H-56B", "--gpu", "H200", "--tp", "2", "--requests", "4", "--rate",
                  "inf", "--json")
    assert doc.exit_code == 0, doc.stderr
    d = json.loads(doc.stdout)
    memory = d["memory"]
    # the parts tile the pool over the run; with every state page useful, the tail can be at most B − 1 unused
    # slots of one attention block per running request: tail ≤ mean_running · 4,127 / (902 · 4,128)
    assert sum(memory[k] for k in ("useful", "tail_fragmentation", "reservation_waste", "external_fragmentation",
                                   "cached_free", "free")) == pytest.approx(1.0, abs=1e-9)
    assert memory["tail_fragmentation"] <= d["mean_running"] * (B - 1) / (NUM_BLOCKS * B) * (1 + 1e-9)
    # one state page a running request in every state group, at every step: the groups' time-means are the running
    assert d["group_blocks_mean"][:6] == pytest.approx([d["mean_running"]] * 6, rel=1e-12)
    assert memory["useful"] >= 6 * d["mean_running"] * B / (NUM_BLOCKS * B) * (1 - 1e-9)


def test_state_page_group_rule_none_is_one_page() -> None:
    state = PoolGroup("state")
    # held_blocks(n): ceil(n / B) − first_block(n − 1, n); none: the page of token n − 1 only, also at n mod B = 1
    assert [state.held_blocks(n, 4, "none") for n in (1, 4, 5, 8, 9, 40)] == [1] * 6
    # align (vLLM's MambaManager): the last step, computed n − 1 -> n, frees the pages before (n − 2) // 4 (the one
    # holding the state after token n − 2) and ends in page (n − 1) // 4: n 1 and 4 one page; 5: pages 0, 1; 8: 7 // 4
    # = 6 // 4 = 1, one page; 9: pages 1, 2
    assert [state.held_blocks(n, 4, "align") for n in (1, 4, 5, 8, 9)] == [1, 1, 2, 1, 2]
