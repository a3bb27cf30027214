"""Model presets against their published figures; preset lookup; resolve_model and explicit overrides."""

import pytest

from kvcalc.core.model.models import PRESETS, ModelSpec, get_preset, resolve_model, with_overrides

KIB = 1024

# Bytes of KV per token at 16 bits, by hand: 2 (K and V) · layers · KV heads · head dim · 2 B;
# MLA: layers · (kv_lora_rank + rope dim) · 2 B.
PUBLISHED_BYTES_PER_TOKEN_16BIT = {
    "OPT-13B": 800 * KIB,  # vLLM paper (Kwon et al. 2023, §3): 2 · 5120 hidden · 40 layers · 2 B = 800 KiB
    "Llama-2-7B": 2 * 32 * 32 * 128 * 2,  # 524,288 = 512 KiB
    "Llama-2-70B": 2 * 80 * 8 * 128 * 2,  # 327,680 = 320 KiB
    "Llama-3-8B": 128 * KIB,  # 2 · 32 · 8 · 128 · 2 = 131,072
    "Llama-3-70B": 2 * 80 * 8 * 128 * 2,  # 320 KiB
    "Llama-3.1-405B": 2 * 126 * 8 * 128 * 2,  # 516,096 = 504 KiB
    "Mistral-7B-v0.1": 2 * 32 * 8 * 128 * 2,  # 128 KiB (within the 4096 window)
    "Mixtral-8x7B": 2 * 32 * 8 * 128 * 2,  # 128 KiB: experts do not touch the KV cache
    "Qwen2.5-7B": 2 * 28 * 4 * 128 * 2,  # 57,344 = 56 KiB
    "Qwen2.5-72B": 2 * 80 * 8 * 128 * 2,  # 320 KiB
    "Qwen3-8B": 2 * 36 * 8 * 128 * 2,  # 147,456 = 144 KiB
    "Qwen3-32B": 2 * 64 * 8 * 128 * 2,  # 262,144 = 256 KiB (head_dim 128, not 5120/64 = 80)
    "Falcon-7B": 2 * 32 * 1 * 64 * 2,  # 8,192 = 8 KiB (MQA)
    "Gemma-2-9B": 2 * 42 * 8 * 256 * 2,  # 344,064 = 336 KiB (within the 4096 window)
    "DeepSeek-V3": 61 * (512 + 64) * 2,  # 70,272 = 68.625 KiB (MLA latent, no factor 2)
}


def test_every_required_preset_exists():
    assert set(PUBLISHED_BYTES_PER_TOKEN_16BIT) <= {spec.name for spec in PRESETS.values()}


@pytest.mark.parametrize("name", sorted(PUBLISHED_BYTES_PER_TOKEN_16BIT))
def test_bytes_per_token_matches_published_figure(name):
    assert get_preset(name).bytes_per_token(16) == PUBLISHED_BYTES_PER_TOKEN_16BIT[name]


def _dense_params(layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, *, tied=False, qkv_bias=False,
                  qk_norm=False, mlp_matrices=3, layer_norm_params=None):
    """Parameters of a Llama-style decoder, counted independently of the presets' stored totals."""
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    if qkv_bias:
        attention += heads * head_dim + 2 * kv_heads * head_dim
    if qk_norm:
        attention += 2 * head_dim
    norms = 2 * hidden if layer_norm_params is None else layer_norm_params
    per_layer = attention + mlp_matrices * hidden * intermediate + norms
    return layers * per_layer + vocab * hidden * (1 if tied else 2) + hidden


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # Totals the model cards / safetensors indexes report, rebuilt from the config dimensions.
        ("Llama-2-7B", _dense_params(32, 4096, 32, 32, 128, 11008, 32000)),  # 6.74B
        ("Llama-2-70B", _dense_params(80, 8192, 64, 8, 128, 28672, 32000)),  # 68.98B
        ("Llama-3-8B", _dense_params(32, 4096, 32, 8, 128, 14336, 128256)),  # 8.03B
        ("Llama-3-70B", _dense_params(80, 8192, 64, 8, 128, 28672, 128256)),  # 70.55B
        ("Llama-3.1-405B", _dense_params(126, 16384, 128, 8, 128, 53248, 128256)),  # 405.85B
        ("Mistral-7B-v0.1", _dense_params(32, 4096, 32, 8, 128, 14336, 32000)),  # 7.24B
        ("Qwen2.5-7B", _dense_params(28, 3584, 28, 4, 128, 18944, 152064, qkv_bias=True)),  # 7.62B
        ("Qwen2.5-72B", _dense_params(80, 8192, 64, 8, 128, 29568, 152064, qkv_bias=True)),  # 72.71B
        ("Qwen3-8B", _dense_params(36, 4096, 32, 8, 128, 12288, 151936, qk_norm=True)),  # 8.19B
        ("Qwen3-32B", _dense_params(64, 5120, 64, 8, 128, 25600, 151936, qk_norm=True)),  # 32.76B
        # Gemma-2: four RMSNorms per layer, tied embeddings; 9.24B.
        ("Gemma-2-9B", _dense_params(42, 3584, 16, 8, 256, 14336, 256000, tied=True, layer_norm_params=4 * 3584)),
    ],
)
def test_num_params_rebuilt_from_dimensions(name, expected):
    assert get_preset(name).num_params == expected


def test_opt_13b_num_params_by_hand():
    # Per layer: q/k/v/out 4 · (5120² + 5120), fc1 5120·20480 + 20480, fc2 20480·5120 + 5120, 2 LayerNorms of
    # 2 · 5120. Plus tokens 50272 · 5120, 2050 learned positions · 5120 (OPT offsets positions by 2), final
    # LayerNorm 2 · 5120; lm_head tied. = 12,853,473,280 (the number the skeleton had: it is right).
    h, f = 5120, 20480
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    assert get_preset("OPT-13B").num_params == 40 * layer + 50272 * h + 2050 * h + 2 * h == 12_853_473_280


def test_falcon_7b_num_params_by_hand():
    # Fused query_key_value 4544 · (4544 + 2 · 64) (MQA: one K and one V head), dense 4544², MLP 2 · 4544 · 18176,
    # one LayerNorm (weight + bias) per layer; tied lm_head; final LayerNorm. 6,921,720,704.
    h = 4544
    layer = h * (h + 2 * 64) + h * h + 2 * h * 4 * h + 2 * h
    assert get_preset("Falcon-7B").num_params == 32 * layer + 65024 * h + 2 * h


def test_moe_active_params():
    # Mixtral: attention + 2 of 8 experts + router + norms per layer, embeddings and lm_head: 12.9B of 46.7B.
    h = 4096
    attention, expert = 2 * h * h + 2 * h * 1024, 3 * h * 14336
    mixtral = get_preset("Mixtral-8x7B")
    assert mixtral.num_params == 32 * (attention + 8 * expert + 8 * h + 2 * h) + 2 * 32000 * h + h
    assert mixtral.num_active_params == 32 * (attention + 2 * expert + 8 * h + 2 * h) + 2 * 32000 * h + h
    deepseek = get_preset("DeepSeek-V3")
    assert deepseek.num_params == 671_026_419_200  # the 671B of the DeepSeek-V3 report
    # DeepSeek reports 36.6B activated without the 0.93B input embedding (129280 · 7168); we count it.
    assert deepseek.num_active_params - 129280 * 7168 == pytest.approx(36.6e9, rel=2e-3)
    for spec in PRESETS.values():
        assert spec.num_params and spec.intermediate_size and spec.vocab_size and spec.max_position_embeddings
        assert spec.hidden_size > 0 and (spec.num_active_params or spec.num_params) <= spec.num_params


def test_attention_kinds():
    kinds = {spec.name: spec.attention for spec in PRESETS.values()}
    assert kinds["OPT-13B"] == "mha" and kinds["Llama-2-7B"] == "mha"
    assert kinds["Llama-3-8B"] == "gqa" and kinds["Falcon-7B"] == "mqa" and kinds["DeepSeek-V3"] == "mla"


def test_sliding_windows_of_presets():
    mistral, gemma = get_preset("Mistral-7B-v0.1"), get_preset("Gemma-2-9B")
    assert (mistral.sliding_window, mistral.num_sliding_layers) == (4096, 32)  # every layer
    assert (gemma.sliding_window, gemma.num_sliding_layers) == (4096, 21)  # every other of 42
    # 10,000 tokens: Gemma's 21 global layers hold 10,000, its 21 sliding layers 4,096.
    assert gemma.layer_tokens(10_000) == 21 * 10_000 + 21 * 4096
    assert mistral.layer_tokens(10_000) == 32 * 4096


@pytest.mark.parametrize("name", ["llama-3-8b", "LLAMA-3-8B", " Llama-3-8B ", "llama3-8b", "llama_3_8b"])
def test_preset_names_match_case_and_punctuation_insensitively(name):
    assert get_preset(name).name == "Llama-3-8B"


def test_unknown_preset_suggests_close_names():
    with pytest.raises(ValueError, match=r"unknown model 'qwen3'.*did you mean Qwen3-8B, Qwen3-32B"):
        get_preset("qwen3")
    with pytest.raises(ValueError, match="choose one of OPT-13B"):
        get_preset("zzzz")


def test_resolve_model_nothing_given_is_none():
    assert resolve_model(None, None) is None


def test_resolve_model_preset_and_overrides():
    assert resolve_model("llama-3-8b", None) is get_preset("Llama-3-8B")
    spec = resolve_model("llama-3-8b", None, layers=16, kv_heads=4)
    assert (spec.layers, spec.kv_heads, spec.head_dim) == (16, 4, 128)
    assert spec.name == "Llama-3-8B (layers=16, kv_heads=4)"
    assert spec.bytes_per_token(16) == 2 * 16 * 4 * 128 * 2
    assert resolve_model("llama-3-8b", None, head_dim=128) is get_preset("Llama-3-8B")  # no change, same spec


def test_resolve_model_explicit_dims_make_a_custom_mha_spec():
    spec = resolve_model(None, None, layers=32, kv_heads=8, head_dim=128)
    assert (spec.name, spec.attention, spec.num_attention_heads, spec.max_position_embeddings) == (
        "custom", "mha", 8, None)
    assert spec.bytes_per_token(16) == 128 * KIB


def test_resolve_model_errors():
    with pytest.raises(ValueError, match="either model or config, not both"):
        resolve_model("llama-3-8b", "config.json")
    with pytest.raises(ValueError, match=r"missing kv_heads, head_dim"):
        resolve_model(None, None, layers=32)
    with pytest.raises(ValueError, match=r"^layers must be a positive integer, got 0"):
        resolve_model(None, None, layers=0, kv_heads=8, head_dim=128)
    with pytest.raises(ValueError, match="32 query heads are not a multiple of 3 KV heads"):
        resolve_model("llama-3-8b", None, kv_heads=3)
    with pytest.raises(ValueError, match="MLA"):
        resolve_model("deepseek-v3", None, kv_heads=8)


def test_layer_override_keeps_sliding_proportion_only_when_exact():
    gemma = with_overrides(get_preset("Gemma-2-9B"), layers=10)
    assert (gemma.layers, gemma.num_sliding_layers) == (10, 5)
    mistral = with_overrides(get_preset("Mistral-7B-v0.1"), layers=7)
    assert (mistral.layers, mistral.num_sliding_layers) == (7, 7)
    with pytest.raises(ValueError, match="21 of 42 layers"):
        with_overrides(get_preset("Gemma-2-9B"), layers=7)


def test_spec_validation_messages():
    with pytest.raises(ValueError, match="layers must be a positive integer"):
        ModelSpec(name="x", layers=0, num_attention_heads=1, kv_heads=1, head_dim=1, hidden_size=1,
                  max_position_embeddings=None)
    with pytest.raises(ValueError, match="both kv_lora_rank and qk_rope_head_dim"):
        ModelSpec(name="x", layers=1, num_attention_heads=1, kv_heads=1, head_dim=1, hidden_size=1,
                  max_position_embeddings=None, kv_lora_rank=4)


def test_moe_presets_carry_their_expert_counts():
    # config.json: DeepSeek-V3 n_routed_experts 256, num_experts_per_tok 8; Mixtral num_local_experts 8, top 2.
    assert (get_preset("DeepSeek-V3").num_experts, get_preset("DeepSeek-V3").experts_per_token) == (256, 8)
    assert (get_preset("Mixtral-8x7B").num_experts, get_preset("Mixtral-8x7B").experts_per_token) == (8, 2)
    assert all(s.num_experts is None for s in PRESETS.values() if s.num_active_params is None)
