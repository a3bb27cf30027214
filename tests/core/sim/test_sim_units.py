"""The pieces of `kvcalc sim` one by one: allocator, memory plan, step time, workloads, SLOs, policies."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.inputs.traces import Trace
from kvcalc.core.model.models import get_preset
from kvcalc.core.sim.alloc import FirstFitAllocator
from kvcalc.core.sim.hardware import GPU_PRESETS, estimate_num_params, get_gpu, plan_memory
from kvcalc.core.sim.metrics import Slo, parse_slo
from kvcalc.core.sim.paged import mooncake_prompt_keys
from kvcalc.core.sim.reserve import ReservationPolicy
from kvcalc.core.sim.steptime import (
    Efficiencies,
    StepTimeModel,
    build_model,
    calibrated_attention_eff,
    prefill_positions,
)
from kvcalc.core.sim.workload import cancellation_points, constructed, from_trace, unit_rate_arrivals


# ---- first-fit allocator ------------------------------------------------------------------------------
def test_first_fit_holes_and_merging():
    a = FirstFitAllocator(100)
    assert a.allocate(1, 30) and a.allocate(2, 20) and a.allocate(3, 40)  # [0,30) [30,50) [50,90), hole [90,100)
    a.release(2, "finished")  # hole [30,50)
    assert a.holes == [(30, 20), (90, 10)]
    assert not a.allocate(4, 25)  # 30 slots free, no hole of 25: external fragmentation
    assert a.free_in_holes_smaller_than(25) == 30
    assert a.allocate(5, 15) and a.regions[5] == (30, 15)  # first fit: the lowest hole that holds it
    a.release(1, "cancelled")  # [0,30) merges with nothing on its right ([30,45) is held)
    a.release(5, "preempted")  # [0,30) + [30,45) + [45,50) merge into [0,50)
    assert a.holes == [(0, 50), (90, 10)]
    a.check_invariants()
    with pytest.raises(AssertionError, match="double free"):
        a.release(5, "finished")
    a.release(3, "timed_out")
    a.check_whole()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=60))
def test_first_fit_invariants_under_random_operations(ops):
    a = FirstFitAllocator(120)
    live: list[int] = []
    for i, (alloc, length) in enumerate(ops):
        if alloc or not live:
            fits = any(h >= length for _, h in a.holes)
            assert a.allocate(i, length) == fits
            if fits:
                live.append(i)
        else:
            a.release(live.pop(length % len(live)), "finished")
        a.check_invariants()
    for owner in live:
        a.release(owner, "finished")
    a.check_whole()


# ---- memory plan ----------------------------------------------------------------------------------------
# OPT-13B on an A100-40GB by hand: tests/core/sim/test_sim_memory_plan.py (the plan size --gpu makes)


def test_tensor_parallel_splits_weights_and_kv_heads():
    spec = get_preset("Llama-3-8B")
    one = plan_memory(spec, get_gpu("H100-SXM"), kv_dtype_bits=16, block_size=16)
    two = plan_memory(spec, get_gpu("H100-SXM"), kv_dtype_bits=16, block_size=16, tp=2)
    rotary = 8192 * 128 * 2  # the cos/sin cache, whole on every GPU; the rest splits over tp
    # + 1 MiB for each half vocabulary table (64,128 × 4,096 × 2 B = 250.5 × 2 MiB: the caching allocator charges
    # the whole segment, core/model/weight_tensors.py)
    assert two.weights_bytes == (one.weights_bytes - rotary) // 2 + rotary + 2 * 2**20
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2 == 32 * 2 * 4 * 128 * 2


def test_weights_that_do_not_fit():
    # 50 GiB = 53,687,091,200 B vs int(0.92 · 42,298,834,944) = 38,914,928,148 B (36.24 GiB): 14,772,163,052 B short
    with pytest.raises(ValueError, match=r"36\.24 GiB: 13\.76 GiB short"):  # 14,772,163,052 / 2^30 = 13.7576
        plan_memory(get_preset("OPT-13B"), get_gpu("A100-40GB"), kv_dtype_bits=16, block_size=16,
                    weights_bytes=50 * 2**30)


def test_param_estimate_from_dimensions_is_close_to_the_published_count():
    spec = get_preset("Llama-3-8B")
    assert estimate_num_params(spec) == pytest.approx(spec.num_params, rel=0.01)


def test_gpu_presets_and_unknown_gpu():
    assert {g.name for g in GPU_PRESETS.values()} >= {"A100-40GB", "A100-80GB", "H100-SXM", "H200"}
    assert get_gpu("h100-sxm").bandwidth_bytes_per_s == 3.35e12
    with pytest.raises(ValueError, match="unknown GPU"):
        get_gpu("Z900")  # no such GPU (B300 became a preset)


# ---- step time ----------------------------------------------------------------------------------------------
def test_roofline_by_hand():
    m = StepTimeModel(flops_per_token=2, attn_flops_per_position=4, kv_bytes_per_token=10, compute_s_per_flop=1,
                      weights_s=5, kv_s_per_byte=0.1, overhead_s=1, swap_bandwidth_bytes_per_s=100)
    # compute 2·3 + 4·2 = 14; memory 5 + 4 tokens · 10 B · 0.1 = 9; max 14 + overhead 1 = 15
    assert m.step_s(3.0, 2.0, 4.0) == 15
    # memory-bound: compute 2·1 + 4·1 = 6, memory 5 + 20·10·0.1 = 25 -> 26; swap 300 B / 100 B/s adds 3
    assert m.step_s(1.0, 1.0, 20.0, swap_bytes=300.0) == 29
    assert prefill_positions(np.array([2]), np.array([3]))[0] == 12  # positions 3 + 4 + 5


def test_llama3_8b_decode_on_h100_by_hand():
    spec = get_preset("Llama-3-8B")
    plan = plan_memory(spec, get_gpu("H100-SXM"), kv_dtype_bits=16, block_size=16)
    m = build_model(spec, plan, Efficiencies())
    # one sequence at 1,000 tokens of context: memory-bound; weights 16,060,522,496 B (bf16 parameters) + the
    # rotary cache 8,192 · 128 · 2 B = 16,062,619,648 B (as size --gpu loads them) / (3.35e12 · 0.8)
    # + KV (1000 read + 1 written) · 131,072 B / (3.35e12 · 0.8) + 0.5 ms
    assert plan.weights_bytes == 16_060_522_496 + 8192 * 128 * 2 == 16_062_619_648
    expected = 16_062_619_648 / 2.68e12 + 1001 * 131_072 / 2.68e12 + 0.5e-3
    assert m.decode_steps_s(1, 1000.0) == pytest.approx(expected, rel=1e-12)


def test_calibrate_from_bench_json(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"copy_tbps": 3.0, "timing": [{"achieved_tbps": t} for t in (2.5, 2.7, 2.9)]}))
    eff, text = calibrated_attention_eff(path, get_gpu("H100-SXM"))
    assert eff == pytest.approx(2.7 / 3.35)
    assert "median achieved 2.700 TB/s" in text
    path.write_text(json.dumps({"timing": []}))
    with pytest.raises(ValueError, match="achieved_tbps"):
        calibrated_attention_eff(path, get_gpu("H100-SXM"))
    path.write_text(json.dumps({"device": {"type": "cpu"}, "timing": [{"achieved_tbps": 0.01}]}))
    with pytest.raises(ValueError, match="not a GPU"):
        calibrated_attention_eff(path, get_gpu("H100-SXM"))
    path.write_text(json.dumps({"timing": [{"achieved_tbps": 4.0}]}))  # 4 TB/s > H100's 3.35: another GPU
    with pytest.raises(ValueError, match="another GPU"):
        calibrated_attention_eff(path, get_gpu("H100-SXM"))


# ---- workloads ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_arrivals_have_rate_and_burstiness(burstiness):
    # Gamma(b, 1/(R·b)) gaps: mean 1/R, squared coefficient of variation 1/b (50,000 gaps: ~1 % noise)
    times = unit_rate_arrivals(50_001, "gamma", burstiness, np.random.default_rng(0)) / 4.0
    gaps = np.diff(times)
    assert times[0] == 0
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(1 / burstiness, rel=0.06)


def test_constructed_workload_keeps_lengths_across_rates():
    w = constructed(100, 2.0, np.arange(1, 101), np.arange(1, 101), seed=4)
    faster = w.at_rate(8.0)
    assert np.allclose(faster.arrival_s * 4, w.arrival_s)
    assert np.array_equal(faster.prompt_tokens, w.prompt_tokens)
    with pytest.raises(ValueError, match="rate_per_s -1"):  # core names its parameter; the CLI says --rate
        constructed(10, -1.0, np.ones(10), np.ones(10))


def test_a_trace_time_that_is_not_a_number_is_named_not_blamed_on_the_time_scale():
    trace = Trace("azure", "t.csv", np.array([0.0, np.nan, 2.0]), np.array([5, 5, 5]), np.array([2, 2, 2]))
    with pytest.raises(ValueError, match=r"request 2 arrives at nan, not a finite time; fix or remove its timestamp"):
        from_trace(trace, time_scale=4.0)


def test_cancellation_points():
    out = np.array([1, 2, 10, 100] * 250)
    cancel = cancellation_points(out, 0.5, np.random.default_rng(1))
    eligible = out >= 2
    assert np.all(cancel[~eligible] == 0)  # a one-token request cannot stop early
    chosen = cancel > 0
    assert chosen.sum() == round(0.5 * eligible.sum())
    assert np.all((cancel[chosen] >= 1) & (cancel[chosen] < out[chosen]))


# ---- SLOs, keys, reservations -----------------------------------------------------------------------------
def test_parse_slo():
    assert parse_slo("ttft=200ms,tpot=0.05,e2e=3s") == Slo(0.2, 0.05, 3.0)
    assert parse_slo(None).is_empty
    for bad in ("ttft", "ttft=-1", "latency=2", "ttft=2x"):
        with pytest.raises(ValueError, match=r"^slo "):  # core names its parameter; the CLI says --slo
            parse_slo(bad)


def test_mooncake_keys():
    # B = 256: two sub-blocks per 512-token hash id. Prompt 700 has 2 full blocks, both in hash id 7.
    keys = mooncake_prompt_keys(np.array([7, 9]), np.array([0, 2]), np.array([700]), 256)
    assert keys[0].tolist() == [7 * 2 + 0, 7 * 2 + 1]
    # B = 528 (a Mamba hybrid's forced block) does not tile the ids: block j is keyed by the id holding its last
    # token, ids[(528·(j + 1) − 1) // 512]: prompt 1,000 has 1 full block, its last token 527 in id 1 -> [9]
    # (kvcalc sim refuses such a block for a single-group pool, whose block the user typed: setup.py)
    assert mooncake_prompt_keys(np.array([7, 9]), np.array([0, 2]), np.array([1000]), 528)[0].tolist() == [9]
    # 1,100 tokens need ceil(1100 / 512) = 3 hash ids; the request has 2: an error, not a silent cut
    with pytest.raises(ValueError, match="request 1: 1100 prompt tokens need 3 hash_ids"):
        mooncake_prompt_keys(np.array([7, 9]), np.array([0, 2]), np.array([1100]), 16)


def test_reservation_sizes():
    prompt, output = np.array([3, 4, 5, 100]), np.array([2, 4, 4, 1])  # true lengths 5, 8, 9, 101
    assert ReservationPolicy("reserve-pow2", 1000, prompt, output, 2048).reserved.tolist() == [8, 8, 16, 128]
    assert ReservationPolicy("reserve-oracle", 1000, prompt, output, 2048).reserved.tolist() == [5, 8, 9, 101]
    assert ReservationPolicy("reserve-max", 1000, prompt, output, 2048).reserved.tolist() == [2048] * 4
