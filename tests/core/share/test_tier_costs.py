"""Bytes of a cached block per KV cache group (core/share/cache_bytes.py) and the load-or-recompute rule
(core/share/load_or_recompute.py), against hand arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from kvcalc.core.errors import ParameterError
from kvcalc.core.gpus import get_gpu
from kvcalc.core.model.models import resolve_model
from kvcalc.core.share.cache_bytes import cached_block_bytes
from kvcalc.core.share.load_or_recompute import break_even_bandwidth, step_time_model, tier_verdict
from kvcalc.core.sim.steptime import StepTimeModel


def model(name: str):
    return resolve_model(name, None, None, None, None)


def test_llama_block_bytes() -> None:
    # K and V · 32 layers · 8 KV heads · 128 dims · 2 bytes · 16 tokens = 2 MiB; tp 2 halves the heads
    one = cached_block_bytes(model("Llama-3-8B"), "bf16", 16, 16)
    assert one.bytes_per_block == 2 * 32 * 8 * 128 * 2 * 16 == 2 * 2**20
    assert [(g.label, g.layers) for g in one.groups] == [("full", 32)] and one.state_bytes == 0
    assert cached_block_bytes(model("Llama-3-8B"), "bf16", 16, 16, tp=2).bytes_per_block == 2**20
    assert one.split(3) == {"full": 6 * 2**20}


def test_sliding_window_groups_are_cached_too() -> None:
    # Gemma-3-27B: 10 global + 52 sliding (1,024) layers, 16 KV heads · 128 dims: 2 · 16 · 128 · 2 · 16 = 128 KiB
    # per layer per block -> 1.25 MiB full, 6.5 MiB sliding
    c = cached_block_bytes(model("Gemma-3-27B"), "bf16", 16, 16)
    assert {g.label: (g.layers, g.bytes_per_block) for g in c.groups} == {
        "full": (10, 10 * 128 * 2**10), "sliding_1024": (52, 52 * 128 * 2**10)}


def test_mamba_hybrid_pays_a_state_per_cached_block() -> None:
    c = cached_block_bytes(model("Nemotron-H-56B"), "bf16", 16, 512)
    assert c.state_bytes > 0 and any(g.label.startswith("state") for g in c.groups)
    assert c.state_bytes / c.bytes_per_block > 0.9  # the states dwarf 10 attention layers' KV
    with pytest.raises(ParameterError, match="caches no prefix"):
        cached_block_bytes(model("Nemotron-H-56B"), "bf16", 16, 512, mamba_cache_mode="none")


def hand_model(overhead_s: float = 0.0) -> StepTimeModel:
    """Compute-bound: 2 GFLOP per token and 1 kFLOP per attended position at 1 TFLOP/s, no memory time."""
    return StepTimeModel(flops_per_token=2e9, attn_flops_per_position=1e3, kv_bytes_per_token=1,
                         compute_s_per_flop=1e-12, weights_s=0.0, kv_s_per_byte=0.0, overhead_s=overhead_s,
                         swap_bandwidth_bytes_per_s=1.0)


def test_break_even_bandwidth_by_hand() -> None:
    # 8,192 tokens: 2e9 · 8192 + 1e3 · 8192 · 8193 / 2 FLOPs = 1.6384e13 + 3.3558528e10 at 1e12/s = 16.417558528 s;
    # 1,000 bytes a token: 8.192e6 B / 16.417558528 s
    assert break_even_bandwidth(hand_model(), 8192, 1000.0) == pytest.approx(8.192e6 / 16.417558528, rel=1e-12)


def test_tier_verdict_sums_segments_after_their_start() -> None:
    # request 0: 100 tokens after 50 hit above: 2e9·100 + 1e3·(50·100 + 100·101/2) = 2e11 + 1.005e7 FLOPs;
    # request 1: nothing from this tier (0 s); 1 ms overhead per step that runs
    v = tier_verdict(hand_model(1e-3), "host", np.array([50, 7]), np.array([100, 0]), 4_000, 2_000.0)
    assert v.recompute_s == pytest.approx((2e11 + 1.005e7) * 1e-12 + 1e-3, rel=1e-12)
    assert v.load_s == 2.0 and v.loading_pays is False
    assert v.break_even_bytes_per_s == pytest.approx(4_000 / v.recompute_s)


def test_mooncake_eq2_example_scales_like_the_paper() -> None:
    # Llama-3-70B, tp 8, 8,192-token prefix: the paper's 6 GB/s (A800) and 19 GB/s (H800) differ by their
    # FLOP/s (312 vs 989.5 TFLOP/s); kvcalc's compute-bound prefill gives the same ratio
    spec = model("Llama-3-70B")
    per_gpu_token = cached_block_bytes(spec, "bf16", 16, 16, tp=8).bytes_per_block / 16
    a100 = break_even_bandwidth(step_time_model(spec, get_gpu("A100-80GB"), 16, 16, 8), 8192, per_gpu_token)
    h100 = break_even_bandwidth(step_time_model(spec, get_gpu("H100-SXM"), 16, 16, 8), 8192, per_gpu_token)
    assert h100 / a100 == pytest.approx(19 / 6, rel=0.05)
    assert 2e9 < 8 * a100 < 6e9 and 8e9 < 8 * h100 < 19e9  # below the paper's: a 60 % MFU prefill, not 100 %
