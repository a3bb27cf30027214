"""Round-3 QA of `kvcalc size`: each test one defect found by running it on presets, real configs and bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcalc.core.model.presets import get_preset


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines
    return lines[0]


@pytest.mark.parametrize(("model", "flag", "value"), [
    ("nemotron-h-56b", "--layers", "10"),  # its 10 KV layers: was silently no change (the model has 118 layers)
    ("nemotron-h-56b", "--kv-heads", "4"),  # was "so kv_heads=4 has no one value", not the flag
    ("llama-4-scout", "--layers", "16"),  # was "36 of 48 layers with a sliding window": they are chunked
    ("llama-4-scout", "--head-dim", "64"),
])
def test_overriding_a_hybrid_is_refused_naming_the_flag(run_cli, model: str, flag: str, value: str) -> None:
    line = _one_error_line(run_cli("size", "--model", model, flag, value, "--tokens", "8192"))
    groups = len(get_preset(model).layer_groups)
    assert f"layers differ ({groups} layer groups), so {flag} {value} has no one value to replace" in line


def test_a_hybrid_keeps_its_own_values_when_they_are_given(run_cli) -> None:
    plain = run_cli("size", "--model", "nemotron-h-56b", "--tokens", "8192", "--json")
    given = run_cli("size", "--model", "nemotron-h-56b", "--layers", "118", "--kv-heads", "8", "--head-dim", "128",
                    "--tokens", "8192", "--json")
    assert plain.exit_code == given.exit_code == 0, given.stderr
    assert given.json()["bytes_per_seq"] == plain.json()["bytes_per_seq"]


def test_layers_fills_a_hybrid_config_without_num_hidden_layers(run_cli, tmp_path: Path) -> None:
    # the error "missing the field 'num_hidden_layers'; add it to the file or give --layers" led to a second error:
    # --layers 118 filled the field, then was re-applied as an override of the 10 KV layers and refused
    pattern = "M-M-M-M*-" + "M-M-M-M-M*-" * 9 + "M-M-M-M-M-"  # Nemotron-H-56B: 54 Mamba-2, 54 MLP, 10 attention
    config = {"model_type": "nemotron_h", "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
              "attention_head_dim": 128, "hybrid_override_pattern": pattern, "mamba_num_heads": 256,
              "mamba_head_dim": 64, "ssm_state_size": 256, "n_groups": 8, "conv_kernel": 4, "expand": 2,
              "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = run_cli("size", "--config", str(tmp_path), "--layers", "118", "--tokens", "8192", "--json")
    assert result.exit_code == 0, result.stderr
    # KV: 2 · 10 layers · 8,192 tokens · 8 heads · 128 · 2 B; state per Mamba-2 layer: conv (16,384 + 2·8·256) · 3
    # at 2 B + ssm 256 heads · 64 · 256 at 4 B (vLLM keeps Nemotron-H's ssm state in fp32) = 16,900,096 B
    kv, state = 2 * 10 * 8192 * 8 * 128 * 2, 54 * ((16384 + 2 * 8 * 256) * 3 * 2 + 256 * 64 * 256 * 4)
    assert result.json()["bytes_per_seq"] == kv + state == 1_248_149_504


def test_gpu_plan_says_when_vllm_would_not_start(run_cli) -> None:
    # was: "Maximum concurrency for 10,000,000 tokens per request: 0.04x" and nothing else, for a model of 8,192
    # positions whose pool cannot hold one such request; vLLM refuses both at start-up
    result = run_cli("size", "--model", "llama-3-8b", "--gpu", "H100-SXM", "--max-model-len", "10000000", "--json")
    assert result.exit_code == 0, result.stderr
    plan = result.json()["gpu_plan"]
    assert plan["blocks_per_request"] == 10_000_000 // 16 == 625_000 > plan["num_blocks"]
    refusals = plan["start_refusals"]
    assert refusals[0].startswith("--max-model-len 10,000,000 is above the model's max_position_embeddings 8,192")
    assert refusals[1].startswith(f"one request of 10,000,000 tokens needs 625,000 blocks and the pool has "
                                  f"{plan['num_blocks']:,}")
    assert [line for line in result.stderr.splitlines() if line.startswith("warning: vLLM would not start: ")] == [
        f"warning: vLLM would not start: {r}" for r in refusals]
    fine = run_cli("size", "--model", "llama-3-8b", "--gpu", "H100-SXM", "--json")
    assert fine.exit_code == 0 and "start_refusals" not in fine.json()["gpu_plan"] and fine.stderr == ""


def test_gpu_plan_takes_every_block_size_vllm_accepts(run_cli) -> None:
    # size --gpu refused --block 256, which vLLM's CacheConfig takes (BlockSize 1, 8, ..., 256) and frag's best block
    # counts among the sizes vLLM accepts: two lists that disagreed, now one (core/model/kv_groups.py)
    result = run_cli("size", "--model", "llama-3-8b", "--gpu", "H100-SXM", "--block", "256", "--json")
    assert result.exit_code == 0, result.stderr
    plan = result.json()["gpu_plan"]
    assert plan["block_size"] == 256 and plan["block_bytes"] == 256 * 131_072  # 128 KiB a token
    line = run_cli("size", "--model", "llama-3-8b", "--gpu", "H100-SXM", "--block", "512").stderr
    assert "(1, 8, 16, 32, 64, 128, 256)" in line


def test_a_size_that_is_not_whole_bytes_is_refused_with_whole_sizes_to_give(run_cli) -> None:
    # was "give whole bytes" and nothing more for 79.19GiB, the H100's memory as vLLM logs it (docs/size.md)
    line = _one_error_line(run_cli("size", "--model", "llama-3-8b", "--memory", "79.19GiB"))
    # 79.19 · 2^30 = 85,029,615,042.56 bytes
    assert line.endswith("not a whole number of bytes (85,029,615,042.56): give whole bytes, e.g. 85029615042 "
                         "(rounded down) or 85029615043")
    fixed = run_cli("size", "--model", "llama-3-8b", "--memory", "85029615042", "--tokens", "8192", "--json")
    assert fixed.exit_code == 0 and fixed.json()["capacity"]["max_tokens"] == 85_029_615_042 // 131_072


@pytest.mark.parametrize(("tokens", "peak"), [
    (8_192, 8_192), (8_193, 8_192), (16_384, 16_384), (16_385, 16_384), (100_000, 98_304)])
def test_max_sequences_of_a_chunked_model_counts_each_at_its_peak(run_cli, tokens: int, peak: int) -> None:
    # was 213 sequences of 8,193 tokens but 53 of 8,192 in 80 GiB: at 8,193 a chunked layer holds 1 token, but
    # every sequence held a whole chunk of 8,192 one token before, so 213 of them cannot get there together
    result = run_cli("size", "--model", "llama-4-scout", "--tokens", str(tokens), "--memory", "80GiB", "--json")
    assert result.exit_code == 0, result.stderr
    per_token_layer = 8 * 128 * 2 * 2  # 8 KV heads · 128 · K and V · 2 B
    held = 36 * 8_192 * per_token_layer + 12 * peak * per_token_layer  # 36 chunked at a whole chunk, 12 full
    assert result.json()["capacity"]["max_seqs"] == 80 * 2**30 // held
    # the bytes at the end stay the current chunk's: 36 chunked layers hold n − 8,192 · floor((n − 1) / 8,192)
    now = tokens - 8_192 * ((tokens - 1) // 8_192)
    assert result.json()["bytes_per_seq"] == (36 * now + 12 * tokens) * per_token_layer
