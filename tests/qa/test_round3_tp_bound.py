"""Round-3 QA: the largest --tp is one value (kvcalc.core.model.layers.MAX_TP = 1,024) with one error in every
command; it was 1,024 in sim, share and plan and 4,096 in size (vllm_memory), each worded differently."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcalc.core.errors import ParameterError
from kvcalc.core.model.layers import MAX_TP, check_tp

TRACE = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "mooncake_conversation.jsonl"
# The one error for a tp above the bound, whichever command reads it.
ABOVE = ("error: --tp 5000 is above its limit of 1,024 GPUs, the largest tensor-parallel size kvcalc takes; "
         "give --tp 1024 or fewer")


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, lines
    return lines[0]


def test_the_bound_is_1024_and_its_ends_are_taken() -> None:
    assert MAX_TP == 1024
    assert check_tp(1) == 1 and check_tp(1024) == 1024
    with pytest.raises(ParameterError, match=r"^tp 1025 is above its limit of 1,024 GPUs") as caught:
        check_tp(1025)
    assert caught.value.params == ("tp",)
    with pytest.raises(ParameterError, match=r"^tp must be a positive number of GPUs, got 0"):
        check_tp(0)


@pytest.mark.parametrize("args", [
    ("size", "--model", "llama-3-8b"),  # was "--tp 5,000 is above 32: ... (and kvcalc takes at most 4096)"
    ("sim", "--model", "llama-3-8b", "--requests", "10"),  # was "... is above its limit of 1,024; give a real figure"
    ("plan", "--model", "llama-3-8b", "--gpu-cost", "H100-SXM=4"),  # was --tp '5000': 5000 must be between 1 and 1,024
])
def test_every_command_gives_the_same_bound_and_error(run_cli, args: tuple[str, ...]) -> None:
    assert _one_error_line(run_cli(*args, "--tp", "5000")) == ABOVE


def test_plan_refuses_the_one_value_of_a_list_above_the_bound(run_cli) -> None:
    assert _one_error_line(run_cli("plan", "--model", "llama-3-8b", "--gpu-cost", "H100-SXM=4",
                                   "--tp", "1,5000")) == ABOVE


@pytest.mark.skipif(not TRACE.exists(), reason="the shared Mooncake trace is absent (../shared/traces)")
def test_share_gives_the_same_bound_and_error(run_cli) -> None:
    # was "--tp 5000 must be in 1..1,024"
    result = run_cli("share", "--trace", "mooncake", str(TRACE), "--capacity", "1M", "--model", "llama-3-8b",
                     "--tp", "5000")
    assert _one_error_line(result) == ABOVE


def test_size_still_names_the_attention_heads_below_the_bound(run_cli) -> None:
    # Llama-3-8B has 32 attention heads: tp 64 is within 1..1,024 but leaves GPUs without a head
    line = _one_error_line(run_cli("size", "--model", "llama-3-8b", "--tp", "64"))
    assert line.startswith("error: --tp 64 is above 32: each GPU needs at least one of Llama-3-8B's attention heads")
