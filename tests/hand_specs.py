"""Three Mamba / linear-attention hybrids built by hand from their public configs, independently of kvcalc's
presets and config reader: the tests of kv_groups, share and sim check the per-group figures against them.
(On pytest's path through `pythonpath = ["tests"]` in pyproject.toml.)"""

from __future__ import annotations

from kvcalc.core.model.layers import LayerGroup
from kvcalc.core.model.models import ModelSpec
from kvcalc.core.model.state import RecurrentState

ATTN_8x128 = {"kv_heads": 8, "k_head_dim": 128, "v_head_dim": 128, "q_heads": 32}  # 2 · 8 · 128 · 2 B = 4,096 B


def jamba() -> ModelSpec:
    # ai21labs/AI21-Jamba-1.5-Mini: 32 layers, attention at 4, 12, 20, 28 (8 KV heads of 128), 28 Mamba-1 layers of
    # d_inner 2 · 4096 = 8192, d_conv 4, d_state 16, bf16 state.
    return ModelSpec.from_groups("Jamba-1.5-Mini", (
        LayerGroup("full", 4, **ATTN_8x128),
        LayerGroup("none", 28, note="mamba1", state=RecurrentState("mamba1", "bf16", "bf16", d_inner=8192, d_conv=4,
                                                                   d_state=16, dt_rank=256))),
        num_attention_heads=32, hidden_size=4096, max_position_embeddings=262_144)


def granite_h_small() -> ModelSpec:
    # ibm-granite/granite-4.0-h-small: 40 layers, 4 attention (8 KV heads of 128), 36 Mamba-2: 128 heads of 64,
    # n_groups 1, d_state 128, d_conv 4, expand 2 (d_inner 8192), bf16 state.
    return ModelSpec.from_groups("Granite-4.0-H-Small", (
        LayerGroup("full", 4, **ATTN_8x128),
        LayerGroup("none", 36, note="mamba2", state=RecurrentState("mamba2", "bf16", "bf16", d_inner=8192, d_conv=4,
                                                                   d_state=128, heads=128, head_dim=64, n_groups=1))),
        num_attention_heads=32, hidden_size=4096, max_position_embeddings=131_072)


def qwen3_next() -> ModelSpec:
    # Qwen/Qwen3-Next-80B-A3B: 48 layers, every 4th full attention (2 KV heads of 256), 36 Gated DeltaNet:
    # 16 key heads of 128, 32 value heads of 128, conv kernel 4, bf16 state.
    return ModelSpec.from_groups("Qwen3-Next-80B", (
        LayerGroup("full", 12, kv_heads=2, k_head_dim=256, v_head_dim=256, q_heads=16),
        LayerGroup("none", 36, note="gated_deltanet", state=RecurrentState(
            "gated_deltanet", "bf16", "bf16", d_conv=4, heads=32, head_dim=128, k_heads=16, k_dim=128))),
        num_attention_heads=16, hidden_size=2048, max_position_embeddings=262_144)
