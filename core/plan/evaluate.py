"""One point of a plan: the `kvcalc sim --max-rate` run of its options, or the reason it was not run.

    1. does not fit: the memory plan of `kvcalc sim` (hardware.plan_memory, whose workspace estimate is
       core/model/gpu_plan's) leaves no KV pool, or sim's paged pool says a request of max_model_len tokens
       could never run in it (its `never_fits`, per KV cache group for hybrid models) — pruned, nothing
       simulated;
    2. requests longer than the context: more than (1 − attainment) · N requests are longer than
       max_model_len; every engine rejects them, so attainment ≤ 1 − those / N < target — pruned;
    3. the run at the point's own load (one replica at 1/replicas of the workload's rate), exactly as
       `kvcalc sim` runs it (simulate.run_policies). If it misses the attainment target the point's SLO is
       lost and its max-rate search is skipped (the early stop): "OOM / preemption storm" when it rejected
       a request as larger than the whole pool or preempted at least as many times as it has requests,
       else "SLO missed";
    4. otherwise the point serves, and its max-rate search (simulate.search_max_rates, the bracketing +
       bisection of `sim --max-rate`, starting from the point's own load) gives its headroom.

Every figure of a point is one that `kvcalc sim` prints for the same options (Simulation.from_runs), so
the command `space.sim_argv` writes reproduces it. The result is a plain dict of JSON values (it is cached
on disk and crosses process and Ray boundaries), identical wherever it was computed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ParameterError
from ..sim.hardware import plan_memory
from ..sim.options import SimOptions
from ..sim.record import CANCELLED
from ..sim.run import make_policy
from ..sim.setup import SimJob, build
from ..sim.simulate import Simulation, run_policies, search_max_rates
from .space import Point, point_options

SERVES = "serves"
DOES_NOT_FIT = "does_not_fit"
LONGER_THAN_CONTEXT = "longer_than_context"
STORM = "oom_or_preemption_storm"
SLO_MISSED = "slo_missed"
VERDICTS = {
    SERVES: "serves",
    DOES_NOT_FIT: "does not fit",
    LONGER_THAN_CONTEXT: "requests longer than context",
    STORM: "OOM / preemption storm",
    SLO_MISSED: "SLO missed",
}
OOM_REASON = "more KV than the whole pool (OOM)"  # core/sim/scheduler.py's rejection reason
LATENCY_KEYS = ("ttft", "tpot", "e2e")


def build_or_unfit(options: SimOptions) -> tuple[SimJob | None, str | None]:
    """(`kvcalc sim`'s SimJob for `options`, None), or (None, why it does not fit) when sim's own memory plan
    (hardware.plan_memory, called by setup.build) refuses it: the weights, workspace and any reserved state
    leave no room for one block. Any other error is bad input and is raised."""
    try:
        return build(options), None
    except ParameterError as exc:
        if _raised_in(exc, plan_memory.__code__) and not set(exc.params) & INPUT_PARAMS \
                and exc.params != POOL_TOO_LARGE:
            return None, str(exc)
        raise


# plan_memory's errors that are about the input, not the fit: a bad utilisation or weight size, and a pool too
# large for the simulator (a tiny model on a huge GPU with tiny blocks)
INPUT_PARAMS = {"memory_utilization", "weights_bytes"}
POOL_TOO_LARGE = ("block_size", "gpu_memory")


def _raised_in(exc: BaseException, code) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


def _float(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def evaluate_point(base: SimOptions, point: Point) -> dict[str, Any]:
    """The point's verdict and figures (module docstring)."""
    options = point_options(base, point)
    result: dict[str, Any] = {"verdict": None, "reason": None}
    job, unfit = build_or_unfit(options)
    if job is None:
        return result | {"verdict": DOES_NOT_FIT, "reason": unfit}
    plan, sim = job.plan, job.sim
    max_len = sim.scheduler.max_model_len
    result["memory"] = {
        "weights_bytes": plan.weights_bytes, "workspace_bytes": plan.workspace_bytes,
        "kv_pool_bytes": plan.pool_bytes, "kv_bytes_per_token": plan.kv_bytes_per_token,
        "num_blocks": plan.num_blocks, "block_size": sim.block_size, "max_model_len": max_len,  # vLLM's, as sim's
    }
    if make_policy("paged", job.workload, sim).never_fits(0, max_len):
        return result | {"verdict": DOES_NOT_FIT, "reason": (
            f"the KV pool's {sim.capacity_blocks:,} blocks of {sim.block_size} per replica cannot hold one "
            f"max-length sequence ({max_len:,} tokens)")}
    workload = job.workload
    n = len(workload)
    too_long = int(np.sum(workload.prompt_tokens + workload.output_tokens > max_len))
    if too_long > (1 - job.target_attainment) * n:
        return result | {"verdict": LONGER_THAN_CONTEXT, "reason": (
            f"{too_long:,} of {n:,} requests are longer than max_model_len {max_len:,}: attainment is at most "
            f"{1 - too_long / n:.4f} < {job.target_attainment:g}")}
    records = run_policies(job)
    (policy,) = job.policies
    summary = Simulation.from_runs(job, records, {}).summaries[policy]
    result |= _run_figures(summary, load_rate(workload))
    attained = summary.slo_attainment
    assert attained is not None  # a plan's SLO is never empty (planner.py refuses it)
    if attained < job.target_attainment:
        oom = summary.rejected_reasons.get(OOM_REASON, 0)
        active = summary.requests - int(np.sum(records[policy].status == CANCELLED))
        if oom or summary.preemptions >= active:
            reason = (f"{oom:,} requests larger than the pool (OOM), {summary.preemptions:,} preemptions for "
                      f"{summary.requests:,} requests")
            return result | {"verdict": STORM, "reason": reason + f"; attainment {attained:.4f}"}
        return result | {"verdict": SLO_MISSED, "reason": (
            f"attainment {attained:.4f} < {job.target_attainment:g} at {result['load_rps']:.4g} req/s per "
            "replica")}
    search = search_max_rates(job)[policy]
    return result | {
        "verdict": SERVES, "reason": None,
        "max_rate_rps": search.max_rate_rps,
        "bracket_rps": [search.bracket_rps[0], _float(search.bracket_rps[1])],
        "search_runs": len(search.evaluations),
        "evaluations": [list(e) for e in search.evaluations],
    }


def load_rate(workload) -> float:
    """The rate the run was given, as the max-rate search reads it (its starting rate): a constructed
    workload's nominal rate, a trace's mean rate."""
    if workload.unit_arrival_s is not None and workload.span_s > 0:
        return float(workload.unit_arrival_s[-1] / workload.arrival_s[-1])
    return workload.mean_rate_per_s


def _run_figures(summary, load_rps: float) -> dict[str, Any]:
    """The run's figures as `kvcalc sim --json` prints them (RunSummary.to_dict)."""
    doc = summary.to_dict()
    figures = {"load_rps": load_rps, "slo_attainment": doc["slo_attainment"]}
    for key in LATENCY_KEYS:
        for stat in ("mean", "p50", "p90", "p99"):
            figures[f"{key}_{stat}_s"] = _float(doc[f"{key}_s"][stat])
    figures |= {key: doc[key] for key in ("requests", "completed", "rejected", "timed_out", "preemptions",
                                          "throughput_rps", "goodput_rps", "rejected_reasons")}
    return figures
