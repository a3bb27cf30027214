"""Start-up of `kvcalc size --json` against a bare interpreter (run with `python -m pytest -m perf
tests/perf/test_startup_perf.py -s`).

The computation takes about a millisecond, so the command's wall time is almost all interpreter start-up
and imports. Both commands run as fresh subprocesses of the same interpreter, interleaved so that the drift
of a shared, noisy machine hits both alike; the best of N of each is compared (the best run is the one
least disturbed by other processes). Goal: at most 4x a bare `python -c pass`.

Bytecode is cached as on a user's machine (pip compiles an installed package; a checkout writes
__pycache__ on first run): the subprocesses write it under a temporary PYTHONPYCACHEPREFIX even where
PYTHONDONTWRITEBYTECODE is set, which would otherwise recompile kvcalc's sources on every run.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.perf

RUNS = 31
GOAL_RATIO = 4.0


def _wall_s(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
    return time.perf_counter() - start


def test_size_json_starts_within_4x_of_a_bare_interpreter(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pycache")
    bare_args, size_args = ["-c", "pass"], ["-m", "kvcalc", "size", "--json"]
    _wall_s(bare_args, env), _wall_s(size_args, env)  # bytecode written, files in the page cache, for both
    bare_s, size_s = [], []
    for _ in range(RUNS):
        bare_s.append(_wall_s(bare_args, env))
        size_s.append(_wall_s(size_args, env))
    ratio = min(size_s) / min(bare_s)
    print(f"\nbare interpreter: best {1e3 * min(bare_s):.1f} ms, median {1e3 * statistics.median(bare_s):.1f} ms")
    print(f"kvcalc size --json: best {1e3 * min(size_s):.1f} ms, median {1e3 * statistics.median(size_s):.1f} ms")
    print(f"ratio (best / best): {ratio:.2f}x (goal <= {GOAL_RATIO}x); "
          f"median / median: {statistics.median(size_s) / statistics.median(bare_s):.2f}x")
    assert ratio <= GOAL_RATIO
