"""Issue 17's refused-but-valid configs: each read by its architecture, with its KV and state by hand; and
DeepSeek-V4, refused in one line naming its model_type and every field kvcalc does not read.

The configs are trimmed to the fields that shape the cache plus the field that used to be refused; where the
reference corpus had the public config.json its values are used, otherwise the comment says what the
dimensions stand for."""

from __future__ import annotations

import json

import pytest

from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.sizing import compute_size


def write(tmp_path, config, folder="model"):
    directory = tmp_path / folder
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


# Kimi-K3: a KDA / MLA hybrid (NeMo AutoModel's KimiK3TextConfig: "hybrid KDA/MLA text backbone") with a SiTU
# activation whose `activation_situ_linear_beta` was refused for its `linear_` name. The K3 checkpoint's own
# config is not in the reference corpus: the dimensions are Kimi-Linear-48B-A3B's (same layer layout).
KIMI_K3 = {
    "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
    "text_config": {
        "model_type": "kimi_k3_text", "hidden_size": 2304, "num_hidden_layers": 27, "num_attention_heads": 32,
        "num_key_value_heads": 32, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "mla_use_nope": True, "hidden_act": "situ", "activation_situ_linear_beta": 0.5,
        "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
                               "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)],
                               "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4},
        "num_experts": 256, "num_experts_per_token": 8, "moe_intermediate_size": 1024, "intermediate_size": 9216,
        "vocab_size": 163840, "max_position_embeddings": 1048576, "torch_dtype": "bfloat16",
    },
}


def test_kimi_k3(tmp_path):
    spec = load_config(write(tmp_path, KIMI_K3))
    # 7 MLA layers · (512 + 64) latent · 2 B = 8,064 B a token
    assert spec.bytes_per_token(16) == 7 * (512 + 64) * 2 == 8_064
    # 20 KDA layers: conv q, k, v 3 · (4 − 1) · 32 · 128 bf16 = 73,728 B; recurrent 32 · 128 · 128 fp32 =
    # 2,097,152 B; 2,170,880 B each, 43,417,600 B a sequence
    assert spec.state_bits() // 8 == 20 * (3 * 3 * 4096 * 2 + 32 * 128 * 128 * 4) == 43_417_600
    # transformers 5 writes the layout as layer_types and the KDA dims at the top level: the same cache
    text = {k: v for k, v in KIMI_K3["text_config"].items() if k != "linear_attn_config"}
    full = (4, 8, 12, 16, 20, 24, 27)
    text.update(layer_types=["full_attention" if i + 1 in full else "linear_attention" for i in range(27)],
                linear_num_heads=32, linear_head_dim=128, linear_conv_kernel_dim=4)
    again = load_config(write(tmp_path, {**KIMI_K3, "text_config": text}, folder="t5"))
    assert (again.bytes_per_token(16), again.state_bits()) == (spec.bytes_per_token(16), spec.state_bits())


# https://huggingface.co/tiiuae/Falcon-H1-0.5B-Base/blob/main/config.json (as Megatron-Bridge's Falcon-H1 test
# quotes it; mamba_d_ssm 1536 = 24 heads · 64, which transformers' mixer needs): `mamba_use_mlp` was refused.
FALCON_H1_05B = {
    "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "hidden_size": 1024, "head_dim": 64,
    "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 36,
    "mamba_d_conv": 4, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1,
    "mamba_n_heads": 24, "mamba_d_ssm": 1536, "mamba_use_mlp": True, "mamba_rms_norm": False,
    "mamba_norm_before_gate": False, "mamba_chunk_size": 128, "attn_layer_indices": None,
    "ssm_multipliers": [0.35, 0.25, 0.35, 0.5, 0.35], "max_position_embeddings": 16384, "vocab_size": 32784,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_falcon_h1_05b(tmp_path):
    spec = load_config(write(tmp_path, FALCON_H1_05B))
    # 36 hybrid layers: attention 2 (K, V) · 2 KV heads · 64 · 2 B = 512 B a token each: 18,432 B
    assert spec.bytes_per_token(16) == 36 * 2 * 2 * 64 * 2 == 18_432
    # and Mamba-2: conv (4 − 1) · (1536 + 2 · 1 · 128) = 5,376 + SSM 24 · 64 · 128 = 196,608 scalars, bf16:
    # 403,968 B each, 14,542,848 B a sequence
    assert spec.state_bits() // 8 == 36 * (5_376 + 196_608) * 2 == 14_542_848


# https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16/blob/main/config.json: 23 Mamba-2, 23 MoE
# and 6 attention blocks; `expand` 2 · 2688 = 5376 disagrees with 64 heads · 64 = 4096, and transformers'
# and vLLM's mixers both take heads · head_dim (kvcalc said "fix one", which a user cannot do).
NEMOTRON3_NANO = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 2688,
    "num_hidden_layers": 52, "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "mamba_num_heads": 64,
    "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "expand": 2,
    "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712, "intermediate_size": 1856, "mlp_hidden_act": "relu2",
    "max_position_embeddings": 262144, "vocab_size": 131072, "torch_dtype": "bfloat16",
}


def test_nemotron3_nano_takes_heads_times_head_dim(tmp_path):
    spec = load_config(write(tmp_path, NEMOTRON3_NANO))
    assert spec.bytes_per_token(16) == 6 * 2 * 2 * 128 * 2 == 6_144  # 6 attention layers, 2 KV heads of 128
    # 23 Mamba-2 layers, inner width 64 · 64 = 4096 (not expand · hidden = 5376): conv (4 − 1) · (4096 + 2 · 8 ·
    # 128) = 18,432 scalars bf16 = 36,864 B; SSM 64 · 64 · 128 = 524,288 scalars fp32 (NemotronH's cache dtype)
    # = 2,097,152 B; 2,134,016 B each, 49,082,368 B a sequence
    assert spec.state_bits() // 8 == 23 * (18_432 * 2 + 524_288 * 4) == 49_082_368


# https://huggingface.co/mistralai/Mamba-Codestral-7B-v0.1/blob/main/config.json: a pure Mamba-2 model (no
# attention: `conv_kernel` was refused and num_attention_heads missing)
MAMBA_CODESTRAL = {
    "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "hidden_size": 4096, "num_hidden_layers": 64,
    "num_heads": 128, "head_dim": 64, "expand": 2, "n_groups": 8, "state_size": 128, "conv_kernel": 4,
    "chunk_size": 256, "residual_in_fp32": True, "use_conv_bias": True, "vocab_size": 32768,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_mamba2_codestral_keeps_no_kv_only_state(tmp_path):
    spec = load_config(write(tmp_path, MAMBA_CODESTRAL))
    assert (spec.layers, spec.keeps_kv, spec.model_layers) == (0, False, 64)
    assert spec.kv_bits(1_000_000, 16) == 0
    # 64 layers: conv (4 − 1) · (8192 + 2 · 8 · 128) = 30,720 scalars; SSM 128 · 64 · 128 = 1,048,576 scalars;
    # bf16 both (no mamba_ssm_cache_dtype: vLLM's auto = the model dtype): 2,158,592 B each, 138,149,888 B
    assert spec.state_bits() // 8 == 64 * (30_720 + 1_048_576) * 2 == 138_149_888
    size = compute_size(spec, "bf16", tokens=32768, seqs=4, memory_bytes=10 * 2**30)
    assert size.bytes_per_token == 0 and size.bytes_per_seq == 138_149_888 and size.total_bytes == 4 * 138_149_888
    assert size.capacity.max_seqs == 10 * 2**30 // 138_149_888 == 77  # 10 GiB / 131.75 MiB a sequence
    # --tp 2: 64 heads, 4096 inner and 4 groups a GPU: conv 3 · (4096 + 2 · 4 · 128) = 15,360; SSM 64 · 64 · 128
    assert spec.state_bits(2) // 8 == 64 * (15_360 + 524_288) * 2
    with pytest.raises(ValueError, match="expand 4 · hidden_size 4096 = 16384 is not num_heads 128 · head_dim 64"):
        load_config(write(tmp_path, {**MAMBA_CODESTRAL, "expand": 4}, folder="bad"))


# https://huggingface.co/tiiuae/falcon-mamba-7b/blob/main/config.json: Mamba-1, no attention (`expand` 16 is
# overridden by intermediate_size 8192, as transformers' config sets the saved value last)
FALCON_MAMBA_7B = {
    "architectures": ["FalconMambaForCausalLM"], "model_type": "falcon_mamba", "hidden_size": 4096,
    "num_hidden_layers": 64, "intermediate_size": 8192, "expand": 16, "state_size": 16, "conv_kernel": 4,
    "time_step_rank": 256, "residual_in_fp32": True, "use_conv_bias": True, "use_bias": False,
    "vocab_size": 65024, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_falcon_mamba_keeps_no_kv_only_state(tmp_path):
    spec = load_config(write(tmp_path, FALCON_MAMBA_7B))
    assert spec.layers == 0 and spec.max_position_embeddings is None
    # 64 layers: conv 8192 · (4 − 1) + SSM 8192 · 16 = 155,648 bf16 scalars = 311,296 B each
    assert spec.state_bits() // 8 == 64 * (8192 * 3 + 8192 * 16) * 2 == 19_922_944
    # --tp 4 (vLLM splits d_inner): a quarter of each
    assert spec.state_bits(4) // 8 == 19_922_944 // 4


@pytest.mark.parametrize(("config", "published"), [
    (FALCON_MAMBA_7B, 7.27e9),  # model card
    (MAMBA_CODESTRAL, 7.285e9),  # 7,285,403,648 in the safetensors index
], ids=["falcon_mamba", "mamba2"])
def test_pure_recurrent_weights_match_published_counts(tmp_path, config, published):
    from kvcalc.core.model.weights import estimate_params

    assert estimate_params(load_config(write(tmp_path, config))).total == pytest.approx(published, rel=0.01)


# https://huggingface.co/RWKV/rwkv-4-169m-pile/blob/main/config.json: RWKV-4, no num_attention_heads at all
RWKV4_169M = {
    "architectures": ["RwkvForCausalLM"], "model_type": "rwkv", "hidden_size": 768, "attention_hidden_size": 768,
    "intermediate_size": 3072, "num_hidden_layers": 12, "context_length": 1024, "vocab_size": 50277,
    "rescale_every": 6, "tie_word_embeddings": False, "torch_dtype": "float32",
}


def test_rwkv4_keeps_no_kv_only_state(tmp_path):
    spec = load_config(write(tmp_path, RWKV4_169M))
    assert (spec.layers, spec.max_position_embeddings) == (0, 1024)
    # transformers' RwkvModel: 5 vectors of hidden_size per layer, 2 in the model dtype (fp32 here), 3 in fp32:
    # 768 · (2 · 4 + 3 · 4) = 15,360 B a layer, 184,320 B a sequence
    assert spec.state_bits() // 8 == 12 * 768 * (2 * 4 + 3 * 4) == 184_320
    bf16 = load_config(write(tmp_path, {**RWKV4_169M, "torch_dtype": "bfloat16"}, folder="bf16"))
    assert bf16.state_bits() // 8 == 12 * 768 * (2 * 2 + 3 * 4) == 147_456  # the wkv vectors stay fp32
    with pytest.raises(ValueError, match="tp 2: RWKV-4 has no tensor-parallel split"):
        spec.state_bits(2)
    from kvcalc.core.model.weights import estimate_params

    # 12 layers · (time mixing 4 h² + channel mixing: receptance h² + key, value 2 · h · 3072) + embedding and
    # head 2 · 50,277 · 768 = 92,012,544 + 77,225,472 = 169,238,016 (the model's name: 169M)
    assert estimate_params(spec).total == 12 * (5 * 768 * 768 + 2 * 768 * 3072) + 2 * 50277 * 768 == 169_238_016


# https://huggingface.co/LiquidAI/LFM2-1.2B/blob/main/config.json: 6 attention and 10 short-convolution layers;
# `conv_dim_out` (the output projection's width) was refused
LFM2_12B = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "hidden_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "conv_L_cache": 3, "conv_bias": False, "conv_dim": 2048,
    "conv_dim_out": 2048, "full_attn_idxs": [2, 5, 8, 10, 12, 14], "block_dim": 2048, "block_ff_dim": 12288,
    "intermediate_size": 12288, "max_position_embeddings": 128000, "vocab_size": 65536, "torch_dtype": "bfloat16",
}


def test_lfm2_12b(tmp_path):
    spec = load_config(write(tmp_path, LFM2_12B))
    assert spec.bytes_per_token(16) == 6 * 2 * 8 * 64 * 2 == 12_288  # head dim 2048 / 32 = 64
    # 10 conv layers: (3 − 1) · 2048 bf16 scalars = 8,192 B each (vLLM's short-conv state: conv_L_cache − 1 rows)
    assert spec.state_bits() // 8 == 10 * 2 * 2048 * 2 == 81_920


# https://huggingface.co/microsoft/Phi-4-mini-instruct/blob/main/config.json: Phi-3 architecture;
# `full_attn_mod` (read by no Phi-3 engine) was refused; the 262,144 window exceeds any context it serves
PHI4_MINI = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "num_hidden_layers": 32,
    "num_attention_heads": 24, "num_key_value_heads": 8, "intermediate_size": 8192, "full_attn_mod": 1,
    "sliding_window": 262144, "partial_rotary_factor": 0.75, "max_position_embeddings": 131072,
    "vocab_size": 200064, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}


def test_phi4_mini(tmp_path):
    spec = load_config(write(tmp_path, PHI4_MINI))
    assert spec.bytes_per_token(16) == 32 * 2 * 8 * 128 * 2 == 131_072  # head dim 3072 / 24 = 128
    assert spec.kv_bytes(131072, 16) == 131_072 * 131072  # every token of the longest context held


# GLM-5 (glm_moe_dsa, as a public C++ test quotes the released config.json): MLA + DeepSeek sparse attention,
# whose `indexer_types` mark the layers that carry an indexer ("full") and those that reuse one ("shared": no
# indexer keys cached); the MTP layer shares the indexer too (index_share_for_mtp_iteration). The file generates
# indexer_types; here: full on the first 3 layers and every 4th after (index_skip_topk_offset 3, index_topk_freq 4)
GLM5_TYPES = ["full" if i < 3 or (i - 3) % 4 == 0 else "shared" for i in range(78)]
GLM5 = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "hidden_size": 6144,
    "num_hidden_layers": 78, "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 192,
    "kv_lora_rank": 512, "q_lora_rank": 2048, "qk_head_dim": 256, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64,
    "v_head_dim": 256, "index_head_dim": 128, "index_n_heads": 32, "index_topk": 2048, "index_topk_freq": 4,
    "index_skip_topk_offset": 3, "index_share_for_mtp_iteration": True, "indexer_types": GLM5_TYPES,
    "indexer_rope_interleave": True,
    "num_nextn_predict_layers": 1, "first_k_dense_replace": 3, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "intermediate_size": 12288,
    "max_position_embeddings": 1048576, "vocab_size": 154880, "dtype": "bfloat16",
}


def test_glm5_shared_indexers_and_mtp_layer(tmp_path):
    from kvcalc.core.model.models import with_drafter

    spec = load_config(write(tmp_path, GLM5))
    assert GLM5_TYPES.count("full") == 3 + 19 == 22
    assert not any("ignored (not among" in note for note in spec.notes)
    # 78 MLA layers · (512 + 64) · 2 B = 89,856 B, plus the indexer keys of the 22 "full" layers: 22 · (128 fp8 +
    # one float32 scale) = 2,904 B: 92,760 B a token
    assert spec.bytes_per_token(16) == 78 * 576 * 2 + 22 * 132 == 92_760
    # --spec-method mtp: one more MLA layer, without indexer keys of its own: + 1,152 B
    assert with_drafter(spec, "mtp")[0].bytes_per_token(16) == 92_760 + 1_152 == 93_912
    everywhere = load_config(write(tmp_path, {k: v for k, v in GLM5.items() if k != "indexer_types"}, folder="all"))
    assert everywhere.bytes_per_token(16) == 78 * (1_152 + 132) == 100_152
    with pytest.raises(ValueError, match="indexer_types must give each of the 78 layers 'full' or 'shared'"):
        load_config(write(tmp_path, {**GLM5, "indexer_types": ["dense"] * 78}, folder="bad"))


# DeepSeek-V4 (Flash-like, dimensions as vLLM / SGLang / Megatron readers of it show them): compressed sparse
# attention. Each layer keeps a 128-token window plus a cache compressed 4× or 128× (compress_ratios) and an
# indexer's keys; no reader in kvcalc models that, and taking the file as plain attention gave 11.3 MB per 32K.
DEEPSEEK_V4 = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": 4096,
    "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
    "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [0], "compress_rope_theta": 160000, "sliding_window": 128,
    "window_size": 128, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "n_routed_experts": 256,
    "num_experts_per_tok": 6, "moe_intermediate_size": 2048, "num_nextn_predict_layers": 1,
    "max_position_embeddings": 1048576, "vocab_size": 129280, "torch_dtype": "bfloat16",
}


def test_deepseek_v4_is_refused_naming_its_architecture_and_every_unread_field(tmp_path):
    with pytest.raises(ValueError) as refused:
        load_config(write(tmp_path, DEEPSEEK_V4))
    message = str(refused.value)
    assert "\n" not in message and "model_type 'deepseek_v4' is not an architecture kvcalc knows" in message
    for field in ("q_lora_rank", "compress_ratios", "window_size", "index_n_heads", "index_head_dim", "index_topk"):
        assert field in message
    assert "remove" not in message and "compressed sparse attention" in message
    # with every one of those fields deleted it would read as 43 sliding layers of one 512-wide head:
    # 43 · 128 tokens · 2 · 512 · 2 B = 11,272,192 B per 32K sequence (the 11.3 MB, ~19x too little);
    # the model_type alone is refused
    stripped = {k: v for k, v in DEEPSEEK_V4.items()
                if k not in ("q_lora_rank", "compress_ratios", "window_size", "index_n_heads", "index_head_dim",
                             "index_topk", "qk_rope_head_dim")}
    with pytest.raises(ValueError, match="model_type 'deepseek_v4' is not an architecture kvcalc knows"):
        load_config(write(tmp_path, stripped, folder="stripped"))
    as_plain = load_config(write(tmp_path, {**stripped, "model_type": "llama"}, folder="plain"))
    assert as_plain.kv_bytes(32768, 16) == 43 * 128 * 2 * 512 * 2 == 11_272_192


KNOWN = {"kimi_k3": KIMI_K3, "falcon_h1": FALCON_H1_05B, "nemotron3_nano": NEMOTRON3_NANO, "mamba2": MAMBA_CODESTRAL,
         "falcon_mamba": FALCON_MAMBA_7B, "rwkv": RWKV4_169M, "lfm2": LFM2_12B, "phi4_mini": PHI4_MINI}


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_a_field_of_a_known_architecture_that_it_does_not_read_is_ignored_and_named(tmp_path, name):
    """Any extra field (a new activation constant, a training flag) leaves a known architecture's KV as it was;
    the fields the family documents as not its cache's (hf_families.IGNORED) pass silently, others are named."""
    config = KNOWN[name]
    base = load_config(write(tmp_path, config))
    assert not any("ignored (not among" in note for note in base.notes)
    extra = {"linear_new_constant": 1.5, "mamba_new_flag": True}
    if "text_config" in config:
        changed = {**config, "text_config": {**config["text_config"], **extra}}
    else:
        changed = {**config, **extra}
    again = load_config(write(tmp_path, changed, folder="extra"))
    assert (again.layer_groups, again.state_bits()) == (base.layer_groups, base.state_bits())
    assert any(": linear_new_constant, mamba_new_flag ignored (not among the fields kvcalc reads" in note
               for note in again.notes)


def test_every_real_config_of_a_known_architecture_is_read_without_an_unexplained_field(tmp_path):
    """The 2024–26 configs of test_real_configs.py: whatever their family does not read is documented."""
    import importlib.util
    from pathlib import Path

    location = importlib.util.spec_from_file_location("real_configs", Path(__file__).with_name("test_real_configs.py"))
    test_real_configs = importlib.util.module_from_spec(location)
    location.loader.exec_module(test_real_configs)
    configs = {name: value for name, value in vars(test_real_configs).items()
               if name.isupper() and isinstance(value, dict) and "model_type" in value}
    assert len(configs) >= 30
    for name, config in configs.items():
        spec = load_config(write(tmp_path, config, folder=name))
        assert not any("ignored (not among" in note for note in spec.notes), (name, spec.notes)


def test_pure_recurrent_models_are_sized_by_size_and_refused_by_paging_commands(tmp_path, run_cli):
    from kvcalc.core.model.models import resolve_model

    folder = write(tmp_path, MAMBA_CODESTRAL)
    with pytest.raises(ValueError, match=r"no KV cache \(every layer is recurrent: a state of 138,149,888 B per seq"):
        resolve_model(None, folder)
    assert resolve_model(None, folder, kv_free=True).state_bits() // 8 == 138_149_888
    doc = run_cli("size", "--config", str(folder), "--tokens", "32768", "--memory", "10GiB", "--json").json()
    assert doc["model"]["layers"] == 0 and doc["bytes_per_token"] == 0 and doc["bytes_per_seq"] == 138_149_888
    table = run_cli("size", "--config", str(folder), "--tokens", "32768").stdout
    assert table.startswith("model: no KV cache, 0 of 64 layers keep KV (64 mamba2): a constant recurrent state")
    result = run_cli("share", "--config", str(folder))
    assert result.exit_code == 2 and "keeps no KV cache" in result.stderr


def test_the_cli_refuses_deepseek_v4_in_one_line(tmp_path, run_cli):
    result = run_cli("size", "--config", str(write(tmp_path, DEEPSEEK_V4)), "--tokens", "32768")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "model_type 'deepseek_v4'" in result.stderr
