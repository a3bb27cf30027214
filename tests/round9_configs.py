"""Public config.json files of 2025-26 models first tried in round 9 of QA (tests/qa/test_round9_*.py), trimmed to
the fields an engine reads for the cache plus the ones kvcalc must not trip over; each with its source. One loader
writes a config where `--config` reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# https://huggingface.co/allenai/Olmo-3-1025-7B/blob/main/config.json (every 4th layer full, the rest a 4,096 window)
OLMO3_7B: dict[str, Any] = {
    "architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3", "attention_bias": False, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 32, "max_position_embeddings": 65536, "rms_norm_eps": 1e-06, "sliding_window": 4096,
    "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 8,
    "rope_scaling": {"attention_factor": 1.2079441541679836, "beta_fast": 32, "beta_slow": 1, "factor": 8.0,
                     "original_max_position_embeddings": 8192, "rope_type": "yarn"},
    "rope_theta": 500000, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 100278,
}

# https://huggingface.co/ByteDance-Seed/Seed-OSS-36B-Instruct/blob/main/config.json
SEED_OSS_36B: dict[str, Any] = {
    "architectures": ["SeedOssForCausalLM"], "model_type": "seed_oss", "attention_bias": True,
    "attention_out_bias": False, "hidden_act": "silu", "hidden_size": 5120, "head_dim": 128,
    "intermediate_size": 27648, "max_position_embeddings": 524288, "mlp_bias": False, "num_attention_heads": 80,
    "num_hidden_layers": 64, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": {"rope_type": "default"},
    "rope_theta": 10000000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 155136,
}

# https://huggingface.co/zai-org/GLM-4.6/blob/main/config.json (92 layers; the MTP layer serves only speculation)
GLM_46: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 12288, "max_position_embeddings": 202752,
    "moe_intermediate_size": 1536, "n_group": 1, "n_routed_experts": 160, "n_shared_experts": 1,
    "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
    "num_hidden_layers": 92, "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000, "routed_scaling_factor": 2.5,
    "tie_word_embeddings": False, "topk_group": 1, "torch_dtype": "bfloat16", "use_qk_norm": True,
    "vocab_size": 151552,
}

# https://huggingface.co/swiss-ai/Apertus-8B-Instruct-2509/blob/main/config.json (a model_type kvcalc has no rules
# for: read as a plain decoder because every field that could shape its cache was read)
APERTUS_8B: dict[str, Any] = {
    "architectures": ["ApertusForCausalLM"], "model_type": "apertus", "attention_bias": False, "hidden_act": "xielu",
    "hidden_size": 4096, "intermediate_size": 21504, "max_position_embeddings": 65536, "mlp_bias": False,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "qk_norm": True,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 12000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 131072,
}

# https://huggingface.co/inclusionAI/Ring-mini-linear-2.0/blob/main/config.json: the last layer of every group of
# layer_group_size (5) is softmax attention, the other four linear (lightning) attention with a state
RING_MINI_LINEAR_2: dict[str, Any] = {
    "architectures": ["BailingMoeLinearV2ForCausalLM"], "model_type": "bailing_moe_linear",
    "first_k_dense_replace": 1, "group_norm_size": 4, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 5120, "layer_group_size": 5, "linear_silu": False, "max_position_embeddings": 131072,
    "moe_intermediate_size": 512, "moe_router_enable_expert_bias": True, "moe_shared_expert_intermediate_size": 512,
    "n_group": 8, "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8,
    "num_hidden_layers": 20, "num_key_value_heads": 4, "num_nextn_predict_layers": 0, "num_shared_experts": 1,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "routed_scaling_factor": 2.5, "score_function": "sigmoid", "tie_word_embeddings": False, "topk_group": 4,
    "torch_dtype": "bfloat16", "use_qk_norm": True, "use_qkv_bias": False, "vocab_size": 157184,
}

# https://huggingface.co/tencent/Tencent-Hunyuan-Large/blob/main/config.json (cross-layer attention: two layers
# share one KV)
HUNYUAN_LARGE: dict[str, Any] = {
    "architectures": ["HunYuanForCausalLM"], "model_type": "hunyuan", "hidden_size": 6400, "intermediate_size": 18304,
    "num_hidden_layers": 64, "num_attention_heads": 80, "num_key_value_heads": 8, "use_cla": True,
    "cla_share_factor": 2, "num_experts": 16, "moe_topk": 1, "max_position_embeddings": 131072,
    "use_qk_norm": True, "vocab_size": 129024, "torch_dtype": "bfloat16",
}

# https://huggingface.co/stepfun-ai/step3/blob/main/config.json (multi-matrix factorization attention: one KV head
# of 256 a layer; experts per token named moe_top_k)
STEP3: dict[str, Any] = {
    "architectures": ["Step3VLForConditionalGeneration"], "model_type": "step3_vl",
    "text_config": {
        "architectures": ["Step3TextForCausalLM"], "model_type": "step3_text", "hidden_size": 7168,
        "intermediate_size": 18432, "num_attention_heads": 64, "num_attention_groups": 1, "num_hidden_layers": 61,
        "max_seq_len": 65536, "vocab_size": 128815, "rms_norm_eps": 1e-05, "moe_intermediate_size": 5120,
        "moe_num_experts": 48, "moe_top_k": 3, "rope_theta": 500000, "head_dim": 256, "share_expert_dim": 5120,
        "share_q_dim": 2048, "moe_layers_enum": ",".join(str(i) for i in range(4, 60)), "torch_dtype": "bfloat16",
    },
}


# https://huggingface.co/LiquidAI/LFM2-8B-A1B/blob/main/config.json (6 attention layers, 18 short convolutions)
LFM2_8B_A1B: dict[str, Any] = {
    "architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "vocab_size": 65536, "hidden_size": 2048,
    "intermediate_size": 7168, "moe_intermediate_size": 1792, "num_hidden_layers": 24, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 128000, "norm_eps": 1e-05, "conv_bias": False,
    "conv_L_cache": 3, "rope_theta": 1000000.0, "num_dense_layers": 2, "num_experts": 32, "num_experts_per_tok": 4,
    "norm_topk_prob": True, "use_expert_bias": True, "routed_scaling_factor": 1.0, "torch_dtype": "bfloat16",
    "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "conv", "full_attention", "conv", "conv", "conv",
                    "full_attention", "conv", "conv", "conv", "full_attention", "conv", "conv", "conv",
                    "full_attention", "conv", "conv", "full_attention", "conv", "conv"],
}

# https://huggingface.co/Qwen/Qwen3.5-35B-A3B/blob/main/config.json (3 Gated DeltaNet layers, then 1 gated attention)
QWEN35_35B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_moe_text", "attention_bias": False, "attn_output_gate": True, "dtype": "bfloat16",
        "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10, "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "linear_value_head_dim": 128, "max_position_embeddings": 262144, "moe_intermediate_size": 512,
        "mtp_num_hidden_layers": 1, "num_attention_heads": 16, "num_experts": 256, "num_experts_per_tok": 8,
        "num_hidden_layers": 40, "num_key_value_heads": 2, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                            "rope_theta": 10000000, "partial_rotary_factor": 0.25},
        "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "vocab_size": 248320,
    },
    "vision_config": {
        "model_type": "qwen3_5_moe", "depth": 27, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152,
        "in_channels": 3, "intermediate_size": 4304, "num_heads": 16, "num_position_embeddings": 2304,
        "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    },
}


# https://huggingface.co/nvidia/NVIDIA-Nemotron-Nano-9B-v2/blob/main/config.json (M Mamba-2, * attention, - MLP)
NEMOTRON_NANO_9B_V2: dict[str, Any] = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": 131072, "hidden_size": 4480,
    "intermediate_size": 15680, "num_hidden_layers": 56, "max_position_embeddings": 131072, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "hybrid_override_pattern":
    "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-", "mamba_num_heads": 128, "mamba_head_dim": 80,
    "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16",
}


# https://huggingface.co/ByteDance/Ouro-1.4B/blob/main/config.json: a looped model, its 24 layers run total_ut_steps
# (4) times, each pass with its own KV cache (vLLM's OuroAttention: an Attention per ut step and layer)
OURO_14B: dict[str, Any] = {
    "architectures": ["OuroForCausalLM"], "model_type": "ouro", "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
    "max_position_embeddings": 65536, "total_ut_steps": 4, "early_exit_threshold": 1.0, "vocab_size": 49152,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "sliding_window": None, "max_window_layers": 24,
    "layer_types": ["full_attention"] * 24,
}


# https://huggingface.co/openbmb/MiniCPM3-4B/blob/main/config.json: MLA fields, but vLLM's MiniCPM3Attention caches the
# decompressed K and V of all 40 heads, 64 + 32 = 96 wide: 2 · 40 · 96 · 2 = 15,360 B a token a layer, 952,320 B for
# the 62 (read as DeepSeek's latent it was (256 + 32) · 2 · 62 = 35,712 B, 26.7× too little)
MINICPM3_4B: dict[str, Any] = {
    "architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3", "hidden_act": "silu", "hidden_size": 2560,
    "num_hidden_layers": 62, "num_attention_heads": 40, "num_key_value_heads": 40, "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32, "q_lora_rank": 768, "kv_lora_rank": 256, "v_head_dim": 64, "intermediate_size": 6400,
    "max_position_embeddings": 32768, "vocab_size": 73448, "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

# https://huggingface.co/databricks/dbrx-instruct/blob/main/config.json: 8 KV heads under attn_config (kv_n_heads);
# read as a plain decoder it had 48 (n_heads), 6× the KV
DBRX: dict[str, Any] = {
    "architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40,
    "max_seq_len": 32768, "vocab_size": 100352, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "model_type": "", "rope_theta": 500000},
    "ffn_config": {"ffn_hidden_size": 10752, "model_type": "", "moe_jitter_eps": 0.01, "moe_loss_weight": 0.05,
                   "moe_num_experts": 16, "moe_top_k": 4},
}


# https://huggingface.co/zai-org/GLM-4.7-Flash/blob/main/config.json (as vLLM's test of its glm4_moe_lite config quotes
# it): DeepSeek-style MLA, which vLLM caches as one 512 + 64 latent (ModelConfig.is_deepseek_mla)
GLM47_FLASH: dict[str, Any] = {
    "architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite", "vocab_size": 154880,
    "hidden_size": 2048, "intermediate_size": 10240, "moe_intermediate_size": 1536, "num_hidden_layers": 47,
    "num_attention_heads": 20, "num_key_value_heads": 20, "hidden_act": "silu", "rms_norm_eps": 1e-05,
    "attention_bias": False, "max_position_embeddings": 202752, "rope_theta": 1000000.0, "rope_scaling": None,
    "partial_rotary_factor": 1.0, "q_lora_rank": 768, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64, "v_head_dim": 256, "n_routed_experts": 64, "n_shared_experts": 1,
    "num_experts_per_tok": 4, "norm_topk_prob": True, "routed_scaling_factor": 1.8, "n_group": 1, "topk_group": 1,
    "topk_method": "noaux_tc", "first_k_dense_replace": 1, "tie_word_embeddings": False, "dtype": "bfloat16",
}


def write(folder: Path, config: dict[str, Any]) -> Path:
    """`folder` (created) holding `config` as its config.json, where `--config` reads it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
