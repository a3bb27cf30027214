"""`kvcalc sim --host-cache … --disk-cache …` on the command line: the rungs side by side in JSON, the GPU-only
rung equal to a plain run, the max rate of every rung, errors as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

TRACE = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "mooncake_conversation.jsonl"
BASE = ["sim", "--trace", "mooncake", str(TRACE), "--model", "Llama-3.1-8B", "--gpu", "A100-40GB"]

needs_trace = pytest.mark.skipif(not TRACE.exists(), reason="../shared/traces/mooncake_conversation.jsonl is absent")


@needs_trace
def test_rungs_side_by_side(run_cli) -> None:
    tiered = run_cli(*BASE, "--limit", "300", "--host-cache", "20GiB", "--disk-cache", "100GiB", "--json")
    assert tiered.exit_code == 0, tiered.stderr
    doc = tiered.json()
    rungs = doc["tiers"]["rungs"]
    assert [r["label"] for r in rungs] == ["GPU only", "GPU + host", "GPU + host + disk"]
    plain = run_cli(*BASE, "--limit", "300", "--json")
    assert plain.exit_code == 0, plain.stderr
    # the GPU-only rung is the plain run (tiers of size 0), and the last rung is the run the report shows
    assert rungs[0]["ttft_mean_s"] == plain.json()["ttft_s"]["mean"]
    assert rungs[-1]["ttft_mean_s"] == doc["ttft_s"]["mean"]
    per_block = doc["tiers"]["bytes_per_block"]
    assert per_block == 16 * 131_072  # block 16 x (32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B)
    for r in rungs:
        assert r["hit_rate"] == pytest.approx(r["gpu_hit_rate"] + r["host_hit_rate"] + r["disk_hit_rate"])
        assert r["host_read_bytes"] % per_block == 0 and r["disk_read_bytes"] % per_block == 0
    assert rungs[0]["host_read_bytes"] == rungs[0]["host_write_bytes"] == 0
    assert rungs[1]["disk_write_bytes"] == 0 and rungs[1]["host_cache_bytes"] == 20 * 2**30 // per_block * per_block
    assert rungs[2]["hit_rate"] >= rungs[1]["hit_rate"] >= rungs[0]["hit_rate"]


@needs_trace
def test_max_rate_per_rung(run_cli) -> None:
    result = run_cli(*BASE, "--limit", "120", "--host-cache", "20GiB", "--slo", "ttft=5", "--max-rate", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    rates = [r["max_rate_rps"] for r in doc["tiers"]["rungs"]]
    assert len(rates) == 2 and all(rate is not None for rate in rates)
    assert rates[-1] == doc["max_rate_rps"]["paged"]


@pytest.mark.parametrize(("args", "message"), [
    (["--host-bw", "10GB/s"], "error: --host-bw is a tier's link: add --host-cache or --disk-cache"),
    (["--host-cache", "1M", "--policy", "reserve-max"], "error: --host-cache/--disk-cache hold the paged pool's"),
])
def test_errors_are_one_line(run_cli, args, message) -> None:
    result = run_cli("sim", *args)
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(message), result.stderr
