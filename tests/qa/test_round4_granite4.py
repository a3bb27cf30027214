"""Round-4 QA: IBM Granite-4.0's hybrids. The dense members of the family (Granite-4.0-H-Micro, H-1B, Micro ...)
write `num_local_experts: 0` and `num_experts_per_tok: 0` and carry their MLP as the "shared" one
(`shared_intermediate_size`, transformers' and vLLM's GraniteMoeHybrid: no MoE block when num_local_experts is 0);
kvcalc refused their real config.json ("field 'num_local_experts' must be a positive integer, got 0"). The MoE
members (H-Small, H-Tiny) have a shared expert of `shared_intermediate_size` beside the routed ones in every
layer, which the weight estimate left out: 40 · 3 · 4,096 · 8,192 = 4.03B parameters (7.5 GiB at bf16) of
Granite-4.0-H-Small, so `size --gpu` planned 7.5 GiB too much KV memory. Kimi-Linear's one shared expert
(`num_shared_experts` · `moe_intermediate_size`, as DeepSeek's n_shared_experts) was left out the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_configs import real_config

from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.layers import FfnGroup
from kvcalc.core.model.weights import param_count

_TYPES = (["mamba"] * 5 + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 9 + ["attention"]
          + ["mamba"] * 9 + ["attention"] + ["mamba"] * 4)  # attention at 5, 15, 25, 35
# https://huggingface.co/ibm-granite/granite-4.0-h-micro/blob/main/config.json (the fields sizing reads)
GRANITE_4_H_MICRO = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 2048,
    "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192,
    "shared_intermediate_size": 8192, "num_local_experts": 0, "num_experts_per_tok": 0, "layer_types": _TYPES,
    "mamba_n_heads": 64, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4,
    "mamba_expand": 2, "max_position_embeddings": 131072, "vocab_size": 100352, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
GRANITE_4_H_SMALL = real_config("GRANITE_4_H_SMALL")  # tests/core/model/test_real_configs.py


def _write(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_granite_4_h_micro_is_read(run_cli, tmp_path: Path) -> None:
    folder = _write(tmp_path, GRANITE_4_H_MICRO)
    spec = load_config(folder / "config.json")
    assert spec.num_experts is None and spec.ffn_groups == (FfnGroup(40, dense_intermediate=8192, gated=True),)
    doc = run_cli("size", "--config", str(folder), "--tokens", "4096", "--json")
    assert doc.exit_code == 0, doc.stderr
    # 4 attention layers · 2 · 8 KV heads · (2,048 / 32 = 64) dim · 2 B = 8,192 B a token; each of the 36 Mamba-2
    # layers: conv (64 · 64 + 2 · 1 · 128) · (4 − 1) · 2 B = 26,112 B + SSM 64 · 64 · 128 · 2 B = 1,048,576 B
    assert doc.json()["bytes_per_token"] == 8_192
    assert doc.json()["state_bytes_per_seq"] == 36 * (26_112 + 1_048_576) == 38_688_768
    # parameters: embeddings 100,352 · 2,048 (tied) + MLPs 40 · 3 · 2,048 · 8,192 + Mamba 36 · (in_proj 2,048 ·
    # (2 · 4,096 + 2 · 128 + 64) + out_proj 4,096 · 2,048) + attention 4 · (2 · 2,048² + 2 · 2,048 · 512) ≈ 3.19B
    assert 3.1e9 < param_count(spec).total < 3.3e9
    gpu = run_cli("size", "--config", str(folder), "--gpu", "H100-SXM", "--json")
    assert gpu.exit_code == 0, gpu.stderr


def test_granite_4_h_small_counts_its_shared_expert(tmp_path: Path) -> None:
    with_shared = load_config(_write(tmp_path, GRANITE_4_H_SMALL) / "config.json")
    assert with_shared.ffn_groups == (FfnGroup(40, dense_intermediate=8192, experts=72, experts_per_token=10,
                                               expert_intermediate=512, gated=True),)
    (tmp_path / "plain").mkdir()
    without = load_config(_write(tmp_path / "plain", {**GRANITE_4_H_SMALL, "shared_intermediate_size": 0})
                          / "config.json")
    # the shared expert: 40 layers · 3 matrices · 4,096 · 8,192 = 4,026,531,840 parameters, every token uses it
    assert param_count(with_shared).total - param_count(without).total == 40 * 3 * 4096 * 8192 == 4_026_531_840
    assert param_count(with_shared).active - param_count(without).active == 4_026_531_840


def test_zero_experts_with_experts_per_token_is_refused(tmp_path: Path) -> None:
    bad = {**GRANITE_4_H_MICRO, "num_experts_per_tok": 2}
    with pytest.raises(ValueError, match="num_local_experts"):
        load_config(_write(tmp_path, bad) / "config.json")


def test_kimi_linear_counts_its_shared_expert(tmp_path: Path) -> None:
    from tests.qa.test_round3_kimi_linear import KIMI_LINEAR_48B

    spec = load_config(_write(tmp_path, KIMI_LINEAR_48B) / "config.json")
    moe = [g for g in spec.ffn_groups if g.experts]
    # 26 MoE layers (first_k_dense_replace 1), each 256 routed experts of 1,024 and num_shared_experts 1 · 1,024
    assert moe == [FfnGroup(26, dense_intermediate=1024, experts=256, experts_per_token=8, expert_intermediate=1024,
                            gated=True)]



def test_other_shared_expert_spellings(tmp_path: Path) -> None:
    """Hunyuan-A13B: `num_shared_expert` (a per-layer list) · intermediate_size beside the experts when
    use_mixed_mlp_moe; ERNIE-4.5: `moe_num_shared_experts` · moe_intermediate_size, and its dense first layer
    (MoE only from moe_layer_start_index 1 to moe_layer_end_index 27, vLLM's Ernie4_5_MoeModel)."""
    (tmp_path / "hunyuan").mkdir()
    (tmp_path / "ernie").mkdir()
    hunyuan = load_config(_write(tmp_path / "hunyuan", real_config("HUNYUAN_A13B")) / "config.json")
    assert hunyuan.ffn_groups == (FfnGroup(32, dense_intermediate=3072, experts=64, experts_per_token=8,
                                           expert_intermediate=3072, gated=True),)
    # 80B total, 13B active as Tencent states: 32 · 64 · 3 · 4,096 · 3,072 routed + 32 · 3 · 4,096 · 3,072 shared
    assert 79.9e9 < param_count(hunyuan).total < 80.9e9 and 12.5e9 < param_count(hunyuan).active < 13.5e9
    ernie = load_config(_write(tmp_path / "ernie", real_config("ERNIE45_21B")) / "config.json")
    assert sorted(ernie.ffn_groups, key=lambda g: g.count) == [
        FfnGroup(1, dense_intermediate=12288, gated=True),
        FfnGroup(27, dense_intermediate=2 * 1536, experts=64, experts_per_token=6, expert_intermediate=1536,
                 gated=True)]
    # 21B total, 3B active as Baidu states
    assert 21.0e9 < param_count(ernie).total < 22.5e9 and 2.8e9 < param_count(ernie).active < 3.5e9
