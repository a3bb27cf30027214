"""`kvcalc sim` through the CLI: the JSON contract, labels, files it writes, and bad input."""

from __future__ import annotations

import csv
import json

import pytest

CONTRACT = ("requests", "completed", "rejected", "timed_out", "cancelled", "preemptions", "ttft_s", "tpot_s",
            "e2e_s", "throughput_rps", "goodput_rps", "memory")
SMALL = ("--requests", "60", "--rate", "4")


def test_json_contract(run_cli):
    result = run_cli("sim", *SMALL, "--slo", "ttft=1,tpot=50ms", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    for key in CONTRACT:
        assert key in doc, key
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(doc[key]) == {"mean", "p50", "p90", "p99"}
    assert doc["requests"] == 60
    assert doc["completed"] + doc["rejected"] + doc["timed_out"] + doc["cancelled"] == 60
    memory = doc["memory"]
    parts = ("useful", "tail_fragmentation", "reservation_waste", "external_fragmentation", "cached_free", "free")
    assert sum(memory[p] for p in parts) == pytest.approx(1.0)
    assert doc["workload"]["kind"] == "constructed"
    assert doc["latency_source"].startswith("roofline")
    assert doc["goodput_rps"] <= doc["throughput_rps"]


def test_table_says_where_latencies_and_workload_come_from(run_cli):
    result = run_cli("sim", *SMALL)
    assert result.exit_code == 0, result.stderr
    assert "latencies come from the step-time model" in result.stdout
    assert "workload is constructed" in result.stdout


def test_compare_runs_every_policy_on_one_workload(run_cli):
    result = run_cli("sim", *SMALL, "--compare", "paged,reserve-max,reserve-pow2,reserve-oracle", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert list(doc["policies"]) == ["paged", "reserve-max", "reserve-pow2", "reserve-oracle"]
    assert doc["policy"] == "paged" and doc["completed"] == doc["policies"]["paged"]["completed"]
    useful = {p: s["memory"]["useful_of_occupied"] for p, s in doc["policies"].items()}
    assert useful["paged"] > useful["reserve-oracle"] > useful["reserve-max"]


def test_max_rate_per_policy(run_cli):
    result = run_cli("sim", "--requests", "40", "--rate", "2", "--compare", "paged,reserve-max",
                     "--slo", "ttft=0.5", "--max-rate", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    rates = doc["max_rate_rps"]
    assert set(rates) == {"paged", "reserve-max"}
    assert rates["paged"] >= rates["reserve-max"] > 0
    for name, search in doc["max_rate_search"].items():
        passing = [r for r, share in search["evaluations"] if share >= 0.9]
        assert rates[name] == max(passing)


def test_real_trace_is_labelled_and_time_scaled(run_cli, tmp_path):
    path = tmp_path / "azure.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:15:{10 + i:02d}.0000000,{100 + 7 * i},{20 + i}" for i in range(30)]
    path.write_text("\n".join(rows) + "\n")
    result = run_cli("sim", "--trace", "azure", str(path), "--time-scale", "2", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["workload"]["kind"] == "real"
    assert doc["workload"]["mean_rate_rps"] == pytest.approx(2.0)  # one request a second, twice as fast
    assert doc["completed"] == 30


def test_mooncake_prefix_hits(run_cli, tmp_path):
    path = tmp_path / "mooncake.jsonl"
    lines = [json.dumps({"timestamp": 1000 * i, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3 + i]})
             for i in range(10)]
    path.write_text("\n".join(lines) + "\n")
    result = run_cli("sim", "--trace", "mooncake", str(path), "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["completed"] == 10


def test_timeline_and_cancellations(run_cli, tmp_path):
    out = tmp_path / "timeline.csv"
    result = run_cli("sim", *SMALL, "--cancel-fraction", "0.5", "--timeline", str(out), "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["cancelled"] > 0
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and rows[0]["policy"] == "paged"
    assert float(rows[-1]["t_end_s"]) == pytest.approx(result.json()["duration_s"])


@pytest.mark.parametrize(("args", "needle"), [
    (("--gpu", "Z900"), "unknown GPU"),
    (("--rate", "-1"), "--rate"),
    (("--slo", "ttft=fast"), "--slo"),
    (("--slo", "latency=2"), "--slo"),
    (("--weights-bytes", "100GB"), "short"),
    (("--model", "Llama-3-8B", "--gpu", "A100-40GB", "--tp", "0"), "--tp"),
    (("--policy", "buddy"), "unknown policy"),
    (("--preempt", "drop"), "--preempt"),
    (("--cancel-fraction", "1.5"), "--cancel-fraction"),
    (("--max-rate",), "--slo"),
    (("--prompt-dist", "lognormal:mean=-3"), "mean"),
    (("--gpu-memory", "80GiB"), "together"),
])
def test_bad_input_is_one_line_exit_2(run_cli, args, needle):
    result = run_cli("sim", "--requests", "5", *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr


def test_weights_that_do_not_fit_say_by_how_much(run_cli):
    result = run_cli("sim", "--weights-bytes", "50GiB", "--gpu", "A100-40GB")
    # budget int(0.92 · 42,298,834,944 B) = 38,914,928,148 B = 36.24 GiB (vLLM 0.21's default utilisation of what
    # CUDA shows on an A100-40GB); 50 GiB = 53,687,091,200 B of weights are 14,772,163,052 B = 13.76 GiB short
    assert result.exit_code == 2
    assert "gives 36.24 GiB: 13.76 GiB short" in result.stderr


def test_trace_without_requests(run_cli, tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    result = run_cli("sim", "--trace", "azure", str(path))
    assert result.exit_code == 2 and "no requests" in result.stderr


def test_calibrate_sets_the_attention_efficiency(run_cli, tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"},
                                 "timing": [{"achieved_tbps": 2.68}]}))
    result = run_cli("sim", *SMALL, "--model", "Llama-3-8B", "--gpu", "H100-SXM", "--calibrate", str(bench), "--json")
    assert result.exit_code == 0, result.stderr
    assert "attention 0.8," in result.json()["latency_source"]  # 2.68 / 3.35 = 0.8
    table = run_cli("sim", *SMALL, "--model", "Llama-3-8B", "--gpu", "H100-SXM", "--calibrate", str(bench))
    assert "median achieved 2.680 TB/s" in table.stdout


@pytest.mark.parametrize("flag", ["--limit", "--requests", "--tp", "--block", "--max-batched-tokens", "--max-seqs",
                                  "--max-model-len", "--seed", "--kv-heads"])
def test_every_integer_option_says_not_an_integer_the_same_way(run_cli, flag):
    # the wording of size/frag, not pydantic's "Input should be a valid integer"
    result = run_cli("sim", flag, "abc")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {flag} 'abc' is not an integer: write a whole number")
    assert result.stderr.count("\n") == 1


def test_integer_spellings_are_read_exactly(run_cli):
    # 1e1 = 10 requests, 8.192e3 = 8192, 2.56e2 = 256, 1_6 = 16, 2e3 = 2000: same document as the plain values
    common = ("--rate", "4", "--json")
    plain = run_cli("sim", "--requests", "10", "--max-batched-tokens", "8192", "--max-seqs", "256", "--block", "16",
                    "--max-model-len", "2000", *common)
    spelled = run_cli("sim", "--requests", "1e1", "--max-batched-tokens", "8.192e3", "--max-seqs", "2.56e2",
                      "--block", "1_6", "--max-model-len", "2e3", *common)
    assert spelled.exit_code == 0, spelled.stderr
    assert spelled.json() == plain.json() and plain.json()["requests"] == 10


def test_timeline_into_a_missing_directory_is_refused_before_the_run(run_cli, tmp_path):
    # the directory is named (as frag --plot), not "no such file"; nothing runs first
    target = tmp_path / "missing" / "t.csv"
    result = run_cli("sim", "--requests", "3", "--timeline", str(target))
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (f"error: --timeline {target}: the directory {target.parent} does not exist; "
                             "create it or write the file elsewhere\n")
    directory = run_cli("sim", "--requests", "3", "--timeline", str(tmp_path))
    assert directory.exit_code == 2 and f"--timeline {tmp_path} is a directory" in directory.stderr


def test_an_empty_slo_is_refused(run_cli):
    result = run_cli("sim", "--requests", "3", "--slo", "")
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: --slo '' names no target: give e.g. ttft=2,tpot=100ms,e2e=30, "
                                     "or drop --slo")


def test_default_kv_dtype_is_bf16_and_shown(run_cli):
    default = run_cli("sim", "--requests", "5", "--json")
    fp16 = run_cli("sim", "--requests", "5", "--dtype", "fp16", "--json")
    assert default.json()["kv_dtype"] == "bf16" and fp16.json()["kv_dtype"] == "fp16"
    # both are 16 bits: the same pool, the same run
    assert default.json()["policies"] == fp16.json()["policies"]
    assert "per token in bf16" in run_cli("sim", "--requests", "5").stdout


def test_progress_bar_goes_to_a_terminal_on_stderr_and_never_to_stdout():
    """A real terminal on stderr (a pty), stdout a pipe: the bar is drawn there and --json stays one document.
    The terminal is read while the command runs (a full pty would block its writes)."""
    import os
    import pty
    import subprocess
    import sys
    import threading

    from kvcalc.cli.sim import PROGRESS_FROM

    leader, follower = pty.openpty()
    drawn = bytearray()

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # closed once the command has exited and everything is read
                return
            if not chunk:
                return
            drawn.extend(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    command = ["sim", "--requests", str(PROGRESS_FROM), "--rate", "5", "--json"]
    proc = subprocess.run([sys.executable, "-c", "from kvcalc.cli.app import main; main()", *command],
                          stdout=subprocess.PIPE, stderr=follower, timeout=300, check=False)
    os.close(follower)
    reader.join(timeout=10)
    os.close(leader)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["requests"] == PROGRESS_FROM
    assert b"simulating paged" in drawn, bytes(drawn[:300])


@pytest.mark.parametrize("flag", ["--time-scale", "--memory-utilization", "--flops", "--attainment", "--draft-cost"])
def test_a_float_option_that_is_not_a_number_names_it_and_a_fix(run_cli, flag):
    result = run_cli("sim", "--requests", "3", flag, "")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {flag} '' is not a number: write e.g. {flag} ")
