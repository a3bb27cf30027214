"""The capacity sweep against one replay on the real Mooncake conversation trace (issue 21: a 10-point sweep
in at most twice one replay). Run with `python -m pytest -m perf tests/perf/test_share_capacity_perf.py -s`.

One replay is what `kvcalc share --trace mooncake F --block 16` runs (the pool, unbounded); the sweep is one
stack-distance pass plus the curve at 10 capacities from 10 thousand to 10 million tokens, in the same run.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from kvcalc.core.inputs.traces import read_trace
from kvcalc.core.share.capacity import capacity_curve
from kvcalc.core.share.replay import replay
from kvcalc.core.share.stack_distance import stack_distances

pytestmark = pytest.mark.perf
MOONCAKE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_conversation.jsonl"


def timed(fn):
    start, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - start, time.process_time() - cpu


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"the Mooncake trace is not at {MOONCAKE}")
def test_ten_point_sweep_within_twice_one_replay() -> None:
    trace = read_trace("mooncake", MOONCAKE)
    one, replay_s, replay_cpu = timed(lambda: replay(trace, 16, None, True))
    capacities = [int(c) // 16 for c in np.geomspace(1e4, 1e7, 10)]
    curve, sweep_s, sweep_cpu = timed(lambda: capacity_curve(stack_distances(trace, 16), capacities))
    assert curve.ceiling.hit_tokens == one.hit_tokens == 54_097_440
    assert len(curve.points) == 10
    ratio = sweep_cpu / replay_cpu
    print(f"\nconversation trace, block 16: one replay {replay_s:.2f} s wall ({replay_cpu:.2f} s CPU); 10-point "
          f"sweep {sweep_s:.2f} s wall ({sweep_cpu:.2f} s CPU): {ratio:.2f}x one replay (CPU)")
    assert ratio <= 2.0
