"""Round-3 QA: real Hugging Face config.json files as published, and configs kvcalc must refuse rather than misread.

Each test is one defect found by running the commands on real configs: the input, what happened, what must."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# google/gemma-3-27b-it's config.json as published (huggingface.co/google/gemma-3-27b-it; the same file is a test
# fixture of TensorRT-LLM): its text_config names neither vocab_size nor max_position_embeddings, which
# transformers' Gemma3TextConfig (and vLLM, which reads configs through it) fills in with 262,208 and 131,072.
GEMMA3_27B_IT = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                    "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                    "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}


def _write(tmp_path: Path, config: dict, folder: str) -> Path:
    directory = tmp_path / folder
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines
    return lines[0]


def test_gemma3_27b_it_as_published_sizes_at_its_default_context(run_cli, tmp_path: Path) -> None:
    # was: "names no context length" (size) and "has no vocab_size to count its embedding weights" (--gpu, sim)
    model = _write(tmp_path, GEMMA3_27B_IT, "gemma-3-27b-it")
    result = run_cli("size", "--config", str(model), "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["tokens"] == doc["model"]["max_position_embeddings"] == 131_072
    # 10 full layers hold 131,072 tokens, 52 sliding ones their 1,024-token window; 16 KV heads × 128 × 2 (K, V) × 2 B
    assert doc["bytes_per_seq"] == (10 * 131_072 + 52 * 1_024) * 16 * 128 * 2 * 2 == 11_173_625_856
    assert "transformers' defaults" in result.stderr  # said, never silent


def test_gemma3_27b_it_gpu_plan_equals_the_config_with_the_defaults_written_out(run_cli, tmp_path: Path) -> None:
    published = _write(tmp_path, GEMMA3_27B_IT, "gemma-3-27b-it")
    explicit = json.loads(json.dumps(GEMMA3_27B_IT))
    explicit["text_config"].update(vocab_size=262_208, max_position_embeddings=131_072)
    written = _write(tmp_path, explicit, "explicit")
    plans = []
    for model in (published, written):
        result = run_cli("size", "--config", str(model), "--gpu", "H100-SXM", "--json")
        assert result.exit_code == 0, result.stderr
        plans.append(result.json()["gpu_plan"])
    assert plans[0] == plans[1]
    assert plans[0]["max_model_len"] == 131_072


def test_gemma3_27b_it_runs_in_sim(run_cli, tmp_path: Path) -> None:
    model = _write(tmp_path, GEMMA3_27B_IT, "gemma-3-27b-it")
    result = run_cli("sim", "--config", str(model), "--gpu", "H200", "--requests", "20", "--json")
    assert result.exit_code == 0, result.stderr
    assert isinstance(result.json(), dict)


def test_class_defaults_are_transformers_own() -> None:
    transformers = pytest.importorskip("transformers")
    from kvcalc.core.model.hf_config import CLASS_DEFAULTS

    for model_type, fields in CLASS_DEFAULTS.items():
        config = transformers.AutoConfig.for_model(model_type)
        assert {k: getattr(config, k) for k in fields} == fields, model_type


@pytest.mark.parametrize(("config", "named"), [
    # Llama-3.2-Vision (mllama): 8 of 40 text layers are cross-attention layers, which cache the image's tokens,
    # not the text's; was read as 40 self-attention layers
    ({"model_type": "mllama", "vision_config": {"hidden_size": 1280},
      "text_config": {"model_type": "mllama_text_model", "num_hidden_layers": 40, "num_attention_heads": 32,
                      "num_key_value_heads": 8, "hidden_size": 4096, "cross_attention_layers": [3, 8, 13, 18, 23,
                                                                                             28, 33, 38]}},
     "cross_attention_layers"),
    # T5-11B: encoder-decoder, 128 heads of d_kv 128 on d_model 1024; was read as a 24-layer decoder of head dim 8
    ({"model_type": "t5", "d_model": 1024, "num_heads": 128, "num_layers": 24, "num_decoder_layers": 24,
      "d_kv": 128, "is_encoder_decoder": True, "vocab_size": 32128}, "num_decoder_layers, d_kv, is_encoder_decoder"),
])
def test_cross_attention_and_encoder_decoder_configs_are_refused_by_field(run_cli, tmp_path: Path, config: dict,
                                                                          named: str) -> None:
    line = _one_error_line(run_cli("size", "--config", str(_write(tmp_path, config, "m")), "--tokens", "4096"))
    assert f"does not read its fields {named}" in line


def test_a_config_of_a_trillion_layers_is_one_error_line(run_cli, tmp_path: Path) -> None:
    # was a MemoryError traceback (each layer is placed one by one)
    config = {"model_type": "llama", "num_hidden_layers": 10**12, "num_attention_heads": 8, "hidden_size": 512,
              "num_key_value_heads": 2}
    line = _one_error_line(run_cli("size", "--config", str(_write(tmp_path, config, "m"))))
    assert "'num_hidden_layers' is 1,000,000,000,000" in line and "fix the file" in line


@pytest.mark.parametrize(("lengths", "expected"), [
    ({"model_max_length": 1_048_576}, 1_048_576),  # Kimi-Linear's field: was "names no context length"
    ({"max_seq_length": 32_768}, 32_768),
    ({"seq_len": 4_096}, 4_096),
    # Command-R v01: vLLM takes the smallest of its length fields (_get_and_verify_max_len)
    ({"max_position_embeddings": 8_192, "model_max_length": 131_072}, 8_192),
    ({"model_max_length": 4_096, "max_position_embeddings": 131_072}, 4_096),
])
def test_the_model_length_is_the_smallest_of_vllms_length_fields(run_cli, tmp_path: Path, lengths: dict,
                                                                  expected: int) -> None:
    config = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "hidden_size": 256, **lengths}
    result = run_cli("size", "--config", str(_write(tmp_path, config, "m")), "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["tokens"] == doc["model"]["max_position_embeddings"] == expected
    assert doc["bytes_per_seq"] == 2 * 2 * expected * 2 * 64 * 2  # K and V · 2 layers · tokens · 2 heads · 64 · 2 B


# A compressed-tensors checkpoint whose quantization_config gives the KV cache as fp8 (vLLM pages fp8 only with
# --kv-cache-dtype fp8): size advised --dtype fp8, frag and share said nothing of it.
FP8_KV_CHECKPOINT = {
    "model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "hidden_size": 256, "max_position_embeddings": 4096, "vocab_size": 1000, "intermediate_size": 512,
    "quantization_config": {"quant_method": "compressed-tensors",
                            "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                                "dynamic": False, "symmetric": True}},
}


@pytest.mark.parametrize("config", [GEMMA3_27B_IT, FP8_KV_CHECKPOINT], ids=["gemma3-defaults", "fp8-kv-scheme"])
def test_every_command_that_reads_a_config_prints_its_notes(run_cli, tmp_path: Path, config: dict) -> None:
    model = str(_write(tmp_path, config, "m"))
    size = run_cli("size", "--config", model, "--tokens", "1024")
    assert size.exit_code == 0, size.stderr
    warnings = [line for line in size.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings and ("--dtype fp8" in size.stderr or "transformers' defaults" in size.stderr)
    for command in (("frag", "--lengths", "100,1000"), ("share", "--prefix", "100", "--gen", "10")):
        result = run_cli(*command, "--config", model)
        assert result.exit_code == 0, result.stderr
        assert [line for line in result.stderr.splitlines() if line.startswith("warning: ")] == warnings, command


def test_phi3_small_reads_its_mlp_width(run_cli, tmp_path: Path) -> None:
    # microsoft/Phi-3-small-8k-instruct names its MLP width ff_intermediate_size: size --gpu, sim and plan stopped
    # with "has no intermediate_size to count its MLP weights"; its blocksparse fields are attention compute only
    # (vLLM keeps every token's K and V), so its KV is 32 layers · 8 heads · 128 · 2 · 2 B = 131,072 B a token
    phi3_small = {"model_type": "phi3small", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "ff_intermediate_size": 14336, "max_position_embeddings": 8192,
                  "vocab_size": 100352, "torch_dtype": "bfloat16", "dense_attention_every_n_layers": 2,
                  "blocksparse_block_size": 64, "blocksparse_num_local_blocks": 16, "blocksparse_vert_stride": 8}
    spelled = {k: v for k, v in phi3_small.items() if k != "ff_intermediate_size"} | {"intermediate_size": 14336}
    plans = []
    for name, config in (("phi3", phi3_small), ("spelled", spelled)):
        result = run_cli("size", "--config", str(_write(tmp_path, config, name)), "--gpu", "H100-SXM", "--json")
        assert result.exit_code == 0, result.stderr
        assert result.json()["bytes_per_token"] == 32 * 8 * 128 * 2 * 2
        plans.append(result.json()["gpu_plan"]["weights_bytes"])
    assert plans[0] == plans[1]
