"""Round-4 QA: a config.json whose torch_dtype is float32 is served by vLLM (--dtype auto, the default) in bf16:
vLLM's `_resolve_auto_dtype` ("Downcast for float32 models") turns float32 into the platform's preferred 16-bit
dtype, bf16 on every GPU kvcalc plans. `size --gpu` and `sim` loaded such a checkpoint's weights (and ran its
activations) at 4 bytes a parameter: Gemma-2-2B's geometry with torch_dtype float32 planned 9.77 GiB of weights
and 62.05 GiB of KV on an H100 where vLLM 0.19 logged 4.90 GiB and 66.47 GiB (../shared/vllm_startup), 6.6 % off.
`--weight-dtype fp32` (vLLM's --dtype float32) still plans 4 bytes a parameter."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from real_configs import real_config

GIB = 2**30
STARTUP = Path(__file__).resolve().parents[3] / "shared" / "vllm_startup" / "startup.csv"

# google/gemma-2-2b-it (config.json): 26 layers alternating sliding (4,096) and full attention, 4 KV heads of 256.
GEMMA2_2B = {
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "head_dim": 256, "hidden_size": 2304,
    "intermediate_size": 9216, "max_position_embeddings": 8192, "num_attention_heads": 8, "num_hidden_layers": 26,
    "num_key_value_heads": 4, "query_pre_attn_scalar": 256, "sliding_window": 4096, "vocab_size": 256000,
    "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh",
}


def _folder(tmp_path: Path, name: str, config: dict) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def _plan(run_cli, folder: str, *extra: str) -> dict:
    result = run_cli("size", "--config", folder, "--gpu", "H100-SXM", "--json", *extra)
    assert result.exit_code == 0, result.stderr
    return result.json()["gpu_plan"]


def test_a_float32_config_is_planned_as_vllm_serves_it(run_cli, tmp_path: Path) -> None:
    olmo = real_config("OLMO2_13B")  # allenai/OLMo-2-1124-13B: torch_dtype float32
    as_fp32 = _plan(run_cli, _folder(tmp_path, "fp32", olmo))
    as_bf16 = _plan(run_cli, _folder(tmp_path, "bf16", {**olmo, "torch_dtype": "bfloat16"}))
    explicit = _plan(run_cli, _folder(tmp_path, "explicit", olmo), "--weight-dtype", "fp32")
    # the same start-up as a bfloat16 config: weights, activation peak, KV memory, blocks
    for key in ("weights_bytes", "activation_bytes", "kv_cache_bytes", "num_blocks"):
        assert as_fp32[key] == as_bf16[key], key
    # 13.7B parameters at 2 B are about 25.6 GiB; --weight-dtype fp32 asks for 4 B: about twice
    assert 24 * GIB < as_bf16["weights_bytes"] < 27 * GIB
    assert explicit["weights_bytes"] > 1.9 * as_bf16["weights_bytes"]
    result = run_cli("size", "--config", _folder(tmp_path, "note", olmo), "--gpu", "H100-SXM")
    assert "float32" in result.stdout + result.stderr and "bf16" in result.stdout + result.stderr
    assert "give --weight-dtype fp32" in " ".join((result.stdout + result.stderr).split())  # the note names our flag


def test_sim_plans_the_same_weights(run_cli, tmp_path: Path) -> None:
    olmo = _folder(tmp_path, "olmo", real_config("OLMO2_13B"))
    size = _plan(run_cli, olmo)
    sim = run_cli("sim", "--config", olmo, "--gpu", "H100-SXM", "--requests", "20", "--json")
    assert sim.exit_code == 0, sim.stderr
    plan = sim.json()["memory_plan"]
    assert plan["weights_bytes"] == size["weights_bytes"] and plan["num_blocks"] == size["num_blocks"]


@pytest.mark.skipif(not STARTUP.exists(), reason=f"{STARTUP} is absent (the shared vLLM start-up logs)")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemma2_2b_against_its_start_up_log(run_cli, tmp_path: Path, dtype: str) -> None:
    with open(STARTUP, newline="", encoding="utf-8") as f:
        row = next(r for r in csv.DictReader(f) if r["model"] == "google/gemma-2-2b-it" and r["status"] == "ok")
    assert row["dtype"] == "torch.bfloat16" and row["weights_gib"] == "4.9"  # what vLLM ran: 16-bit weights
    plan = _plan(run_cli, _folder(tmp_path, dtype, {**GEMMA2_2B, "torch_dtype": dtype}), "--vllm-version", "0.19",
                 "--gpu-memory-utilization", row["gpu_memory_utilization"], "--max-model-len", row["max_model_len"])
    # 2.61B parameters · 2 B = 4.87 GiB (+ the allocator's rounding); vLLM logged 4.90 GiB and 66.47 GiB of KV
    assert plan["weights_bytes"] / GIB == pytest.approx(float(row["weights_gib"]), abs=0.1)
    assert plan["kv_cache_bytes"] / GIB == pytest.approx(float(row["available_kv_gib"]), rel=0.02)
    # two groups of 13 layers (sliding, full), a block id of 13 · 16 · 4,096 B = 851,968 B; a request of 8,192
    # tokens holds 512 full blocks and min(4,095 + 8,192, 8,192) / 16 + 1 = 513 sliding ones: 1,025
    assert plan["block_bytes"] == 851_968 and plan["blocks_per_request"] == 1_025
    assert plan["max_concurrency"] == pytest.approx(float(row["max_concurrency"]), rel=0.02)
