"""Round-3 QA of `kvcalc share`: each test one defect found by running it on real traces and bad inputs."""

from __future__ import annotations

import pytest


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines
    return lines[0]


@pytest.mark.parametrize(("args", "named"), [
    (("--plot", "hits.png"), "--plot applies"),
    (("--gpu", "H100-SXM", "--tp", "2"), "--gpu, --tp apply"),
    (("--capacity", "1M"), "--capacity applies"),
])
def test_a_replay_flag_without_a_trace_names_the_flags_given(run_cli, args: tuple[str, ...], named: str) -> None:
    # was "--capacity and the tier options replay a trace" whichever of them was given (e.g. --plot alone)
    line = _one_error_line(run_cli("share", *args))
    assert line.startswith(f"error: {named} to a trace's prefix-cache replay") and "add --trace mooncake FILE" in line
