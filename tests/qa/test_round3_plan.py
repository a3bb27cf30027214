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


def test_plan_prints_the_models_notes_as_size_does(run_cli, tmp_path) -> None:
    # the gemma-3-27b-it text_config (no vocab_size, no max_position_embeddings): plan ran on transformers' defaults
    # without a word, where size, frag, share and sim say so
    import json

    text = {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
            "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16, "sliding_window": 1024}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text,
                                                      "torch_dtype": "bfloat16"}))
    result = run_cli("plan", "--config", str(tmp_path), "--gpu-cost", "H200=5", "--tp", "1", "--block", "16",
                     "--replicas", "1", "--slo", "ttft=2", "--requests", "5", "--jobs", "1", "--no-cache", "--json")
    assert result.exit_code == 0, result.stderr
    assert "warning: gemma3_text: vocab_size 262,208 and max_position_embeddings 131,072" in result.stderr
    assert isinstance(result.json(), dict)
