"""Round-4 QA: Llama-4 (chunked local attention) with an EAGLE drafter. vLLM turns its hybrid KV cache manager off
for chunked local attention with an EAGLE-style proposer (VllmConfig: "Hybrid KV cache manager is not yet supported
with chunked local attention + eagle", speculative_config.use_eagle(): eagle, eagle3, mtp), and then pages the
chunked layers as full attention (unify_hybrid_kv_cache_specs). kvcalc kept the chunked groups: Llama-4-Scout with
an EAGLE head on 40 GiB at max_model_len 32,768 was planned at 9.85x concurrency where vLLM gives 6.53x."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_configs import write_config

# an EAGLE-3 head for Llama-4 (one Llama decoder layer of the target's width: 8 KV heads of 128)
EAGLE_HEAD = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 5120,
              "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 1,
              "intermediate_size": 32768, "vocab_size": 202048, "max_position_embeddings": 1048576}


@pytest.fixture
def folders(tmp_path: Path) -> tuple[str, str]:
    (tmp_path / "scout").mkdir()
    (tmp_path / "eagle").mkdir()
    (tmp_path / "eagle" / "config.json").write_text(json.dumps(EAGLE_HEAD))
    return str(write_config(tmp_path / "scout", "LLAMA4_SCOUT")), str(tmp_path / "eagle")


def test_eagle_pages_every_chunked_layer_as_full(run_cli, folders: tuple[str, str]) -> None:
    scout, eagle = folders
    result = run_cli("size", "--config", scout, "--kv-memory", "40GiB", "--max-model-len", "32768", "--tokens", "32768",
                     "--spec-tokens", "3", "--spec-method", "eagle", "--draft-config", eagle, "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    plan = doc["gpu_plan"]
    # 36 chunked + 12 full + 1 EAGLE layer, all full attention: one group of 49, a block id 49 · 16 · 4,096 B
    assert [(g["kind"], g["layers"], g["blocks_per_request"]) for g in plan["groups"]] == [("full", 49, 2048)]
    assert plan["num_blocks"] == 40 * 2**30 // (49 * 16 * 4096) == 13_374
    assert plan["max_concurrency"] == pytest.approx(13_374 / 2048)  # 6.53x
    # equation 1 as vLLM holds it: every layer every token
    assert doc["bytes_per_seq"] == 49 * 32768 * 2 * 8 * 128 * 2
    assert "chunked local attention" in result.stderr  # the note says why


def test_ngram_keeps_the_chunked_groups(run_cli, folders: tuple[str, str]) -> None:
    scout, _ = folders
    plan = run_cli("size", "--config", scout, "--kv-memory", "40GiB", "--max-model-len", "32768",
                   "--spec-tokens", "3", "--spec-method", "ngram", "--json").json()["gpu_plan"]
    # 36 chunked layers in 3 groups of 12 (chunk 8,192: min(8,192 + 8,192, 32,768) / 16 = 1,024 blocks) + 12 full
    assert [(g["kind"], g["blocks_per_request"]) for g in plan["groups"]] == [("chunked", 1024)] * 3 + [("full", 2048)]
