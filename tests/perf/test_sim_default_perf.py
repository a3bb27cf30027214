"""`kvcalc sim --trace azure <conversation trace>` with the defaults (OPT-13B on one A100-40GB), and its --max-rate
search, as whole processes (issue 18; run with `python -m pytest -m perf tests/perf/test_sim_default_perf.py -s`).

Every child runs with compiled bytecode (a private PYTHONPYCACHEPREFIX, warmed first), as an installed kvcalc
does: PYTHONDONTWRITEBYTECODE=1 would recompile ~130 modules in every run. Times are CPU seconds of the child
(user + system, from os.wait4), which another process on the machine inflates far less than wall time, and each
is set beside a fixed reference measured in turn with it in the same run: REFERENCE, a plain-Python loop of
known cost (REFERENCE_QUIET_S on a quiet machine). The issue's goal, the whole trace in <= 2 s on
a quiet machine, is then a ratio: sim CPU <= GOAL_S / REFERENCE_QUIET_S x the reference's CPU.

Linearity: CPU seconds at 10 / 50 / 100 % of the trace's requests, less the start-up (a one-request run), fitted
as a power law; the exponent must stay <= 1.2. Memory per request: the slope of peak RSS from 10 % to 100 %.

Where it stands (round 7, loaded 2-core machine, min of interleaved runs): the plain run goes through the lean loop
(core/sim/lean.py: the running batch in plain lists, every figure byte-identical). Whole process against the tree at
the round's start (715aa7a): 3.98 -> 2.28 s CPU (0.57x); against b25049f 5.41 -> 1.91 s (0.35x); the engine alone,
in-process: 2.97 -> 1.31 s (0.44x). Against the reference loop the first test measured 5.4x (1.74 s, ~2.0 s quiet)
and 6.1x (1.97 s) in two runs under different load (goal 5.4x): borderline, not met with a margin; start-up ~0.35 s
of it; the first test fails whenever the ratio is over the goal. The reachable --max-rate search is the search's
own work this round (core/sim/search.py, rate_steps.py).
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
REQUESTS = 19_366  # the trace's requests
GOAL_S = 2.0  # issue 18: the whole trace's plain run, on a quiet machine
REFERENCE = [sys.executable, "-c", "acc = 0\nfor i in range(2_000_000):\n    acc = (acc + i * i) % 1_000_003"]
# The reference's CPU seconds on a quiet machine, derived: the engine before this round (b25049f) took 6.5 s CPU for
# the whole trace on a quiet 2-core machine (issue 18's figure, 21:06); run in turn with it on the same machine under
# load (7 runnable), the reference took 1/17.4 of its CPU (0.46 s against 8.0 s): 6.5 / 17.4 = 0.37 s. The goal
# then reads sim <= 5.4 x the reference.
REFERENCE_QUIET_S = 0.37


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The children's environment: bytecode compiled once into a private cache, then reused."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    environment["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    subprocess.run([*SIM[:4], "--requests", "1", "--json"], check=True, capture_output=True, env=environment)
    return environment


@pytest.fixture(autouse=True)
def need_trace() -> None:
    if not TRACE.is_file():
        pytest.skip(f"the Azure conversation trace is not at {TRACE} (see ../shared/traces/README.md)")


def run_process(args: list[str], env: dict[str, str]) -> tuple[str, float, float, float]:
    """(stdout, CPU seconds, wall seconds, peak resident MiB) of one child (its output is small: no pipe fills)."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.stdout.close()
    assert os.waitstatus_to_exitcode(status) == 0
    return out, usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def best_of(args: list[str], env: dict[str, str], runs: int = 3) -> tuple[str, float, float, float]:
    """The run with the least CPU time, and the least peak memory of the runs."""
    results = [run_process(args, env) for _ in range(runs)]
    best = min(results, key=lambda r: r[1])
    return best[0], best[1], best[2], min(r[3] for r in results)


def test_sim_default_is_fast_and_linear_in_requests(env: dict[str, str]) -> None:
    rounds = [(run_process(REFERENCE, env)[1], run_process(SIM, env)) for _ in range(3)]
    reference = min(r[0] for r in rounds)
    _, cpu, wall, _ = min((r[1] for r in rounds), key=lambda r: r[1])
    ratio = cpu / reference
    start_up = best_of([*SIM[:4], "--requests", "1", "--json"], env)[1]
    sizes, cpus, mibs = [], [], []
    for share in (0.1, 0.5, 1.0):
        doc, seconds, _, mib = best_of([*SIM, "--limit", str(round(REQUESTS * share))], env, runs=2)
        sizes.append(json.loads(doc)["requests"])
        cpus.append(seconds - start_up)
        mibs.append(mib)
    exponent = float(np.polyfit(np.log(sizes), np.log(cpus), 1)[0])
    per_request = (mibs[-1] - mibs[0]) * 2**20 / (sizes[-1] - sizes[0])
    print(f"\nazure default, whole trace: {cpu:.2f} s CPU ({wall:.2f} s wall), {ratio:.1f}x the reference loop "
          f"({reference:.3f} s); on a quiet machine ~{ratio * REFERENCE_QUIET_S:.2f} s (goal {GOAL_S:g} s = "
          f"{GOAL_S / REFERENCE_QUIET_S:.1f}x); start-up {start_up:.2f} s")
    print("; ".join(f"{n:,} requests: {c:.2f} s after start-up, {m:.0f} MiB" for n, c, m in zip(sizes, cpus, mibs,
                                                                                                 strict=True))
          + f"; time ~ requests^{exponent:.2f}; peak memory {per_request:,.0f} bytes per request")
    assert exponent <= 1.2, f"time grows as requests^{exponent:.2f}"
    assert ratio <= GOAL_S / REFERENCE_QUIET_S, (
        f"the whole trace takes {ratio:.1f}x the reference (goal {GOAL_S / REFERENCE_QUIET_S:.1f}x: {GOAL_S:g} s)")


def test_unreachable_max_rate_is_reported_after_one_run(env: dict[str, str]) -> None:
    """The search adds no run to sim's own: in turn with the plain run, their CPU ratio stays near 1."""
    rounds = [(run_process([*SIM, "--slo", "ttft=2,tpot=100ms", "--max-rate"], env), run_process(SIM, env))
              for _ in range(3)]
    doc, cpu = rounds[0][0][0], min(r[0][1] for r in rounds)
    plain_cpu = min(r[1][1] for r in rounds)
    search = json.loads(doc)["max_rate_search"]["paged"]
    print(f"\n--max-rate on the whole trace: {cpu:.2f} s CPU (the plain run {plain_cpu:.2f} s: "
          f"{cpu / plain_cpu:.2f}x), {len(search['evaluations'])} evaluation(s): {search['unattainable']}")
    assert len(search["evaluations"]) == 1 and "rejected at any rate" in search["unattainable"]
    assert cpu / plain_cpu <= 1.25, f"the search takes {cpu / plain_cpu:.2f}x the plain run"


@pytest.mark.parametrize("extra", [["--attainment", "0.8"], ["--model", "Llama-3-8B"]],
                         ids=["attainment 0.8 on OPT-13B", "Llama-3-8B (8,192 tokens: every request fits)"])
def test_reachable_max_rate_search(env: dict[str, str], extra: list[str]) -> None:
    """A reachable target on the whole trace: the search starts from sim's own run, stops each later run once its
    verdict is certain, and answers to its stated 2 % resolution; its CPU in plain runs of the same trace and
    against the goal of 10 s (as the reference ratio above)."""
    reference = min(run_process(REFERENCE, env)[1] for _ in range(2))
    doc, cpu, wall, _ = run_process([*SIM, "--slo", "ttft=2,tpot=100ms", *extra, "--max-rate"], env)
    search = json.loads(doc)["max_rate_search"]["paged"]
    lo, hi = search["bracket_rps"]
    ratio = cpu / reference
    print(f"\nreachable --max-rate ({' '.join(extra)}) on the whole trace: {cpu:.2f} s CPU ({wall:.2f} s wall), "
          f"{ratio:.1f}x the reference (~{ratio * REFERENCE_QUIET_S:.1f} s quiet; goal 10 s), "
          f"{len(search['evaluations'])} runs, {lo:.4f} req/s, bracket [{lo:.4f}, {hi:.4f}]")
    assert search["unattainable"] is None and hi - lo <= 0.02 * lo  # the stated resolution (search.REL_TOL)
    assert ratio * REFERENCE_QUIET_S <= 10.0, f"the search takes ~{ratio * REFERENCE_QUIET_S:.1f} s quiet (goal 10 s)"
