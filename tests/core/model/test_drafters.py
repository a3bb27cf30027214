"""Drafter layers: a config's multi-token-prediction layers keep KV only under speculative decoding (MTP /
EAGLE drafting with them), a draft model's layers under --spec-method draft|eagle --draft-config; each
added exactly, by hand, and said in the output; with no method they are not counted but named."""

from __future__ import annotations

import json

import pytest

from kvcalc.core.errors import ParameterError
from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.models import get_preset, with_drafter

# https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (trimmed): one MTP layer
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "hidden_size": 7168, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "num_attention_heads": 128, "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "torch_dtype": "bfloat16",
}
# https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json (trimmed; every 4th layer full)
QWEN3_NEXT = {
    "model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "torch_dtype": "bfloat16",
}


def write(tmp_path, config, folder="model"):
    directory = tmp_path / folder
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


# an EAGLE-style head for Llama-3-8B: one Llama decoder layer with the target's attention shape
EAGLE_HEAD = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 1, "intermediate_size": 14336, "vocab_size": 128256,
              "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def test_deepseek_v3_mtp_layer(tmp_path):
    spec = load_config(write(tmp_path, DEEPSEEK_V3))
    assert (spec.drafter_layers, spec.drafter_field) == (1, "num_nextn_predict_layers")
    assert spec.bytes_per_token(16) == 61 * 576 * 2 == 70_272  # the MTP layer is not in the plain figure
    same, note = with_drafter(spec, None)
    assert same is spec and "1 MTP layer (num_nextn_predict_layers 1)" in note and "not counted" in note
    assert with_drafter(spec, "ngram")[0] is spec
    for method in ("mtp", "eagle"):
        drafted, note = with_drafter(spec, method)
        # 62 MLA layers · (512 + 64) latent · 2 B = 71,424 B a token: 1,152 B more
        assert drafted.bytes_per_token(16) == 62 * 576 * 2 == 71_424
        assert drafted.kv_bytes(32768, 16) == 71_424 * 32768
        assert f"spec_method {method}: the KV of 1 MTP drafter layer" in note  # the CLI: --spec-method


def test_qwen3_next_mtp_layer_is_full_attention(tmp_path):
    spec = load_config(write(tmp_path, {**QWEN3_NEXT, "mtp_num_hidden_layers": 1}))
    assert spec.bytes_per_token(16) == 12 * 2 * 2 * 256 * 2 == 24_576  # 12 full layers, 2 KV heads of 256
    drafted, _ = with_drafter(spec, "mtp")
    assert drafted.bytes_per_token(16) == 13 * 2 * 2 * 256 * 2 == 26_624  # the MTP layer: one more full layer
    assert drafted.state_bits() == spec.state_bits()  # the 36 linear-attention layers' state is unchanged


def test_draft_model_config(tmp_path):
    target = get_preset("llama-3-8b")
    head = load_config(write(tmp_path, EAGLE_HEAD))
    drafted, note = with_drafter(target, "eagle", head)
    # 32 + 1 layers · 2 · 8 KV heads · 128 · 2 B = 135,168 B a token (the head adds 4,096)
    assert drafted.bytes_per_token(16) == 33 * 2 * 8 * 128 * 2 == 135_168
    assert "the draft model" in note and "1 layer, 1 with KV" in note
    assert drafted.kv_bits(8192, 16, tp=8) == 33 * 8192 * 2 * 1 * 128 * 16  # one KV head a GPU in both models
    assert with_drafter(target, "draft", head)[0].bytes_per_token(16) == 135_168
    # without a draft config, draft counts only slots and says so
    assert "draft model's own KV is not counted" in with_drafter(target, "draft")[1]


def test_drafter_refusals(tmp_path):
    target = get_preset("llama-3-8b")
    # core names its parameters (method, draft); the CLI says --spec-method, --draft-config (test_size_cli_...)
    with pytest.raises(ParameterError, match=r"^method mtp: Llama-3-8B's config has no MTP layers") as caught:
        with_drafter(target, "mtp")
    assert caught.value.params == ("method", "draft")
    with pytest.raises(ParameterError, match=r"^draft gives a drafter's layers, which only method"):
        with_drafter(target, "ngram", target)


def test_size_cli_adds_and_states_the_drafter(tmp_path, run_cli):
    folder = str(write(tmp_path, DEEPSEEK_V3))
    plain = run_cli("size", "--config", folder, "--tokens", "32768", "--json").json()
    assert plain["bytes_per_token"] == 70_272
    assert any("1 MTP layer (num_nextn_predict_layers 1)" in w and "not counted" in w for w in plain["warnings"])
    mtp = run_cli("size", "--config", folder, "--tokens", "32768", "--spec-tokens", "1", "--spec-method", "mtp",
                  "--json").json()
    assert mtp["bytes_per_token"] == 71_424 and mtp["model"]["layers"] == 62
    assert any("--spec-method mtp: the KV of 1 MTP drafter layer" in w for w in mtp["warnings"])
    head = str(write(tmp_path, EAGLE_HEAD, folder="head"))
    eagle = run_cli("size", "-m", "llama-3-8b", "--tokens", "8192", "--spec-tokens", "3", "--spec-method", "eagle",
                    "--draft-config", head, "--json").json()
    assert eagle["bytes_per_token"] == 135_168
    bad = run_cli("size", "-m", "llama-3-8b", "--draft-config", head)
    assert bad.exit_code == 2 and "--draft-config needs" in bad.stderr


def test_minimax_m2_mtp_modules(tmp_path):
    # https://huggingface.co/MiniMaxAI/MiniMax-M2/blob/main/config.json: use_mtp, 3 modules of 1 transformer layer
    config = {"model_type": "minimax_m2", "hidden_size": 3072, "head_dim": 128, "num_attention_heads": 48,
              "num_key_value_heads": 8, "num_hidden_layers": 62, "attn_type_list": [1] * 62, "use_mtp": True,
              "num_mtp_modules": 3, "mtp_transformer_layers": 1, "torch_dtype": "bfloat16"}
    spec = load_config(write(tmp_path, config))
    assert (spec.drafter_layers, spec.drafter_field) == (3, "num_mtp_modules")
    assert spec.bytes_per_token(16) == 62 * 2 * 8 * 128 * 2 == 253_952
    # + 3 full-attention layers of 8 KV heads of 128: 65 · 4,096 = 266,240 B a token
    assert with_drafter(spec, "mtp")[0].bytes_per_token(16) == 65 * 2 * 8 * 128 * 2 == 266_240
    off = load_config(write(tmp_path, {**config, "use_mtp": False}, folder="off"))
    assert off.drafter_layers == 0


# Step-3.7-Flash's schema (step3p7 around a step3p5 text_config, as a public loader test quotes the published
# checkpoint): KV heads as num_attention_groups, sliding layers' own heads in attention_other_setting, and
# layer_types sized over the decoder layers PLUS the num_nextn_predict_layers MTP layers. Trimmed to 6 + 2 layers.
STEP37 = {
    "architectures": ["Step3p7ForConditionalGeneration"], "model_type": "step3p7",
    "text_config": {
        "architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5", "hidden_size": 4096,
        "num_hidden_layers": 6, "num_nextn_predict_layers": 2, "num_attention_heads": 64, "num_attention_groups": 8,
        "head_dim": 128, "sliding_window": 512, "max_position_embeddings": 65536, "vocab_size": 128896,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention",
                        "sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": 96,
                                    "num_attention_groups": 8, "head_dim": 128},
        "torch_dtype": "bfloat16",
    },
}


def test_step37_layer_types_cover_the_mtp_layers(tmp_path):
    spec = load_config(write(tmp_path, STEP37))
    kinds = {(g.kind, g.window, g.kv_heads, g.q_heads): g.count for g in spec.layer_groups}
    assert kinds == {("full", None, 8, 64): 2, ("sliding", 512, 8, 96): 4}  # the first 6 entries; 8 KV heads
    # 6 layers · 2 · 8 · 128 · 2 B = 24,576 B a token (64 KV heads, as without num_attention_groups: 196,608)
    assert spec.bytes_per_token(16) == 6 * 4_096 == 24_576
    # 32K: 2 full layers hold every token, 4 sliding ones 512: (2 · 32,768 + 4 · 512) · 4,096 B
    assert spec.kv_bytes(32768, 16) == (2 * 32768 + 4 * 512) * 4096 == 276_824_064
    assert (spec.drafter_layers, spec.drafter_field) == (2, "num_nextn_predict_layers")
    drafted, note = with_drafter(spec, "mtp")
    # + the MTP layers as layer_types' last two entries say: one sliding (512), one full
    assert drafted.kv_bytes(32768, 16) == (3 * 32768 + 5 * 512) * 4096 == 413_138_944
    assert "2 MTP drafter layers (num_nextn_predict_layers 2)" in note
