"""Real config.json files of 2024–26 models (trimmed to the fields kvcalc reads, plus a few it must not trip
over), each with its KV computed by hand; where transformers has the model's config class, its own
`layer_types` is the independent check of which layer is which. The file is long because each config sits
next to its own arithmetic; the second half holds configs checked after the readers were written."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.weights import estimate_params

pytestmark = pytest.mark.filterwarnings("ignore")


def write(tmp_path, config, folder="model"):
    directory = tmp_path / folder
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def kinds(spec) -> Counter:
    """Layers by kind ('none' for recurrent, MLP-only, no-op and KV-shared layers)."""
    out: Counter = Counter()
    for g in spec.layer_groups:
        out[g.kind] += g.count
    return out


def transformers_kinds(model_type: str, config: dict) -> Counter:
    """The same count from transformers' own config class (layer_types / layers_block_type)."""
    transformers = pytest.importorskip("transformers")
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "text_config")}
    c = transformers.AutoConfig.for_model(model_type, **fields)
    names = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked"}
    return Counter(names.get(t, "none") for t in (getattr(c, "layer_types", None) or c.layers_block_type))


# https://huggingface.co/nvidia/Nemotron-H-56B-Base-8K/blob/main/config.json (118 layers: 54 M, 54 -, 10 *)
NEMOTRON_H_56B = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 8192,
    "num_hidden_layers": 118, "num_attention_heads": 64, "num_key_value_heads": 8, "attention_head_dim": 128,
    "hybrid_override_pattern": "M-M-M-M*-" + "M-M-M-M-M*-" * 9 + "M-M-M-M-M-",
    "mamba_num_heads": 256, "mamba_head_dim": 64, "ssm_state_size": 256, "n_groups": 8, "conv_kernel": 4,
    "expand": 2, "chunk_size": 128, "mamba_hidden_act": "silu", "use_mamba_kernels": True, "mlp_hidden_act": "relu2",
    "intermediate_size": 32768, "vocab_size": 131072, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def test_nemotron_h_56b(tmp_path):
    spec = load_config(write(tmp_path, NEMOTRON_H_56B))
    assert kinds(spec) == Counter({"full": 10, "none": 108}) == transformers_kinds("nemotron_h", NEMOTRON_H_56B)
    # 10 attention layers · 2 (K, V) · 8 KV heads · 128 · 2 B = 40,960 B per token (the 118 layers gave 483,328)
    assert spec.bytes_per_token(16) == 40_960
    # 54 Mamba-2 layers, each: conv (4 − 1) · (16384 + 2 · 8 · 256) = 61,440 scalars in bf16 = 122,880 B, and
    # SSM 256 heads · 64 · 256 = 4,194,304 scalars in fp32 (NemotronH's mamba_ssm_cache_dtype) = 16,777,216 B.
    assert spec.state_bits() == 54 * (122_880 + 16_777_216) * 8 == 912_605_184 * 8


# https://huggingface.co/ai21labs/AI21-Jamba-1.5-Mini/blob/main/config.json
JAMBA_15_MINI = {
    "architectures": ["JambaForCausalLM"], "model_type": "jamba", "attn_layer_offset": 4, "attn_layer_period": 8,
    "expert_layer_offset": 1, "expert_layer_period": 2, "hidden_size": 4096, "intermediate_size": 14336,
    "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_state": 16, "mamba_dt_rank": 256, "mamba_expand": 2,
    "mamba_proj_bias": False, "max_position_embeddings": 262144, "num_attention_heads": 32, "num_experts": 16,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 65536,
}


def test_jamba(tmp_path):
    spec = load_config(write(tmp_path, JAMBA_15_MINI))
    assert kinds(spec) == Counter({"full": 4, "none": 28}) == transformers_kinds("jamba", JAMBA_15_MINI)
    assert spec.bytes_per_token(16) == 4 * 2 * 8 * 128 * 2 == 16_384  # layers 4, 12, 20, 28 (was 131,072)
    # 28 Mamba-1 layers: d_inner 2 · 4096 = 8192; conv 8192 · 3 + SSM 8192 · 16 scalars, bf16 (no state dtype named)
    assert spec.state_bits() == 28 * (8192 * 3 + 8192 * 16) * 16


# https://huggingface.co/MiniMaxAI/MiniMax-M1-80k/blob/main/config.json (layernorm_* residual scales kept:
# they must not be taken for layer fields)
MINIMAX_M1 = {
    "architectures": ["MiniMaxM1ForCausalLM"], "model_type": "minimax_m1", "attn_type_list": ([0] * 7 + [1]) * 10,
    "head_dim": 128, "hidden_size": 6144, "intermediate_size": 9216,
    "layernorm_full_attention_alpha": 3.5565588200778455,
    "layernorm_linear_attention_alpha": 3.5565588200778455, "layernorm_mlp_alpha": 3.5565588200778455,
    "max_position_embeddings": 10240000, "num_attention_heads": 64, "num_experts_per_tok": 2,
    "num_hidden_layers": 80, "num_key_value_heads": 8, "num_local_experts": 32, "postnorm": True, "rotary_dim": 64,
    "shared_intermediate_size": 0, "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 200064,
    "torch_dtype": "bfloat16",
}


def test_minimax_m1(tmp_path):
    spec = load_config(write(tmp_path, MINIMAX_M1))
    assert kinds(spec) == Counter({"full": 10, "none": 70})
    assert spec.bytes_per_token(16) == 10 * 2 * 8 * 128 * 2 == 40_960  # was 327,680 (all 80 layers)
    # 70 lightning-attention layers: a 64-head state of 128 × 128 each, in the model dtype (bf16)
    assert spec.state_bits() == 70 * 64 * 128 * 128 * 16


# https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E/blob/main/config.json (no_rope_layers is [] there:
# transformers derives one NoPE layer in every 4)
LLAMA4_SCOUT = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "text_config": {
        "model_type": "llama4_text", "attention_chunk_size": 8192, "head_dim": 128, "hidden_size": 5120,
        "intermediate_size": 8192, "intermediate_size_mlp": 16384, "interleave_moe_layer_step": 1,
        "max_position_embeddings": 10485760, "no_rope_layers": [], "num_attention_heads": 40,
        "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16,
        "vocab_size": 202048, "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    },
}


@pytest.mark.parametrize("no_rope", [[], [1, 1, 1, 0] * 12])
def test_llama4_scout(tmp_path, no_rope):
    config = {**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"], "no_rope_layers": no_rope}}
    spec = load_config(write(tmp_path, config))
    assert kinds(spec) == Counter({"chunked": 36, "full": 12}) == transformers_kinds(
        "llama4_text", config["text_config"])
    # 32,768 tokens: 12 global layers hold 32,768, 36 chunked layers at most one chunk of 8,192, each token-layer
    # 2 · 8 · 128 · 2 = 4,096 B: (12 · 32,768 + 36 · 8,192) · 4,096 = 2,818,572,288 (not 6,442,450,944)
    assert spec.kv_bytes(32768, 16) == (12 * 32768 + 36 * 8192) * 4096 == 2_818_572_288


# https://huggingface.co/XiaomiMiMo/MiMo-V2-Flash/blob/main/config.json: full attention at layers 0, 5, 11,
# 17, ..., 47 (9 of 48), sliding window 128 elsewhere with its own heads; V heads 128 wide, K heads 192.
MIMO_V2_FLASH = {
    "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash", "hidden_size": 4096,
    "num_hidden_layers": 48, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192, "v_head_dim": 128,
    "swa_num_attention_heads": 64, "swa_num_key_value_heads": 8, "swa_head_dim": 192, "swa_v_head_dim": 128,
    "sliding_window": 128, "sliding_window_size": 128, "attention_chunk_size": 128, "hybrid_block_size": None,
    "hybrid_layer_pattern": [0 if i in {0, 5, 11, 17, 23, 29, 35, 41, 47} else 1 for i in range(48)],
    "moe_layer_freq": [0] + [1] * 47, "add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False,
    "swa_rope_theta": 10000, "rope_theta": 5000000, "partial_rotary_factor": 0.334, "attention_value_scale": 0.707,
    "intermediate_size": 16384, "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "n_shared_experts": None, "max_position_embeddings": 262144, "vocab_size": 152576, "torch_dtype": "bfloat16",
}


def test_mimo_v2_flash(tmp_path):
    spec = load_config(write(tmp_path, MIMO_V2_FLASH))
    assert kinds(spec) == Counter({"full": 9, "sliding": 39})
    # per token: 9 · 4 heads · (192 + 128) · 2 B + 39 · 8 heads · 320 · 2 B = 23,040 + 199,680 = 222,720
    assert spec.bytes_per_token(16) == 222_720
    # 32K: full layers every token, sliding ones 128: 9 · 32,768 · 2,560 + 39 · 128 · 5,120 = 780,533,760
    # (the window on all 48 layers with the full-layer heads gave 48 · 128 · 2 · 4 · 192 · 2 = 18,874,368: 41×)
    assert spec.kv_bytes(32768, 16) == 9 * 32768 * 2560 + 39 * 128 * 5120 == 780_533_760


# https://huggingface.co/nvidia/Llama-3_3-Nemotron-Super-49B-v1/blob/main/config.json: 80 blocks, 31 of them
# no-op attention; the others 64 / 8 = 8 KV heads (num_key_value_heads is null).
_ATTN, _NOOP = 8, None
_SUPER_BLOCKS = ([_ATTN] * 6 + [_NOOP] * 2 + [_ATTN] * 3 + [_NOOP] + [_ATTN] * 30 + [_NOOP] * 10 + [_ATTN]
                 + [_NOOP] * 18 + [_ATTN] * 9)
_SUPER_FFN_MULTS = ([2.625] + [5.25] * 5 + [2.625] * 2 + [5.25] * 3 + [3.28125] + [5.25] * 30
                    + [1.3125, 2.625, 2.625, 1.3125, 5.25, 1.3125, 2.625, 1.3125, 1.3125, 1.3125] + [5.25]
                    + [1.3125, 1.0, 1.0, 1.3125, 1.0, 1.0, 1.0, 1.3125, 1.3125, 0.5, 0.5, 1.0, 1.0, 0.5, 0.5]
                    + [1.0, 0.5, 0.5] + [5.25] * 9)
NEMOTRON_SUPER_49B = {
    "architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas", "hidden_size": 8192,
    "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": None, "intermediate_size": None,
    "max_position_embeddings": 131072, "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "block_configs": [
        {"attention": {"n_heads_in_group": group, "no_op": group is None, "num_sink_tokens": None,
                       "replace_with_linear": False, "sparsify": None, "unshifted_sink": False,
                       "use_prefill_window_in_sink_attention": False, "window_length": None},
         "ffn": {"ffn_mult": mult, "no_op": False, "replace_with_linear": False, "sparsify": None}}
        for group, mult in zip(_SUPER_BLOCKS, _SUPER_FFN_MULTS, strict=True)
    ],
}


def test_llama_nemotron_super_49b(tmp_path):
    assert len(_SUPER_BLOCKS) == 80 and _SUPER_BLOCKS.count(None) == 31
    spec = load_config(write(tmp_path, NEMOTRON_SUPER_49B))
    assert kinds(spec) == Counter({"full": 49, "none": 31})
    assert spec.bytes_per_token(16) == 49 * 2 * 8 * 128 * 2 == 200_704  # was 2,621,440 (80 layers of 64 heads)


# https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json (text_config)
GEMMA3_27B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
    "text_config": {"model_type": "gemma3_text", "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 168, "rope_local_base_freq": 10000.0, "sliding_window": 1024,
                    "sliding_window_pattern": 6, "max_position_embeddings": 131072, "vocab_size": 262208},
    "torch_dtype": "bfloat16",
}


def test_gemma3_27b(tmp_path):
    spec = load_config(write(tmp_path, GEMMA3_27B))
    assert kinds(spec) == Counter({"sliding": 52, "full": 10}) == transformers_kinds(
        "gemma3_text", GEMMA3_27B["text_config"])
    assert spec.bytes_per_token(16) == 62 * 2 * 16 * 128 * 2 == 507_904
    # 32K: 10 global layers · 32,768 + 52 sliding · 1,024 tokens, 8,192 B each
    assert spec.kv_bytes(32768, 16) == (10 * 32768 + 52 * 1024) * 8192 == 3_120_562_176


# https://huggingface.co/google/gemma-4-31B/blob/main/config.json (text_config): full layers have 4 KV heads of
# 512 (global_head_dim, num_global_key_value_heads with attention_k_eq_v), sliding ones 16 of 256.
GEMMA4_31B = {
    "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
    "text_config": {
        "model_type": "gemma4_text", "attention_k_eq_v": True, "enable_moe_block": False, "global_head_dim": 512,
        "head_dim": 256, "hidden_size": 5376, "hidden_size_per_layer_input": 0, "intermediate_size": 21504,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10, "max_position_embeddings": 262144,
        "num_attention_heads": 32, "num_experts": None, "num_global_key_value_heads": 4, "num_hidden_layers": 60,
        "num_key_value_heads": 16, "num_kv_shared_layers": 0, "sliding_window": 1024, "top_k_experts": None,
        "vocab_size": 262144, "tie_word_embeddings": True,
    },
    "dtype": "bfloat16",
}


def test_gemma4_31b(tmp_path):
    spec = load_config(write(tmp_path, GEMMA4_31B))
    assert kinds(spec) == Counter({"sliding": 50, "full": 10}) == transformers_kinds(
        "gemma4_text", GEMMA4_31B["text_config"])
    full = next(g for g in spec.layer_groups if g.kind == "full")
    assert (full.kv_heads, full.k_head_dim, full.v_head_dim) == (4, 512, 512)
    # 50 · 2 · 16 · 256 · 2 + 10 · 2 · 4 · 512 · 2 = 819,200 + 81,920 (K = V shares a projection; both are cached)
    assert spec.bytes_per_token(16) == 901_120
    assert spec.kv_bytes(32768, 16) == 50 * 1024 * 16384 + 10 * 32768 * 8192
    assert spec.num_experts is None


# https://huggingface.co/google/gemma-4-E4B/blob/main/config.json (text_config): the last 18 of 42 layers reuse
# the KV of earlier ones; without attention_k_eq_v, full layers keep num_key_value_heads.
GEMMA4_E4B = {
    "model_type": "gemma4",
    "text_config": {
        "model_type": "gemma4_text", "hidden_size": 2560, "num_hidden_layers": 42, "intermediate_size": 10240,
        "num_attention_heads": 8, "head_dim": 256, "global_head_dim": 512, "vocab_size": 262144,
        "num_key_value_heads": 2, "sliding_window": 512, "hidden_size_per_layer_input": 256,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 7, "max_position_embeddings": 131072,
        "final_logit_softcapping": 30.0, "num_kv_shared_layers": 18, "attention_k_eq_v": False,
    },
}


def test_gemma4_e4b_kv_sharing(tmp_path):
    spec = load_config(write(tmp_path, GEMMA4_E4B))
    # layers 0..23 keep KV: full at 5, 11, 17, 23, the other 20 sliding; 18 shared layers add none
    assert kinds(spec) == Counter({"sliding": 20, "full": 4, "none": 18})
    # 20 · 2 · 2 · 256 · 2 + 4 · 2 · 2 · 512 · 2 = 40,960 + 16,384
    assert spec.bytes_per_token(16) == 57_344


def test_gemma4_moe_names_top_k_experts(tmp_path):
    # gemma-4-26B-A4B: 30 layers (full at 5, 11, 17, 23, 29), 8 KV heads of 256, full layers 2 of 512; 128 experts
    config = {"model_type": "gemma4_text", "num_hidden_layers": 30, "num_attention_heads": 16, "hidden_size": 2816,
              "head_dim": 256, "global_head_dim": 512, "num_key_value_heads": 8, "num_global_key_value_heads": 2,
              "attention_k_eq_v": True, "sliding_window": 1024, "enable_moe_block": True, "num_experts": 128,
              "top_k_experts": 8, "moe_intermediate_size": 704, "intermediate_size": 2112, "vocab_size": 262144}
    spec = load_config(write(tmp_path, config))
    assert (spec.num_experts, spec.experts_per_token) == (128, 8)  # was refused: "add num_experts_per_tok"
    assert spec.bytes_per_token(16) == 25 * 2 * 8 * 256 * 2 + 5 * 2 * 2 * 512 * 2 == 225_280


# https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json (no layer_types: every 4th full)
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "intermediate_size": 5120, "vocab_size": 151936, "max_position_embeddings": 262144, "torch_dtype": "bfloat16",
    "partial_rotary_factor": 0.25, "tie_word_embeddings": False,
}


def test_qwen3_next(tmp_path):
    spec = load_config(write(tmp_path, QWEN3_NEXT))
    assert kinds(spec) == Counter({"full": 12, "none": 36}) == transformers_kinds("qwen3_next", QWEN3_NEXT)
    assert spec.bytes_per_token(16) == 12 * 2 * 2 * 256 * 2 == 24_576
    # 36 Gated DeltaNet layers: conv 3 · (2 · 16 · 128 + 32 · 128) = 24,576 and recurrent 32 · 128 · 128 scalars, bf16
    assert spec.state_bits() == 36 * (24_576 + 524_288) * 16


# https://huggingface.co/Qwen/Qwen3.5-27B/blob/main/config.json (text_config): the recurrent state in float32
QWEN35_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text", "attn_output_gate": True, "dtype": "bfloat16", "full_attention_interval": 4,
        "head_dim": 256, "hidden_size": 5120, "intermediate_size": 17408,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(64)],
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 48, "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144, "mtp_num_hidden_layers": 1, "num_attention_heads": 24,
        "num_hidden_layers": 64, "num_key_value_heads": 4, "tie_word_embeddings": False, "vocab_size": 248320,
    },
    "tie_word_embeddings": False,
}


def test_qwen35_27b(tmp_path):
    spec = load_config(write(tmp_path, QWEN35_27B))
    assert kinds(spec) == Counter({"full": 16, "none": 48}) == transformers_kinds(
        "qwen3_5_text", QWEN35_27B["text_config"])
    assert spec.bytes_per_token(16) == 16 * 2 * 4 * 256 * 2 == 65_536
    # 48 layers: conv 3 · (2 · 16 · 128 + 48 · 128) = 30,720 bf16 scalars + recurrent 48 · 128 · 128 fp32 ones
    assert spec.state_bits() // 8 == 48 * (30_720 * 2 + 786_432 * 4) == 153_944_064


# https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json
GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880,
    "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
    "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "initial_context_length": 4096,
    "max_position_embeddings": 131072, "vocab_size": 201088, "swiglu_limit": 7.0, "attention_bias": True,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_gpt_oss_120b(tmp_path):
    spec = load_config(write(tmp_path, GPT_OSS_120B))
    assert kinds(spec) == Counter({"sliding": 18, "full": 18}) == transformers_kinds("gpt_oss", GPT_OSS_120B)
    assert spec.bytes_per_token(16) == 36 * 2 * 8 * 64 * 2 == 73_728
    assert spec.kv_bytes(32768, 16) == 18 * 32768 * 2048 + 18 * 128 * 2048


# https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "first_k_dense_replace": 3,
    "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 129280, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_deepseek_v3(tmp_path):
    spec = load_config(write(tmp_path, DEEPSEEK_V3))
    assert kinds(spec) == Counter({"mla": 61})
    assert spec.bytes_per_token(16) == 61 * (512 + 64) * 2 == 70_272  # one latent, no factor 2


# https://huggingface.co/deepseek-ai/DeepSeek-V3.2-Exp/blob/main/config.json: MLA plus the sparse-attention
# indexer's own key cache
DEEPSEEK_V32 = {**DEEPSEEK_V3, "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
                "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}


def test_deepseek_v32_indexer_cache(tmp_path):
    spec = load_config(write(tmp_path, DEEPSEEK_V32))
    # per token per layer: the 576-scalar latent at 2 B + the indexer's 128 fp8 keys and 1 float32 scale (132 B)
    assert spec.bytes_per_token(16) == 61 * (576 * 2 + 132) == 78_324
    assert spec.bytes_per_token(8) == 61 * (576 + 132)  # the indexer keeps its own precision


# https://huggingface.co/tiiuae/falcon-7b/blob/main/config.json: no max_position_embeddings
FALCON_7B = {
    "architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71,
    "num_hidden_layers": 32, "multi_query": True, "new_decoder_architecture": False, "parallel_attn": True,
    "bias": False, "vocab_size": 65024, "torch_dtype": "bfloat16",
}


def test_falcon_7b(tmp_path):
    spec = load_config(write(tmp_path, FALCON_7B, folder="falcon-7b"))
    assert spec.name == "falcon-7b" and spec.max_position_embeddings is None
    assert spec.bytes_per_token(16) == 2 * 32 * 1 * 64 * 2 == 8192


# --- configs checked after the readers were written (none of them was used to write a reader) ---------


# https://huggingface.co/HuggingFaceTB/SmolLM3-3B/blob/main/config.json: every 4th layer is NoPE
# (no_rope_layers 0), which changes no KV; the sliding window is off.
SMOLLM3_3B = {
    "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "hidden_size": 2048, "intermediate_size": 11008,
    "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 4, "max_position_embeddings": 65536,
    "no_rope_layers": [1, 1, 1, 0] * 9, "no_rope_layer_interval": 4, "sliding_window": None,
    "use_sliding_window": False, "max_window_layers": 28, "layer_types": ["full_attention"] * 36,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 128256,
}


def test_smollm3_3b(tmp_path):
    spec = load_config(write(tmp_path, SMOLLM3_3B))
    assert kinds(spec) == Counter({"full": 36}) == transformers_kinds("smollm3", SMOLLM3_3B)
    # head dim 2048 / 16 = 128; 36 · 2 · 4 · 128 · 2 B = 73,728 B per token; 32K: 73,728 · 32,768
    assert spec.bytes_per_token(16) == 73_728
    assert spec.kv_bytes(32768, 16) == 2_415_919_104


# https://huggingface.co/google/gemma-3n-E4B/blob/main/config.json (text_config): intermediate_size is a list
# (one per layer; it was refused as "must be a positive integer"), the last 15 of 35 layers reuse earlier KV.
GEMMA3N_E4B = {
    "architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n",
    "text_config": {
        "model_type": "gemma3n_text", "hidden_size": 2048, "hidden_size_per_layer_input": 256,
        "intermediate_size": [16384] * 35, "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 256, "sliding_window": 512, "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7,
        "num_kv_shared_layers": 15, "max_position_embeddings": 32768, "vocab_size": 262400,
        "vocab_size_per_layer_input": 262144, "activation_sparsity_pattern": [0.95] * 10 + [0.0] * 25,
        "altup_num_inputs": 4, "altup_active_idx": 0, "altup_coef_clip": 120.0, "altup_correct_scale": True,
        "laurel_rank": 64, "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256,
        "rope_local_base_freq": 10000.0, "torch_dtype": "bfloat16",
    },
    "vision_config": {"model_type": "gemma3n_vision"}, "audio_config": {"model_type": "gemma3n_audio"},
}


def test_gemma3n_e4b(tmp_path):
    spec = load_config(write(tmp_path, GEMMA3N_E4B))
    # layers 0..19 keep KV: full at 4, 9, 14, 19, the other 16 sliding (window 512); 15 shared layers add none
    assert kinds(spec) == Counter({"sliding": 16, "full": 4, "none": 15})
    # one token-layer: 2 · 2 KV heads · 256 · 2 B = 2,048 B; 20 layers: 40,960
    assert spec.bytes_per_token(16) == 40_960
    # 32K: 4 full layers · 32,768 + 16 sliding · 512 tokens, 2,048 B each = 268,435,456 + 16,777,216
    assert spec.kv_bytes(32768, 16) == 285_212_672
    assert spec.intermediate_size == 16384


# https://huggingface.co/internlm/internlm3-8b-instruct/blob/main/config.json
INTERNLM3_8B = {
    "architectures": ["InternLM3ForCausalLM"], "model_type": "internlm3", "hidden_size": 4096,
    "intermediate_size": 10240, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
    "num_hidden_layers": 48, "max_position_embeddings": 32768, "vocab_size": 128512, "bias": False, "qkv_bias": False,
    "rope_scaling": {"factor": 6.0, "rope_type": "dynamic"}, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_internlm3_8b(tmp_path):
    spec = load_config(write(tmp_path, INTERNLM3_8B))
    assert spec.bytes_per_token(16) == 48 * 2 * 2 * 128 * 2 == 49_152
    assert spec.kv_bytes(32768, 16) == 49_152 * 32768 == 1_610_612_736


# https://huggingface.co/tencent/Hunyuan-A13B-Instruct/blob/main/config.json: per-layer lists for the MoE
# (moe_topk [8, ...] was refused as "must be a positive integer"), and a cla_share_factor with cross-layer
# attention off (was refused as an unread KV field).
HUNYUAN_A13B = {
    "architectures": ["HunYuanMoEV1ForCausalLM"], "model_type": "hunyuan_v1_moe", "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "attention_head_dim": 128,
    "num_hidden_layers": 32, "intermediate_size": 3072, "moe_intermediate_size": [3072] * 32, "num_experts": 64,
    "moe_topk": [8] * 32, "num_shared_expert": [1] * 32, "use_cla": False, "cla_share_factor": 2,
    "use_mixed_mlp_moe": True, "use_qk_norm": True, "max_position_embeddings": 32768, "vocab_size": 128167,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}


def test_hunyuan_a13b(tmp_path):
    spec = load_config(write(tmp_path, HUNYUAN_A13B))
    assert (spec.num_experts, spec.experts_per_token) == (64, 8)
    assert spec.bytes_per_token(16) == 32 * 2 * 8 * 128 * 2 == 131_072
    assert spec.kv_bytes(32768, 16) == 131_072 * 32768 == 4_294_967_296
    with pytest.raises(ValueError, match="'cla_share_factor'"):  # sharing on: not modelled, so refused
        load_config(write(tmp_path, {**HUNYUAN_A13B, "use_cla": True}, folder="cla"))
    with pytest.raises(ValueError, match="'moe_topk' must be a positive integer or a list of one repeated"):
        load_config(write(tmp_path, {**HUNYUAN_A13B, "moe_topk": [8] * 31 + [4]}, folder="mixed"))


# https://huggingface.co/baidu/ERNIE-4.5-21B-A3B-PT/blob/main/config.json
ERNIE45_21B = {
    "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "hidden_size": 2560,
    "intermediate_size": 12288, "num_attention_heads": 20, "num_key_value_heads": 4, "head_dim": 128,
    "num_hidden_layers": 28, "max_position_embeddings": 131072, "moe_num_experts": 64, "moe_k": 6,
    "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": 27, "moe_layer_interval": 1,
    "moe_intermediate_size": 1536, "use_bias": False, "vocab_size": 103424, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def test_ernie45_21b_a3b(tmp_path):
    spec = load_config(write(tmp_path, ERNIE45_21B))
    assert spec.bytes_per_token(16) == 28 * 2 * 4 * 128 * 2 == 57_344
    assert spec.kv_bytes(32768, 16) == 57_344 * 32768 == 1_879_048_192


# https://huggingface.co/zai-org/GLM-4.5-Air/blob/main/config.json (96 query heads of 128 on hidden 4096: the
# head dim is given, not hidden / heads; one multi-token-prediction layer, off by default)
GLM45_AIR = {
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "first_k_dense_replace": 1, "head_dim": 128,
    "hidden_size": 4096, "intermediate_size": 10944, "max_position_embeddings": 131072, "model_type": "glm4_moe",
    "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1,
    "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46, "num_key_value_heads": 8,
    "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5, "tie_word_embeddings": False, "topk_group": 1,
    "torch_dtype": "bfloat16", "use_qk_norm": False, "vocab_size": 151552,
}


def test_glm45_air(tmp_path):
    spec = load_config(write(tmp_path, GLM45_AIR))
    assert spec.bytes_per_token(16) == 46 * 2 * 8 * 128 * 2 == 188_416
    assert spec.kv_bytes(32768, 16) == 188_416 * 32768 == 6_174_015_488


# https://huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json (DeepSeek-V3's MLA, fp8 weights)
KIMI_K2 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "first_k_dense_replace": 1,
    "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 131072,
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1,
    "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 64,
    "num_nextn_predict_layers": 0, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 163840, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}


def test_kimi_k2(tmp_path):
    spec = load_config(write(tmp_path, KIMI_K2))
    assert kinds(spec) == Counter({"mla": 61}) and spec.weight_dtype == "fp8"
    assert spec.bytes_per_token(16) == 61 * (512 + 64) * 2 == 70_272  # one latent per token-layer, no factor 2
    assert spec.kv_bytes(32768, 16) == 70_272 * 32768 == 2_302_672_896
    # transformers 5 writes qk_head_dim (nope + rope) when it saves a config: read, and checked (was refused)
    assert load_config(write(tmp_path, {**KIMI_K2, "qk_head_dim": 192}, folder="t5")).bytes_per_token(16) == 70_272
    with pytest.raises(ValueError, match="qk_head_dim 128 is not qk_nope_head_dim"):
        load_config(write(tmp_path, {**KIMI_K2, "qk_head_dim": 128}, folder="bad"))


# https://huggingface.co/Zyphra/Zamba2-2.7B/blob/main/config.json: 9 hybrid layers (a shared attention block,
# each use with its own KV, then Mamba-2) among 54 Mamba-2 layers; attention runs 5120 wide (2 · hidden).
# attention_hidden_size, num_query_groups, hybrid_layer_ids and use_conv_bias were each refused as unread.
ZAMBA2_HYBRID = (6, 12, 18, 24, 30, 36, 42, 47, 51)
ZAMBA2_27B = {
    "architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "hidden_size": 2560, "num_hidden_layers": 54,
    "num_attention_heads": 32, "num_key_value_heads": 32, "attention_hidden_size": 5120, "attention_head_dim": 160,
    "kv_channels": 80, "num_query_groups": 32, "n_mamba_heads": 80, "mamba_headdim": 64, "mamba_d_state": 64,
    "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1, "use_conv_bias": True, "use_mamba_kernels": True,
    "chunk_size": 256, "num_mem_blocks": 2, "use_shared_attention_adapter": False, "adapter_rank": 128,
    "use_mem_rope": False, "intermediate_size": 10240, "max_position_embeddings": 4096,
    "hybrid_layer_ids": list(ZAMBA2_HYBRID),
    "layers_block_type": ["hybrid" if i in ZAMBA2_HYBRID else "mamba" for i in range(54)],
    "vocab_size": 32000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}


def test_zamba2_27b(tmp_path):
    spec = load_config(write(tmp_path, ZAMBA2_27B))
    full = next(g for g in spec.layer_groups if g.kind == "full")
    assert (full.count, full.kv_heads, full.k_head_dim) == (9, 32, 160)  # 5120 / 32 heads
    assert spec.bytes_per_token(16) == 9 * 2 * 32 * 160 * 2 == 184_320
    # 54 Mamba-2 layers (45 alone, 9 in the hybrids): conv 3 · (5120 + 2 · 64) = 15,744 and SSM 80 · 64 · 64 =
    # 327,680 scalars, bf16: 686,848 B each
    assert spec.state_bits() // 8 == 54 * (15_744 + 327_680) * 2 == 37_089_792
    for bad, message in (({"num_query_groups": 8}, "num_query_groups 8 and num_key_value_heads 32 disagree"),
                         ({"attention_hidden_size": 4096}, "attention_hidden_size 4096 is not num_attention_heads"),
                         ({"mamba_expand": 4}, "mamba_expand 4 · hidden_size 2560 = 10240 is not the Mamba inner"),
                         ({"hybrid_layer_ids": [6]}, "disagree on which layers are which")):
        with pytest.raises(ValueError, match=message):
            load_config(write(tmp_path, {**ZAMBA2_27B, **bad}, folder=next(iter(bad))))


# https://huggingface.co/Qwen/Qwen2.5-72B-Instruct/blob/main/config.json: a sliding_window value with the
# window switched off (use_sliding_window false): every layer full
QWEN25_72B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 8192, "intermediate_size": 29568,
    "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8, "max_position_embeddings": 32768,
    "max_window_layers": 70, "sliding_window": 131072, "use_sliding_window": False, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 152064,
}


def test_qwen25_72b(tmp_path):
    spec = load_config(write(tmp_path, QWEN25_72B))
    assert kinds(spec) == Counter({"full": 80}) == transformers_kinds("qwen2", QWEN25_72B)
    assert spec.bytes_per_token(16) == 80 * 2 * 8 * 128 * 2 == 327_680
    assert spec.kv_bytes(32768, 16) == 327_680 * 32768 == 10_737_418_240


# https://huggingface.co/mistralai/Mistral-Small-3.1-24B-Instruct-2503/blob/main/config.json (text_config;
# the vision tower keeps no KV cache of its own)
MISTRAL_SMALL_31 = {
    "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3", "spatial_merge_size": 2,
    "text_config": {"model_type": "mistral", "head_dim": 128, "hidden_size": 5120, "intermediate_size": 32768,
                    "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 40,
                    "num_key_value_heads": 8, "sliding_window": None, "vocab_size": 131072},
    "vision_config": {"model_type": "pixtral", "head_dim": 64, "hidden_size": 1024, "num_attention_heads": 16,
                      "num_hidden_layers": 24, "patch_size": 14},
    "torch_dtype": "bfloat16",
}


def test_mistral_small_31(tmp_path):
    spec = load_config(write(tmp_path, MISTRAL_SMALL_31))
    assert spec.bytes_per_token(16) == 40 * 2 * 8 * 128 * 2 == 163_840
    assert spec.kv_bytes(32768, 16) == 163_840 * 32768 == 5_368_709_120


# https://huggingface.co/microsoft/Phi-3.5-MoE-instruct/blob/main/config.json: a sliding window on every layer,
# as long as the context (transformers' Phimoe applies it everywhere)
PHI35_MOE = {
    "architectures": ["PhiMoEForCausalLM"], "model_type": "phimoe", "hidden_size": 4096, "intermediate_size": 6400,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "num_local_experts": 16,
    "num_experts_per_tok": 2, "sliding_window": 131072, "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096, "vocab_size": 32064, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_phi35_moe(tmp_path):
    spec = load_config(write(tmp_path, PHI35_MOE))
    # the 131,072 window is no shorter than the 131,072 positions: no token ever leaves it, so the layers are
    # full attention (as a window they cost a block a request more in the pool: tests/qa/test_round6_inputs.py)
    assert kinds(spec) == Counter({"full": 32})
    assert any("window 131,072 is not shorter than the model's 131,072 positions" in n for n in spec.notes)
    assert spec.bytes_per_token(16) == 32 * 2 * 8 * 128 * 2 == 131_072
    assert spec.kv_bytes(131072, 16) == 131_072 * 131072  # every token of the longest context held


# https://huggingface.co/CohereForAI/c4ai-command-r7b-12-2024/blob/main/config.json: three sliding layers
# (window 4,096) then one global, from sliding_window_pattern 4
COMMAND_R7B = {
    "architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 32,
    "sliding_window": 4096, "sliding_window_pattern": 4, "order_of_interleaved_layers": "local_attn_first",
    "max_position_embeddings": 132096, "logit_scale": 0.25, "use_embedding_sharing": True, "vocab_size": 256000,
    "torch_dtype": "bfloat16",
}


def test_command_r7b(tmp_path):
    spec = load_config(write(tmp_path, COMMAND_R7B))
    assert kinds(spec) == Counter({"sliding": 24, "full": 8}) == transformers_kinds("cohere2", COMMAND_R7B)
    assert spec.bytes_per_token(16) == 32 * 2 * 8 * 128 * 2 == 131_072
    # 32K: 8 global layers · 32,768 + 24 sliding · 4,096 tokens, 4,096 B a token-layer
    assert spec.kv_bytes(32768, 16) == (8 * 32768 + 24 * 4096) * 4096 == 1_476_395_008
    # transformers 5 saves the pattern as _sliding_window_pattern beside layer_types (was refused as unread)
    saved = {**COMMAND_R7B, "_sliding_window_pattern": 4,
             "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"] * 8}
    del saved["sliding_window_pattern"]
    assert load_config(write(tmp_path, saved, folder="t5")).kv_bytes(32768, 16) == 1_476_395_008


# https://huggingface.co/allenai/OLMo-2-1124-13B/blob/main/config.json (MHA: 40 KV heads; weights in float32)
OLMO2_13B = {
    "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "hidden_size": 5120, "intermediate_size": 13824,
    "num_attention_heads": 40, "num_key_value_heads": 40, "num_hidden_layers": 40, "max_position_embeddings": 4096,
    "vocab_size": 100352, "tie_word_embeddings": False, "torch_dtype": "float32",
}


def test_olmo2_13b(tmp_path):
    spec = load_config(write(tmp_path, OLMO2_13B))
    assert spec.bytes_per_token(16) == 40 * 2 * 40 * 128 * 2 == 819_200  # KV at bf16, whatever the weights
    assert spec.kv_bytes(4096, 16) == 819_200 * 4096


# https://huggingface.co/MiniMaxAI/MiniMax-M2/blob/main/config.json: softmax attention in every layer
# (attn_type_list all 1), multi-token-prediction modules that only serve speculative decoding
MINIMAX_M2 = {
    "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "hidden_size": 3072,
    "intermediate_size": 1536, "head_dim": 128, "num_attention_heads": 48, "num_key_value_heads": 8,
    "num_hidden_layers": 62, "num_local_experts": 256, "num_experts_per_tok": 8, "max_position_embeddings": 196608,
    "rotary_dim": 64, "attn_type_list": [1] * 62, "use_qk_norm": True, "qk_norm_type": "per_layer", "use_mtp": True,
    "num_mtp_modules": 3, "mtp_transformer_layers": 1, "vocab_size": 200064, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_minimax_m2(tmp_path):
    spec = load_config(write(tmp_path, MINIMAX_M2))
    assert kinds(spec) == Counter({"full": 62})
    assert spec.bytes_per_token(16) == 62 * 2 * 8 * 128 * 2 == 253_952
    assert spec.kv_bytes(32768, 16) == 253_952 * 32768 == 8_321_499_136


# https://huggingface.co/meituan-longcat/LongCat-Flash-Chat/blob/main/config.json: num_layers 28 decoder
# layers of two MLA sublayers each, every sublayer with its own cache (transformers: num_hidden_layers =
# 2 · num_layers). kvcalc read 28 layers: half the KV, silently.
LONGCAT_FLASH = {
    "architectures": ["LongcatFlashForCausalLM"], "model_type": "longcat_flash", "hidden_size": 6144,
    "ffn_hidden_size": 12288, "expert_ffn_hidden_size": 2048, "num_layers": 28, "num_attention_heads": 64,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 512, "zero_expert_num": 256, "moe_topk": 12, "max_position_embeddings": 131072,
    "vocab_size": 131072, "torch_dtype": "bfloat16",
}


def test_longcat_flash(tmp_path):
    spec = load_config(write(tmp_path, LONGCAT_FLASH))
    assert kinds(spec) == Counter({"mla": 56})
    assert spec.bytes_per_token(16) == 56 * (512 + 64) * 2 == 64_512  # (was 32,256)
    assert spec.kv_bytes(32768, 16) == 64_512 * 32768 == 2_113_929_216


# Published parameter counts (model cards, safetensors indexes; language model only for multimodal ones).
# The estimate leaves out norms and biases, so it is checked within 3 %; active counts include the input
# embedding (model cards usually leave it out), so only the totals are compared except where noted.
LLAMA31_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
              "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}  # meta-llama/Llama-3.1-8B
MIXTRAL_8X7B = {**LLAMA31_8B, "model_type": "mixtral", "vocab_size": 32000, "num_local_experts": 8,
                "num_experts_per_tok": 2, "max_position_embeddings": 32768}  # mistralai/Mixtral-8x7B-v0.1
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "head_dim": 128,
                 "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "num_attention_heads": 32, "num_hidden_layers": 48, "num_key_value_heads": 4,
                 "vocab_size": 151936, "tie_word_embeddings": False,
                 "max_position_embeddings": 40960}  # Qwen/Qwen3-30B-A3B


@pytest.mark.parametrize(("config", "published"), [
    (LLAMA31_8B, 8.03e9),
    (MIXTRAL_8X7B, 46.7e9),
    (QWEN3_30B_A3B, 30.5e9),
    (DEEPSEEK_V3, 671e9),  # without the 14B multi-token-prediction module of the 685B checkpoint
    (GPT_OSS_120B, 117e9),
    (QWEN35_27B, 27e9),
    (QWEN3_NEXT, 80e9),
    (NEMOTRON_H_56B, 56e9),
    (JAMBA_15_MINI, 51.6e9),
    (MINIMAX_M1, 456e9),
    (LLAMA4_SCOUT, 109e9),  # 109B with the 0.9B vision tower
    (MIMO_V2_FLASH, 309e9),
    (NEMOTRON_SUPER_49B, 49.9e9),
    (GEMMA3_27B, 27e9),
    (LONGCAT_FLASH, 560e9),  # one MoE and two dense MLPs per decoder layer
    (QWEN25_72B, 72.7e9),
    (GLM45_AIR, 106e9),
], ids=lambda x: x.get("model_type", "") if isinstance(x, dict) else "")
def test_weights_from_dimensions_match_published_counts(tmp_path, config, published):
    assert estimate_params(load_config(write(tmp_path, config))).total == pytest.approx(published, rel=0.03)


@pytest.mark.parametrize(("config", "published_active"), [
    (MIXTRAL_8X7B, 12.9e9), (QWEN3_30B_A3B, 3.3e9), (JAMBA_15_MINI, 12e9), (LLAMA4_SCOUT, 17e9),
])
def test_active_parameters(tmp_path, config, published_active):
    assert estimate_params(load_config(write(tmp_path, config))).active == pytest.approx(published_active, rel=0.03)


# https://huggingface.co/ibm-granite/granite-4.0-h-small/blob/main/config.json (the fields kvcalc reads): 40 layers,
# attention at 5, 15, 25, 35 (8 KV heads of 128), 36 Mamba-2 layers of 128 heads of 64, d_state 128; 72 experts of
# 512 (10 a token) and a shared MLP of 8,192 in every layer
GRANITE_4_H_SMALL = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 4096,
    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
    "layer_types": ["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)], "mamba_n_heads": 128,
    "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2,
    "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "vocab_size": 100352, "intermediate_size": 512,
    "num_local_experts": 72, "num_experts_per_tok": 10, "shared_intermediate_size": 8192,
}
