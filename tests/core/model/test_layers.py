"""Equation 1 as a sum over layer groups, against a layer-by-layer reference; the TP rule per group; the state."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.model.layers import LayerGroup, bits_to_bytes, kv_bits, state_bits, window_terms
from kvcalc.core.model.model_spec import ModelSpec
from kvcalc.core.model.state import RecurrentState

MAMBA2 = RecurrentState("mamba2", conv_dtype="bf16", ssm_dtype="fp32", d_inner=16384, d_conv=4, d_state=256,
                        heads=256, head_dim=64, n_groups=8)


def reference_bits(layers: list[dict], tokens: int, bits: int, tp: int) -> int:
    """One layer at a time, by the definitions: held tokens × cached scalars of the heads on one GPU × bits."""
    total = 0
    for layer in layers:
        kind = layer["kind"]
        if kind in ("full", "mla"):
            held = tokens
        elif kind == "sliding":
            held = min(tokens, layer["window"])
        elif kind == "chunked":  # the current chunk: positions C · floor((n − 1) / C) … n − 1
            held = len(range(layer["window"] * ((tokens - 1) // layer["window"]), tokens))
        else:
            held = 0
        if kind == "mla":
            scalars = layer["latent"]
        elif kind == "none":
            scalars = 0
        else:
            heads = layer["heads"]
            per_gpu = heads // tp if tp <= heads else 1
            scalars = per_gpu * (layer["k"] + layer["v"])
        total += held * scalars * bits
    return total


layer_st = st.one_of(
    st.fixed_dictionaries({"kind": st.just("full"), "heads": st.sampled_from([1, 2, 4, 8]),
                           "k": st.integers(1, 256), "v": st.integers(1, 256)}),
    st.fixed_dictionaries({"kind": st.sampled_from(["sliding", "chunked"]), "heads": st.sampled_from([1, 2, 8]),
                           "k": st.integers(1, 256), "v": st.integers(1, 256), "window": st.integers(1, 5000)}),
    st.fixed_dictionaries({"kind": st.just("mla"), "latent": st.integers(2, 600)}),
    st.fixed_dictionaries({"kind": st.just("none")}),
)


def as_group(layer: dict) -> LayerGroup:
    kind = layer["kind"]
    if kind == "mla":
        return LayerGroup("mla", 1, kv_lora_rank=layer["latent"] - 1, rope_dim=1)
    if kind == "none":
        return LayerGroup("none", 1, note="mamba2")
    return LayerGroup(kind, 1, kv_heads=layer["heads"], k_head_dim=layer["k"], v_head_dim=layer["v"],
                      window=layer.get("window"))


@settings(max_examples=300, deadline=None)
@given(st.lists(layer_st, min_size=1, max_size=12), st.integers(1, 10**7), st.sampled_from([4, 8, 16, 32]),
       st.sampled_from([1, 2, 4, 8]))
def test_sum_over_groups_equals_the_layer_by_layer_reference(layers, tokens, bits, tp):
    groups = [as_group(layer) for layer in layers]
    assert kv_bits(groups, tokens, bits, tp) == reference_bits(layers, tokens, bits, tp)
    # grouped by window, the same sum (what frag applies to many lengths at once)
    terms = window_terms(groups, bits, tp)
    by_window = sum(b * (tokens if w is None else min(tokens, w)) for w, b in terms.items())
    if any(layer["kind"] == "chunked" for layer in layers):
        assert by_window >= kv_bits(groups, tokens, bits, tp)  # a chunk holds at most C: an upper bound
    else:
        assert by_window == kv_bits(groups, tokens, bits, tp)


def test_hand_computed_hybrid():
    # Gemma-4-31B-like: 50 sliding layers of 16 × 256 (window 1024), 10 full of 4 × 512, at 8,192 tokens, bf16:
    # 50 · 1,024 · 16 · 512 · 16 bits + 10 · 8,192 · 4 · 1,024 · 16 bits = (419,430,400 + 335,544,320) · 8 bits
    groups = [LayerGroup("sliding", 50, kv_heads=16, k_head_dim=256, v_head_dim=256, window=1024),
              LayerGroup("full", 10, kv_heads=4, k_head_dim=512, v_head_dim=512)]
    assert kv_bits(groups, 8192, 16) == (50 * 1024 * 16 * 512 + 10 * 8192 * 4 * 1024) * 16
    # --tp 8: sliding layers 2 heads per GPU, full layers 4 heads < 8: one per GPU (each replicated on 2)
    assert kv_bits(groups, 8192, 16, tp=8) == (50 * 1024 * 2 * 512 + 10 * 8192 * 1 * 1024) * 16


def test_rounding_rule_is_once_per_quantity():
    # int4, a 3-scalar MLA latent in 1 layer: 12 bits per token. 3 tokens = 36 bits = 4.5 B -> 5 B, once
    # (per-token rounding would give 3 · 2 = 6 B).
    g = [LayerGroup("mla", 1, kv_lora_rank=2, rope_dim=1)]
    assert kv_bits(g, 3, 4) == 36 and bits_to_bytes(kv_bits(g, 3, 4)) == 5


@pytest.mark.parametrize(("heads", "tp", "message"), [
    (8, 3, "tp 3 does not divide the 8 KV heads of m's sliding layers"),
    (8, 12, "tp 12 is above the 8 KV heads of m's sliding layers but not a multiple of 8"),
])
def test_tp_rule_per_group_names_the_layers(heads, tp, message):
    spec = ModelSpec.from_groups("m", (LayerGroup("full", 2, kv_heads=24, k_head_dim=64, v_head_dim=64),
                                      LayerGroup("sliding", 2, kv_heads=heads, k_head_dim=64, v_head_dim=64,
                                                 window=16)),
                                 num_attention_heads=24, hidden_size=1536, max_position_embeddings=None)
    with pytest.raises(ValueError, match=message):
        spec.kv_bits(1, 16, tp)


def test_mamba2_state_and_its_tp_split():
    # conv (4 − 1) · (16384 + 2 · 8 · 256) = 61,440 bf16 scalars; SSM 256 · 64 · 256 = 4,194,304 fp32 scalars
    assert MAMBA2.bits() == 61_440 * 16 + 4_194_304 * 32
    # tp 8: 32 heads, d_inner 2048, 1 group per GPU: conv 3 · (2048 + 512), SSM 32 · 64 · 256; the GPUs sum back
    assert MAMBA2.bits(8) == 3 * (2048 + 512) * 16 + 32 * 64 * 256 * 32 and MAMBA2.bits(8) * 8 == MAMBA2.bits()
    # tp 16 > 8 groups: each GPU keeps one group (replicated), so together they hold more than one copy of B, C
    assert MAMBA2.bits(16) == 3 * (1024 + 2 * 256) * 16 + 16 * 64 * 256 * 32
    assert MAMBA2.bits(16) * 16 > MAMBA2.bits()
    with pytest.raises(ValueError, match="tp 3 does not divide the Mamba heads"):
        MAMBA2.bits(3)


def test_other_states_by_hand():
    gdn = RecurrentState("gated_deltanet", "bf16", "fp32", heads=48, head_dim=128, k_heads=16, k_dim=128, d_conv=4)
    assert gdn.bits() == 3 * (2 * 16 * 128 + 48 * 128) * 16 + 48 * 128 * 128 * 32  # Qwen3.5-27B, one layer
    lightning = RecurrentState("lightning", "bf16", "bf16", heads=64, head_dim=128)
    assert lightning.bits(8) == 8 * 128 * 128 * 16
    mamba1 = RecurrentState("mamba1", "bf16", "bf16", d_inner=8192, d_conv=4, d_state=16)
    assert mamba1.bits() == (8192 * 3 + 8192 * 16) * 16
    assert state_bits([LayerGroup("none", 28, state=mamba1)]) == 28 * mamba1.bits()
    with pytest.raises(ValueError, match="fp12"):
        RecurrentState("lightning", "bf16", "fp12", heads=1, head_dim=1)


def test_layer_group_validation():
    with pytest.raises(ValueError, match="sliding layers need a positive window"):
        LayerGroup("sliding", 1, kv_heads=1, k_head_dim=1, v_head_dim=1)
    with pytest.raises(ValueError, match="either KV or a recurrent state"):
        LayerGroup("full", 1, kv_heads=1, k_head_dim=1, v_head_dim=1, state=MAMBA2)
    with pytest.raises(ValueError, match="no layer keeps a KV cache or a recurrent state"):
        ModelSpec.from_groups("m", (LayerGroup("none", 4, note="MLP only"),), num_attention_heads=1, hidden_size=1,
                              max_position_embeddings=None)
    # a pure recurrent model: no KV layer, no KV head, a state in every layer
    pure = ModelSpec.from_groups("m", (LayerGroup("none", 4, state=MAMBA2),), hidden_size=1,
                                 max_position_embeddings=None)
    assert (pure.layers, pure.kv_heads, pure.head_dim, pure.keeps_kv, pure.attention) == (0, 0, 0, False, "none")
    assert pure.kv_bits(1_000_000, 16) == 0 and pure.state_bits() == 4 * MAMBA2.bits()
