"""kvcalc's sim step by step against an independent model of vLLM v1's scheduler + KV cache manager
(tests/vllm_model.py, written from vLLM's source, not from kvcalc's).

Both run the same explicit request list (Mooncake-style hash ids, one per 512 prompt tokens, prefix-chained) on the
same pool: `capacity_blocks` free block ids for kvcalc = the model's ids less vLLM's null block. Every step takes 1 s
(a constant executor on kvcalc's side), so arrivals meet the same steps on both sides. Compared after every step's
scheduling (what the executor sees): which requests run, from which computed token, how many new tokens (prefix-cache
hits are the admitted requests' computed tokens), who was preempted, and the distinct blocks each group's tables hold;
at the end the finish order and each request's preemptions.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm_model import Group, Req, VllmEngine

from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.sim.engine import Engine
from kvcalc.core.sim.plan import StepOutcome
from kvcalc.core.sim.run import make_policy
from kvcalc.core.sim.scheduler import SchedulerConfig
from kvcalc.core.sim.settings import SimSetup
from kvcalc.core.sim.workload import Workload


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
        blocks = getattr(self.policy, "group_blocks", None)
        if blocks is not None:
            return list(blocks())
        self.policy.sync()
        return [self.policy.pool.num_used]


def workload(reqs: list[Req]) -> Workload:
    ids = [list(r.ids) for r in reqs]
    return Workload(arrival_s=np.array([r.arrival for r in reqs], dtype=np.float64),
                    prompt_tokens=np.array([r.prompt for r in reqs], dtype=np.int64),
                    output_tokens=np.array([r.output for r in reqs], dtype=np.int64), kind="constructed",
                    description="vLLM model comparison", hash_ids=np.array([i for r in ids for i in r], dtype=np.int64),
                    hash_offsets=np.cumsum([0] + [len(i) for i in ids]).astype(np.int64))


def run_kvcalc(reqs: list[Req], kinds: list[tuple[str, int]], num_blocks: int, block: int, *, budget: int,
               max_seqs: int, max_model_len: int, caching: bool):
    """kvcalc's sim on `num_blocks` ids (less the null block), groups `kinds` in that order; (steps, record)."""
    groups = tuple(PoolGroup(k, w or None) for k, w in kinds)
    config = SchedulerConfig(max_batched_tokens=budget, max_seqs=max_seqs, max_model_len=max_model_len,
                             fast_forward=False)
    plain = kinds == [("full", 0)]
    # no step-time model: the Recorder times the steps
    setup = SimSetup(num_blocks - 1, block, None, config, prefix_caching=caching,
                     groups=None if plain else groups, state_mode="none", null_blocks=1)
    w = workload(reqs)
    policy = make_policy("paged", w, setup)
    recorder = Recorder(policy)
    record = Engine(w, policy, recorder, config).run(None, None)
    return recorder.steps, record


def run_model(reqs: list[Req], kinds: list[tuple[str, int]], num_blocks: int, block: int, **kw) -> VllmEngine:
    fresh = [Req(r.rid, r.arrival, r.prompt, r.output, r.ids) for r in reqs]
    return VllmEngine(fresh, [Group(k, w) for k, w in kinds], num_blocks, block, **kw).run()


def compare(reqs, kinds, num_blocks, block, *, hash_outputs=False, **kw) -> None:
    steps, record = run_kvcalc(reqs, kinds, num_blocks, block, **kw)
    model = run_model(reqs, kinds, num_blocks, block, hash_outputs=hash_outputs, **kw)
    for k, (ours, theirs) in enumerate(zip(steps, model.steps, strict=False)):
        for key in ("t", "scheduled", "preempted", "groups"):
            assert ours[key] == theirs[key], f"step {k} {key}: kvcalc {ours[key]} vLLM {theirs[key]}"
    assert len(steps) == len(model.steps)
    finish = sorted(range(len(reqs)), key=lambda i: (record.finish_s[i], model.finished.index(i)))
    assert finish == model.finished
    assert record.preemptions.tolist() == [r.preemptions for r in model.reqs]


# ---- workloads --------------------------------------------------------------------------------------------------
B = 128  # tiles Mooncake's 512-token ids: each id is 4 blocks


@st.composite
def requests(draw, max_total: int = 2048) -> list[Req]:
    """2-7 requests; prompts share a leading run of ids from one chain (1, 2, 3, ...) then ids of their own."""
    n = draw(st.integers(2, 7))
    reqs, t = [], 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0]))
        prompt = draw(st.integers(1, max_total - 64))
        output = draw(st.integers(1, min(64, max_total - prompt)))
        num_ids = -(-prompt // 512)
        shared = draw(st.integers(0, num_ids))
        ids = tuple(range(1, shared + 1)) + tuple(1000 * (i + 1) + k for k in range(num_ids - shared))
        reqs.append(Req(i, t, prompt, output, ids))
    return reqs


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_LEN = 2048


def _pool(draw, per_request: int) -> int:
    # at least one max-length request's blocks (so none is refused), at most a few: preemption is common
    return draw(st.integers(per_request + 1, 4 * per_request + 1))


@SETTINGS
@given(reqs=requests(), data=st.data(), caching=st.booleans())
def test_full_attention_model(reqs, data, caching):
    budget = data.draw(st.sampled_from([128, 256, 512, 2048]))
    num_blocks = _pool(data.draw, MAX_LEN // B)
    compare(reqs, [("full", 0)], num_blocks, B, budget=budget, max_seqs=data.draw(st.integers(1, 8)),
            max_model_len=MAX_LEN, caching=caching)


@SETTINGS
@given(reqs=requests(), data=st.data(), caching=st.booleans())
def test_sliding_hybrid_model(reqs, data, caching):
    # Gemma-3-like: full and sliding tables, windows below, at and above a block
    window = data.draw(st.sampled_from([100, 128, 129, 300, 512, 1000]))
    kinds = data.draw(st.sampled_from([[("full", 0), ("sliding", window)],
                                       [("sliding", window), ("sliding", window), ("full", 0)]]))
    budget = data.draw(st.sampled_from([128, 256, 512, 2048]))
    num_blocks = _pool(data.draw, len(kinds) * MAX_LEN // B)
    compare(reqs, kinds, num_blocks, B, budget=budget, max_seqs=data.draw(st.integers(1, 8)),
            max_model_len=MAX_LEN, caching=caching)


@SETTINGS
@given(reqs=requests(), data=st.data(), caching=st.booleans())
def test_chunked_hybrid_model(reqs, data, caching):
    # Llama-4-Scout-like: full and chunked-local tables, chunks of whole blocks
    chunk = data.draw(st.sampled_from([256, 512, 1024]))
    kinds = [("full", 0)] + [("chunked", chunk)] * data.draw(st.integers(1, 3))
    budget = data.draw(st.sampled_from([128, 256, 512, 2048]))
    num_blocks = _pool(data.draw, len(kinds) * MAX_LEN // B)
    compare(reqs, kinds, num_blocks, B, budget=budget, max_seqs=data.draw(st.integers(1, 8)),
            max_model_len=MAX_LEN, caching=caching)


@SETTINGS
@given(reqs=requests(), data=st.data())
def test_state_hybrid_model(reqs, data):
    # a Mamba hybrid under mamba_cache_mode none (no prefix caching): one state page a request for its life
    kinds = [("full", 0)] + [("state", 0)] * data.draw(st.integers(1, 3))
    budget = data.draw(st.sampled_from([128, 256, 512, 2048]))
    num_blocks = _pool(data.draw, MAX_LEN // B + len(kinds))
    compare(reqs, kinds, num_blocks, B, budget=budget, max_seqs=data.draw(st.integers(1, 8)),
            max_model_len=MAX_LEN, caching=False)
