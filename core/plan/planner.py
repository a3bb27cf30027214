"""`kvcalc plan` as one call: every point of the space evaluated (or read from the cache), the Pareto
fronts and the chosen point.

    result = run_plan(PlanRequest(base, space, prices, version), jobs=2, cache=PointCache(dir))

Cost of a point = price per GPU-hour × tp × replicas. Its SLO metric is the p99 of the first latency the
SLO targets (TTFT, then TPOT, then E2E) in the run at the point's own load. Among the points that serve:

* the chosen point is the cheapest; ties go to the lower SLO metric, then the larger headroom (max rate /
  load), then fewer GPUs, then the earlier point of the space;
* the cost front holds every point that no other serving point beats on both cost and SLO metric (no
  more costly and no slower, one of them strictly); the efficiency front the same for cost and the max
  requests/s per GPU (max rate / tp, higher is better).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ParameterError
from ..inputs.traces import read_trace
from ..model.models import get_preset, resolve_model
from ..sim.checks import finite_float
from ..sim.metrics import SLO_KEYS, Slo, parse_slo
from ..sim.options import DEFAULT_MODEL, DEFAULT_RATE, SimOptions
from ..sim.search import check_attainment, check_search
from ..sim.workload import from_trace
from .cache import PointCache, point_key, workload_fingerprint
from .evaluate import SERVES, build_or_unfit
from .execute import run_points
from .space import Point, Space, check_space, point_options, sim_argv


@dataclass(frozen=True)
class PlanRequest:
    """The base `kvcalc sim` options (workload, model, SLO, attainment; its gpu, tp, block_size,
    max_batched_tokens, dtype and rate-per-replica are the space's), the space, prices per GPU-hour."""

    base: SimOptions
    space: Space
    prices: dict[str, float]
    version: str


@dataclass(frozen=True)
class PlanResult:
    request: PlanRequest
    target_rate_rps: float
    slo: Slo
    target_attainment: float
    metric: str  # the key of the SLO metric in each point, e.g. "ttft_p99_s"
    points: list[dict[str, Any]]
    front: list[int]
    efficiency_front: list[int]
    chosen: int | None
    workload_description: str
    cached: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def sim_argv(self, index: int) -> list[str]:
        """`kvcalc sim` arguments (without "kvcalc sim") that reproduce point `index`."""
        return sim_argv(point_options(self.request.base, self.points[index]["point"]))


def metric_key(slo: Slo) -> str:
    for key, value in zip(SLO_KEYS, (slo.ttft_s, slo.tpot_s, slo.e2e_s), strict=True):
        if value is not None:
            return f"{key}_p99_s"
    raise AssertionError("an empty SLO was checked before")


def _workload_facts(base: SimOptions) -> tuple[float, str, str]:
    """(target rate, workload fingerprint, description) of the base workload."""
    if base.trace is not None:
        kind, path = base.trace
        workload = from_trace(read_trace(kind, path), finite_float("time_scale", base.time_scale), base.limit)
        if not workload.span_s > 0:
            raise ParameterError("trace: every request arrives at once, so it has no rate to split over replicas",
                                 "trace")
        return workload.mean_rate_per_s, workload_fingerprint(workload), workload.description
    rate = DEFAULT_RATE if base.rate is None else finite_float("rate", base.rate)
    if not rate > 0:
        raise ParameterError(f"rate {base.rate} must be a positive number of requests per second", "rate")
    # A constructed workload is decided by its options (seed, distributions, count, arrivals), all in the key.
    return rate, "constructed", f"constructed, {rate:g} req/s"


def check_request(request: PlanRequest) -> tuple[Slo, float]:
    """Everything that can be checked before any simulation; returns (SLO, attainment target)."""
    base = request.base
    if base.policy is not None or base.compare is not None or base.spec_tokens is not None:
        raise ParameterError("plan searches the paged policy without speculative decoding: drop policy, compare "
                             "and spec_tokens", "policy")
    slo = parse_slo(base.slo)
    if slo.is_empty:
        raise ParameterError("slo is required: the targets a deployment must meet, e.g. slo ttft=2,tpot=100ms",
                             "slo")
    target = check_attainment(True, base.target_attainment)
    check_search(slo, target)
    check_space(request.space)
    missing = [gpu for gpu in request.space.gpus if gpu not in request.prices]
    if missing:
        raise ParameterError(f"gpu {', '.join(missing)} has no price: add gpu_cost NAME=PRICE_PER_HOUR", "gpu_cost")
    spec = resolve_model(base.model, base.config, base.layers, base.kv_heads, base.head_dim) or get_preset(
        DEFAULT_MODEL)
    for tp in request.space.tp:
        try:
            spec.kv_bits(1, 16, tp)
        except ValueError as exc:
            raise ParameterError(str(exc) if f"tp {tp} " in str(exc) else f"tp {tp}: {exc}", "tp") from None
    return slo, target


def _check_options(base: SimOptions, points: list[Point]) -> None:
    """Build the first point that fits, as its worker will: a bad option (a workload option that does not
    apply, say) is one error here, before any process starts or any point is cached."""
    for point in points:
        job, _ = build_or_unfit(point_options(base, point))
        if job is not None:
            return


def run_plan(request: PlanRequest, *, jobs: int = 1, ray_address: str | None = None,
             cache: PointCache | None = None, progress: Callable[[int], None] | None = None) -> PlanResult:
    """Every point's result (cached ones read back), the fronts and the chosen point; `progress(1)` per point."""
    slo, target = check_request(request)
    base = request.base
    rate, fingerprint, description = _workload_facts(base)
    spec = resolve_model(base.model, base.config, base.layers, base.kv_heads, base.head_dim) or get_preset(
        DEFAULT_MODEL)
    points = request.space.points()
    _check_options(base, points)
    keys = [point_key(request.version, repr(spec), fingerprint, point_options(base, p)) for p in points]
    results: dict[int, dict[str, Any]] = {}
    if cache is not None:
        for index, key in enumerate(keys):
            hit = cache.get(key)
            if hit is not None:
                results[index] = hit
    cached = len(results)
    if progress is not None and cached:
        progress(cached)

    def on_result(index: int, result: dict[str, Any]) -> None:
        results[index] = result
        if cache is not None:
            cache.put(keys[index], result)
        if progress is not None:
            progress(1)

    tasks = [(i, p) for i, p in enumerate(points) if i not in results]
    run_points(base, tasks, on_result, jobs=jobs, ray_address=ray_address)
    records = [_record(i, p, results[i], request.prices[p.gpu], rate) for i, p in enumerate(points)]
    metric = metric_key(slo)
    serving = [r for r in records if r["verdict"] == SERVES]
    chosen = min(serving, key=lambda r: (r["cost_per_hour"], r[metric], -r["headroom"], r["gpus"], r["index"]),
                 default=None)
    return PlanResult(
        request=request, target_rate_rps=rate, slo=slo, target_attainment=target, metric=metric, points=records,
        front=pareto_front(serving, metric, lower_is_better=True),
        efficiency_front=pareto_front(serving, "max_rps_per_gpu", lower_is_better=False),
        chosen=None if chosen is None else chosen["index"], workload_description=description, cached=cached)


def _record(index: int, point: Point, result: dict[str, Any], price: float, rate: float) -> dict[str, Any]:
    record = {"index": index, "point": point, "gpu": point.gpu, "tp": point.tp, "block_size": point.block_size,
              "max_batched_tokens": point.max_batched_tokens, "kv_dtype": point.kv_dtype,
              "replicas": point.replicas, "gpus": point.gpus, "price_per_gpu_hour": price,
              "cost_per_hour": price * point.gpus, "rate_per_replica_rps": rate / point.replicas}
    record |= result
    if result["verdict"] == SERVES:
        record["max_rps_per_gpu"] = result["max_rate_rps"] / point.tp
        record["headroom"] = result["max_rate_rps"] / result["load_rps"]
    return record


def pareto_front(records: list[dict[str, Any]], key: str, *, lower_is_better: bool) -> list[int]:
    """Indices of the records that no other record beats on both cost and `key` (ties on both: all kept),
    by cost then `key`."""
    def value(r: dict[str, Any]) -> float:
        v = r[key]
        v = math.inf if v is None else v
        return v if lower_is_better else -v

    ordered = sorted(records, key=lambda r: (r["cost_per_hour"], value(r), r["index"]))
    front, best = [], math.inf
    for i, r in enumerate(ordered):
        v = value(r)
        tied = any(o["cost_per_hour"] == r["cost_per_hour"] and value(o) == v for o in ordered[:i]
                   if o["index"] in front)
        if v < best or tied:
            front.append(r["index"])
            best = min(best, v)
    return front


def without_point(result: PlanResult) -> list[dict[str, Any]]:
    """The records without their Point objects (for documents)."""
    return [{k: v for k, v in r.items() if k != "point"} for r in result.points]


__all__ = ["PlanRequest", "PlanResult", "Point", "Space", "pareto_front", "run_plan"]
