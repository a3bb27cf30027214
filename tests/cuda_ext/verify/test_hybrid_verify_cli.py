"""`kvcalc verify --model hybrid-tiny` through the CLI: exit codes, bad input named by its flag, and the CSV's
columns (every event, the hybrid ones included)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from kvcalc.cuda_ext.verify.hybrid_scenarios import HYBRID_EVENT_LABELS


def test_cli_hybrid_exit_codes(run_cli):
    ok = run_cli("verify", "--model", "hybrid-tiny", "--scenario", "hybrid-prefix-cache", "--json")
    assert ok.exit_code == 0 and ok.json()["status"] == "passed"
    caught = run_cli("verify", "--model", "hybrid-tiny", "--scenario", "hybrid-prefix-cache", "--inject",
                     "stale-state", "--json")
    assert caught.exit_code == 1 and caught.json()["inject_status"] == "caught"  # the run fails, as it must
    idle = run_cli("verify", "--model", "hybrid-tiny", "--scenario", "hybrid-cancel", "--inject", "stale-state")
    assert idle.exit_code == 4 and "NOT EXERCISED" in idle.stdout


def test_cli_hybrid_csv_has_the_hybrid_events(run_cli):
    result = run_cli("verify", "--model", "hybrid-tiny", "--scenario", "hybrid-preempt-swap", "--format", "csv")
    assert result.exit_code == 0
    header, row = [line for line in result.stdout.splitlines() if line and not line.startswith("#")]
    columns = dict(zip(header.split(","), row.split(","), strict=True))
    assert columns["name"] == "hybrid-preempt-swap" and columns["passed"] == "true"
    # the events every scenario has, then the hybrid ones, each with the count the JSON reports
    doc = run_cli("verify", "--model", "hybrid-tiny", "--scenario", "hybrid-preempt-swap", "--json").json()
    events = doc["scenarios"][0]["events"]
    assert {f"event_{k}" for k in HYBRID_EVENT_LABELS} <= set(columns) and "event_late_reads" in columns
    assert all(int(columns[f"event_{k}"]) == v for k, v in events.items())
    assert int(columns["event_swapped_state_pages"]) > 0


@pytest.mark.parametrize("args, says", [
    (["--inject", "early-free"], "--inject"), (["--scenario", "ragged"], "--scenario"),
])
def test_cli_hybrid_bad_input(run_cli, args, says):
    bad = run_cli("verify", "--model", "hybrid-tiny", *args)
    assert bad.exit_code == 2 and says in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
