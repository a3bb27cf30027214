"""What the round-7 sweep of `kvcalc frag` over real configs, the four shared traces and bad inputs found wrong,
each pinned: block sizes vLLM refuses are said so (the best-block note claimed vLLM accepts 7 and 9)."""

from __future__ import annotations

import pytest


def _text(run_cli, *args: str) -> str:
    result = run_cli("frag", *args)
    assert result.exit_code == 0, result.stderr
    return " ".join(result.stdout.split())


@pytest.mark.parametrize("model", ["gemma-3-27b", "nemotron-h-56b", "llama-3-8b"])
def test_block_sizes_vllm_refuses_are_said_so(run_cli, model: str) -> None:
    # vLLM's --block-size takes 1, 8, 16, 32, 64, 128 or 256 (CacheConfig.BlockSize): 7 and 9 are neither
    both = _text(run_cli, "--model", model, "--block", "7", "--block", "9")
    assert "that vLLM's block_size accepts: 7, 9" not in both
    assert "None of the sizes given (7, 9) is one vLLM's block_size accepts" in both
    one = _text(run_cli, "--model", model, "--block", "7")
    assert "None of the sizes given (7) is one vLLM's block_size accepts" in one
    # under --layout ideal no engine is asked: no such note
    ideal = _text(run_cli, "--model", model, "--block", "7", "--layout", "ideal")
    assert "accepts" not in ideal


def test_accepted_sizes_keep_their_notes(run_cli) -> None:
    mixed = _text(run_cli, "--model", "gemma-3-27b", "--block", "7", "--block", "16")
    assert "Best block size: only B = 16 of those given is one vLLM accepts." in mixed
    assert "None of the sizes given" not in mixed
    plain = _text(run_cli, "--model", "gemma-3-27b", "--block", "16", "--block", "32")
    assert "chosen among the sizes given that vLLM's block_size accepts: 16, 32." in plain
