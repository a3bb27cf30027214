"""The scheduler and the memory policies: hand-computed runs, fast-forward = step by step, invariants."""

from __future__ import annotations

import numpy as np
import pytest

from kvcalc.core.model.models import get_preset
from kvcalc.core.sim.hardware import get_gpu, plan_memory
from kvcalc.core.sim.metrics import latencies
from kvcalc.core.sim.paged import PagedPolicy
from kvcalc.core.sim.record import CANCELLED, COMPLETED, TIMED_OUT
from kvcalc.core.sim.run import SimSetup, run_policy, unlimited
from kvcalc.core.sim.scheduler import SchedulerConfig
from kvcalc.core.sim.steptime import Efficiencies, StepTimeModel, build_model
from kvcalc.core.sim.workload import Workload, cancellation_points, constructed, length_streams

POLICIES = ("paged", "reserve-max", "reserve-pow2", "reserve-oracle")


def constant_steptime(step_s: float = 0.01, kv_bytes_per_token: int = 1) -> StepTimeModel:
    """Every step takes exactly `step_s` (no FLOPs, no bytes moved): latencies by hand."""
    return StepTimeModel(0.0, 0.0, kv_bytes_per_token, 0.0, 0.0, 0.0, step_s, 1e9)


def make_workload(arrival, prompt, output) -> Workload:
    return Workload(np.asarray(arrival, float), np.asarray(prompt, np.int64), np.asarray(output, np.int64),
                    "constructed", "test workload")


def make_setup(blocks: int, block_size: int = 16, steptime: StepTimeModel | None = None, *, cancel_fraction=0.0,
               seed=0, **scheduler) -> SimSetup:
    scheduler.setdefault("max_model_len", 512)
    return SimSetup(blocks, block_size, steptime or constant_steptime(), SchedulerConfig(**scheduler),
                    cancel_fraction, seed)


def opt13b_steptime() -> StepTimeModel:
    spec = get_preset("OPT-13B")
    plan = plan_memory(spec, get_gpu("A100-40GB"), kv_dtype_bits=16, block_size=16, max_batched_tokens=2048)
    return build_model(spec, plan, Efficiencies())


def random_workload(n: int, rate: float, seed: int, mean_prompt: int = 120, mean_output: int = 60) -> Workload:
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.geometric(1 / mean_prompt, n), 1, 250)
    output = np.clip(rng.geometric(1 / mean_output, n), 1, 250)
    return constructed(n, rate, prompt, output, seed=seed)


# ---- a run by hand --------------------------------------------------------------------------------------
def test_tiny_scenario_by_hand():
    # Every step takes 10 ms. A: arrives 0, prompt 3, output 3. B: arrives 15 ms, prompt 2, output 2.
    #   step 1  0-10 ms   A prefill (3 tokens)  -> A token 1 at 10
    #   step 2 10-20 ms   A decode              -> A token 2 at 20   (B has not arrived at 10)
    #   step 3 20-30 ms   A decode, B prefill   -> A token 3 at 30 (done), B token 1 at 30
    #   step 4 30-40 ms   B decode              -> B token 2 at 40 (done)
    # TTFT: A 10, B 30 - 15 = 15. E2E: A 30, B 40 - 15 = 25. TPOT: A (30 - 10) / 2 = 10, B (25 - 15) / 1 = 10.
    w = make_workload([0.0, 0.015], [3, 2], [3, 2])
    for fast_forward in (True, False):
        record = run_policy(w, "paged", make_setup(8, 4, fast_forward=fast_forward))
        lat = latencies(record)
        assert lat.ttft_s == pytest.approx([0.010, 0.015])
        assert lat.e2e_s == pytest.approx([0.030, 0.025])
        assert lat.tpot_s == pytest.approx([0.010, 0.010])
        assert record.steps == 4
        # ITL: A's tokens 2, 3 and B's token 2, each 10 ms after the previous one
        assert np.repeat(record.itl_values_s, record.itl_weights) == pytest.approx([0.01, 0.01, 0.01])


def test_tiny_scenario_memory_by_hand():
    # Same run, B = 4, 8 blocks (32 slots). Held tokens during each step (KV of the step's tokens included):
    #   step 1: A 3        -> 1 block,  useful 3, tail 1
    #   step 2: A 4        -> 1 block,  useful 4, tail 0
    #   step 3: A 5, B 2   -> 2 + 1 blocks, useful 7, tail 5
    #   step 4: B 3        -> 1 block,  useful 3, tail 1       (A left at the end of step 3)
    # Σ over 10 ms steps: useful (3+4+7+3)·0.01 = 0.17 slot·s, tail (1+0+5+1)·0.01 = 0.07 slot·s
    w = make_workload([0.0, 0.015], [3, 2], [3, 2])
    record = run_policy(w, "paged", make_setup(8, 4))
    assert record.memory_slot_s[0] == pytest.approx(0.17)
    assert record.memory_slot_s[1] == pytest.approx(0.07)
    assert record.memory_slot_s.sum() == pytest.approx(32 * 0.04)  # the parts tile the pool at every moment


def test_reserve_max_memory_by_hand():
    # reserve-max with max_model_len 10, one request prompt 3 output 2: steps 1 (3 held) and 2 (4 held);
    # reservation waste (10 - 3) + (10 - 4) = 13 slot-steps; pool 20 slots
    w = make_workload([0.0], [3], [2])
    record = run_policy(w, "reserve-max", make_setup(5, 4, max_model_len=10))
    assert record.memory_slot_s[0] == pytest.approx((3 + 4) * 0.01)
    assert record.memory_slot_s[2] == pytest.approx(13 * 0.01)


def test_chunked_prefill_by_hand():
    # Budget 4 tokens per step, prompt 10, output 2: chunks 4, 4, 2 (token 1 at 30 ms), then a decode.
    w = make_workload([0.0], [10], [2])
    record = run_policy(w, "paged", make_setup(8, 4, max_batched_tokens=4))
    lat = latencies(record)
    assert lat.ttft_s == pytest.approx([0.03])
    assert lat.e2e_s == pytest.approx([0.04])


# ---- fast-forward is an optimisation, not a change ---------------------------------------------------------
def assert_same_run(a, b):
    for field in ("first_token_s", "finish_s"):
        assert np.array_equal(getattr(a, field), getattr(b, field), equal_nan=True), field
    for field in ("generated", "status", "preemptions"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert a.steps == b.steps and a.peak_running == b.peak_running
    assert np.array_equal(np.sort(np.repeat(a.itl_values_s, a.itl_weights)),
                          np.sort(np.repeat(b.itl_values_s, b.itl_weights)))
    np.testing.assert_allclose(a.memory_slot_s, b.memory_slot_s, rtol=1e-9, atol=1e-9)
    assert a.in_system_s == pytest.approx(b.in_system_s, rel=1e-9)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("blocks", "preempt", "cancel", "timeout"), [
    (2000, "recompute", 0.0, None),  # plenty of memory
    (60, "recompute", 0.2, None),  # tight: preemption by recompute, cancellations
    (60, "swap", 0.0, 3.0),  # tight: swap, timeouts
])
def test_fast_forward_equals_step_by_step(policy, blocks, preempt, cancel, timeout):
    w = random_workload(60, 4.0, seed=3)
    runs = [run_policy(w, policy, make_setup(blocks, 16, opt13b_steptime(), cancel_fraction=cancel, seed=5,
                                             preempt=preempt, timeout_s=timeout, fast_forward=ff))
            for ff in (True, False)]
    assert runs[0].segments > 0 and runs[1].segments == 0
    assert_same_run(*runs)


# ---- invariants ---------------------------------------------------------------------------------------------
def test_unlimited_memory_every_policy_gives_identical_latencies():
    w = random_workload(120, 6.0, seed=7)
    base = make_setup(10, 16, opt13b_steptime(), max_seqs=1000)
    runs = [run_policy(w, p, unlimited(base, w)) for p in POLICIES]
    for other in runs[1:]:
        assert np.array_equal(runs[0].first_token_s, other.first_token_s)
        assert np.array_equal(runs[0].finish_s, other.finish_s)


@pytest.mark.parametrize("policy", POLICIES)
def test_conservation_of_tokens(policy):
    # generated = Σ output of completed + Σ cancellation points of cancelled; timed out / rejected add 0
    w = random_workload(80, 8.0, seed=11)
    s = make_setup(80, 16, opt13b_steptime(), cancel_fraction=0.3, seed=2, timeout_s=4.0)
    record = run_policy(w, policy, s)
    cancel_at = cancellation_points(w.output_tokens, 0.3, length_streams(2)[2])  # drawn independently
    completed, cancelled = record.status == COMPLETED, record.status == CANCELLED
    assert np.array_equal(record.generated[cancelled], cancel_at[cancelled])
    assert record.generated.sum() == w.output_tokens[completed].sum() + cancel_at[cancelled].sum()
    # every token after a request's first is one ITL sample
    assert record.itl_weights.sum() == np.maximum(record.generated - 1, 0).sum()
    assert cancelled.sum() > 0


def test_littles_law_on_a_long_stationary_run():
    # L = λ·W: time-averaged requests in the system (integrated by the engine, step by step) against the
    # arrival rate times the mean time in system (from per-request records). The engine notices an arrival
    # at the next step boundary, so L is low by at most one step per request: tolerance 2 %.
    w = random_workload(3000, 5.0, seed=13, mean_prompt=200, mean_output=100)
    record = run_policy(w, "paged", make_setup(900, 16, opt13b_steptime()))
    duration = record.end_s
    little_l = record.in_system_s / duration
    lam = len(w) / duration
    mean_w = float(np.mean(record.finish_s - record.arrival_s))
    assert little_l == pytest.approx(lam * mean_w, rel=0.02)
    assert little_l > 1  # a loaded system, not an idle one


def test_paged_admits_at_least_as_many_concurrent_requests():
    w = random_workload(200, float("inf"), seed=17, mean_prompt=150, mean_output=300)
    s = make_setup(400, 16, opt13b_steptime(), max_seqs=1000, max_model_len=1024)
    runs = {p: run_policy(w, p, s) for p in POLICIES}
    for p in POLICIES[1:]:
        assert runs["paged"].peak_running >= runs[p].peak_running, p
        assert runs["paged"].running_s / runs["paged"].end_s >= runs[p].running_s / runs[p].end_s, p


@pytest.mark.parametrize("preempt", ["recompute", "swap"])
def test_preemption_finishes_every_request(preempt):
    w = random_workload(100, float("inf"), seed=19, mean_prompt=100, mean_output=200)
    record = run_policy(w, "paged", make_setup(120, 16, opt13b_steptime(), preempt=preempt, max_model_len=1100))
    assert record.preemptions.sum() > 0
    assert np.all(record.status == COMPLETED)
    assert np.array_equal(record.generated, w.output_tokens)


def test_swap_costs_time_recompute_costs_compute():
    w = random_workload(100, float("inf"), seed=19, mean_prompt=100, mean_output=200)
    runs = [run_policy(w, "paged", make_setup(120, 16, opt13b_steptime(), preempt=p, max_model_len=1100))
            for p in ("recompute", "swap")]
    assert all(r.preemptions.sum() > 0 for r in runs)
    assert runs[0].end_s != runs[1].end_s


def test_seeded_runs_are_reproducible():
    w = random_workload(80, 8.0, seed=23)
    a, b, c = (run_policy(w, "paged", make_setup(80, 16, opt13b_steptime(), cancel_fraction=0.3, seed=s))
               for s in (1, 1, 2))
    assert_same_run(a, b)
    assert not np.array_equal(a.status, c.status) or not np.array_equal(a.generated, c.generated)


@pytest.mark.parametrize("policy", POLICIES)
def test_pool_whole_after_cancellations_timeouts_and_preemptions(policy):
    w = random_workload(120, 30.0, seed=29, mean_prompt=150, mean_output=150)
    s = make_setup(70, 16, opt13b_steptime(), cancel_fraction=0.25, seed=3, timeout_s=2.0)
    record = run_policy(w, policy, s)  # run() checks the pool whole; it raises if not
    assert (record.status == CANCELLED).sum() > 0 and (record.status == TIMED_OUT).sum() > 0
    if policy == "paged":
        assert record.preemptions.sum() > 0


def test_never_fitting_request_is_rejected_and_kept():
    # 4 blocks of 4 = 16 slots: a 30-token request can never fit; the others run
    w = make_workload([0.0, 0.0, 0.0], [3, 30, 2], [2, 1, 2])
    record = run_policy(w, "paged", make_setup(4, 4, max_model_len=100))
    assert list(record.status) == [COMPLETED, 5, COMPLETED]  # 5 = REJECTED
    assert record.rejected_reason == {"more KV than the whole pool (OOM)": 1}


def test_whole_check_catches_a_leak():
    policy = PagedPolicy(8, 4, 2)
    assert policy.admit(0, 0, 5)
    with pytest.raises(AssertionError, match="still hold blocks"):
        policy.check_whole()


def test_paged_accounting_matches_the_pool():
    # The policy's own parts (with owed blocks) agree with the pool's accounting once synced.
    policy = PagedPolicy(20, 4, 3)
    assert policy.admit(0, 0, 5) and policy.admit(1, 0, 3)
    assert policy.grow_many(np.array([0, 1]), np.array([9, 4]))  # 0 crosses into block 3, 1 fills block 1
    tokens = np.array([9, 4])
    parts, table_bytes = policy.parts(tokens, None)
    policy.sync()
    usage = policy.pool.usage()
    assert parts[0] == usage.useful_tokens == 13
    assert parts[1] == usage.tail_fragmentation_slots == 3
    assert parts.sum() == 80
    assert table_bytes == usage.block_table_bytes == 4 * 4
    policy.release(0, "finished")
    policy.release(1, "cancelled")
    policy.check_whole()


def test_prefix_cache_hits_skip_prefill():
    # Two requests share hash id 5 (B = 4: their 2 full blocks have keys 5·128 + 0, 5·128 + 1); the second
    # arrives after the first finished.
    # Its hit covers 8 of its 10 prompt tokens, so its prefill computes 2 tokens (not 10) — equal step time
    # here, so check the pool's counters and the hit it reported.
    w = Workload(np.array([0.0, 1.0]), np.array([10, 10]), np.array([2, 2]), "real", "t",
                 hash_ids=np.array([5, 5]), hash_offsets=np.array([0, 1, 2]))
    s = make_setup(10, 4)
    from kvcalc.core.sim.engine import Engine
    from kvcalc.core.sim.run import make_policy
    from kvcalc.core.sim.steptime import StepTimeExecutor

    policy = make_policy("paged", w, s)
    record = Engine(w, policy, StepTimeExecutor(s.steptime), s.scheduler).run()
    assert np.all(record.status == COMPLETED)
    assert policy.pool.stats().hit_tokens == 8


def test_swap_in_needs_blocks_for_every_swapped_token():
    # pool of 4 blocks of 4; request 0 holds 8 tokens = 2 blocks, 2 free. Request 1 swapped out at 8 tokens
    # comes back with 9: ceil(9 / 4) = 3 fresh blocks > 2 free (its 8 tokens are not prefix-cache hits).
    policy = PagedPolicy(4, 4, 2)
    assert policy.admit(0, 0, 8)
    assert not policy.can_admit(1, 8, 9, from_swap=True)
    assert not policy.admit(1, 8, 9, from_swap=True)
    assert policy.can_admit(1, 8, 8, from_swap=True)  # 2 blocks: fits
    policy.release(0, "finished")
    policy.check_whole()


@pytest.mark.parametrize("seed", [19, 20])
def test_swap_and_recompute_preempt_alike_when_time_does_not_differ(seed):
    # With every step the same length, swap moving 0 bytes, and a token budget that never binds, a swapped
    # request and a recomputed one need the same blocks at the same steps (swap-in: its tokens + 1; recompute:
    # its whole prefix again, in one chunk), so the two schedules, and their preemptions, are identical.
    # Before the swap-in fit check counted every token, swap preempted ~3x more.
    w = random_workload(100, float("inf"), seed=seed, mean_prompt=100, mean_output=200)
    runs = [run_policy(w, "paged", make_setup(120, 16, constant_steptime(kv_bytes_per_token=0), preempt=p,
                                              max_model_len=1100, max_batched_tokens=10**6))
            for p in ("recompute", "swap")]
    assert runs[0].preemptions.sum() > 0
    assert np.array_equal(runs[0].preemptions, runs[1].preemptions)
    assert np.array_equal(runs[0].finish_s, runs[1].finish_s)


def test_plain_step_token_is_one_token():
    """A plain step's outcome holds one token per sampling request; a tuple (a speculative step's) is refused
    by name instead of failing deep in int()."""
    from kvcalc.core.sim.engine import one_token

    assert one_token(3, 17) == 17
    assert one_token(3, np.int64(17)) == 17  # a model runner's numpy token ids are ints too
    with pytest.raises(ValueError, match="2 tokens for request 3 in a step without drafts"):
        one_token(3, (17, 18))
