"""Sliding windows in the step-time model: sliding layers attend and read at most W tokens;
the pool side is not windowed and the report says so."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvcalc.core.model.models import get_preset
from kvcalc.core.sim.hardware import get_gpu, plan_memory
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.steptime import Efficiencies, StepTimeModel, build_model

from .test_sim_engine import assert_same_run, make_setup, opt13b_steptime, random_workload


def windowed(window: int, share: float) -> StepTimeModel:
    return StepTimeModel(0, 0, 0, 0, 0, 0, 0, 1, window_tokens=window, sliding_share=share)


def test_chunk_excess_by_hand():
    m = windowed(4, 1.0)
    # chunk of 5 after 2 cached: queries 3..7 attend max(q − 4, 0) = 0, 0, 1, 2, 3 positions too many = 6;
    # the first query (3) is within the window, so no token is read beyond it: reads max(2 + 1 − 4, 0) = 0
    assert m.chunk_excess(np.array([2]), np.array([5])) == (6.0, 0.0)
    # decode at context 11 (10 cached + 1): 7 beyond the window, for positions and reads alike; summed
    # with the chunk above: 6 + 7 and 0 + 7
    assert m.chunk_excess(np.array([2, 10]), np.array([5, 1])) == (13.0, 7.0)
    assert windowed(0, 0.0).chunk_excess(np.array([100]), np.array([1])) == (0.0, 0.0)


def test_decode_excess_by_hand():
    m = windowed(4, 1.0)
    # contexts 3 and 6 at step 0, W = 4: step j: max(3 + j − 4, 0) + max(6 + j − 4, 0) = 0+2, 0+3, 1+4
    assert m.decode_excess(np.array([3, 6]), 3).tolist() == [2.0, 3.0, 5.0]
    # the second request runs only in step 0, the first in steps 0..2: 2, 0, 1
    assert m.decode_excess(np.array([3, 6]), 3, np.array([3, 1])).tolist() == [2.0, 0.0, 1.0]


def test_mistral_decode_reads_only_the_window():
    spec = get_preset("Mistral-7B-v0.1")  # window 4,096 on all 32 layers
    plan = plan_memory(spec, get_gpu("H100-SXM"), kv_dtype_bits=16, block_size=16)
    m = build_model(spec, plan, Efficiencies())
    # one sequence at context 10,000: weights 7,241,732,096 · 2 B + the rotary cache 32,768 · 128 · 2 B (as size
    # --gpu loads them) / (3.35e12 · 0.8) + (4,096 read + 1 written) · 131,072 B / (3.35e12 · 0.8) + 0.5 ms
    # (memory-bound; FLOPs ~1.5e10 take 25 µs)
    assert plan.weights_bytes == 14_483_464_192 + 32_768 * 128 * 2 == 14_491_852_800
    expected = 14_491_852_800 / 2.68e12 + 4097 * 131_072 / 2.68e12 + 0.5e-3
    assert m.decode_steps_s(1, 10_000.0, 10_000.0 - 4096) == pytest.approx(expected, rel=1e-12)
    within = m.decode_steps_s(1, 1_000.0, 0.0)  # inside the window nothing changes
    assert within == pytest.approx(14_491_852_800 / 2.68e12 + 1001 * 131_072 / 2.68e12 + 0.5e-3, rel=1e-12)


@pytest.mark.parametrize(("blocks", "preempt"), [(2000, "recompute"), (60, "swap")])
def test_fast_forward_equals_step_by_step_with_a_window(blocks, preempt):
    steptime = dataclasses.replace(opt13b_steptime(), window_tokens=64, sliding_share=0.5)
    w = random_workload(60, 4.0, seed=3)
    runs = [run_policy(w, "paged", make_setup(blocks, 16, steptime, seed=5, preempt=preempt, fast_forward=ff))
            for ff in (True, False)]
    assert runs[0].segments > 0
    assert_same_run(*runs)
    plain = run_policy(w, "paged", make_setup(blocks, 16, opt13b_steptime(), seed=5, preempt=preempt))
    assert runs[0].end_s < plain.end_s  # reading less KV makes the same work finish sooner


def test_csv_carries_the_caveats_of_the_notes(run_cli):
    # People read "latencies come from the step-time model" and the window note; a script reading CSV gets
    # them as columns.
    lines = run_cli("sim", "--requests", "5", "--model", "mistral-7b-v0.1", "--gpu", "H100-SXM",
                    "--format", "csv").stdout.splitlines()
    row = dict(zip(lines[1].split(","), lines[2].split(","), strict=True))
    assert row["latency_source"] == "step_time_model" and row["workload_kind"] == "constructed"
    assert row["sliding_window_pool_modelled"] == "true" and row["moe_weight_reads"] == ""
    lines = run_cli("sim", "--requests", "5", "--format", "csv").stdout.splitlines()
    row = dict(zip(lines[1].split(","), lines[2].split(","), strict=True))
    assert row["sliding_window_pool_modelled"] == ""  # OPT-13B has no sliding window
