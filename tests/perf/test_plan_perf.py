"""Benchmark: a 24-point `kvcalc plan` on the Azure LLM 2023 conversation trace.

Llama-3.1-8B, the trace's first LIMIT requests at their own rate, SLO TTFT ≤ 2 s and TPOT ≤ 100 ms for
90 % of requests; A100-80GB and H100-SXM × TP 1, 2, 4 × block 16, 32 × 1 or 2 replicas = 24 points, each
a `kvcalc sim --max-rate` run. Goals (issue 22), on the 2-core machines: `--jobs 2` in ≤ 0.6× the serial
time with identical results, and a second run from the cache in ≤ 5 % of the serial time. All three are
measured in one run (CPU timings on a shared machine are noisy: compare ratios, not seconds; the load
average is printed, since other processes take CPU from the two workers unevenly). Run with
`python -m pytest -m perf tests/perf/test_plan_perf.py -s`. The trace is not in the repository: get it
from https://github.com/Azure/AzurePublicDataset (AzureLLMInferenceTrace_conv) into ../shared/traces/.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

from kvcalc.core.plan.cache import PointCache
from kvcalc.core.plan.planner import PlanRequest, run_plan
from kvcalc.core.plan.space import Space
from kvcalc.core.sim.options import SimOptions

TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure_llm_2023_conv.csv"
LIMIT = 1000


def _points(result):
    return [{k: v for k, v in p.items() if k != "point"} for p in result.points]


@pytest.mark.perf
def test_plan_24_points_azure_conv_jobs2_and_cache(tmp_path):
    if not TRACE.is_file():
        pytest.skip(f"the Azure conversation trace is not at {TRACE} (not shipped; see the module docstring)")
    base = SimOptions(trace=("azure", str(TRACE)), limit=LIMIT, model="Llama-3.1-8B", slo="ttft=2,tpot=100ms")
    space = Space(gpus=("A100-80GB", "H100-SXM"), tp=(1, 2, 4), block_sizes=(16, 32), replicas=(1, 2))
    request = PlanRequest(base, space, {"A100-80GB": 1.8, "H100-SXM": 3.9}, "bench")
    assert len(space.points()) == 24

    load_before = os.getloadavg()[0]
    start, cpu = time.perf_counter(), time.process_time()
    serial = run_plan(request, jobs=1)
    serial_s, serial_cpu = time.perf_counter() - start, time.process_time() - cpu

    cache = PointCache(tmp_path)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    parallel = run_plan(request, jobs=2, cache=cache)
    parallel_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers_cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)

    start = time.perf_counter()
    cached = run_plan(request, jobs=2, cache=cache)
    cached_s = time.perf_counter() - start

    verdicts: dict[str, int] = {}
    for p in serial.points:
        verdicts[p["verdict"]] = verdicts.get(p["verdict"], 0) + 1
    runs = sum(1 + p.get("search_runs", 0) for p in serial.points if "slo_attainment" in p)
    print(f"\nplan, Azure conv first {LIMIT:,} requests, 24 points ({verdicts}; {runs} simulated runs): "
          f"serial {serial_s:.1f} s, --jobs 2 {parallel_s:.1f} s ({parallel_s / serial_s:.2f}x), "
          f"from the cache {cached_s:.3f} s ({cached_s / serial_s:.4f}x); load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after on {os.cpu_count()} CPUs; CPU time serial {serial_cpu:.1f} s, the two "
          f"workers {workers_cpu:.1f} s (parallel wall / (their CPU / 2) = {parallel_s / (workers_cpu / 2):.2f}: "
          "1.00 when both always had a core)")
    assert _points(parallel) == _points(serial) == _points(cached)
    assert cached.cached == 24
    assert parallel_s <= 0.6 * serial_s, f"--jobs 2 took {parallel_s / serial_s:.2f}x the serial time"
    assert cached_s <= 0.05 * serial_s, f"the cached run took {cached_s / serial_s:.3f}x the serial time"
