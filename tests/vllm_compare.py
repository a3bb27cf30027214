"""Drive kvcalc's sim and the vLLM model (tests/vllm_model.py) on one explicit request list, step by step.

Both run the same requests (Mooncake-style hash ids, one per 512 prompt tokens, prefix-chained) on the same pool:
`capacity_blocks` free block ids for kvcalc = the model's ids less vLLM's null block. Every step takes 1 s (a
constant executor on kvcalc's side), so arrivals meet the same steps on both sides. Each step is read after its
scheduling (what the executor sees): the scheduled (request, computed tokens, new tokens), the preempted requests,
and the distinct blocks each group's tables hold.
"""

from __future__ import annotations

import numpy as np
from vllm_model import Req, VllmEngine
from vllm_pool import Group

from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.sim.engine import Engine
from kvcalc.core.sim.plan import StepOutcome
from kvcalc.core.sim.run import make_policy, run_policy
from kvcalc.core.sim.scheduler import SchedulerConfig
from kvcalc.core.sim.settings import SimSetup
from kvcalc.core.sim.steptime import StepTimeModel
from kvcalc.core.sim.workload import Workload

# every step 1 s whatever it computes: the step-time model's roofline at zero, its fixed overhead 1 s
ONE_SECOND = StepTimeModel(flops_per_token=0.0, attn_flops_per_position=0.0, kv_bytes_per_token=0,
                           compute_s_per_flop=0.0, weights_s=0.0, kv_s_per_byte=0.0, overhead_s=1.0,
                           swap_bandwidth_bytes_per_s=1e12)


class Recorder:
    """A constant-time executor that records each plan and the pool's per-group blocks when it runs."""

    def __init__(self, policy) -> None:
        self.policy, self.steps = policy, []

    def execute(self, plan) -> StepOutcome:
        ids, start, new = (a.tolist() for a in (plan.request_ids, plan.num_computed_tokens, plan.num_new_tokens))
        self.steps.append(dict(t=plan.start_s, scheduled=list(zip(ids, start, new, strict=True)),
                               preempted=[p.request_id for p in plan.events.preempted], groups=self.group_blocks()))
        return StepOutcome(1.0)

    def group_blocks(self) -> list[int]:
        """Blocks each group holds, read without settling anything: `sync` would tell the pool what the policy
        owes it, which `kvcalc sim` does not do between steps (and that changed what a release registers)."""
        blocks = getattr(self.policy, "group_blocks", None)
        if blocks is not None:
            return list(blocks())
        return [self.policy.pool.num_used + self.policy.owed_blocks]  # PagedPolicy: the blocks taken or owed


def workload(reqs: list[Req]) -> Workload:
    ids = [list(r.ids) for r in reqs]
    return Workload(arrival_s=np.array([r.arrival for r in reqs], dtype=np.float64),
                    prompt_tokens=np.array([r.prompt for r in reqs], dtype=np.int64),
                    output_tokens=np.array([r.output for r in reqs], dtype=np.int64), kind="constructed",
                    description="vLLM model comparison", hash_ids=np.array([i for r in ids for i in r], dtype=np.int64),
                    hash_offsets=np.cumsum([0] + [len(i) for i in ids]).astype(np.int64))


def run_kvcalc(reqs: list[Req], kinds: list[tuple[str, int]], num_blocks: int, block: int, *, budget: int,
               max_seqs: int, max_model_len: int, caching: bool, state_mode: str = "none"):
    """kvcalc's sim on `num_blocks` ids (less the null block), groups `kinds` in that order, a state group under
    mamba_cache_mode `state_mode` (none or align); (steps, record)."""
    groups = tuple(PoolGroup(k, w or None) for k, w in kinds)
    config = SchedulerConfig(max_batched_tokens=budget, max_seqs=max_seqs, max_model_len=max_model_len,
                             fast_forward=False)
    plain = kinds == [("full", 0)]
    # no step-time model: the Recorder times the steps
    setup = SimSetup(num_blocks - 1, block, None, config, prefix_caching=caching,
                     groups=None if plain else groups, state_mode=state_mode, null_blocks=1)
    w = workload(reqs)
    policy = make_policy("paged", w, setup)
    recorder = Recorder(policy)
    record = Engine(w, policy, recorder, config).run(None, None)
    return recorder.steps, record


def run_kvcalc_fast(reqs: list[Req], kinds: list[tuple[str, int]], num_blocks: int, block: int, *, budget: int,
                    max_seqs: int, max_model_len: int, caching: bool, state_mode: str = "none"):
    """kvcalc's sim as `kvcalc sim` runs it (run_policy: the step-time executor, fast-forward and the lean loop where
    they apply) with every step 1 s (ONE_SECOND); the run's record."""
    config = SchedulerConfig(max_batched_tokens=budget, max_seqs=max_seqs, max_model_len=max_model_len)
    plain = kinds == [("full", 0)]
    setup = SimSetup(num_blocks - 1, block, ONE_SECOND, config, prefix_caching=caching, null_blocks=1,
                     groups=None if plain else tuple(PoolGroup(k, w or None) for k, w in kinds), state_mode=state_mode)
    return run_policy(workload(reqs), "paged", setup)


def run_model(reqs: list[Req], kinds: list[tuple[str, int]], num_blocks: int, block: int, **kw) -> VllmEngine:
    fresh = [Req(r.rid, r.arrival, r.prompt, r.output, r.ids) for r in reqs]
    return VllmEngine(fresh, [Group(k, w) for k, w in kinds], num_blocks, block, **kw).run()


def compare(reqs, kinds, num_blocks, block, *, hash_outputs=True, one_block_per_hash=False, **kw) -> None:
    steps, record = run_kvcalc(reqs, kinds, num_blocks, block, **kw)
    model = run_model(reqs, kinds, num_blocks, block, hash_outputs=hash_outputs, one_block_per_hash=one_block_per_hash,
                      **kw)
    for k, (ours, theirs) in enumerate(zip(steps, model.steps, strict=False)):
        for key in ("t", "scheduled", "preempted", "groups"):
            assert ours[key] == theirs[key], f"step {k} {key}: kvcalc {ours[key]} vLLM {theirs[key]}"
    assert len(steps) == len(model.steps), f"kvcalc {len(steps)} steps, vLLM {len(model.steps)}"
    finish = sorted(range(len(reqs)), key=lambda i: (record.finish_s[i], model.finished.index(i)))
    assert finish == model.finished, f"finish order: kvcalc {finish} vLLM {model.finished}"
    theirs = [r.preemptions for r in model.reqs]
    assert record.preemptions.tolist() == theirs, f"preemptions: kvcalc {record.preemptions.tolist()} vLLM {theirs}"
