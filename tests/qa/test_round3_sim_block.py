"""Round-3 QA of sim's "one KV block does not fit" error: it said "use a smaller --block (e.g. 16)" even with
--block 16 (a huge --layers), so the fix it gave could not work. Now it names the largest block that fits, or,
when no block size can fit, what can: a larger GPU or more --tp, or (when not even that) the model's dimensions."""

from __future__ import annotations

import re

import pytest


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines
    return lines[0]


def _runs(run_cli, *args: str) -> bool:
    result = run_cli("sim", *args, "--requests", "2", "--json")
    assert result.exit_code in (0, 2), result.stderr
    return result.exit_code == 0


def test_a_huge_layer_count_at_block_16_suggests_a_block_that_fits(run_cli) -> None:
    # One token of Llama-3-8B with 10^6 layers, bf16: 10^6 layers x 8 KV heads x 128 x 2 (K, V) x 2 B
    # = 4,096,000,000 B (3.81 GiB); A100-40GB leaves 19.10 GiB for the pool: 5 tokens (20.48e9 B) fit, 6 do not
    # (24.58e9 B). Was "use a smaller --block (e.g. 16)" with --block 16.
    # (--layout ideal: kvcalc's own pool takes any block size; vLLM's layout only 1 to 256, test_sim_setup_vllm)
    args = ("--model", "llama-3-8b", "--layers", "1000000", "--layout", "ideal")
    line = _one_error_line(run_cli("sim", *args))
    assert line.endswith("use --block 5 or smaller"), line
    assert "(e.g. 16)" not in line
    assert _runs(run_cli, *args, "--block", "5") and not _runs(run_cli, *args, "--block", "6")


def test_the_suggested_block_is_the_largest_that_fits(run_cli) -> None:
    # 131,072 B a token (32 layers x 8 x 128 x 2 x 2 B): the suggestion N runs and N + 1 is refused
    ideal = ("--model", "llama-3-8b", "--layout", "ideal")  # any block size (kvcalc's own pool)
    line = _one_error_line(run_cli("sim", *ideal, "--block", "100000000"))
    largest = int(re.search(r"use --block (\d+) or smaller$", line).group(1))
    assert 19 * 2**30 // 131072 < largest < 20 * 2**30 // 131072  # the pool is 19.10 GiB
    assert _runs(run_cli, *ideal, "--block", str(largest))
    assert not _runs(run_cli, *ideal, "--block", str(largest + 1))


@pytest.mark.parametrize(("layers", "fix"), [
    # 10^7 layers: 40.96e9 B (38.15 GiB) a token, more than the 19.10 GiB pool; over 8 KV heads (tp 8) 4.77 GiB
    ("10000000", "so no --block fits; use a larger GPU or more --tp"),
    # 10^12 layers: 4.096e15 B a token; even split over all 8 KV heads, 5.12e14 B, above any GPU (H200: 141 GB)
    ("1e12", "so no --block fits; no GPU kvcalc knows holds one token at any --tp: check the model's dimensions"),
])
def test_no_block_size_fits_names_what_can(run_cli, layers: str, fix: str) -> None:
    line = _one_error_line(run_cli("sim", "--model", "llama-3-8b", "--layers", layers))
    assert fix in line and "smaller --block" not in line, line


def test_a_mamba_hybrid_with_a_huge_block_suggests_a_smaller_one_that_works(run_cli) -> None:
    line = _one_error_line(run_cli("sim", "--model", "nemotron-h-56b", "--gpu", "H200", "--block", "100000000"))
    # vLLM's layout takes the block sizes vLLM takes (its Mamba state then raises the block to 4,128 tokens)
    assert "--block 100,000,000: vLLM pages blocks of 1, 8, 16, 32, 64, 128 or 256 tokens only" in line, line
    assert _runs(run_cli, "--model", "nemotron-h-56b", "--gpu", "H200", "--block", "16")
