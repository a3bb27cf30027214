"""Round-9 QA: quantized 2025-26 checkpoints whose weights the GPU plan cannot count exactly are said so, never
silently under-counted (the KV memory size --gpu and sim print is what the weights leave).

Kimi-K2-Thinking / K2.5 / K2.6 (compressed-tensors, pack-quantized): only the routed experts are int4, symmetric in
groups of 32 (4 + 16 / 32 = 4.5 bits a weight); `ignore` keeps attention, the shared experts and the dense MLPs at
16 bits. kvcalc's plan takes every linear layer at int4 in groups of 128 (4 + 20 / 128 bits): at tp 8 on H200 that
is about 8 GiB a GPU of weights too few (the experts' 1.0147e12 weights · (4.5 − 4.156) / 8 B / 8 GPUs = 5.45 GB,
and ~24e9 attention and dense weights at 2 B instead of ~0.52 B: ~4.4 GB), so about as much KV memory too much.
Fixed: a warning names the patterns kept at 16 bits and the group size (core/model/weights.partial_quantization_note).
Kimi-K2.5 keeps its quantization_config at the top level beside its text_config: it was dropped with the top level
(so neither that warning nor any other quantization note was said); core/model/hf_config keeps it now.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_configs import real_config

# Kimi-K2-Thinking's quantization_config (the same ignore list and group ship with K2.5 / K2.6 beside their vision
# tower's "re:vision_tower.*", "re:mm_projector.*")
KIMI_INT4 = {
    "config_groups": {"group_0": {"input_activations": None, "output_activations": None, "targets": ["Linear"],
                                  "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                                              "group_size": 32, "num_bits": 4, "observer": "minmax",
                                              "observer_kwargs": {}, "strategy": "group", "symmetric": True,
                                              "type": "int"}}},
    "format": "pack-quantized", "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                                           "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed",
}
# a RedHatAI-style w4a16 checkpoint: every linear layer but the head, groups of 128 (what the plan models)
W4A16 = {**KIMI_INT4, "ignore": ["lm_head"], "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"group_size": 128, "num_bits": 4, "strategy": "group", "symmetric": True,
                                       "type": "int"}}}}

# https://huggingface.co/openai/gpt-oss-20b/blob/main/config.json
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True, "experts_per_token": 4,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "intermediate_size": 2880, "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "num_local_experts": 32, "rms_norm_eps": 1e-05, "rope_theta": 150000,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "vocab_size": 201088,
}


def _write(folder: Path, config: dict) -> str:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _warnings(run_cli, path: str, *args: str) -> list[str]:
    result = run_cli(*args, "--config", path, "--json")
    assert result.exit_code == 0, result.stderr
    return [line for line in result.stderr.splitlines() if "quantization_config" in line]


@pytest.mark.parametrize("args", [("size", "--gpu", "H200", "--tp", "8"), ("sim", "--gpu", "H200", "--tp", "8",
                                                                           "--requests", "3")])
def test_experts_only_int4_is_said(run_cli, tmp_path: Path, args: tuple[str, ...]) -> None:
    path = _write(tmp_path / "k2", {**real_config("KIMI_K2"), "quantization_config": KIMI_INT4})
    (line,) = _warnings(run_cli, path, *args)
    assert "keeps 3 module pattern(s) at 16 bits (re:.*self_attn.*, re:.*shared_experts.*" in line
    assert "groups its int4 weights by 32" in line and "under-count" in line


def test_multimodal_top_level_quantization_is_read(run_cli, tmp_path: Path) -> None:
    # Kimi-K2.5's layout: the language model under text_config, the quantization_config at the top level
    wrapped = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "text_config": {k: v for k, v in real_config("KIMI_K2").items() if k != "quantization_config"},
               "quantization_config": {
                   **KIMI_INT4, "ignore": [*KIMI_INT4["ignore"], "re:vision_tower.*", "re:mm_projector.*"]}}
    (line,) = _warnings(run_cli, _write(tmp_path / "k25", wrapped), "size", "--gpu", "H200", "--tp", "8")
    assert "keeps 3 module pattern(s)" in line  # the vision tower's patterns are modelled (16-bit tower), not news


def test_whole_model_int4_in_groups_of_128_says_nothing(run_cli, tmp_path: Path) -> None:
    path = _write(tmp_path / "w4a16", {**real_config("LLAMA31_8B"), "quantization_config": W4A16})
    assert _warnings(run_cli, path, "size", "--gpu", "H200") == []
    # gpt-oss's mxfp4 keeps attention and the router at 16 bits by modules_to_not_convert: modelled (experts only)
    assert _warnings(run_cli, _write(tmp_path / "oss", GPT_OSS_20B), "size", "--gpu", "H200") == []
