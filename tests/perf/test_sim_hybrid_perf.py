"""A hybrid `kvcalc sim` costs at most 2x a plain one of the same workload (issue 19's "Done when"; run with
`python -m pytest -m perf tests/perf/test_sim_hybrid_perf.py -s`).

Whole processes, CPU time (user + system) from the kernel's accounting (os.wait4), each the best of three,
hybrid and plain alternated in the same run so that load on the machine affects both. The default workload
(1,000 requests, Poisson 1/s) on one H200 (two for the 120B/70B pair), each hybrid model against a
full-attention model of similar size: Gemma-3-27B (sliding 1,024) vs Qwen3-32B, gpt-oss-120b (sliding 128)
vs Llama-3-70B, Nemotron-H-56B (Mamba state pages) vs Qwen3-32B.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.perf
SIM = [sys.executable, "-m", "kvcalc", "sim", "--gpu", "h200", "--json", "--model"]
PAIRS = [
    (["gemma-3-27b"], ["qwen3-32b"]),
    (["gpt-oss-120b", "--tp", "2"], ["llama-3-70b", "--tp", "2"]),
    (["nemotron-h-56b"], ["qwen3-32b"]),
]


def cpu_s(args: list[str]) -> float:
    """CPU seconds (user + system) of one child process."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, " ".join(args)
    return usage.ru_utime + usage.ru_stime


@pytest.mark.parametrize(("hybrid", "plain"), PAIRS, ids=[h[0] for h, _ in PAIRS])
def test_hybrid_sim_costs_at_most_twice_a_plain_one(hybrid, plain):
    times: dict[str, list[float]] = {"hybrid": [], "plain": []}
    for _ in range(3):
        times["hybrid"].append(cpu_s([*SIM, *hybrid]))
        times["plain"].append(cpu_s([*SIM, *plain]))
    h, p = min(times["hybrid"]), min(times["plain"])
    print(f"\n{' '.join(hybrid)}: {h:.2f} s CPU, {' '.join(plain)}: {p:.2f} s, ratio {h / p:.2f}")
    assert h / p <= 2.0
