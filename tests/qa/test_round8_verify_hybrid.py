"""Round-8 QA, issue 19 ("New faults, each caught (exit 1)"): `kvcalc verify --model hybrid-tiny` exits 0 on a
clean run and 1 when a planted hybrid fault is caught wherever it acted (the run fails, as a negative control
must; 5 would say it went unnoticed, 4 that it never acted)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")


def _verify(run_cli, *args: str) -> tuple[int, dict]:
    result = run_cli("verify", "--model", "hybrid-tiny", "--device", "cpu", *args, "--json")
    assert "error" not in result.stderr, result.stderr
    return result.exit_code, result.json()


def test_clean_hybrid_run_exits_0(run_cli) -> None:
    code, doc = _verify(run_cli, "--scenario", "hybrid-ragged", "--scenario", "hybrid-prefix-chunked")
    assert (code, doc["status"], doc["passed"]) == (0, "passed", True)
    assert all(s["mismatched_tokens"] == 0 for s in doc["scenarios"])


@pytest.mark.parametrize(("fault", "scenarios"), [
    # a sliding block freed while still inside the window: the window's reads see another block's K/V
    ("swa-early-free", ("hybrid-ragged", "hybrid-prefix-cache")),
    # a prefix hit restores the state saved at another position: only prefix hits act
    ("stale-state", ("hybrid-prefix-chunked", "hybrid-ragged")),
    # the state computed over rejected drafts left in place (vLLM #48375's class): only speculation acts
    ("no-state-rewind", ("hybrid-speculative",)),
])
def test_each_hybrid_fault_is_caught_exit_1(run_cli, fault: str, scenarios: tuple[str, ...]) -> None:
    code, doc = _verify(run_cli, "--inject", fault, *(a for s in scenarios for a in ("--scenario", s)))
    assert code == 1
    assert doc["inject"] == fault and doc["inject_status"] == "caught" and doc["inject_fired"] > 0
    assert doc["inject_undetected_in"] == [] and not doc["passed"]
    for s in doc["scenarios"]:  # wherever it acted a check failed; where it never acted the scenario passed
        assert (s["fault"], s["passed"]) in {("caught", False), ("not exercised", True)}, s["name"]
    assert doc["inject_caught_by"]


def test_a_fault_that_never_acts_exits_4(run_cli) -> None:
    # stale-state acts only on a prefix hit: hybrid-ragged shares no prefix
    code, doc = _verify(run_cli, "--inject", "stale-state", "--scenario", "hybrid-ragged")
    assert (code, doc["inject_status"], doc["inject_fired"]) == (4, "not exercised", 0)
