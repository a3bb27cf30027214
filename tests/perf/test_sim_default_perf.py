"""`kvcalc sim --trace azure <conversation trace>` with the defaults (OPT-13B on one A100-40GB), and its
--max-rate search, as whole processes (issue 18; run with `python -m pytest -m perf
tests/perf/test_sim_default_perf.py -s`).

Wall time and peak resident memory of each child from the kernel's accounting (os.wait4), best of three.
Goals: the plain run <= 2 s; time linear in requests (exponent of a least-squares fit over 5,000 / 10,000 /
19,366 requests <= 1.2), with the memory per request stated (the slope of peak RSS over those runs); the
--max-rate search of the whole trace <= 10 s — its target (0.9 of requests within ttft 2 s, tpot 100 ms)
is out of reach at any rate (14.7 % of the requests are longer than OPT-13B's 2,048 tokens and are
rejected), which the search must report after the one run sim has already done.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.perf
TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure_llm_2023_conv.csv"
SIM = [sys.executable, "-m", "kvcalc", "sim", "--trace", "azure", str(TRACE), "--json"]


def run_process(args: list[str]) -> tuple[str, float, float]:
    """(stdout, wall seconds, peak resident MiB) of one child process (its output is small: no pipe fills)."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out = proc.stdout.read()
    proc.stdout.close()
    assert os.waitstatus_to_exitcode(status) == 0
    return out, wall, usage.ru_maxrss / 1024


def best_of(args: list[str], runs: int = 3) -> tuple[str, float, float]:
    results = [run_process(args) for _ in range(runs)]
    return results[0][0], min(r[1] for r in results), min(r[2] for r in results)


@pytest.fixture(autouse=True)
def need_trace() -> None:
    if not TRACE.is_file():
        pytest.skip(f"the Azure conversation trace is not at {TRACE} (see ../shared/traces/README.md)")


def test_sim_default_is_fast_and_linear_in_requests() -> None:
    sizes, walls, mibs = [], [], []
    for limit in (5_000, 10_000, None):
        doc, wall, mib = best_of([*SIM, *([] if limit is None else ["--limit", str(limit)])])
        sizes.append(json.loads(doc)["requests"])
        walls.append(wall)
        mibs.append(mib)
    exponent = float(np.polyfit(np.log(sizes), np.log(walls), 1)[0])
    per_request = (mibs[-1] - mibs[0]) * 2**20 / (sizes[-1] - sizes[0])
    rows = zip(sizes, walls, mibs, strict=True)
    print("\n" + "; ".join(f"{n:,} requests: {w:.2f} s, {m:.0f} MiB" for n, w, m in rows)
          + f"; time ~ requests^{exponent:.2f}; peak memory {per_request:,.0f} bytes per request")
    assert exponent <= 1.2, f"time grows as requests^{exponent:.2f}"
    assert walls[-1] <= 2.0, f"the whole trace takes {walls[-1]:.2f} s (goal 2 s)"


def test_unreachable_max_rate_is_reported_after_one_run() -> None:
    """The search adds no run to sim's own: in turn with the plain run, their time ratio stays near 1."""
    rounds = [(run_process([*SIM, "--slo", "ttft=2,tpot=100ms", "--max-rate"]), run_process(SIM)) for _ in range(3)]
    doc, wall = rounds[0][0][0], min(r[0][1] for r in rounds)
    plain_wall = min(r[1][1] for r in rounds)
    search = json.loads(doc)["max_rate_search"]["paged"]
    print(f"\n--max-rate on the whole trace: {wall:.2f} s (the plain run {plain_wall:.2f} s: "
          f"{wall / plain_wall:.2f}x), {len(search['evaluations'])} evaluation(s): {search['unattainable']}")
    assert len(search["evaluations"]) == 1 and "rejected at any rate" in search["unattainable"]
    assert wall / plain_wall <= 1.25, f"the search takes {wall / plain_wall:.2f}x the plain run"
    assert wall <= 10.0, f"the search takes {wall:.2f} s (goal 10 s)"


def test_reachable_max_rate_search_takes_few_runs() -> None:
    """A reachable target (0.8: 85.3 % of the requests fit the model) on the whole trace: the search starts from
    sim's own run, stops each later run once its verdict is certain, and answers to its stated 2 % resolution."""
    doc, wall, _ = run_process([*SIM, "--slo", "ttft=2,tpot=100ms", "--attainment", "0.8", "--max-rate"])
    search = json.loads(doc)["max_rate_search"]["paged"]
    lo, hi = search["bracket_rps"]
    print(f"\nreachable --max-rate on the whole trace: {wall:.2f} s, {len(search['evaluations'])} runs, "
          f"{lo:.4f} req/s, bracket [{lo:.4f}, {hi:.4f}]")
    assert search["unattainable"] is None and hi - lo <= 0.02 * lo  # the stated resolution (search.REL_TOL)
    assert wall <= 10.0, f"the search takes {wall:.2f} s (goal 10 s)"
