"""`kvcalc plan` through the CLI: the chosen point's printed `kvcalc sim` command reproduces its figures
exactly, the output formats, the cache flags, and bad input."""

from __future__ import annotations

import csv
import io
import shlex

import pytest

# The hand-checked workload of tests/core/plan/conftest.py: A100-80GB tp4 at $6/h is the answer.
HAND = ("--model", "Llama-3.1-8B", "--rate", "0.05", "--requests", "40", "--prompt-dist", "uniform:low=64,high=64",
        "--output-dist", "uniform:low=128,high=128", "--slo", "tpot=4ms", "--gpu-cost", "A100-80GB=1.5",
        "--gpu-cost", "H100-SXM=4", "--replicas", "1", "--jobs", "1", "--no-cache")


@pytest.fixture(scope="module")
def hand_doc():
    import json

    from typer.testing import CliRunner

    from kvcalc.cli.app import app

    result = CliRunner().invoke(app, ["plan", *HAND, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _sim(run_cli, command: str) -> dict:
    argv = shlex.split(command)
    assert argv[:2] == ["kvcalc", "sim"]
    result = run_cli(*argv[1:], "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()


def test_the_printed_sim_command_reproduces_the_chosen_point_exactly(run_cli, hand_doc):
    chosen = hand_doc["points"][hand_doc["chosen"]]
    assert (chosen["gpu"], chosen["tp"], chosen["cost_per_hour"]) == ("A100-80GB", 4, 6.0)
    sim = _sim(run_cli, hand_doc["sim_command"])
    assert sim["slo_attainment"] == chosen["slo_attainment"]
    for key in ("ttft", "tpot", "e2e"):
        for stat in ("mean", "p50", "p90", "p99"):
            assert sim[f"{key}_s"][stat] == chosen[f"{key}_{stat}_s"], (key, stat)
    assert sim["max_rate_rps"]["paged"] == chosen["max_rate_rps"]
    assert sim["max_rate_search"]["paged"]["evaluations"] == chosen["evaluations"]
    assert sim["memory_plan"]["num_blocks"] == chosen["memory"]["num_blocks"]
    assert (sim["throughput_rps"], sim["preemptions"]) == (chosen["throughput_rps"], chosen["preemptions"])


def test_the_next_cheaper_point_simulated_alone_misses_the_slo(run_cli, hand_doc):
    from kvcalc.core.plan.space import Point, point_options, sim_argv
    from kvcalc.core.sim.options import SimOptions

    chosen = hand_doc["points"][hand_doc["chosen"]]
    cheaper = max((p for p in hand_doc["points"] if p["cost_per_hour"] < chosen["cost_per_hour"]),
                  key=lambda p: p["cost_per_hour"])
    assert (cheaper["gpu"], cheaper["tp"], cheaper["verdict"]) == ("H100-SXM", 1, "slo_missed")
    base = SimOptions(model="Llama-3.1-8B", rate="0.05", requests=40, prompt_dist="uniform:low=64,high=64",
                      output_dist="uniform:low=128,high=128", slo="tpot=4ms")
    point = Point(cheaper["gpu"], cheaper["tp"], 16, 8192, "bf16", 1)
    sim = _sim(run_cli, shlex.join(["kvcalc", "sim", *sim_argv(point_options(base, point))]))
    assert sim["slo_attainment"] < 0.9
    assert sim["slo_attainment"] == cheaper["slo_attainment"]
    assert sim["tpot_s"]["p99"] == cheaper["tpot_p99_s"]


def test_table_names_the_choice_the_command_and_every_verdict(run_cli):
    result = run_cli("plan", *HAND)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "chosen: #2 A100-80GB tp4" in out
    assert "reproduce it: kvcalc sim --rate 0.05" in out and "--gpu A100-80GB --tp 4" in out
    assert "6 points: 3 SLO missed, 3 serves" in out and "serves (chosen)" in out
    assert "Pareto front" in out


def test_csv_and_markdown(run_cli):
    result = run_cli("plan", *HAND, "--format", "csv")
    assert result.exit_code == 0, result.stderr
    every = result.stdout.split("# Every point\n")[1]
    rows = list(csv.DictReader(io.StringIO(every)))
    assert [r["verdict"] for r in rows].count("serves") == 3
    assert {r["on_cost_front"] for r in rows} == {"true", "false"}
    markdown = run_cli("plan", *HAND, "--format", "markdown")
    assert markdown.exit_code == 0 and "| # " in markdown.stdout


def test_cache_dir_is_read_back(run_cli, tmp_path):
    args = [a for a in HAND if a != "--no-cache"]
    first = run_cli("plan", *args, "--cache-dir", str(tmp_path), "--json")
    second = run_cli("plan", *args, "--cache-dir", str(tmp_path), "--json")
    assert first.exit_code == second.exit_code == 0, first.stderr + second.stderr
    assert (first.json()["cached_points"], second.json()["cached_points"]) == (0, 6)
    assert first.json()["points"] == second.json()["points"]
    assert "6 from the cache" in second.stderr


def test_plot(run_cli, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "plan.png"
    result = run_cli("plan", *HAND, "--plot", str(path))
    assert result.exit_code == 0, result.stderr
    assert path.stat().st_size > 1000


@pytest.mark.parametrize(("args", "message"), [
    (("--slo", "tpot=4ms"), "--gpu-cost is required"),
    (("--slo", "tpot=4ms", "--gpu-cost", "H100-SXM"), "write NAME=PRICE_PER_HOUR"),
    (("--slo", "tpot=4ms", "--gpu-cost", "X999=9"), "unknown GPU 'X999'"),
    (("--slo", "tpot=4ms", "--gpu-cost", "H100-SXM=-1"), "positive finite"),
    (("--slo", "tpot=4ms", "--gpu-cost", "H100-SXM=4", "--gpu", "H200"), "--gpu H200 has no price"),
    (("--gpu-cost", "H100-SXM=4"), "--slo is required"),
    (("--slo", "tpot=4ms", "--gpu-cost", "H100-SXM=4", "--tp", "1,x"), "--tp '1,x': 'x' is not an integer"),
    (("--slo", "tpot=4ms", "--gpu-cost", "H100-SXM=4", "--tp", "3"), "--tp 3"),
    (("--slo", "tpot=4ms", "--gpu-cost", "H100-SXM=4", "--dtype", "bf16,bf16"), "--dtype 'bf16,bf16' names bf16"),
    (("--slo", "tpot=4ms", "--gpu-cost", "H100-SXM=4", "--jobs", "0"), "--jobs 0 must be at least 1"),
    (("--slo", "tpot=4ms", "--gpu-cost", "H100-SXM=4", "--jobs", "2", "--ray", "auto"), "not both"),
    (("--slo", "tpot=4ms", "--gpu-cost", "H100-SXM=4", "--no-cache", "--cache-dir", "x"), "not both"),
    (("--slo", "tpot=4ms", "--gpu-cost", "H100-SXM=4", "--rate", "inf"), "--rate"),
])
def test_bad_input_is_one_error_line(run_cli, args, message):
    result = run_cli("plan", "--requests", "10", *args)
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0], lines[0]


def test_a_hybrid_plan_says_which_block_it_simulated(run_cli):
    """Nemotron-H (Mamba hybrid): the KV cache layout may set the pool's page size; the plan says so."""
    # a 1 ms TPOT is lost at the point's own load: one run, no search
    args = ("plan", "--model", "Nemotron-H-56B", "--rate", "0.05", "--requests", "20", "--slo", "tpot=1ms",
            "--gpu-cost", "H200=5", "--tp", "8", "--replicas", "1", "--jobs", "1", "--no-cache")
    doc = run_cli(*args, "--json").json()
    (point,) = doc["points"]
    assert point["verdict"] == "slo_missed"
    table = run_cli(*args).stdout
    simulated = point["memory"]["block_size"]
    assert ("the pool's block differs" in table) == (simulated != 16)
    if simulated != 16:
        assert f"16 → {simulated:,} tokens" in table


def test_a_point_that_never_saw_a_rate_fail_is_called_one_batch(run_cli):
    # 100 requests at sim's default 1 req/s: every doubling passed up to 2^12 = 4,096 req/s, where the 100 arrive
    # within 100 / 4,096 = 0.0244 s — the table's "≥ 4096" is a batch, not a sustained rate, and a note says so
    result = run_cli("plan", "--model", "Llama-3-8B", "--gpu", "H100-SXM", "--gpu-cost", "H100-SXM=2", "--requests",
                     "100", "--slo", "ttft=2", "--tp", "1", "--replicas", "1", "--jobs", "1", "--no-cache")
    assert result.exit_code == 0, result.stderr
    assert ("1 point never saw a rate fail (max rate '≥'): at 4,096 req/s the 100 requests arrive within about "
            "0.0244 s, one batch") in " ".join(result.stdout.split())
