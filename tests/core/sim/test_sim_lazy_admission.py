"""The paged policy without a prefix cache owes an admission's blocks instead of taking them from the pool
(PagedPolicy.lazy_admission): every run must be the one the pool-taking policy gives, field for field, with the
fast path and step by step, under preemption by recompute and by swap, cancellations and timeouts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.model.models import get_preset
from kvcalc.core.pool.block_pool import ReleaseReason
from kvcalc.core.sim.engine import Engine
from kvcalc.core.sim.fastforward import FastForward
from kvcalc.core.sim.hardware import get_gpu, plan_memory
from kvcalc.core.sim.paged import PagedPolicy
from kvcalc.core.sim.record import RunRecord
from kvcalc.core.sim.scheduler import SchedulerConfig
from kvcalc.core.sim.steptime import Efficiencies, StepTimeExecutor, StepTimeModel, build_model
from kvcalc.core.sim.workload import Workload, cancellation_points, constructed

FIELDS = ("first_token_s", "finish_s", "generated", "status", "preemptions", "itl_values_s", "itl_weights",
          "memory_slot_s", "block_table_byte_s", "end_s", "busy_s", "running_s", "in_system_s", "peak_running",
          "steps", "segments")


def opt13b() -> StepTimeModel:
    spec = get_preset("OPT-13B")
    plan = plan_memory(spec, get_gpu("A100-40GB"), kv_dtype_bits=16, block_size=16, max_batched_tokens=2048)
    return build_model(spec, plan, Efficiencies())


STEPTIME = opt13b()


def run(workload: Workload, blocks: int, lazy: bool, config: SchedulerConfig, cancel_at: np.ndarray) -> RunRecord:
    policy = PagedPolicy(blocks, 16, len(workload))
    assert policy.lazy_admission  # no prefix keys, no exact block tables
    policy.lazy_admission = lazy
    engine = Engine(workload, policy, StepTimeExecutor(STEPTIME), config, cancel_at)
    record = engine.run(FastForward(engine, STEPTIME) if config.fast_forward else None)
    assert record is not None
    if lazy:
        assert not policy.pool.stats().prompt_tokens, "a lazy run never allocates in the pool"
    return record


def same_runs(n: int, rate: float, seed: int, blocks: int, cancel: float, preempt: str,
              timeout_s: float | None = None) -> None:
    rng = np.random.default_rng(seed)
    prompt = np.clip(rng.geometric(1 / 120, n), 1, 250)
    output = np.clip(rng.geometric(1 / 80, n), 1, 250)
    workload = constructed(n, rate, prompt, output, seed=seed)
    cancel_at = cancellation_points(workload.output_tokens, cancel, np.random.default_rng(seed + 1))
    for fast_forward in (True, False):
        cfg = SchedulerConfig(max_model_len=512, preempt=preempt, timeout_s=timeout_s, fast_forward=fast_forward)
        lazy, taking = (run(workload, blocks, flag, cfg, cancel_at) for flag in (True, False))
        for field in FIELDS:
            assert np.array_equal(np.asarray(getattr(lazy, field)), np.asarray(getattr(taking, field)),
                                  equal_nan=True), field


@pytest.mark.parametrize("preempt", ["recompute", "swap"])
def test_lazy_admission_gives_the_pool_taking_run(preempt: str) -> None:
    # 40 blocks of 16 = 640 slots for 150 requests at 40/s: the queue and preemptions are the common case
    same_runs(150, 40.0, 7, 40, 0.2, preempt, timeout_s=3.0)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(17, 80), rate=st.sampled_from([2.0, 20.0, 200.0]),
       preempt=st.sampled_from(["recompute", "swap"]), cancel=st.sampled_from([0.0, 0.3]))
def test_lazy_admission_property(seed: int, blocks: int, rate: float, preempt: str, cancel: float) -> None:
    same_runs(60, rate, seed, blocks, cancel, preempt)


def test_sync_hands_lazy_admissions_to_the_pool() -> None:
    # two admissions owed: 5 tokens = 2 blocks of 4, 3 tokens = 1 block; sync allocates them in the pool
    policy = PagedPolicy(10, 4, 2)
    assert policy.admit(0, 0, 5) and policy.admit(1, 0, 3)
    assert policy.free_blocks == 7 and policy.pool.num_free_blocks == 10
    policy.sync()
    assert policy.pool.num_free_blocks == 7 and policy.owed_blocks == 0
    policy.release(0, ReleaseReason.FINISHED)
    policy.release(1, "cancelled")
    policy.check_whole()
    with pytest.raises(AssertionError, match="not live"):
        policy.release(1, "finished")
