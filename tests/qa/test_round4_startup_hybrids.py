"""Round-4 QA: `kvcalc size --gpu` (and `--kv-memory`) through the CLI against the real vLLM 0.19 start-up logs of
the sliding-window hybrids in ../shared/vllm_startup (Gemma-2-2B and -27B from their public config.json, which
tests/core/model/test_vllm_startup.py skips for want of a config; gpt-oss-20b at tp 2 from its preset). Each
log: H100 80GB (79.19 GiB), utilization 0.95 (gpt-oss: 0.9), max_model_len 8,192, block 16, prefix caching off.

Hand check of the logged lines, Gemma-2-27B: 46 layers alternating sliding (4,096) and full, 16 KV heads of 128:
two groups of 23 layers, a block id 23 · 16 · 2 · 16 · 128 · 2 B = 3,014,656 B; vLLM logged num_gpu_blocks
7,335, "GPU KV cache size" 7,335 // 2 · 16 = 58,672 tokens and a request of 8,192 tokens needs 512 full blocks
+ (min(4,095 + 8,192, 8,192) / 16 + 1 = 513) sliding ones: 7,335 / 1,025 = 7.16x."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

GIB = 2**30
STARTUP = Path(__file__).resolve().parents[3] / "shared" / "vllm_startup" / "startup.csv"
pytestmark = pytest.mark.skipif(not STARTUP.exists(), reason=f"{STARTUP} is absent (the shared start-up logs)")

_GEMMA2 = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "max_position_embeddings": 8192,
           "sliding_window": 4096, "vocab_size": 256000, "attn_logit_softcapping": 50.0,
           "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh", "torch_dtype": "bfloat16"}
# google/gemma-2-27b-it and google/gemma-2-2b-it (config.json, the fields sizing reads)
CONFIGS = {
    "google/gemma-2-27b-it": {**_GEMMA2, "head_dim": 128, "hidden_size": 4608, "intermediate_size": 36864,
                              "num_attention_heads": 32, "num_hidden_layers": 46, "num_key_value_heads": 16,
                              "query_pre_attn_scalar": 144},
    "google/gemma-2-2b-it": {**_GEMMA2, "head_dim": 256, "hidden_size": 2304, "intermediate_size": 9216,
                             "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4,
                             "query_pre_attn_scalar": 256},
}
MODELS = [("google/gemma-2-27b-it", "1"), ("google/gemma-2-2b-it", "1"), ("openai/gpt-oss-20b", "2")]


def _row(model: str, tp: str) -> dict[str, str]:
    with open(STARTUP, newline="", encoding="utf-8") as f:
        return next(r for r in csv.DictReader(f) if r["model"] == model and r["tp"] == tp and r["status"] == "ok")


def _source(model: str, tmp_path: Path) -> list[str]:
    if model not in CONFIGS:
        return ["--model", "gpt-oss-20b"]
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS[model]))
    return ["--config", str(tmp_path)]


def _plan(run_cli, *args: str) -> dict:
    result = run_cli("size", *args, "--vllm-version", "0.19", "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()["gpu_plan"]


@pytest.mark.parametrize(("model", "tp"), MODELS)
def test_predicted_start_up(run_cli, tmp_path: Path, model: str, tp: str) -> None:
    row = _row(model, tp)
    plan = _plan(run_cli, *_source(model, tmp_path), "--gpu", "H100-SXM", "--tp", tp, "--gpu-memory-utilization",
                 row["gpu_memory_utilization"], "--max-model-len", row["max_model_len"])
    assert plan["kv_cache_bytes"] / GIB == pytest.approx(float(row["available_kv_gib"]), rel=0.015)
    assert plan["max_concurrency"] == pytest.approx(float(row["max_concurrency"]), rel=0.015)


@pytest.mark.parametrize(("model", "tp"), MODELS)
def test_logged_memory_gives_the_logged_lines(run_cli, tmp_path: Path, model: str, tp: str) -> None:
    """From the logged GiB (± 0.005, two decimals) the blocks bracket the logged tokens and concurrency."""
    row = _row(model, tp)
    logged = float(row["available_kv_gib"])
    plans = [_plan(run_cli, *_source(model, tmp_path), "--kv-memory", f"{int((logged + d) * GIB)}", "--tp", tp,
                   "--max-model-len", row["max_model_len"]) for d in (-0.005, 0.005)]
    assert [len(p["groups"]) for p in plans] == [2, 2]  # a sliding and a full group, 16 tokens a block
    assert all(p["blocks_per_request"] == 512 + 513 for p in plans)
    assert plans[0]["kv_cache_tokens"] <= int(row["kv_cache_tokens"]) <= plans[1]["kv_cache_tokens"]
    low, high = (p["num_blocks"] / 1025 for p in plans)
    assert low - 0.005 <= float(row["max_concurrency"]) <= high + 0.005
