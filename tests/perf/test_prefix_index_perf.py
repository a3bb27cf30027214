"""`kvcalc share --trace mooncake` against a plain-Python replay over hash ids, at every block size
(issue 18; run with `python -m pytest -m perf tests/perf/test_prefix_index_perf.py -s`).

Whole processes, in turn, in one run: `kvcalc share ... --block B --json` and the plain replay
(tests/core/pool/id_replay.py run as a script: json + dicts, no numpy), each the best of three after one
untimed run of each; CPU time (user + system: the machine is shared, so wall time says more about the other
processes than about these) and peak resident memory from the kernel's accounting of each child (os.wait4).
Bytecode is cached as on a user's machine, under a temporary PYTHONPYCACHEPREFIX (as test_startup_perf):
with PYTHONDONTWRITEBYTECODE set, every run would compile kvcalc's ~130 modules again (~0.15-0.3 s).
Then the CPU time of the replay in-process on 10 / 50 / 100 % of the trace, and the exponent of a
least-squares fit of log time on log prompt tokens: linear is 1. Goals (issue 18): <= 1.5x the plain
replay, <= 128 MiB, exponent <= 1.2.
Blocks 1,024 and 4,096 cover 2 and 8 whole ids (keyed by the last id of each block; the plain replay walks
the trie of ids, with no such key).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kvcalc.core.inputs.traces import read_trace
from kvcalc.core.share.replay import replay
from kvcalc.core.share.trace_blocks import in_arrival_order

pytestmark = pytest.mark.perf
TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
ID_REPLAY = Path(__file__).resolve().parents[1] / "core" / "pool" / "id_replay.py"
MAX_RATIO, MAX_MIB, MAX_EXPONENT = 1.5, 128, 1.2
BLOCKS = [16, 64, 512, 1024, 4096]

_spec = importlib.util.spec_from_file_location("id_replay", ID_REPLAY)
_id_replay_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_id_replay_module)
id_replay = _id_replay_module.id_replay


# Linux carries a process's peak RSS across exec, so a child forked from this test process (~60 MiB) would
# report at least that much: each command runs under a small launcher (a bare interpreter, ~10 MiB), which
# reports its child's CPU time, wall time and peak RSS (os.wait4) as its last line on stderr.
_LAUNCHER = (
    "import os, subprocess, sys, time; start = time.perf_counter(); p = subprocess.Popen(sys.argv[1:]); "
    "_, status, use = os.wait4(p.pid, 0); print(os.waitstatus_to_exitcode(status), use.ru_utime + use.ru_stime, "
    "time.perf_counter() - start, use.ru_maxrss, file=sys.stderr)"
)


def run_process(args: list[str], env: dict[str, str]) -> tuple[str, float, float, float]:
    """(stdout, CPU seconds, wall seconds, peak resident MiB) of one command (see _LAUNCHER)."""
    proc = subprocess.run([sys.executable, "-c", _LAUNCHER, *args], capture_output=True, text=True, env=env)
    err = proc.stderr.splitlines()
    code, cpu, wall, kib = err[-1].split()
    assert proc.returncode == 0 and code == "0", proc.stderr
    return proc.stdout, float(cpu), float(wall), int(kib) / 1024  # ru_maxrss is in KiB on Linux


def best_of(runs: list[tuple[str, float, float, float]]) -> tuple[str, float, float, float]:
    """(the first run's stdout, least CPU, least wall, most MiB) of runs of one command."""
    return runs[0][0], min(r[1] for r in runs), min(r[2] for r in runs), max(r[3] for r in runs)


@pytest.mark.parametrize("name", ["mooncake_conversation.jsonl", "mooncake_synthetic.jsonl"])
@pytest.mark.parametrize("block_size", BLOCKS)
def test_share_against_the_plain_replay(name: str, block_size: int, tmp_path: Path) -> None:
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"the Mooncake trace is not at {path} (see ../shared/traces/README.md)")
    share = [sys.executable, "-m", "kvcalc", "share", "--trace", "mooncake", str(path), "--block", str(block_size),
             "--json"]
    plain = [sys.executable, str(ID_REPLAY), str(path), str(block_size)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pycache")
    run_process(share, env), run_process(plain, env)  # bytecode written, files in the page cache, for both
    rounds = [(run_process(share, env), run_process(plain, env)) for _ in range(3)]  # in turn: the same load
    doc, cpu, wall, mib = best_of([r[0] for r in rounds])
    ref, ref_cpu, ref_wall, ref_mib = best_of([r[1] for r in rounds])
    got, expected = json.loads(doc), json.loads(ref)
    assert (got["hit_tokens"], got["hit_blocks"]) == (expected["hit_tokens"], expected["hit_blocks"])
    assert got["peak_cached_blocks"] == expected["cached_blocks"]
    ratio = cpu / ref_cpu
    print(f"\n{name} block {block_size}: share {cpu:.2f} s CPU ({wall:.2f} s wall), {mib:.0f} MiB; plain replay "
          f"{ref_cpu:.2f} s CPU ({ref_wall:.2f} s wall), {ref_mib:.0f} MiB; ratio {ratio:.2f}x CPU "
          f"({wall / ref_wall:.2f}x wall)")
    assert ratio <= MAX_RATIO, f"share takes {ratio:.2f}x the plain replay (goal {MAX_RATIO}x)"
    assert mib <= MAX_MIB, f"share peaks at {mib:.0f} MiB (goal {MAX_MIB})"


@pytest.mark.parametrize("block_size", BLOCKS)
def test_share_is_linear_in_the_trace(block_size: int) -> None:
    path = TRACES / "mooncake_conversation.jsonl"
    if not path.is_file():
        pytest.skip(f"the Mooncake trace is not at {path} (see ../shared/traces/README.md)")
    trace = in_arrival_order(read_trace("mooncake", path))
    tokens, seconds = [], []
    for fraction in (0.1, 0.5, 1.0):
        part = trace.head(max(1, round(fraction * len(trace))))
        best = math.inf
        for _ in range(3):
            start = time.process_time()
            replay(part, block_size, None, True)
            best = min(best, time.process_time() - start)
        tokens.append(int(part.prompt_tokens.sum()))
        seconds.append(best)
    exponent = float(np.polyfit(np.log(tokens), np.log(seconds), 1)[0])
    # the replay alone against the plain replay alone, in this process (no start-up, no reading)
    requests = [(int(trace.prompt_tokens[i]), trace.request_hash_ids(i).tolist()) for i in range(len(trace))]
    plain = math.inf
    for _ in range(3):
        start = time.process_time()
        id_replay(requests, block_size)
        plain = min(plain, time.process_time() - start)
    print(f"\nblock {block_size}: " + ", ".join(f"{t:,} tokens {s:.2f} s" for t, s in zip(tokens, seconds, strict=True))
          + f"; CPU time ~ tokens^{exponent:.2f}; the whole replay in-process {seconds[-1]:.2f} s against the plain "
          f"replay's {plain:.2f} s: {seconds[-1] / plain:.2f}x")
    assert exponent <= MAX_EXPONENT, f"time grows as tokens^{exponent:.2f} (goal <= {MAX_EXPONENT})"
