"""The lean engine loop (core/sim/lean.py, lean_runs.py) gives the fast path's run and the plain step-by-step run, field
for field and bit for bit: random overloaded workloads (queues, preemptions, chunked prefills handed back, idle gaps,
cancellations), the stop condition asked at the same ticks with the same state, and its two float helpers against
numpy itself (pairwise sums, step times of a decode run)."""

from __future__ import annotations

import functools
import operator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.sim import lean, lean_runs, step_sums
from kvcalc.core.sim.engine import Engine
from kvcalc.core.sim.fastforward import FastForward
from kvcalc.core.sim.paged import PagedPolicy
from kvcalc.core.sim.record import RunRecord
from kvcalc.core.sim.scheduler import Scheduler, SchedulerConfig
from kvcalc.core.sim.step_sums import sum_few
from kvcalc.core.sim.steptime import StepTimeExecutor, StepTimeModel
from kvcalc.core.sim.workload import Workload, cancellation_points, constructed

from .test_sim_engine import opt13b_steptime

FIELDS = ("first_token_s", "finish_s", "generated", "status", "preemptions", "itl_values_s", "itl_weights",
          "memory_slot_s", "block_table_byte_s", "end_s", "busy_s", "running_s", "in_system_s", "peak_running",
          "steps", "segments", "timeline")
STEPTIME = opt13b_steptime()


def workload(n: int, rate: float, seed: int, cancel: float) -> tuple[Workload, np.ndarray]:
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.geometric(1 / 120, n), 1, 300)
    output = np.clip(rng.geometric(1 / 60, n), 1, 250)
    w = constructed(n, rate, prompt, output, seed=seed)
    return w, cancellation_points(w.output_tokens, cancel, np.random.default_rng(seed + 1))


def run(w: Workload, cancel_at: np.ndarray, blocks: int, mode: str, config: SchedulerConfig, *, stop=None,
        timeline: bool = False, monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[RunRecord | None, int]:
    """(the record, how many lean loops ran) in `mode`: lean (the default fast path), fast (without the lean
    loop) or plain (no fast path at all)."""
    policy = PagedPolicy(blocks, 16, len(w))
    engine = Engine(w, policy, StepTimeExecutor(STEPTIME), config, cancel_at, record_timeline=timeline)
    fast = None if mode == "plain" else FastForward(engine, STEPTIME)
    loops = []
    if fast is not None:
        if mode == "fast":
            fast.whole_loop = lambda: None  # type: ignore[method-assign]  # the fast path's own ticks
        else:
            original = fast.whole_loop
            fast.whole_loop = lambda: loops.append(1) or original()  # type: ignore[method-assign]  # counted
    return engine.run(fast, stop), len(loops)


def assert_same(a: RunRecord, b: RunRecord) -> None:
    for field in FIELDS:
        x, y = getattr(a, field), getattr(b, field)
        if field == "timeline":
            assert x == y, field
        else:
            assert np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True), field
    assert a.prefix == b.prefix


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(20, 120), rate=st.sampled_from([3.0, 30.0, 300.0]),
       cancel=st.sampled_from([0.0, 0.3]), max_seqs=st.sampled_from([4, 256]),
       budget=st.sampled_from([64, 2048]))
def test_lean_loop_gives_the_fast_and_the_plain_run(seed, blocks, rate, cancel, max_seqs, budget) -> None:
    w, cancel_at = workload(80, rate, seed, cancel)
    cfg = SchedulerConfig(max_model_len=600, max_seqs=max_seqs, max_batched_tokens=budget)
    lean_record, loops = run(w, cancel_at, blocks, "lean", cfg, timeline=seed % 2 == 0)
    assert loops == 1, "the lean loop applies to a plain paged run"
    fast_record, _ = run(w, cancel_at, blocks, "fast", cfg, timeline=seed % 2 == 0)
    plain_record, _ = run(w, cancel_at, blocks, "plain", SchedulerConfig(
        max_model_len=600, max_seqs=max_seqs, max_batched_tokens=budget, fast_forward=False), timeline=seed % 2 == 0)
    assert lean_record is not None and fast_record is not None and plain_record is not None
    assert_same(lean_record, fast_record)
    # step by step: the same request times bit for bit (the fast path's integrals of a run are closed forms, equal to
    # stepping's sums only to rounding: tests/core/sim/test_sim_engine.py)
    for field in ("first_token_s", "finish_s", "generated", "status", "preemptions", "end_s", "steps"):
        assert np.array_equal(np.asarray(getattr(lean_record, field)), np.asarray(getattr(plain_record, field)),
                              equal_nan=True), field


def test_a_loaded_run_takes_every_lean_step() -> None:
    # 300 requests at 60/s into 40 blocks of 16 (640 slots): a queue all along, decode runs through arrivals,
    # preemptions by recompute, and prompts over the 64-token budget handed back as prefill chunks
    w, cancel_at = workload(300, 60.0, 3, 0.2)
    cfg = SchedulerConfig(max_model_len=600, max_batched_tokens=64)
    calls = {"_steady": 0, "_preempt": 0, "_segment": 0, "_fallback": 0}
    originals = {name: getattr(lean.LeanLoop, name) for name in calls}

    def counted(name):
        def call(self, *args):
            calls[name] += 1
            return originals[name](self, *args)
        return call

    mp = pytest.MonkeyPatch()
    for name in calls:
        mp.setattr(lean.LeanLoop, name, counted(name))
    try:
        lean_record, _ = run(w, cancel_at, 40, "lean", cfg)
    finally:
        mp.undo()
    fast_record, _ = run(w, cancel_at, 40, "fast", cfg)
    assert lean_record is not None and fast_record is not None
    assert_same(lean_record, fast_record)
    assert min(calls.values()) > 0, calls
    assert int(lean_record.preemptions.sum()) > 0


def test_stop_is_asked_at_the_same_ticks_with_the_same_state() -> None:
    w, cancel_at = workload(300, 60.0, 5, 0.0)
    cfg = SchedulerConfig(max_model_len=600)
    seen: dict[str, list] = {"lean": [], "fast": []}

    def stopper(mode: str, after: int):
        def stop(s: Scheduler) -> bool:
            seen[mode].append((s.now_s, s.next_arrival, s.status.tobytes(), s.first_token_s.tobytes(),
                               s.finish_s.tobytes(), np.where(np.isnan(s.finish_s), 0, s.generated).tobytes()))
            return len(seen[mode]) >= after
        return stop

    for mode in seen:
        record, _ = run(w, cancel_at, 40, mode, cfg, stop=stopper(mode, 12))
        assert record is None
    assert len(seen["lean"]) == 12 and seen["lean"] == seen["fast"]


def test_a_planted_bug_is_caught() -> None:
    # a piece's Σd summed one step after another instead of in numpy's pairwise order: some integral moves by an ulp
    w, cancel_at = workload(200, 60.0, 11, 0.0)
    cfg = SchedulerConfig(max_model_len=600)
    fast_record, _ = run(w, cancel_at, 40, "fast", cfg)
    mp = pytest.MonkeyPatch()
    mp.setattr(lean_runs, "_sum", lambda d: functools.reduce(operator.add, d.tolist(), -0.0))
    try:
        planted, _ = run(w, cancel_at, 40, "lean", cfg)
    finally:
        mp.undo()
    assert planted is not None and fast_record is not None
    with pytest.raises(AssertionError):
        assert_same(planted, fast_record)


def counted_runs_through_finishes(w: Workload, cancel_at: np.ndarray, blocks: int,
                                  cfg: SchedulerConfig) -> tuple[RunRecord | None, int]:
    """(the lean run's record, how many runs through finishes it took itself)."""
    taken = []
    original = lean_runs.LeanBatch.through_finishes
    mp = pytest.MonkeyPatch()
    mp.setattr(lean_runs.LeanBatch, "through_finishes", lambda self: original(self) and not taken.append(1))
    try:
        return run(w, cancel_at, blocks, "lean", cfg, timeline=True)[0], len(taken)
    finally:
        mp.undo()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(12, 200), rate=st.sampled_from([0.5, 2.0, 8.0]),
       cancel=st.sampled_from([0.0, 0.3]))
def test_runs_through_finishes_give_the_fast_path_s(seed, blocks, rate, cancel) -> None:
    # a light load: the queue empties and the batch shrinks as requests finish until the next arrival (or until
    # memory is short: 12 blocks of 16 hold less than one long request), which the lean loop now runs itself
    w, cancel_at = workload(60, rate, seed, cancel)
    cfg = SchedulerConfig(max_model_len=600)
    lean_record, runs = counted_runs_through_finishes(w, cancel_at, blocks, cfg)
    fast_record, _ = run(w, cancel_at, blocks, "fast", cfg, timeline=True)
    assert lean_record is not None and fast_record is not None
    assert_same(lean_record, fast_record)
    assert runs > 0


@pytest.mark.parametrize("plant", ["running_s summed step by step", "every finish at the run's end"])
def test_a_planted_bug_in_a_run_through_finishes_is_caught(plant) -> None:
    w, cancel_at = workload(60, 2.0, 7, 0.3)
    cfg = SchedulerConfig(max_model_len=600)
    fast_record, _ = run(w, cancel_at, 120, "fast", cfg, timeline=True)
    mp = pytest.MonkeyPatch()
    if plant == "running_s summed step by step":  # instead of the BLAS dot product d @ alive: an ulp somewhere

        def add(totals, parts, table_bytes, d, ends, alive, n, now_s):
            before = totals.running_s
            step_sums.add_through_finishes(totals, parts, table_bytes, d, ends, alive, n, now_s)
            terms = [x * a for x, a in zip(d.tolist(), alive.tolist(), strict=True)]
            totals.running_s = before + functools.reduce(operator.add, terms, 0.0)
        mp.setattr(lean_runs, "add_through_finishes", add)
    else:
        original = lean_runs.LeanBatch._leave_in_order
        mp.setattr(lean_runs.LeanBatch, "_leave_in_order",
                   lambda self, finished, k, ends, *rest: original(self, finished, k, [ends[k]] * len(ends), *rest))
    try:
        planted, runs = counted_runs_through_finishes(w, cancel_at, 120, cfg)
    finally:
        mp.undo()
    assert planted is not None and fast_record is not None and runs > 0
    with pytest.raises(AssertionError):
        assert_same(planted, fast_record)


floats = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(floats, st.floats(0, 1e-3)), max_size=7))
def test_sum_few_is_numpy_add_reduce(values) -> None:
    assert sum_few(values) == float(np.add.reduce(np.array(values, dtype=np.float64)))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), context0=st.integers(1, 10**7), k=st.integers(0, 80),
       coefficients=st.tuples(*[st.floats(1e-12, 1e12) for _ in range(6)]), moe=st.booleans(),
       state=st.sampled_from([0, 1 << 20]))
def test_decode_run_s_is_decode_steps_s(n, context0, k, coefficients, moe, state) -> None:
    fpt, afp, cspf, weights_s, kvs, overhead = coefficients
    model = StepTimeModel(fpt, afp, 327_680, cspf, weights_s, kvs, overhead, 1e10, state_bytes_per_seq=state,
                          **({"moe_dense_share": 0.2, "moe_expert_share": 0.01, "num_experts": 64,
                              "experts_per_token": 8} if moe else {}))
    steps = np.arange(k, dtype=np.float64)
    expected = np.asarray(model.decode_steps_s(n, context0 + n * steps, 0.0), dtype=np.float64)
    assert np.array_equal(np.array(model.decode_run_s(n, context0, k), dtype=np.float64), expected[:k])


@settings(max_examples=200, deadline=None)
@given(args=st.tuples(*[st.integers(1, 10**7).map(float) for _ in range(4)]),
       coefficients=st.tuples(*[st.floats(1e-12, 1e12) for _ in range(6)]), moe=st.booleans(),
       state=st.sampled_from([0, 1 << 20]))
def test_step_fn_is_step_s(args, coefficients, moe, state) -> None:
    fpt, afp, cspf, weights_s, kvs, overhead = coefficients
    model = StepTimeModel(fpt, afp, 327_680, cspf, weights_s, kvs, overhead, 1e10, state_bytes_per_seq=state,
                          **({"moe_dense_share": 0.2, "moe_expert_share": 0.01, "num_experts": 64,
                              "experts_per_token": 8} if moe else {}))
    tokens, positions, moved, seqs = args
    assert model.step_fn()(tokens, positions, moved, seqs) == model.step_s(tokens, positions, moved, 0.0, 0.0, 0.0,
                                                                           seqs)
