"""Round-4 QA: `size --gpu --spec-tokens K` on a Mamba / linear-attention hybrid. With speculative decoding vLLM
gives every recurrent layer's MambaSpec `num_speculative_blocks = num_speculative_tokens` (gpu_model_runner), and
a request then holds 1 + K state pages per state group (the state after each draft position, so a rejected
draft can be rolled back; MambaSpec.max_memory_usage_bytes = page · (1 + K) without prefix caching).
kvcalc's GPU plan ignored K for the state: Qwen3.5-27B with K = 2 was planned at 45 blocks a request
(3 groups x 1 state page + 42 attention blocks) where vLLM needs 51, a concurrency 13 % too high."""

from __future__ import annotations

from pathlib import Path

import pytest
from real_configs import write_config


def _plan(run_cli, folder: str, *extra: str) -> dict:
    result = run_cli("size", "--config", folder, "--kv-memory", "40GiB", "--max-model-len", "32768", "--json",
                     *extra)
    assert result.exit_code == 0, result.stderr
    return result.json()["gpu_plan"]


@pytest.mark.parametrize(("k", "method"), [(2, "mtp"), (3, "ngram")])
def test_qwen35_speculative_state_pages(run_cli, tmp_path: Path, k: int, method: str) -> None:
    folder = str(write_config(tmp_path, "QWEN35_27B"))
    plan = _plan(run_cli, folder, "--spec-tokens", str(k), "--spec-method", method)
    # 48 Gated DeltaNet layers: 3 · (2 · 16 · 128 + 48 · 128) · 2 B conv + 48 · 128 · 128 · 4 B recurrent =
    # 3,207,168 B a layer; attention 2 · 4 KV heads · 256 · 2 B = 4,096 B a token a layer: block 16 · ceil(
    # 3,207,168 / 65,536) = 784. MTP adds its one full layer only with --spec-method mtp.
    full_layers = 17 if method == "mtp" else 16
    assert plan["block_size"] == 784 and plan["group_size"] == full_layers
    state = [g for g in plan["groups"] if g["kind"] == "gated_deltanet"]
    full = [g for g in plan["groups"] if g["kind"] == "full"]
    assert len(state) == 3 and all(g["blocks_per_request"] == 1 + k for g in state)
    assert full == [{"kind": "full", "layers": full_layers, "block_size": 784, "blocks_per_request": 42}]  # 32,768/784
    # a block id: group size · 784 · 4,096 B; 40 GiB of them
    blocks = 40 * 2**30 // (full_layers * 784 * 4096)
    assert plan["num_blocks"] == blocks and plan["blocks_per_request"] == 3 * (1 + k) + 42
    assert plan["max_concurrency"] == pytest.approx(blocks / (3 * (1 + k) + 42))


def test_without_speculation_one_state_page(run_cli, tmp_path: Path) -> None:
    plan = _plan(run_cli, str(write_config(tmp_path, "QWEN35_27B")))
    # 16 full layers, 48 / 16 = 3 state groups of 16 slots: 3 · 1 + 42 = 45 blocks a request
    assert plan["blocks_per_request"] == 45 and plan["num_blocks"] == 40 * 2**30 // (16 * 784 * 4096)


def test_the_table_says_why(run_cli, tmp_path: Path) -> None:
    result = run_cli("size", "--config", str(write_config(tmp_path, "QWEN35_27B")), "--kv-memory", "40GiB",
                     "--max-model-len", "32768", "--spec-tokens", "2", "--spec-method", "mtp")
    assert result.exit_code == 0 and "a request holds 1 + 2 pages in each state group" in result.stdout


def test_size_speculative_peak_counts_the_state_pages(run_cli, tmp_path: Path) -> None:
    result = run_cli("size", "--config", str(write_config(tmp_path, "QWEN35_27B")), "--tokens", "32768",
                     "--spec-tokens", "2", "--spec-method", "mtp", "--json")
    assert result.exit_code == 0, result.stderr
    s = result.json()["speculative"]
    # 32,768 + 2 drafts + 2 lookahead slots = 32,772 slots: 2,049 blocks of 16 instead of 2,048, one block of
    # 17 full layers (16 + the MTP layer) · 16 · 4,096 B = 1,114,112 B; and 2 more states of 48 · 3,207,168 B
    assert (s["blocks_per_seq"], s["peak_blocks_per_seq"]) == (2048, 2049)
    assert s["peak_bytes_per_seq"] - s["paged_bytes_per_seq"] == 1_114_112 + 2 * 153_944_064


def test_frag_speculative_peak_counts_the_state_pages(run_cli, tmp_path: Path) -> None:
    result = run_cli("frag", "--config", str(write_config(tmp_path, "QWEN35_27B")), "--lengths", "1000,5000",
                     "--block", "16", "--spec-tokens", "2", "--spec-method", "mtp", "--json")
    assert result.exit_code == 0, result.stderr
    (peak,) = result.json()["speculative"]["paged"]
    # block 784 (the state page forces it): 1,004 and 5,004 slots stay in 2 + 7 blocks, no more KV; each sequence
    # keeps 2 more pages in each of the 3 state groups, a page 17 slots · 784 · 4,096 B = 54,591,488 B
    assert peak["extra_kv_bytes"] == 2 * 3 * 2 * 54_591_488 == 655_097_856
