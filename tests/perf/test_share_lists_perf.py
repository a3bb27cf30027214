"""`kvcalc share --trace mooncake` on a trace of at most LIST_REPLAY_MAX_IDS hash ids runs on plain lists
(core/share/id_replay_lists.py) and never imports numpy (issue 18; run with `python -m pytest -m perf
tests/perf/test_share_lists_perf.py -s`). Whole processes against the plain replay: tests/perf/test_share_perf.py.

In-process CPU time (the least of several runs) of what that path does after start-up — read the lines, replay —
on 10 / 50 / 100 % of each Mooncake trace at every block size, and the exponent of a least-squares fit of log time
on log prompt tokens: linear is 1, the goal is <= 1.2 (asserted). Then the choice of path: the same reading and
replay through numpy (arrays, check_trace, share_trace by ids) plus numpy's import, measured as whole
interpreters (`import numpy` less a bare one), against the list path on each whole trace — asserted no slower
with a 1.2x margin for the load — and the hash ids at which numpy would start to pay for its import, printed.
"""

from __future__ import annotations

import math
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvcalc.cli.share_trace import LIST_REPLAY_MAX_IDS
from kvcalc.core.inputs.trace_text import read_mooncake_lines
from kvcalc.core.inputs.traces import trace_of
from kvcalc.core.share.id_replay_lists import share_trace_lists
from kvcalc.core.share.replay import share_trace

pytestmark = pytest.mark.perf
TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
NAMES = ["mooncake_conversation.jsonl", "mooncake_synthetic.jsonl"]
BLOCKS = [16, 64, 512, 1024, 4096]
MAX_EXPONENT = 1.2


def least_cpu(fn: Callable[[], object], runs: int = 5) -> float:
    """The least CPU seconds of `runs` calls of `fn` (the machine is shared: the least is the least disturbed)."""
    best = math.inf
    for _ in range(runs):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def trace_text(name: str) -> str:
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"the Mooncake trace is not at {path} (see ../shared/traces/README.md)")
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("block_size", BLOCKS)
def test_the_list_path_is_linear_in_the_trace(name: str, block_size: int) -> None:
    lines = trace_text(name).splitlines(keepends=True)
    tokens, seconds = [], []
    for fraction in (0.1, 0.5, 1.0):
        text = "".join(lines[: max(1, round(fraction * len(lines)))])
        result = share_trace_lists(read_mooncake_lines(text, name), "mooncake", name, block_size, None)
        assert result is not None  # the real traces take the list path at every block size
        tokens.append(result.cached.prompt_tokens)
        seconds.append(least_cpu(lambda text=text: share_trace_lists(read_mooncake_lines(text, name), "mooncake",
                                                                     name, block_size, None)))
    fit = _exponent(tokens, seconds)
    print(f"\n{name} block {block_size}: " + ", ".join(f"{t:,} tokens {s * 1e3:.0f} ms" for t, s in
                                                       zip(tokens, seconds, strict=True)) + f"; ~ tokens^{fit:.2f}")
    assert fit <= MAX_EXPONENT, f"the list path's time grows as tokens^{fit:.2f} (goal <= {MAX_EXPONENT})"


def _exponent(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of log y on log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def _interpreter_cpu(code: str, runs: int = 5) -> float:
    """The least CPU seconds of `python -c code` as a child process (bytecode cached as on a user's machine)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    best = math.inf
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return best


def _both_paths(text: str, name: str, block_size: int) -> tuple[float, float]:
    """CPU seconds of reading and replaying `text` on lists, and through numpy arrays (its import aside)."""
    listed = least_cpu(lambda: share_trace_lists(read_mooncake_lines(text, name), "mooncake", name, block_size, None))
    arrays = least_cpu(lambda: share_trace(trace_of("mooncake", name, read_mooncake_lines(text, name)), block_size))
    return listed, arrays


@pytest.mark.parametrize("block_size", [16, 4096])
def test_the_list_path_beats_importing_numpy(block_size: int) -> None:
    numpy_import = max(_interpreter_cpu("import numpy") - _interpreter_cpu("pass"), 1e-3)
    for name in NAMES:
        text = trace_text(name)
        ids = len(read_mooncake_lines(text, name).hash_ids or [])
        assert ids <= LIST_REPLAY_MAX_IDS
        listed, arrays = _both_paths(text, name, block_size)
        per_id = (listed - arrays) / ids  # what the list path costs more (or less) per hash id
        pays_from = f"{numpy_import / per_id:,.0f} ids" if per_id > 0 else "never (lists are cheaper per id)"
        print(f"\n{name} block {block_size}, {ids:,} ids: lists {listed:.3f} s CPU; numpy {arrays:.3f} s + its import "
              f"{numpy_import:.3f} s = {arrays + numpy_import:.3f} s; numpy would pay for its import from {pays_from} "
              f"(the list path runs up to {LIST_REPLAY_MAX_IDS:,})")
        assert listed <= 1.2 * (arrays + numpy_import)
