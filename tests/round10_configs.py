"""Public config.json files of 2025-26 models first tried in round 10 of QA (tests/qa/test_round10_*.py), trimmed to
the fields an engine reads for the cache (and the weights) plus the ones kvcalc must not trip over; each with its
source. One loader writes a config where `--config` reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# https://huggingface.co/meta-llama/Llama-4-Maverick-17B-128E-Instruct/blob/main/config.json (text_config as
# TensorRT-LLM's tests/unittest/_torch/modeling/test_modeling_llama.py quotes it, with its 48 layers and without the
# test's added no_rope_layer_interval): 36 layers of 8,192-token chunked attention, every 4th layer (NoPE) full;
# MoE every 2nd layer (interleave_moe_layer_step), dense layers intermediate_size_mlp wide
LLAMA4_MAVERICK: dict[str, Any] = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "torch_dtype": "bfloat16",
    "text_config": {
        "attention_bias": False, "attention_chunk_size": 8192, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 5120, "interleave_moe_layer_step": 2, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "max_position_embeddings": 1048576, "model_type": "llama4_text", "num_attention_heads": 40,
        "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 128,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
        "use_qk_norm": False, "vocab_size": 202048,
    },
    "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 1408, "num_hidden_layers": 34,
                      "intermediate_size": 5632, "num_attention_heads": 16, "image_size": 336, "patch_size": 14,
                      "projector_input_dim": 4096, "projector_output_dim": 4096, "vision_output_dim": 4096,
                      "pixel_shuffle_ratio": 0.5},
}

# https://huggingface.co/Qwen/Qwen3-VL-30B-A3B-Instruct/blob/main/config.json (as a parser test transcribes it at
# commit 1fc78ad): the language model under text_config, M-RoPE sections in rope_scaling
QWEN3_VL_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3VLMoeForConditionalGeneration"], "model_type": "qwen3_vl_moe", "tie_word_embeddings": False,
    "text_config": {
        "attention_bias": False, "decoder_sparse_step": 1, "dtype": "bfloat16", "head_dim": 128, "hidden_size": 2048,
        "intermediate_size": 6144, "max_position_embeddings": 262144, "mlp_only_layers": [],
        "model_type": "qwen3_vl_moe_text", "moe_intermediate_size": 768, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 5000000, "vocab_size": 151936,
    },
    "vision_config": {"deepstack_visual_indexes": [8, 16, 24], "depth": 27, "hidden_act": "gelu_pytorch_tanh",
                      "hidden_size": 1152, "in_channels": 3, "intermediate_size": 4304, "model_type": "qwen3_vl_moe",
                      "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 2048, "patch_size": 16,
                      "spatial_merge_size": 2, "temporal_patch_size": 2},
}

# https://huggingface.co/zai-org/GLM-4.5V/blob/main/config.json (as transformers 5.7 prints it: rope_parameters with
# M-RoPE sections and a partial rotary factor; no MTP layer under text_config)
GLM45V: dict[str, Any] = {
    "architectures": ["Glm4vMoeForConditionalGeneration"], "dtype": "bfloat16", "model_type": "glm4v_moe",
    "tie_word_embeddings": False,
    "text_config": {
        "attention_bias": True, "dtype": "bfloat16", "first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 10944, "max_position_embeddings": 65536,
        "model_type": "glm4v_moe_text", "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128,
        "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8,
        "num_hidden_layers": 46, "num_key_value_heads": 8, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05,
        "rope_parameters": {"mrope_section": [8, 12, 12], "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
                            "rope_type": "default"},
        "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1, "use_qk_norm": False,
        "vocab_size": 151552,
    },
    "vision_config": {"model_type": "glm4v_moe", "depth": 24, "hidden_size": 1536, "intermediate_size": 13696,
                      "num_heads": 12, "patch_size": 14, "out_hidden_size": 4096, "spatial_merge_size": 2,
                      "temporal_patch_size": 2},
}

# https://huggingface.co/mistralai/Ministral-3-8B-Instruct-2512/blob/main/config.json (text_config's fields as a
# loader test quotes "the real 3B/8B fields"): yarn 16 x 16,384 = 262,144, Llama-4 attention scaling (a query scale,
# not the cache); the vision tower's widths are not quoted, so the GPU plan needs --weights-bytes / --kv-memory
MINISTRAL3_8B: dict[str, Any] = {
    "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
    "text_config": {
        "model_type": "ministral3", "hidden_size": 4096, "num_hidden_layers": 34, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336, "vocab_size": 131072,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 262144, "torch_dtype": "bfloat16",
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000, "factor": 16.0,
                            "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
                            "llama_4_scaling_beta": 0.1},
    },
    "vision_config": {"model_type": "pixtral"},
}

# https://huggingface.co/rednote-hilab/dots.llm1.inst/blob/main/config.json (as a loader test trims it): a model_type
# kvcalc has no rules for, read as a plain decoder (every field that could shape its cache is read): MHA, 32 KV heads
DOTS_LLM1: dict[str, Any] = {
    "architectures": ["Dots1ForCausalLM"], "model_type": "dots1", "hidden_size": 4096, "num_hidden_layers": 62,
    "intermediate_size": 10944, "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-05,
    "vocab_size": 152064, "first_k_dense_replace": 1, "moe_intermediate_size": 1408, "n_routed_experts": 128,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
    "max_position_embeddings": 32768, "rope_theta": 10000000, "scoring_func": "sigmoid", "attention_bias": False,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

# https://huggingface.co/microsoft/Phi-4-mini-flash-reasoning/blob/main/config.json (SambaY: configuration_phi4flash
# puts Mamba on the even layers, the 512 window on the odd layers below 16, full attention on layer 17 and makes the
# odd layers above it share that layer's KV (YOCO)); vLLM v1 dropped Phi4FlashForCausalLM
PHI4_MINI_FLASH: dict[str, Any] = {
    "architectures": ["Phi4FlashForCausalLM"], "model_type": "phi4flash", "attention_dropout": 0.0,
    "bos_token_id": 199999, "eos_token_id": 199999, "pad_token_id": 199999, "embd_pdrop": 0.0, "hidden_act": "silu",
    "hidden_size": 2560, "intermediate_size": 10240, "layer_norm_eps": 1e-5, "max_position_embeddings": 262144,
    "mb_per_layer": 2, "num_attention_heads": 40, "num_hidden_layers": 32, "num_key_value_heads": 20,
    "resid_pdrop": 0.0, "sliding_window": 512, "torch_dtype": "bfloat16", "tie_word_embeddings": True,
    "use_cache": True, "mlp_bias": False, "lm_head_bias": False, "vocab_size": 200064,
}

# https://huggingface.co/NX-AI/xLSTM-7b/blob/main/config.json (the fields two ports quote): mLSTM blocks with a
# matrix memory, no attention; no vLLM model
XLSTM_7B: dict[str, Any] = {
    "architectures": ["xLSTMForCausalLM"], "model_type": "xlstm", "vocab_size": 50304, "embedding_dim": 4096,
    "num_blocks": 32, "num_heads": 8, "qk_dim_factor": 0.5, "v_dim_factor": 1.0, "ffn_proj_factor": 2.667,
    "ffn_round_up_to_multiple_of": 64, "gate_soft_cap": 15.0, "output_logit_soft_cap": 30.0, "chunk_size": 64,
    "chunkwise_kernel": "chunkwise--triton_xl_chunk", "weight_mode": "single", "add_out_norm": True,
    "norm_reduction_force_float32": True, "autocast_kernel_dtype": "bfloat16", "inference_state_dtype": "float32",
    "max_inference_chunksize": 16384, "tie_word_embeddings": False, "torch_dtype": "float32",
}

# https://huggingface.co/google/recurrentgemma-2b/blob/main/config.json (as a port quotes the gated file): Griffin,
# two recurrent blocks then one local-attention block (note the key "_block_types"); no vLLM model
RECURRENTGEMMA_2B: dict[str, Any] = {
    "_block_types": ["recurrent", "recurrent", "attention"], "architectures": ["RecurrentGemmaForCausalLM"],
    "attention_bias": False, "attention_window_size": 2048, "conv1d_width": 4, "embeddings_scale_by_sqrt_dim": True,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2560, "intermediate_size": 15360,
    "logits_soft_cap": 30.0, "lru_width": 2560, "model_type": "recurrent_gemma", "num_attention_heads": 10,
    "num_hidden_layers": 26, "num_key_value_heads": 1, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0, "vocab_size": 256000,
}

# https://huggingface.co/pfnet/plamo-2-1b/blob/main/config.json (as a port's loader test quotes it): Mamba on every
# layer but every mamba_step-th (vLLM's plamo2.is_mamba); vLLM serves it (Plamo2ForCausalLM), kvcalc reads it
# since round 10
PLAMO2_1B: dict[str, Any] = {
    "architectures": ["Plamo2ForCausalLM"], "model_type": "plamo2", "hidden_size": 2048, "num_hidden_layers": 16,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": True, "num_attention_heads": 16, "num_key_value_heads": 1,
    "hidden_size_per_head": 128, "max_position_embeddings": 10485760, "attention_window_size": 2048,
    "mamba_d_state": 64, "mamba_d_conv": 4, "mamba_num_heads": 32, "mamba_step": 2, "mamba_chunk_size": 256,
    "mamba_enabled": True, "intermediate_size": 8192, "vocab_size": 100000,
}

# https://huggingface.co/Qwen/Qwen2.5-Omni-7B/blob/main/config.json (the thinker as rtp-llm's test of its thinker
# loader quotes it, with the text model's max_position_embeddings of the file): vLLM serves the thinker, whose
# text_config keeps the KV; the audio tower (32 Whisper-like layers, d_model 1,280) and the vision tower sit beside it
QWEN25_OMNI_7B: dict[str, Any] = {
    "architectures": ["Qwen2_5OmniModel"], "model_type": "qwen2_5_omni",
    "thinker_config": {
        "model_type": "qwen2_5_omni_thinker",
        "text_config": {"hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
                        "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064, "rms_norm_eps": 1e-06,
                        "rope_theta": 1000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                        "max_position_embeddings": 32768},
        "audio_config": {"model_type": "qwen2_5_omni_audio_encoder", "d_model": 1280, "encoder_attention_heads": 20,
                         "encoder_ffn_dim": 5120, "encoder_layers": 32, "num_mel_bins": 128, "output_dim": 3584},
        "vision_config": {"model_type": "qwen2_5_omni_vision_encoder", "embed_dim": 1280, "depth": 32, "num_heads": 16},
        "audio_token_index": 151646, "image_token_index": 151655,
    },
}


def write(folder: Path, config: dict[str, Any]) -> Path:
    """`folder` (created) holding `config` as its config.json, where `--config` reads it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
