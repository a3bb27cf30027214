"""MoE weight reads in the step-time model: a step reads the dense part and the experts its
tokens touch, E · (1 − (1 − k/E)^T) per layer under uniform routing, not every weight."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcalc.core.model.models import ModelSpec, get_preset
from kvcalc.core.sim.hardware import get_gpu, plan_memory
from kvcalc.core.sim.steptime import Efficiencies, StepTimeModel, build_model, moe_shares


def test_expert_shares_of_a_tiny_moe_by_hand():
    # E = 4 experts, k = 2 per token, 100 params of which 60 active: p_e = (100 − 60) / (4 − 2) = 20,
    # dense = 60 − 2 · 20 = 20. T = 1: 20 + 20 · 4 · (1 − 0.5) = 60; T = 2: 20 + 80 · (1 − 0.25) = 80;
    # T = 3: 20 + 80 · (1 − 0.125) = 90; T → ∞: 20 + 80 = 100 (every weight).
    spec = ModelSpec(name="tiny-moe", layers=1, num_attention_heads=1, kv_heads=1, head_dim=4, hidden_size=4,
                     max_position_embeddings=16, num_params=100, num_active_params=60, num_experts=4,
                     experts_per_token=2)
    shares = moe_shares(spec)
    assert shares == {"moe_dense_share": 0.2, "moe_expert_share": 0.2, "num_experts": 4, "experts_per_token": 2}
    m = StepTimeModel(flops_per_token=0, attn_flops_per_position=0, kv_bytes_per_token=0, compute_s_per_flop=0,
                      weights_s=10.0, kv_s_per_byte=0, overhead_s=0, swap_bandwidth_bytes_per_s=1, **shares)
    assert [m.weights_read_share(t) for t in (1.0, 2.0, 3.0)] == pytest.approx([0.6, 0.8, 0.9], rel=1e-12)
    assert m.weights_read_share(1e9) == pytest.approx(1.0, rel=1e-12)
    assert m.step_s(1.0, 0.0, 0.0) == pytest.approx(6.0, rel=1e-12)  # 10 s of weights · 0.6


def test_deepseek_v3_decode_of_one_token_reads_its_active_weights():
    spec = get_preset("DeepSeek-V3")
    plan = plan_memory(spec, get_gpu("H200"), kv_dtype_bits=16, block_size=16, tp=8)
    # the checkpoint's fp8 (as size --gpu): body 671,026,419,200 − 2 · 129,280 · 7,168 = 669,173,061,120 B at
    # 1 B, embeddings and head 2 · 129,280 · 7,168 · 2 B = 3,706,716,160 B; / 8 GPUs = 84,109,972,160, plus the
    # rotary cache 163,840 · 64 (MLA rotates qk_rope_head_dim) · 2 B = 20,971,520 on each
    assert plan.weights_bytes == (669_173_061_120 + 3_706_716_160) // 8 + 20_971_520 == 84_130_943_680
    m = build_model(spec, plan, Efficiencies())
    # p_e = (671,026,419,200 − 37,552,297,472) / (256 − 8) = 2,554,331,136 = 58 MoE layers · 3 · 7168 · 2048;
    # at T = 1 the step reads the active share of the weights on one GPU, 37,552,297,472 / 671,026,419,200 ·
    # 84,130,943,680 B, at 4.8e12 · 0.8 B/s; plus KV (100 context + 1 written) · 70,272 B per GPU and 0.5 ms.
    per_expert = (671_026_419_200 - 37_552_297_472) / 248
    assert per_expert == 58 * 3 * 7168 * 2048
    active = 37_552_297_472 / 671_026_419_200 * 84_130_943_680
    expected = active / 3.84e12 + 101 * 70_272 / 3.84e12 + 0.5e-3
    assert m.decode_steps_s(1, 100.0) == pytest.approx(expected, rel=1e-12)  # 1.729 ms, was 22.35 ms
    # many tokens: E · (1 − (1 − 8/256)^T) → 256, every expert: the step reads every weight
    everything = 84_130_943_680 / 3.84e12 + 0.5e-3
    assert m.step_s(100_000.0, 0.0, 0.0) == pytest.approx(max(everything, m.flops_per_token * 1e5
                                                              * m.compute_s_per_flop + 0.5e-3), rel=1e-9)


def test_mixtral_batch_of_two_by_hand():
    spec = get_preset("Mixtral-8x7B")
    shares = moe_shares(spec)
    # p_e = (46,702,792,704 − 12,879,925,248) / (8 − 2) = 5,637,144,576 = 32 layers · 3 · 4096 · 14336;
    # dense = 12,879,925,248 − 2 · p_e = 1,605,636,096. T = 2: 8 · (1 − (6/8)^2) = 3.5 experts per layer.
    p_e, dense = 5_637_144_576, 1_605_636_096
    assert p_e == 32 * 3 * 4096 * 14336
    m = StepTimeModel(0, 0, 0, 0, 1.0, 0, 0, 1, **shares)
    assert m.weights_read_share(2.0) == pytest.approx((dense + 3.5 * p_e) / 46_702_792_704, rel=1e-12)


@given(st.integers(1, 64), st.integers(1, 5000))
def test_share_grows_with_tokens_from_active_to_all(k_small, tokens):
    spec = get_preset("DeepSeek-V3")
    m = StepTimeModel(0, 0, 0, 0, 1.0, 0, 0, 1, **moe_shares(spec))
    active = spec.num_active_params / spec.num_params
    a, b = m.weights_read_share(float(tokens)), m.weights_read_share(float(tokens + k_small))
    assert active - 1e-12 <= a <= b <= 1 + 1e-12


def test_dense_models_and_moe_without_counts_read_every_weight():
    assert moe_shares(get_preset("Llama-3-8B")) == {}
    mixtral = get_preset("Mixtral-8x7B")
    # without an active count the counts come from the dimensions (weights.estimate_params): Mixtral's estimate is
    # within 1 % of its published 46.7 B total / 12.9 B active, so the shares are the preset's to within 2 %
    no_active = dataclasses.replace(mixtral, num_active_params=None)
    for key, value in moe_shares(mixtral).items():
        assert moe_shares(no_active)[key] == pytest.approx(value, rel=0.02)
    # nothing to count from (no vocab_size for the embeddings): every step reads every weight
    assert moe_shares(dataclasses.replace(no_active, vocab_size=None)) == {}


def test_moe_fields_are_checked():
    with pytest.raises(ValueError, match="both num_experts and experts_per_token"):
        dataclasses.replace(get_preset("Mixtral-8x7B"), experts_per_token=None)
    with pytest.raises(ValueError, match="exceeds num_experts"):
        dataclasses.replace(get_preset("Mixtral-8x7B"), experts_per_token=9)


def test_the_report_says_what_is_assumed_or_not_modelled(run_cli):
    small = ("--requests", "3", "--rate", "4", "--gpu", "H200")
    mistral = run_cli("sim", *small, "--model", "Mistral-7B-v0.1", "--json")
    assert mistral.exit_code == 0, mistral.stderr
    assert mistral.json()["sliding_window"] == {"kind": "sliding", "window_tokens": 4096, "sliding_layers": 32,
                                                "layers": 32, "attention_modelled": True, "pool_modelled": True}
    # 36 chunked of 48 layers; its 10,485,760 positions would not fit 4 H200s (vLLM would not start)
    scout = run_cli("sim", *small, "--model", "llama-4-scout", "--tp", "4", "--max-model-len", "131072", "--json")
    assert scout.exit_code == 0, scout.stderr
    assert scout.json()["sliding_window"] == {"kind": "chunked", "window_tokens": 8192, "sliding_layers": 36,
                                              "layers": 48, "attention_modelled": True, "pool_modelled": True}
    table = run_cli("sim", *small, "--model", "Gemma-2-9B")
    assert "sliding window 4,096 on 21 of 42 layers: applied to the attention FLOPs and KV reads" in table.stdout
    assert "the pool frees each sequence's blocks that left the window" in table.stdout
    mixtral = run_cli("sim", *small, "--model", "Mixtral-8x7B", "--json")
    assert mixtral.exit_code == 0, mixtral.stderr
    doc = mixtral.json()
    assert doc["moe_weight_reads"] == "uniform_routing_expectation" and doc["sliding_window"] is None
    dense = run_cli("sim", *small, "--model", "Llama-3-8B", "--json").json()
    assert dense["moe_weight_reads"] is None and dense["sliding_window"] is None
