"""Round-3 QA of `kvcalc plan`: each test one defect found by running it on bad inputs."""

from __future__ import annotations

import socket
import time

import pytest


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines
    return lines[0]


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_an_unreachable_ray_address_is_one_error_line_before_any_work(run_cli, address: str) -> None:
    # was: ray.init retried the address without end (--ray foo:1 ran past 6 minutes printing GCS warnings)
    pytest.importorskip("ray")
    address = address.format(port=_closed_port())
    start = time.monotonic()
    line = _one_error_line(run_cli("plan", "--gpu-cost", "H100-SXM=4", "--slo", "ttft=2", "--requests", "10",
                                   "--ray", address))
    assert time.monotonic() - start < 30
    assert line.startswith(f"error: --ray {address}: nothing answers at 127.0.0.1:") and "--ray auto" in line


@pytest.mark.parametrize("address", ["foo", "foo:bar", ":6379", "host:70000"])
def test_a_ray_address_that_is_not_host_port_is_refused(run_cli, address: str) -> None:
    line = _one_error_line(run_cli("plan", "--gpu-cost", "H100-SXM=4", "--slo", "ttft=2", "--ray", address))
    assert f"--ray {address!r}: give auto or a cluster address HOST:PORT" in line
