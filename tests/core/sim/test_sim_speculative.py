"""Speculative decoding in the simulator: the closed form of tokens per step, the ends of requests, the pool's
reserve / commit under both rollback policies, the peak in reservations, the step-time charges, bad input."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kvcalc.core.errors import ParameterError
from kvcalc.core.sim.metrics import Slo, summarize
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.plan import StepPlan
from kvcalc.core.sim.record import COMPLETED
from kvcalc.core.sim.run import SimSetup, run_policy
from kvcalc.core.sim.scheduler import SchedulerConfig
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.speculative import (
    SimSpeculation,
    SpeculativeStepTimeExecutor,
    accepted_drafts,
    speculation_from_options,
)
from kvcalc.core.sim.steptime import StepTimeExecutor

from .test_sim_engine import constant_steptime, make_workload, opt13b_steptime, random_workload


def spec_setup(blocks: int, speculation: SimSpeculation | None, *, steptime=None, block_size: int = 16,
               **scheduler) -> SimSetup:
    scheduler.setdefault("max_model_len", 4096)
    return SimSetup(blocks, block_size, steptime or constant_steptime(), SchedulerConfig(**scheduler),
                    speculation=speculation)


def closed_form(a: float, k: int) -> float:
    return k + 1.0 if a == 1 else (1 - a ** (k + 1)) / (1 - a)


# ---- the acceptance draws ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("a", [0.0, 0.3, 0.7, 0.9, 1.0])
@pytest.mark.parametrize("k", [1, 4, 7])
def test_accepted_drafts_is_the_truncated_geometric(a, k):
    j = accepted_drafts(np.random.default_rng(1), np.full(200_000, k), a)
    assert j.min() >= 0 and j.max() <= k
    # P(j = i) = A^i (1 − A) for i < K, A^K for i = K: E[j + 1] = Σ_{i<=K} A^i
    assert (j + 1).mean() == pytest.approx(closed_form(a, k), rel=0.01)
    if a in (0.0, 1.0):
        assert np.all(j == (k if a == 1 else 0))


def test_accepted_drafts_respects_each_requests_drafts():
    j = accepted_drafts(np.random.default_rng(0), np.array([0, 2, 5]), 1.0)
    assert j.tolist() == [0, 2, 5]


def test_closed_form_property():
    assert SimSpeculation(4, 0.7).closed_form_tokens_per_step == pytest.approx((1 - 0.7**5) / 0.3)  # 2.7731
    assert SimSpeculation(4, 1.0).closed_form_tokens_per_step == 5
    assert SimSpeculation(4, 0.0).closed_form_tokens_per_step == 1


# ---- whole runs --------------------------------------------------------------------------------------------------
def long_outputs(n: int = 40, output: int = 2000) -> object:
    # long outputs, so that the last step of each request (which emits fewer) moves the mean by < 0.1 %
    return make_workload(np.arange(n) * 0.5, np.full(n, 50), np.full(n, output))


@pytest.mark.parametrize("policy", ["paged", "reserve-oracle"])
@pytest.mark.parametrize("a,k", [(0.6, 3), (0.8, 5)])
def test_run_reproduces_the_closed_form_within_3_percent(policy, a, k):
    spec = SimSpeculation(k, a, seed=3)
    record = run_policy(long_outputs(), policy, spec_setup(20_000, spec))
    totals = record.speculative
    assert totals.mean_tokens_per_step == pytest.approx(closed_form(a, k), rel=0.03)
    assert totals.mean_accepted_per_step == pytest.approx(closed_form(a, k) - 1, rel=0.05)
    assert np.all(record.status == COMPLETED) and np.all(record.generated == 2000)


@pytest.mark.parametrize("rollback", ["keep", "free"])
def test_acceptance_zero_gives_one_token_per_step(rollback):
    # every step verifies K drafts and keeps none: the run is step for step the plain one
    spec = SimSpeculation(4, 0.0, rollback_policy=rollback)
    workload = make_workload([0.0, 0.0, 0.1], [30, 17, 64], [40, 9, 25])
    record = run_policy(workload, "paged", spec_setup(400, spec))
    plain = run_policy(workload, "paged", spec_setup(400, None))
    assert record.speculative.mean_tokens_per_step == 1.0
    assert record.speculative.accepted == 0
    assert record.steps == plain.steps
    np.testing.assert_array_equal(record.generated, [40, 9, 25])
    # each decode step reserves 1 + 4 + 4 = 9 slots and commits 1: 8 rolled back per step
    decode_steps = (40 - 1) + (9 - 1) + (25 - 1)
    assert record.speculative.steps == decode_steps
    assert record.speculative.rolled_back_slots == 8 * decode_steps


@pytest.mark.parametrize("method,lookahead", [("draft", 3), ("ngram", 0)])
def test_acceptance_one_gives_k_plus_one_less_at_the_end(method, lookahead):
    k = 3
    spec = SimSpeculation(k, 1.0, method)
    outputs = [10, 1, 2, 5, 17]
    workload = make_workload(np.arange(5) * 10.0, [20] * 5, outputs)  # one at a time
    record = run_policy(workload, "paged", spec_setup(400, spec))
    np.testing.assert_array_equal(record.generated, outputs)
    # after the prefill's token, each step emits min(K + 1, tokens left): ceil((L − 1) / (K + 1)) steps
    steps = [math.ceil((n - 1) / (k + 1)) for n in outputs]  # 3, 0, 1, 1, 4
    assert record.speculative.steps == sum(steps) == 9
    assert record.speculative.emitted == sum(n - 1 for n in outputs) == 30
    assert record.steps == 5 + 9  # 5 prefills, one request at a time
    # every draft accepted: only the lookahead is rolled back, λ per step
    assert record.speculative.rolled_back_slots == lookahead * 9


@pytest.mark.parametrize("rollback", ["keep", "free"])
@pytest.mark.parametrize("preempt", ["recompute", "swap"])
def test_small_pool_preempts_and_the_pool_ends_whole(rollback, preempt):
    # 40 blocks of 16 for 12 requests of up to 250 + 250 tokens: preemptions; run_policy asserts the pool whole
    spec = SimSpeculation(4, 0.7, rollback_policy=rollback, seed=5)
    workload = random_workload(12, 50.0, seed=2)
    setup = spec_setup(40, spec, max_model_len=512, preempt=preempt)
    record = run_policy(workload, "paged", setup)
    assert record.preemptions.sum() > 0
    assert np.all(record.status == COMPLETED)
    np.testing.assert_array_equal(record.generated, workload.output_tokens)
    summary = summarize(record, Slo(), 1)
    assert summary.memory.speculative > 0
    parts = [getattr(summary.memory, p) for p in ("useful", "tail_fragmentation", "reservation_waste",
                                                  "external_fragmentation", "cached_free", "free")]
    assert sum(parts) + summary.memory.speculative == pytest.approx(1.0)


def test_free_rolls_blocks_back_keep_holds_them():
    workload = random_workload(8, 20.0, seed=4)
    shares = {}
    for rollback in ("keep", "free"):
        record = run_policy(workload, "paged", spec_setup(2000, SimSpeculation(6, 0.5, rollback_policy=rollback)))
        shares[rollback] = summarize(record, Slo(), 1).memory.speculative
    # the same draws, the same steps: keep holds the rolled-back blocks between steps as well, and while a
    # step runs both hold the reservation, so keep's share is at least free's
    assert shares["keep"] >= shares["free"] > 0


@pytest.mark.parametrize("policy", ["reserve-oracle", "reserve-pow2", "reserve-max"])
def test_reservations_hold_the_speculative_peak(policy):
    # reserve-oracle reserving only prompt + output would overflow at the last steps (asserted in grow)
    spec = SimSpeculation(5, 0.9)
    workload = random_workload(10, 5.0, seed=1)
    record = run_policy(workload, policy, spec_setup(200, spec, max_model_len=512))
    assert np.all(record.status == COMPLETED)
    assert summarize(record, Slo(), 1).memory.speculative > 0


def test_tpot_below_the_plain_run_at_low_load():
    workload = random_workload(30, 0.5, seed=7)
    setup = spec_setup(2000, SimSpeculation(4, 0.7), steptime=opt13b_steptime(), max_batched_tokens=2048)
    spec = summarize(run_policy(workload, "paged", setup), Slo(), 1)
    plain = summarize(run_policy(workload, "paged", replace(setup, speculation=None)), Slo(), 1)
    assert spec.tpot_s.mean < 0.6 * plain.tpot_s.mean
    assert spec.generated_tokens == plain.generated_tokens


def test_plain_runs_are_unchanged_by_an_absent_speculation():
    workload = random_workload(30, 3.0, seed=9)
    setup = spec_setup(300, None, steptime=opt13b_steptime())
    a = summarize(run_policy(workload, "paged", setup), Slo(), 1).to_dict()
    assert "speculative" not in a and "speculative" not in a["memory"]


# ---- the step-time charges ----------------------------------------------------------------------------------------
def test_verification_is_charged_as_a_chunk_and_the_drafter_as_k_passes():
    model = opt13b_steptime()
    spec = SimSpeculation(4, 0.5, draft_cost=0.25)
    plan = StepPlan(0, 0.0, np.array([0, 1]), np.array([100, 300]), np.array([5, 5]), np.array([True, True]), 2,
                    num_draft_tokens=np.array([4, 4]))
    outcome = SpeculativeStepTimeExecutor(model, spec).execute(plan)
    target = StepTimeExecutor(model).duration_s(plan)
    # the chunk: 10 tokens, positions 100·5 + 15 + 300·5 + 15 = 2030, KV moved 105 + 305 + 10 = 420
    assert target == pytest.approx(model.step_s(10.0, 2030.0, 420.0))
    plain_decode = model.decode_steps_s(2, 101.0 + 301.0)
    assert outcome.duration_s == pytest.approx(target + 4 * 0.25 * plain_decode)
    assert set(outcome.num_accepted) == {0, 1}
    ngram = SpeculativeStepTimeExecutor(model, SimSpeculation(4, 0.5, "ngram", draft_cost=0.0)).execute(plan)
    assert ngram.duration_s == pytest.approx(target)


# ---- bad input -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,param", [
    ({"spec_tokens": 4, "spec_acceptance": 1.5}, "spec_acceptance"),
    ({"spec_tokens": 4, "spec_acceptance": -0.1}, "spec_acceptance"),
    ({"spec_tokens": 4, "spec_acceptance": float("nan")}, "spec_acceptance"),
    ({"spec_tokens": -1, "spec_acceptance": 0.5}, "spec_tokens"),
    ({"spec_acceptance": 0.5}, "spec_acceptance"),
    ({"spec_tokens": 4}, "spec_acceptance"),
    ({"spec_tokens": 4, "spec_acceptance": 0.5, "spec_method": "medusa"}, "spec_method"),
    ({"spec_tokens": 4, "spec_acceptance": 0.5, "rollback_policy": "drop"}, "rollback_policy"),
    ({"spec_tokens": 4, "spec_acceptance": 0.5, "draft_cost": -1.0}, "draft_cost"),
    ({"spec_tokens": 4, "spec_acceptance": 0.5, "spec_method": "ngram", "draft_cost": 0.2}, "draft_cost"),
    ({"spec_tokens": 600, "spec_acceptance": 0.5, "max_batched_tokens": 1024}, "spec_tokens"),
    ({"spec_tokens": 4, "spec_acceptance": 0.5, "rollback_policy": "free", "policy": "reserve-max"},
     "rollback_policy"),
])
def test_bad_speculation_is_refused_naming_the_parameter(kwargs, param):
    with pytest.raises(ParameterError) as info:
        build(SimOptions(requests=5, **kwargs))
    assert param in info.value.params


def test_speculation_from_options_defaults():
    spec = speculation_from_options(3, 0.5, None, None, None, 7)
    assert (spec.method, spec.draft_cost, spec.rollback_policy, spec.seed, spec.lookahead_slots) == (
        "draft", 0.1, "keep", 7, 3)
    assert speculation_from_options(3, 0.5, "ngram", None, None, 0).draft_cost == 0.0
    assert speculation_from_options(None, None, None, None, None, 0) is None


def test_zero_drafts_through_the_speculative_path_is_the_plain_run():
    # K = 0: every decode step reserves and commits one slot; same steps, same times as plain decoding
    workload = random_workload(25, 4.0, seed=11)
    setup = spec_setup(300, SimSpeculation(0, 0.5), steptime=opt13b_steptime(), max_model_len=512)
    spec = run_policy(workload, "paged", setup)
    plain = run_policy(workload, "paged", replace(setup, speculation=None))
    assert spec.steps == plain.steps and spec.speculative.mean_tokens_per_step == 1.0
    np.testing.assert_allclose(spec.first_token_s, plain.first_token_s, rtol=1e-12)
    np.testing.assert_allclose(spec.finish_s, plain.finish_s, rtol=1e-12)
    np.testing.assert_array_equal(spec.preemptions, plain.preemptions)
