"""Phi-4-mini and Phi-3.5-MoE: a config `sliding_window` no shorter than the model's positions drops no token, so
kvcalc pages those layers as full attention, but vLLM registers them as a sliding window: its Attention layer takes
cache_config.sliding_window (the config's, ModelConfig.get_sliding_window) when the model passes no per-layer
window, and get_kv_cache_spec returns a SlidingWindowSpec. Its worst case per request (max_memory_usage_bytes,
which the max-concurrency line and the start-up check divide by) is then
cdiv(min(W − 1 + max_num_batched_tokens, max_model_len), B) + 1 blocks: one more than full attention's."""

from __future__ import annotations

from fractions import Fraction

import pytest
from real_configs import write_config

from kvcalc.core.model.gpu_plan import plan_gpu
from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.layers import LayerGroup
from kvcalc.core.model.models import ModelSpec

GIB = 2**30


@pytest.mark.parametrize(("name", "module", "window"), [
    ("PHI4_MINI", "test_architecture_configs", 262_144),
    ("PHI35_MOE", "test_real_configs", 131_072),
])
def test_phi_concurrency_counts_the_sliding_window_block(tmp_path, name, module, window) -> None:
    spec = load_config(write_config(tmp_path, name, module))
    assert [(g.kind, g.count, g.window, g.vllm_window) for g in spec.layer_groups] == [("full", 32, None, window)]
    plan = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=131_072, kv_memory_bytes=16 * GIB)
    # both: 32 layers · 8 KV heads · 128 dim · 2 (K, V) · 2 B = 131,072 B a token; a block id is 16 tokens of every
    # layer, 2 MiB: 16 GiB holds 8,192 ids
    assert plan.num_blocks == 16 * GIB // (16 * 131_072) == 8_192
    # one request of 131,072 tokens: min(W − 1 + 8,192, 131,072) = 131,072 tokens, cdiv(131,072, 16) + 1 = 8,193
    # blocks (full attention would need 8,192)
    assert plan.blocks_per_request == 131_072 // 16 + 1 == 8_193
    assert plan.max_concurrency == Fraction(8_192, 8_193)  # below 1: vLLM would not start at this length
    # the "GPU KV cache size" line: int(8,192 / 8,193 · 131,072) = int(131,056.002) = 131,056 tokens
    assert plan.kv_cache_tokens == 131_056


def test_a_short_length_still_counts_the_window_block(tmp_path) -> None:
    spec = load_config(write_config(tmp_path, "PHI4_MINI", "test_architecture_configs"))
    plan = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=4_096, kv_memory_bytes=16 * GIB)
    # min(262,143 + 8,192, 4,096) = 4,096 tokens: cdiv(4,096, 16) + 1 = 257 blocks; 8,192 / 257 = 31.87x
    assert plan.blocks_per_request == 257 and plan.max_concurrency == Fraction(8_192, 257)
    ideal = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=4_096, kv_memory_bytes=16 * GIB,
                     kv_layout_name="ideal")
    assert ideal.blocks_per_request == 256  # kvcalc's own ideal layout: full attention, no window block


def test_plain_full_attention_is_unchanged() -> None:
    # the same dimensions without the registered window: cdiv(131,072, 16) = 8,192 blocks, concurrency exactly 1
    spec = ModelSpec.from_groups("full32", (LayerGroup("full", 32, kv_heads=8, k_head_dim=128, v_head_dim=128),),
                                 num_attention_heads=32, hidden_size=4096, max_position_embeddings=None)
    plan = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=131_072, kv_memory_bytes=16 * GIB)
    assert plan.blocks_per_request == 8_192 and plan.max_concurrency == 1


def test_sims_request_groups_count_it_with_the_spec(tmp_path) -> None:
    from kvcalc.core.model.gpu_plan import request_cache_groups
    from kvcalc.core.model.kv_groups import kv_layout

    spec = load_config(write_config(tmp_path, "PHI4_MINI", "test_architecture_configs"))
    kv = kv_layout(spec, 16, 16, "vllm")
    # cdiv(131,072, 16) + 1 = 8,193 with the registered window; 8,192 as full attention (no spec given)
    assert [g.blocks_per_request for g in request_cache_groups(kv, 131_072, 8_192, spec)] == [8_193]
    assert [g.blocks_per_request for g in request_cache_groups(kv, 131_072, 8_192)] == [8_192]
