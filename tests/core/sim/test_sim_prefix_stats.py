"""sim's prefix-cache counts (core/sim/prefix_stats.py): hand-worked Mooncake traces on a Llama-class model, a
sliding-window model, a chunked one and a Mamba hybrid (each group's own hit by hand), preemption by recompute
with and without a hit at readmission, swap, and the recomputed tokens against an independent count over the
step plans of random runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lru_reference import HAND

from kvcalc.core.sim.engine import Engine
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.run import make_policy, run_policy
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.steptime import StepTimeExecutor

from .test_sim_engine import constant_steptime, make_setup, make_workload


def write_trace(tmp_path, rows, name="trace.jsonl"):
    """rows: (timestamp ms, prompt tokens, output tokens, hash ids)."""
    path = tmp_path / name
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": p, "output_length": o, "hash_ids": ids})
                            + "\n" for t, p, o, ids in rows))
    return path


def hand_trace(tmp_path):
    # lru_reference.HAND, one request a second, one output token each (every request has left before the next)
    return write_trace(tmp_path, [(1000 * i, p, 1, ids) for i, (p, ids) in enumerate(HAND)])


# HAND at block 16 (32 blocks per 512-token id; a pool far larger than the trace): r0 (1,536 tokens, ids 1 2 3)
# misses; r1 (1,537, ids 1 2 3 4) hits all of r0's 1,536 (at most (1,537 − 1) // 16 = 96 blocks, all cached);
# r2 (ids 5 6) misses; r3 (2,048, ids 1 2 7 8) hits ids 1 2: 1,024. Hits 1,536 + 1,024 = 2,560 of
# 1,536 + 1,537 + 1,024 + 2,048 = 6,145 tokens looked up. A sliding or chunked group needs only the blocks of the
# window (chunk) before the hit, all cached here: every group's own hit is the same 2,560.
HAND_LOOKED_UP, HAND_HITS = 6145, 2560


@pytest.mark.parametrize(("model", "extra", "groups"), [
    ("llama-3.1-8b", {}, None),
    ("gemma-3-27b", {}, 2),  # full (one block table) and sliding 1,024 (six)
    ("gpt-oss-120b", {}, 2),  # full and sliding 128
    ("llama-4-scout", {"tp": 2}, 2),  # chunked 8,192 (three tables) and full
])
def test_hand_trace_hits_in_every_group(tmp_path, model, extra, groups):
    setup = build(SimOptions(model=model, gpu="H200", trace=("mooncake", str(hand_trace(tmp_path))), block_size=16,
                             max_model_len=16384, **extra))
    for fast_forward in (True, False):
        sim = replace(setup.sim, scheduler=replace(setup.sim.scheduler, fast_forward=fast_forward))
        p = run_policy(setup.workload, "paged", sim).prefix
        assert (p.enabled, p.admissions, p.prompt_tokens, p.hit_tokens) == (True, 4, HAND_LOOKED_UP, HAND_HITS)
        assert p.hit_rate == pytest.approx(2560 / 6145)
        assert (p.readmissions, p.dropped_tokens, p.recomputed_tokens) == (0, 0, 0)
        assert p.group_hit_tokens == (None if groups is None else [HAND_HITS] * groups)


def three_requests(tmp_path):
    # r0: 13,000 tokens (ids 1..26); r1: 9,000 tokens sharing its first 18 ids; r2: r0's prompt again
    return write_trace(tmp_path, [(0, 13000, 4, list(range(1, 27))), (1_000_000, 9000, 4, list(range(1, 19))),
                                  (2_000_000, 13000, 4, list(range(1, 27)))])


@pytest.mark.parametrize(("budget", "hits", "full", "state"), [
    # Nemotron-H-56B: block 4,128, keyed by the id of its last token (ids[(4,128 (j + 1) − 1) // 512]: 9, 17, 25).
    # Budget 16,384: r0's prefill is one chunk cut at its last block boundary 12,384 (then 616 tokens): its state
    # is saved at 12,384 only. r1 (9,000 tokens: at most 2 blocks) finds full blocks 0, 1 (8,256 tokens) but no
    # state saved at 8,256: hit 0. r2 finds 3 full blocks and the state at 12,384: 12,384.
    #   hits 12,384; the full group alone 8,256 + 12,384 = 20,640; the state groups alone 0 + 12,384 = 12,384.
    (16384, 12384, 20640, 12384),
    # Budget 8,192: r0's chunks end at 4,128, 8,256, 12,384 (each cut to whole blocks), states saved at each: r1
    # hits 8,256, r2 12,384: 20,640 in every group
    (8192, 20640, 20640, 20640),
])
def test_mamba_hybrid_state_group_limits_the_hit(tmp_path, budget, hits, full, state):
    setup = build(SimOptions(model="nemotron-h-56b", gpu="H200", trace=("mooncake", str(three_requests(tmp_path))),
                             mamba_cache_mode="align", max_batched_tokens=budget, max_model_len=16384))
    assert setup.plan.block_size == 4128 and [g.kind for g in setup.sim.groups] == ["full"] + ["state"] * 6
    p = run_policy(setup.workload, "paged", setup.sim).prefix
    assert (p.prompt_tokens, p.hit_tokens) == (13000 + 9000 + 13000, hits)
    assert p.group_hit_tokens == [full, state]  # the full group (one table), the state group (six tables)


def test_mamba_hybrid_mode_none_caches_nothing(tmp_path):
    setup = build(SimOptions(model="nemotron-h-56b", gpu="H200", trace=("mooncake", str(three_requests(tmp_path))),
                             mamba_cache_mode="none", max_model_len=16384))
    p = run_policy(setup.workload, "paged", setup.sim).prefix
    assert (p.prompt_tokens, p.hit_tokens, p.group_hit_tokens) == (35000, 0, [0, 0])


@pytest.mark.parametrize("fast_forward", [True, False])
def test_recompute_with_a_hit_at_readmission(tmp_path, fast_forward):
    # Llama-3.1-8B, block 512 (one id per block), a pool of 4 blocks. A (ids 1 2) and B (ids 3 4), 1,024 tokens
    # and 300 output tokens each, both at 0: the prefill fills the pool (2 blocks each) and samples a token each.
    # Token 1,025 needs a third block: B, admitted last, is preempted holding 1,024 tokens (dropped 1,024); its
    # blocks are cached, freed tail first, so A's third block evicts id 4's; A needs no fourth (1,024 + 299 =
    # 1,323 tokens). B comes back with 1,024 + 1 tokens to look up and finds id 3: hit 512; it computes
    # [512, 1,025), of which [512, 1,024) again: recomputed 512.
    #   admissions A 1,024 (hit 0), B 1,024 (0), B 1,025 (512): 3,073 looked up, 512 hits
    path = write_trace(tmp_path, [(0, 1024, 300, [1, 2]), (0, 1024, 300, [3, 4])])
    setup = build(SimOptions(model="llama-3.1-8b", gpu="H200", trace=("mooncake", str(path)), block_size=512,
                             layout="ideal",  # kvcalc's own pool: a block vLLM does not take
                             fast_forward=fast_forward))
    record = run_policy(setup.workload, "paged", replace(setup.sim, capacity_blocks=4))
    p = record.prefix
    assert record.preemptions.tolist() == [0, 1]
    assert (p.admissions, p.prompt_tokens, p.hit_tokens) == (3, 3073, 512)
    assert (p.readmissions, p.readmitted_prompt_tokens, p.readmitted_hit_tokens) == (1, 1025, 512)
    assert (p.dropped_tokens, p.recomputed_tokens) == (1024, 512)
    # swap keeps B's KV on the host: a swap-in is no look-up, nothing is dropped or recomputed
    swap = replace(setup.sim, capacity_blocks=4, scheduler=replace(setup.sim.scheduler, preempt="swap"))
    p = run_policy(setup.workload, "paged", swap).prefix
    assert (p.admissions, p.prompt_tokens, p.hit_tokens, p.readmissions, p.dropped_tokens, p.recomputed_tokens) == (
        2, 2048, 0, 0, 0, 0)


def test_recompute_without_prefix_caching_by_hand():
    # a pool of 4 blocks of 4 tokens, two 6-token prompts, 8 output tokens each, at 0. Step 0 prefills both (2
    # blocks each); decode steps reach 8 tokens each; the 9th needs a third block each: B (admitted last) is
    # preempted holding 8 tokens. A finishes; B comes back with 6 + 3 = 9 tokens to compute, 8 of them again.
    w = make_workload([0.0, 0.0], [6, 6], [8, 8])
    for fast_forward in (True, False):
        record = run_policy(w, "paged", make_setup(4, 4, constant_steptime(0.01), fast_forward=fast_forward))
        p = record.prefix
        assert (p.enabled, p.admissions, p.prompt_tokens, p.hit_tokens) == (False, 3, 6 + 6 + 9, 0)
        assert (p.readmissions, p.readmitted_prompt_tokens, p.dropped_tokens, p.recomputed_tokens) == (1, 9, 8, 8)


class PlanCount(StepTimeExecutor):
    """Counts, from the plans alone, the tokens each request computes again: those below the most it has held
    before (a preemption by recompute drops them; a plan's computed tokens start past any hit)."""

    def __init__(self, steptime, n: int) -> None:
        super().__init__(steptime)
        self.held = np.zeros(n, np.int64)
        self.recomputed = 0

    def execute(self, plan):
        for rid, start, new in zip(plan.request_ids.tolist(), plan.num_computed_tokens.tolist(),
                                   plan.num_new_tokens.tolist(), strict=True):
            self.recomputed += max(0, min(start + new, int(self.held[rid])) - start)
            self.held[rid] = max(int(self.held[rid]), start + new)
        return super().execute(plan)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(6, 30), block_size=st.sampled_from([2, 4, 16]))
def test_recomputed_tokens_match_the_plans(seed, blocks, block_size):
    # a preemption storm (everything at 0 in a small pool): the scheduler's count equals the plans' count, and
    # dropped ≥ recomputed (a readmission recomputes at most what was dropped)
    rng = np.random.default_rng(seed)
    n = 12
    prompts = rng.integers(1, 3 * block_size + 2, n)
    outputs = rng.integers(1, 4 * block_size, n)
    w = make_workload(np.zeros(n), prompts, outputs)
    setup = make_setup(blocks, block_size, constant_steptime(0.01), max_model_len=10_000)
    if any(-(-int(p + o - 1) // block_size) > blocks for p, o in zip(prompts, outputs, strict=True)):
        return  # a request larger than the pool is rejected: not this test's subject
    executor = PlanCount(setup.steptime, n)
    record = Engine(w, make_policy("paged", w, setup), executor, setup.scheduler).run()
    p = record.prefix
    assert p.recomputed_tokens == executor.recomputed
    assert p.recomputed_tokens <= p.dropped_tokens
    assert p.readmissions == p.admissions - n == int(record.preemptions.sum())


TRACE = Path(__file__).resolve().parents[4] / "shared" / "traces" / "mooncake_conversation.jsonl"


@pytest.mark.skipif(not TRACE.exists(), reason="../shared/traces/mooncake_conversation.jsonl is absent")
def test_sliding_window_limits_the_hit_under_pressure():
    # gpt-oss-120b (full and sliding-128 tables), 30 requests of the real conversation trace in a pool of 3,000
    # blocks: the sliding group frees blocks that leave its window while a request runs, so they are evicted
    # before the full group's: some prompts find their full-attention prefix but not the window before its end.
    # The hit is what both serve: at most each group's own, and here below the full group's.
    setup = build(SimOptions(model="gpt-oss-120b", gpu="H200", trace=("mooncake", str(TRACE)), limit=30,
                             block_size=16, max_model_len=131072))
    p = run_policy(setup.workload, "paged", replace(setup.sim, capacity_blocks=3000)).prefix
    full, sliding = p.group_hit_tokens
    assert p.hit_tokens <= sliding < full and p.hit_tokens <= full
    assert p.readmissions > 0 and p.readmitted_hit_tokens > 0  # readmissions find their own cached blocks
