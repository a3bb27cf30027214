"""Requests supported under an SLO: the highest arrival rate at which a policy keeps attainment ≥ a target.

For one policy, `attainment(R)` is the share of requests (cancelled ones aside) that complete within
every SLO target when the same requests arrive at mean rate R: a constructed workload keeps its seeded
unit-rate arrivals and lengths and divides the times by R; a real trace keeps its arrival pattern,
rescaled to mean rate R. The search

    1. brackets: from R0 (the workload's own rate), doubles R while it passes or halves it while it
       fails, until one rate passes and the next one fails (at most `max_doublings` each way);
    2. bisects between the passing `lo` and the failing `hi` until (hi − lo) ≤ rel_tol · lo;
    3. returns `lo`, the highest rate *seen* to pass (0 when even R0 / 2^max_doublings fails).

Attainment falls with load but a finite sample is not perfectly monotone, so the answer is a rate that
was observed to pass, with the bracket it came from; every run uses the same seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ParameterError
from .metrics import Slo, attainment
from .options import DEFAULT_ATTAINMENT
from .run import run_policy
from .settings import SimSetup
from .workload import Workload


@dataclass(frozen=True)
class RateSearch:
    policy: str
    max_rate_rps: float
    bracket_rps: tuple[float, float]
    evaluations: list[tuple[float, float]] = field(default_factory=list)  # (rate, attainment)


def check_attainment(find_max_rate: bool, target: float | None) -> float:
    """The attainment target only means something to the max-rate search; given without it, it is refused."""
    if target is not None and not find_max_rate:
        raise ParameterError(f"target_attainment {target:g} applies to find_max_rate (the share of requests the "
                             "search requires to meet the SLO); add find_max_rate or drop target_attainment",
                             "target_attainment", "find_max_rate")
    return DEFAULT_ATTAINMENT if target is None else target


def check_search(slo: Slo, target: float) -> None:
    """Fail before any simulation when the search cannot be run."""
    if slo.is_empty:
        raise ParameterError("find_max_rate needs an slo, e.g. slo ttft=2,tpot=0.1", "find_max_rate", "slo")
    if not 0 < target <= 1:
        raise ParameterError(f"target_attainment {target:g} must be in (0, 1]", "target_attainment")


def max_rate(workload: Workload, policy: str, setup: SimSetup, slo: Slo, target: float, *,
             rel_tol: float = 0.02, max_doublings: int = 12,
             on_evaluation: Callable[[float, float], None] | None = None) -> RateSearch:
    """Bracketing + bisection as in the module docstring."""
    check_search(slo, target)
    if len(workload) < 2:
        raise ParameterError("find_max_rate needs at least 2 requests (a rate is defined by inter-arrival gaps)",
                             "find_max_rate")
    evaluations: list[tuple[float, float]] = []

    def passes(rate: float) -> bool:
        record = run_policy(workload.at_rate(rate), policy, setup)
        share = attainment(record, slo)
        evaluations.append((rate, share))
        if on_evaluation is not None:
            on_evaluation(rate, share)
        return share >= target

    start = workload.mean_rate_per_s  # a trace's own rate
    if workload.unit_arrival_s is not None:  # a constructed workload's nominal rate R (arrivals = unit / R)
        start = workload.unit_arrival_s[-1] / workload.arrival_s[-1] if workload.span_s > 0 else 1.0
    if passes(start):
        lo, hi = start, None
        for _ in range(max_doublings):
            if not passes(lo * 2):
                hi = lo * 2
                break
            lo *= 2
        if hi is None:
            return RateSearch(policy, lo, (lo, float("inf")), evaluations)
    else:
        lo, hi = None, start
        for _ in range(max_doublings):
            if passes(hi / 2):
                lo = hi / 2
                break
            hi /= 2
        if lo is None:
            return RateSearch(policy, 0.0, (0.0, hi), evaluations)
    while hi - lo > rel_tol * lo:
        mid = (lo + hi) / 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return RateSearch(policy, lo, (lo, hi), evaluations)
