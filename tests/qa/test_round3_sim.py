"""Round-3 QA of `kvcalc sim`: each test one defect found by running it on real configs and bad inputs."""

from __future__ import annotations

import pytest


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines
    return lines[0]


@pytest.mark.parametrize(("flag", "value"), [("--compare", "paged,reserve-max"), ("--policy", "reserve-max")])
def test_a_reservation_policy_on_a_hybrid_names_the_flag_given(run_cli, flag: str, value: str) -> None:
    # was "--policy reserve-max: ..." also when the user gave --compare paged,reserve-max
    line = _one_error_line(run_cli("sim", "--model", "gemma-3-27b", "--gpu", "H200", "--requests", "5", flag, value))
    assert line.startswith(f"error: {flag} reserve-max: the reservation policies reserve one region")
