"""KV precisions as vLLM pages them (vllm/v1/kv_cache_interface.py: AttentionSpec.page_size_bytes,
FullAttentionSpec.real_page_size_bytes, MLAAttentionSpec), each by hand; and the checkpoint's own KV scheme
(quantization_config), read and noted."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.dtypes import DTYPE_BITS, parse_dtype
from kvcalc.core.errors import ParameterError
from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.models import get_preset
from kvcalc.core.model.sizing import compute_size

LLAMA3_8B = get_preset("llama-3-8b")  # 32 layers, 8 KV heads of 128

DEEPSEEK_V3 = {  # https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (trimmed)
    "model_type": "deepseek_v3", "hidden_size": 7168, "kv_lora_rank": 512, "num_attention_heads": 128,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
}


def write(tmp_path, config, folder="model"):
    directory = tmp_path / folder
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def per_token(spec, dtype, tp=1):
    return compute_size(spec, dtype, tokens=1, tp=tp).per_gpu_bytes_per_token


def test_fp8_is_one_byte_a_scalar_and_nothing_per_token():
    # vLLM's fp8 (e4m3 / e5m2) keeps per-tensor k_scale / v_scale: 2 · 8 heads · 128 · 1 B · 32 layers
    assert per_token(LLAMA3_8B, "fp8") == per_token(LLAMA3_8B, "fp8_e4m3") == 32 * 2 * 8 * 128 == 65_536


@pytest.mark.parametrize("dtype", ["fp8_per_token_head", "int8_per_token_head"])
def test_per_token_head_scales(dtype):
    # + a float32 scale for K and for V of each KV head: 8 heads · (256 B + 2 · 4 B) = 2,112 B a layer
    assert per_token(LLAMA3_8B, dtype) == 32 * 8 * (2 * 128 + 2 * 4) == 67_584
    # --tp 2: 4 heads a GPU, each with its scales
    assert per_token(LLAMA3_8B, dtype, tp=2) == 32 * 4 * (2 * 128 + 2 * 4) == 33_792
    size = compute_size(LLAMA3_8B, dtype, tokens=8192, seqs=2, block_size=16)
    assert size.bytes_per_block == 16 * 67_584 and size.total_bytes == 2 * 8192 * 67_584


def test_nvfp4_packs_half_a_byte_and_a_scale_per_16(tmp_path):
    # per head: 128 // 2 = 64 B of fp4 data + 128 // 16 = 8 B of fp8 block scales, for K and V
    assert per_token(LLAMA3_8B, "nvfp4") == 32 * 8 * 2 * (64 + 8) == 36_864
    # K and V of different widths (MiMo-style 192 / 128), and a width that is not a multiple of 16 (80: vLLM floors)
    config = {"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "head_dim": 192, "v_head_dim": 128}
    assert config_bytes(tmp_path, config, "nvfp4") == 2 * 2 * ((96 + 12) + (64 + 8)) == 720


def config_bytes(tmp_path, config, dtype):
    return per_token(load_config(write(tmp_path, config, folder=f"m{len(list(tmp_path.iterdir()))}")), dtype)


def test_nvfp4_floors_a_head_dim_that_is_not_a_multiple_of_16(tmp_path):
    config = {"model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32, "num_hidden_layers": 1}
    assert config_bytes(tmp_path, config, "nvfp4") == 32 * 2 * (80 // 2 + 80 // 16) == 2_880  # 40 + 5 B a head


def test_fp8_ds_mla_is_656_bytes_a_token_layer(tmp_path):
    v32 = load_config(write(tmp_path, {**DEEPSEEK_V3, "model_type": "deepseek_v32", "index_head_dim": 128,
                                       "index_n_heads": 64, "index_topk": 2048}, folder="v32"))
    # 512 fp8 latent + 4 float32 scales + 64 bf16 rope = 512 + 16 + 128 = 656 B, and the indexer's keys beside
    # it: 128 fp8 + one float32 scale = 132 B; 61 layers
    assert per_token(v32, "fp8_ds_mla") == 61 * ((512 + 4 * 4 + 64 * 2) + 132) == 48_068
    assert per_token(v32, "fp8") == 61 * (576 + 132) == 43_188  # a plain fp8 latent
    assert compute_size(v32, "fp8_ds_mla", tokens=32768).kv_bytes_per_seq == 48_068 * 32768
    dense = load_config(write(tmp_path, DEEPSEEK_V3))  # dense MLA: vLLM's sparse backend does not serve it
    with pytest.raises(ParameterError, match=r"'fp8_ds_mla' is the page of vLLM's sparse-MLA backend .* dense MLA"):
        per_token(dense, "fp8_ds_mla")


def test_formats_vllm_does_not_page_for_a_layer_kind_are_refused_naming_dtype(tmp_path):
    spec = load_config(write(tmp_path, DEEPSEEK_V3))
    for dtype in ("nvfp4", "fp8_per_token_head"):
        with pytest.raises(ParameterError, match=f"dtype '{dtype}': vLLM pages an MLA latent") as info:
            per_token(spec, dtype)
        assert info.value.params == ("dtype",)
    with pytest.raises(ParameterError, match="'fp8_ds_mla' is the page of vLLM's sparse-MLA backend"):
        per_token(LLAMA3_8B, "fp8_ds_mla")
    # vLLM's nvfp4 packing lives in FullAttentionSpec; SlidingWindowSpec / ChunkedLocalAttentionSpec page 1 B a scalar
    with pytest.raises(ParameterError, match="nvfp4 pages for full-attention layers only, and these are sliding"):
        per_token(get_preset("gemma-2-9b"), "nvfp4")
    with pytest.raises(ParameterError, match="weight_dtype 'fp8_ds_mla' is not a known precision"):
        parse_dtype("fp8_ds_mla", "weight_dtype")


def test_kv_bits_survive_pickling():
    bits = DTYPE_BITS["nvfp4"]
    again = pickle.loads(pickle.dumps(bits))
    assert (int(again), again.layout, again.name) == (4, "nvfp4", "nvfp4")


@pytest.mark.parametrize(("quant", "expected"), [
    ({"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float",
                                                                 "strategy": "tensor", "dynamic": False}},
     "8-bit float, tensor scales: vLLM pages fp8 only with --kv-cache-dtype fp8"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
     "gives the KV cache as FP8: vLLM's --kv-cache-dtype auto takes it and pages fp8"),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "NVFP4"}},
     "gives the KV cache as NVFP4: vLLM's auto does not map it"),
])
def test_the_checkpoints_kv_scheme_is_read_and_noted(tmp_path, quant, expected):
    config = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "quantization_config": quant}
    spec = load_config(write(tmp_path, config))
    assert any(expected in note for note in spec.notes), spec.notes
    assert spec.bytes_per_token(16) == 131_072  # the note changes no figure: --dtype decides


def test_size_cli_formula_names_the_page_format(run_cli):
    doc = run_cli("size", "-m", "llama-3-8b", "--tokens", "8192", "--dtype", "nvfp4", "--json").json()
    assert doc["bytes_per_token"] == 36_864
    assert doc["formula"] == "32 full layers · 8,192 tokens · 1,152 B (nvfp4) = 288.00 MiB"
    bad = run_cli("size", "-m", "llama-3-8b", "--dtype", "fp8_ds_mla")
    assert bad.exit_code == 2 and "--dtype 'fp8_ds_mla' is the page of vLLM's sparse-MLA backend" in bad.stderr


@given(kv_heads=st.sampled_from([1, 2, 4, 8, 16]), k_dim=st.integers(16, 320), v_dim=st.integers(16, 320),
       layers=st.integers(1, 80), tp=st.sampled_from([1, 2, 4, 8]))
@settings(max_examples=60, deadline=None)
def test_page_formats_by_their_closed_forms(kv_heads, k_dim, v_dim, layers, tp):
    """Property: per token on one GPU, fp8 pages h·(dk + dv) B, per-token-head adds 8 B a head, nvfp4 packs
    dk//2 + dk//16 + dv//2 + dv//16 B a head; a GPU holds max(h / tp, 1) heads (replicated below tp)."""
    from kvcalc.core.model.layers import LayerGroup, kv_bits

    group = LayerGroup("full", layers, kv_heads=kv_heads, k_head_dim=k_dim, v_head_dim=v_dim, q_heads=kv_heads * 2)
    heads = max(kv_heads // tp, 1)  # powers of two: tp divides the heads or is a multiple of them
    bytes_of = {name: kv_bits([group], 1, DTYPE_BITS[name], tp) // 8 for name in ("fp8", "fp8_per_token_head",
                                                                                  "int8_per_token_head", "nvfp4")}
    assert bytes_of["fp8"] == layers * heads * (k_dim + v_dim)
    assert bytes_of["fp8_per_token_head"] == bytes_of["int8_per_token_head"] == bytes_of["fp8"] + layers * heads * 8
    assert bytes_of["nvfp4"] == layers * heads * (k_dim // 2 + k_dim // 16 + v_dim // 2 + v_dim // 16)


def test_the_preset_listing_keeps_the_presets_a_format_pages(run_cli):
    from kvcalc.core.model.models import PRESETS

    doc = run_cli("size", "--dtype", "nvfp4", "--json").json()
    # nvfp4 is neither an MLA page nor one of windowed layers
    mla = [name for name, spec in PRESETS.items() if spec.is_mla or spec.num_sliding_layers]
    assert mla and len(doc["models"]) == len(PRESETS) - len(mla)
    llama = next(m for m in doc["models"] if m["name"] == "Llama-3-8B")
    assert llama["bytes_per_token"] == 36_864
    table = run_cli("size", "--dtype", "nvfp4").stdout
    assert f"nvfp4: only the presets whose layers vLLM pages in it ({len(mla)} of {len(PRESETS)} left out)." in table
