"""Shared inputs of the plan tests: a constructed workload whose answer is checked by hand.

Llama-3.1-8B (16,060,522,496 bytes of bf16 weights), 40 requests of exactly 64 prompt + 128 output tokens
at 0.05 req/s (a request every 20 s on average, each done in under 2 s: they almost never overlap), SLO
TPOT ≤ 4 ms for 90 % of requests. Alone, a request's decode step is memory bound (2 · 8e9 FLOPs per token
take 0.09 ms at tp 1), so by the roofline of core/sim/steptime.py

    TPOT ≈ weights / (tp · bandwidth · 0.8) + 0.5 ms  (+ < 0.01 ms of KV reads at ≤ 192 tokens)

    A100-80GB (2.039e12 B/s): tp1 9.846 + 0.5 = 10.35 ms   tp2 5.42 ms   tp4 2.96 ms
    H100-SXM  (3.35e12 B/s):  tp1 5.993 + 0.5 =  6.49 ms   tp2 3.50 ms   tp4 2.00 ms

At $1.5 (A100) and $4 (H100) per GPU-hour the points cost 1.5, 3, 6 and 4, 8, 16 per hour. Those under
4 ms are A100 tp4 ($6), H100 tp2 ($8) and H100 tp4 ($16): the plan must choose A100-80GB tp4, and the next
cheaper point, H100 tp1 at $4 (6.49 ms), misses the SLO.
"""

from __future__ import annotations

import sys
from types import ModuleType

import pytest

from kvcalc.core.plan.planner import PlanRequest
from kvcalc.core.plan.space import Space
from kvcalc.core.sim.options import SimOptions

HAND_BASE = SimOptions(model="Llama-3.1-8B", rate="0.05", requests=40, prompt_dist="uniform:low=64,high=64",
                       output_dist="uniform:low=128,high=128", slo="tpot=4ms")
HAND_PRICES = {"A100-80GB": 1.5, "H100-SXM": 4.0}
HAND_SPACE = Space(gpus=("A100-80GB", "H100-SXM"), tp=(1, 2, 4), replicas=(1,))
HAND_REQUEST = PlanRequest(HAND_BASE, HAND_SPACE, HAND_PRICES, "test")
# (gpu, tp) -> hand-computed decode step, seconds: weights / (tp · bandwidth · 0.8) + 0.5 ms
WEIGHTS = 16_060_522_496
HAND_STEP_S = {(gpu, tp): WEIGHTS / (tp * bw * 0.8) + 0.5e-3
               for gpu, bw in (("A100-80GB", 2.039e12), ("H100-SXM", 3.35e12)) for tp in (1, 2, 4)}


@pytest.fixture(scope="session")
def cases() -> ModuleType:
    """This module: the constants above."""
    return sys.modules[__name__]


@pytest.fixture(scope="session")
def hand_plan():
    """The hand-checked plan, run once (serially, no cache)."""
    from kvcalc.core.plan.planner import run_plan

    return run_plan(HAND_REQUEST)
