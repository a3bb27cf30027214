"""config.json -> ModelSpec, with fixture files written here (abridged from the published configs)."""

import json

import pytest

from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.models import get_preset, resolve_model

LLAMA_3_8B = {  # meta-llama/Meta-Llama-3-8B
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "torch_dtype": "bfloat16",
}
FALCON_7B = {  # tiiuae/falcon-7b (transformers-native config)
    "model_type": "falcon", "hidden_size": 4544, "n_head": 71, "n_layer": 32, "multi_query": True,
    "new_decoder_architecture": False, "parallel_attn": True, "vocab_size": 65024,
}
FALCON_40B = {  # tiiuae/falcon-40b: new decoder architecture with 8 KV heads
    "model_type": "falcon", "hidden_size": 8192, "num_attention_heads": 128, "num_hidden_layers": 60,
    "num_kv_heads": 8, "new_decoder_architecture": True, "vocab_size": 65024,
}
GEMMA_2_9B = {  # google/gemma-2-9b: no layer_types; gemma2 alternates sliding and global layers
    "model_type": "gemma2", "head_dim": 256, "hidden_size": 3584, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8,
    "sliding_window": 4096, "vocab_size": 256000,
}
QWEN3_32B = {  # Qwen/Qwen3-32B: head_dim 128, not hidden_size / heads = 80
    "model_type": "qwen3", "head_dim": 128, "hidden_size": 5120, "intermediate_size": 25600,
    "max_position_embeddings": 40960, "max_window_layers": 64, "num_attention_heads": 64, "num_hidden_layers": 64,
    "num_key_value_heads": 8, "sliding_window": None, "use_sliding_window": False, "vocab_size": 151936,
}
QWEN25_7B = {  # Qwen/Qwen2.5-7B: a sliding_window value that is switched off
    "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "max_position_embeddings": 131072, "max_window_layers": 28,
    "sliding_window": 131072, "use_sliding_window": False, "vocab_size": 152064,
}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3: MLA; num_key_value_heads 128 must not size the cache
    "model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "num_attention_heads": 128, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 129280,
}
LLAVA = {  # llava-hf/llava-1.5-7b-hf style: the language model under text_config
    "model_type": "llava", "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24},
    "text_config": {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
                    "num_key_value_heads": 32, "max_position_embeddings": 4096, "vocab_size": 32064},
}


def write(tmp_path, config, folder="model", name="config.json"):
    directory = tmp_path / folder
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(config) if not isinstance(config, str) else config)
    return path


def test_llama_matches_the_preset(tmp_path):
    spec = load_config(write(tmp_path, LLAMA_3_8B, folder="Meta-Llama-3-8B"))
    preset = get_preset("Llama-3-8B")
    assert spec.name == "Meta-Llama-3-8B"  # from the folder that holds config.json
    assert (spec.layers, spec.kv_heads, spec.head_dim, spec.attention) == (32, 8, 128, "gqa")
    assert (spec.max_position_embeddings, spec.intermediate_size, spec.vocab_size) == (8192, 14336, 128256)
    assert spec.bytes_per_token(16) == preset.bytes_per_token(16) == 131072  # 2 · 32 · 8 · 128 · 2


def test_name_from_name_or_path(tmp_path):
    spec = load_config(write(tmp_path, {**LLAMA_3_8B, "_name_or_path": "meta-llama/Meta-Llama-3-8B"}))
    assert spec.name == "Meta-Llama-3-8B"


def test_falcon_multi_query_has_one_kv_head(tmp_path):
    spec = load_config(write(tmp_path, FALCON_7B))
    # n_layer / n_head aliases; 4544 / 71 = 64; MQA: 2 · 32 · 1 · 64 · 2 = 8192 bytes per token.
    assert (spec.layers, spec.num_attention_heads, spec.kv_heads, spec.head_dim) == (32, 71, 1, 64)
    assert spec.attention == "mqa" and spec.bytes_per_token(16) == 8192
    assert spec.max_position_embeddings is None  # the config does not say; commands that need it ask


def test_falcon_new_decoder_architecture_reads_num_kv_heads(tmp_path):
    spec = load_config(write(tmp_path, FALCON_40B))
    assert (spec.kv_heads, spec.head_dim) == (8, 64)  # 8192 / 128
    # Without the new architecture, num_kv_heads is not read (Falcon-7B style): MQA or MHA by multi_query.
    old = load_config(write(tmp_path, {**FALCON_40B, "new_decoder_architecture": False}, folder="old"))
    assert old.kv_heads == 128


def test_multi_query_without_kv_heads_field(tmp_path):
    spec = load_config(write(tmp_path, {"model_type": "gpt_bigcode", "n_embd": 6144, "n_head": 48, "n_layer": 40,
                                        "multi_query": True, "n_positions": 8192}))
    assert (spec.kv_heads, spec.head_dim, spec.max_position_embeddings) == (1, 128, 8192)


def test_absent_kv_heads_means_mha(tmp_path):
    config = {k: v for k, v in LLAMA_3_8B.items() if k != "num_key_value_heads"}
    assert load_config(write(tmp_path, config)).kv_heads == 32


def test_gemma2_alternates_sliding_layers(tmp_path):
    spec = load_config(write(tmp_path, GEMMA_2_9B))
    assert (spec.head_dim, spec.sliding_window, spec.num_sliding_layers) == (256, 4096, 21)  # 42 / 2
    assert spec.kv_bits(8192, 16) == get_preset("Gemma-2-9B").kv_bits(8192, 16)


def test_layer_types_count_sliding_layers(tmp_path):
    layer_types = ["sliding_attention", "sliding_attention", "full_attention"] * 14
    spec = load_config(write(tmp_path, {**GEMMA_2_9B, "layer_types": layer_types}))
    assert spec.num_sliding_layers == 28
    with pytest.raises(ValueError, match="layer_types lists 3 layers but num_hidden_layers is 42"):
        load_config(write(tmp_path, {**GEMMA_2_9B, "layer_types": layer_types[:3]}, folder="bad"))


def test_sliding_window_pattern_and_gemma3_default(tmp_path):
    # Gemma-3: of every 6 layers, 5 slide. 62 layers -> 62 - 62 // 6 = 52 sliding.
    gemma3 = {"model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376, "num_attention_heads": 32,
              "num_hidden_layers": 62, "num_key_value_heads": 16, "sliding_window": 1024}
    assert load_config(write(tmp_path, gemma3)).num_sliding_layers == 52
    patterned = load_config(write(tmp_path, {**gemma3, "sliding_window_pattern": 4}, folder="p4"))
    assert patterned.num_sliding_layers == 62 - 15


def test_mistral_window_applies_to_every_layer(tmp_path):
    config = {**LLAMA_3_8B, "model_type": "mistral", "vocab_size": 32000, "sliding_window": 4096}
    spec = load_config(write(tmp_path, config))
    assert (spec.sliding_window, spec.num_sliding_layers) == (4096, 32)


def test_qwen_use_sliding_window_false_means_no_window(tmp_path):
    spec = load_config(write(tmp_path, QWEN25_7B))
    assert (spec.sliding_window, spec.num_sliding_layers) == (None, 0)
    assert spec.bytes_per_token(16) == 2 * 28 * 4 * 128 * 2
    # Switched on, Qwen2 slides on the layers from index max_window_layers upward: 28 - 20 = 8 of them.
    on = load_config(write(tmp_path, {**QWEN25_7B, "use_sliding_window": True, "max_window_layers": 20,
                                      "sliding_window": 4096}, folder="on"))
    assert (on.sliding_window, on.num_sliding_layers) == (4096, 8)


def test_qwen3_head_dim_wins_over_hidden_over_heads(tmp_path):
    spec = load_config(write(tmp_path, QWEN3_32B))
    assert spec.head_dim == 128 and spec.hidden_size // spec.num_attention_heads == 80
    assert spec.bytes_per_token(16) == 2 * 64 * 8 * 128 * 2 == get_preset("Qwen3-32B").bytes_per_token(16)


def test_deepseek_mla_ignores_num_key_value_heads(tmp_path):
    spec = load_config(write(tmp_path, DEEPSEEK_V3))
    assert spec.attention == "mla" and (spec.kv_lora_rank, spec.qk_rope_head_dim) == (512, 64)
    assert spec.kv_heads == 1 and spec.head_dim == 192  # 128 nope + 64 rope
    # 61 layers · 576 · 2 B = 70,272, not 2 · 61 · 128 · 192 · 2 = 5,996,544.
    assert spec.bytes_per_token(16) == 70_272 == get_preset("DeepSeek-V3").bytes_per_token(16)


def test_mla_without_rope_dim_names_the_field(tmp_path):
    config = {k: v for k, v in DEEPSEEK_V3.items() if k != "qk_rope_head_dim"}
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        load_config(write(tmp_path, config))


def test_multimodal_reads_text_config(tmp_path):
    spec = load_config(write(tmp_path, LLAVA))
    assert (spec.layers, spec.kv_heads, spec.head_dim, spec.vocab_size) == (32, 32, 128, 32064)


@pytest.mark.parametrize("field", ["num_hidden_layers", "num_attention_heads"])
def test_missing_field_is_named_with_the_file(tmp_path, field):
    path = write(tmp_path, {k: v for k, v in LLAMA_3_8B.items() if k != field})
    with pytest.raises(ValueError, match=rf"{path}: missing the field '{field}'"):
        load_config(path)


def test_missing_hidden_size_and_head_dim(tmp_path):
    path = write(tmp_path, {k: v for k, v in LLAMA_3_8B.items() if k != "hidden_size"})
    with pytest.raises(ValueError, match="missing the field 'hidden_size'"):
        load_config(path)


def test_not_json_names_the_file(tmp_path):
    path = write(tmp_path, "{not json")
    with pytest.raises(ValueError, match=rf"{path}: not valid JSON .*line 1"):
        load_config(path)
    with pytest.raises(ValueError, match="expected a JSON object"):
        load_config(write(tmp_path, [1, 2], folder="list"))


def test_bad_field_values(tmp_path):
    with pytest.raises(ValueError, match="'num_hidden_layers' must be a positive integer, got '32'"):
        load_config(write(tmp_path, {**LLAMA_3_8B, "num_hidden_layers": "32"}))
    with pytest.raises(ValueError, match="not a multiple of num_attention_heads"):
        load_config(write(tmp_path, {**LLAMA_3_8B, "hidden_size": 4100}, folder="odd"))


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "nope.json")


def test_resolve_model_reads_config_and_applies_overrides(tmp_path):
    path = write(tmp_path, LLAMA_3_8B)
    spec = resolve_model(None, path, kv_heads=4)
    assert spec.kv_heads == 4 and spec.bytes_per_token(16) == 2 * 32 * 4 * 128 * 2
    assert resolve_model(None, str(path)).kv_heads == 8


def test_explicit_dims_fill_missing_fields(tmp_path):
    path = write(tmp_path, {k: v for k, v in LLAMA_3_8B.items() if k not in ("num_hidden_layers", "hidden_size")})
    spec = resolve_model(None, path, layers=16, head_dim=64)
    assert (spec.layers, spec.head_dim, spec.kv_heads) == (16, 64, 8)
    with pytest.raises(ValueError, match="missing the field 'num_hidden_layers'; add it to the file or give layers"):
        resolve_model(None, path, head_dim=64)


def test_binary_file_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ValueError, match=rf"{path}: not a text file"):
        load_config(path)


def test_mpt_and_refinedweb_spellings(tmp_path):
    mpt = load_config(write(tmp_path, {"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32,
                                       "max_seq_len": 2048}))
    assert (mpt.layers, mpt.kv_heads, mpt.head_dim, mpt.max_position_embeddings) == (32, 32, 128, 2048)
    refined = load_config(write(tmp_path, {"model_type": "RefinedWeb", "hidden_size": 8192, "n_head": 128,
                                           "n_head_kv": 8, "n_layer": 60}, folder="rw"))
    assert (refined.kv_heads, refined.head_dim) == (8, 64)


def test_linear_attention_layers_keep_no_kv(tmp_path):
    # Qwen3-Next style: 3 linear-attention layers then 1 full-attention layer, 48 layers -> 12 KV layers.
    config = {"model_type": "qwen3_next", "hidden_size": 2048, "head_dim": 256, "num_attention_heads": 16,
              "num_key_value_heads": 2, "num_hidden_layers": 48,
              "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 12}
    spec = load_config(write(tmp_path, config))
    assert spec.layers == 12 and spec.num_kv_free_layers == 36 and "36 of 48 layers keep no KV cache" in spec.source
    from kvcalc.core.model.sizing import model_layers

    assert model_layers(spec) == 48  # 12 that keep KV + 36 that do not
    assert spec.bytes_per_token(16) == 2 * 12 * 2 * 256 * 2
    with pytest.raises(ValueError, match="no entry of layer_types is an attention layer"):
        load_config(write(tmp_path, {**config, "layer_types": ["mamba"] * 48}, folder="none"))


def test_moe_expert_counts_are_read(tmp_path):
    # DeepSeek-V3 spells them n_routed_experts / num_experts_per_tok, Mixtral num_local_experts.
    deepseek = load_config(write(tmp_path, {**DEEPSEEK_V3, "n_routed_experts": 256, "n_shared_experts": 1,
                                            "num_experts_per_tok": 8}, folder="ds"))
    assert (deepseek.num_experts, deepseek.experts_per_token) == (256, 8)
    mixtral = load_config(write(tmp_path, {**LLAMA_3_8B, "num_local_experts": 8, "num_experts_per_tok": 2},
                                folder="mx"))
    assert (mixtral.num_experts, mixtral.experts_per_token) == (8, 2)
    assert load_config(write(tmp_path, LLAMA_3_8B, folder="dense")).num_experts is None
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        load_config(write(tmp_path, {**LLAMA_3_8B, "num_local_experts": 8}, folder="half"))
    with pytest.raises(ValueError, match="exceeds"):
        load_config(write(tmp_path, {**LLAMA_3_8B, "num_local_experts": 2, "num_experts_per_tok": 4}, folder="bad"))
