"""Requests supported under an SLO: the highest arrival rate at which a policy keeps attainment ≥ a target.

For one policy, `attainment(R)` is the share of requests (cancelled ones aside) that complete within
every SLO target when the same requests arrive at mean rate R: a constructed workload keeps its seeded
unit-rate arrivals and lengths and divides the times by R; a real trace keeps its arrival pattern,
rescaled to mean rate R. The search

    1. runs R0 (the workload's own rate). When it fails and its run served fewer than R0 / 2 requests per
       second (overloaded), that served rate is tried next (a guess that only saves runs);
    2. closes a bracket: a passing `lo` and a failing `hi` with (hi − lo) ≤ rel_tol · lo (the stated
       resolution, 2 %), choosing each next rate from the attainments seen so far (rate_steps.py: a secant of
       the attainment's log-odds in ln R, guarded to stay strictly inside the bracket and to halve it at least
       every third step; while only one end is known, never more than doubling or halving it, up to
       R0 · 2^max_doublings or down to R0 / 2^max_doublings);
    3. returns `lo`, the highest rate *seen* to pass (0 when even R0 / 2^max_doublings fails).

Every run after the first stops as soon as its verdict is certain (verdict.py: enough requests already
missed the SLO that the target cannot be met, or enough met it that it is met whatever follows; the
requests the first run rejected at arrival count as missed from the start, being rejected at any rate), so a
rate far from the answer costs a fraction of a run; the pass/fail of each rate is the whole run's.

Attainment falls with load but a finite sample is not perfectly monotone, so the answer is a rate that
was observed to pass, with the bracket it came from; every run uses the same seed.

The first run (at R0) is the workload as it is — the run `kvcalc sim` has just done, which the caller may
hand over instead of running it again — and no rate is run twice. A target that no rate can reach is
reported after that first run, with its reason: requests rejected at arrival (longer than the model's
max length, or more KV than the whole pool) are rejected at every rate, so attainment can never exceed
the share of the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import ParameterError
from .metrics import Slo, attainment
from .options import DEFAULT_ATTAINMENT
from .rate_steps import Steps, close_bracket
from .record import CANCELLED, COMPLETED, REJECTED, RunRecord
from .run import run_policy, run_until
from .settings import SimSetup
from .verdict import Verdict
from .workload import Workload

REL_TOL = 0.02  # the search's resolution: it stops once (hi − lo) ≤ REL_TOL · lo


@dataclass(frozen=True)
class RateSearch:
    policy: str
    max_rate_rps: float
    bracket_rps: tuple[float, float]
    evaluations: list[tuple[float, float]] = field(default_factory=list)  # (rate, attainment)
    unattainable: str | None = None  # why no rate can reach the target (then max_rate_rps is 0), or None
    resolution: float = REL_TOL  # the bracket's relative width at the end: (hi − lo) ≤ resolution · lo
    decided_early: list[float] = field(default_factory=list)  # rates whose run stopped once its verdict was
    # certain (verdict.py): their evaluation is the bound that decided it, not the whole run's attainment


def attainment_ceiling(record: RunRecord, target: float) -> tuple[float, str | None]:
    """(the highest attainment any arrival rate can give this workload, why the target is out of reach or
    None): requests rejected at arrival are rejected at every rate (the checks depend only on the request:
    its length against the max length, its KV against the whole pool), so at most the others meet the
    SLO. Cancelled requests are outside the share, as in `attainment`; when every request is cancelled (each at
    an output count drawn once, so at every rate) no rate has an attainment at all."""
    counted = len(record.status) - int(np.count_nonzero(record.status == CANCELLED))
    rejected = int(np.count_nonzero(record.status == REJECTED))
    if not counted:  # a request's cancellation point is an output count, the same at every rate
        return 0.0, (f"all {len(record.status):,} requests are cancelled (at the same output token at any rate), "
                     "so none is measured against the SLO: attainment is undefined; cancel a smaller fraction")
    ceiling = (counted - rejected) / counted
    if ceiling >= target:
        return ceiling, None
    reasons = "; ".join(f"{reason}: {count:,}" for reason, count in sorted(record.rejected_reason.items()))
    return ceiling, (f"{rejected:,} of {counted:,} requests ({rejected / counted:.1%}) are rejected at any rate "
                     f"({reasons}), so at most {ceiling:.1%} can meet the SLO, below the {target:.1%} target")


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
             rel_tol: float = REL_TOL, max_doublings: int = 12,
             on_evaluation: Callable[[float, float], None] | None = None,
             first: RunRecord | None = None) -> RateSearch:
    """The search of the module docstring. `first`: the run of `workload` itself (at its own
    rate, R0) when the caller has it; the search then starts from it instead of running it again."""
    check_search(slo, target)
    if len(workload) < 2:
        raise ParameterError("find_max_rate needs at least 2 requests (a rate is defined by inter-arrival gaps)",
                             "find_max_rate")
    runs = _Runs(workload, policy, setup, slo, target, on_evaluation)
    passes = runs.passes
    start = workload.mean_rate_per_s  # a trace's own rate
    if workload.unit_arrival_s is not None:  # a constructed workload's nominal rate R (arrivals = unit / R)
        start = workload.unit_arrival_s[-1] / workload.arrival_s[-1] if workload.span_s > 0 else 1.0
    if first is None:
        first = run_policy(workload, policy, setup)

    ceiling, reason = attainment_ceiling(first, target)
    runs.steps = Steps(target, ceiling, _counted(first), rel_tol)
    runs.rejected = int(np.count_nonzero(first.status == REJECTED))
    lo: float | None = None
    hi: float | None = None
    if passes(start, first):
        lo = start
    elif reason is not None:
        return RateSearch(policy, 0.0, (0.0, start), runs.evaluations, reason, rel_tol, runs.decided_early)
    else:
        hi = start
        served = served_rate(first)
        if 0 < served < start / 2:  # overloaded: above its served rate it fails too
            runs.steps.served = served
            lo, hi = (served, hi) if passes(served) else (lo, served)
    rate, bracket = close_bracket(passes, runs.steps, lo, hi, start / 2**max_doublings, start * 2**max_doublings)
    return RateSearch(policy, rate, bracket, runs.evaluations, None, rel_tol, runs.decided_early)


def _counted(record: RunRecord) -> int:
    return len(record.status) - int(np.count_nonzero(record.status == CANCELLED))


class _Runs:
    """The search's runs, each rate at most once: (rate, attainment share) in the order run, the rates a run
    stopped early once its verdict was certain, and `on_evaluation(rate, share)` after each."""

    def __init__(self, workload: Workload, policy: str, setup: SimSetup, slo: Slo, target: float,
                 on_evaluation: Callable[[float, float], None] | None) -> None:
        self.workload, self.policy, self.setup, self.slo, self.target = workload, policy, setup, slo, target
        self.on_evaluation = on_evaluation
        self.evaluations: list[tuple[float, float]] = []
        self.decided_early: list[float] = []
        self.seen: dict[float, bool] = {}  # rate -> passes: no rate is run twice
        self.steps: Steps | None = None  # where to run next (rate_steps.py), told every run's outcome
        self.rejected = 0  # requests rejected at arrival at any rate (the first run's): missed from the start

    def passes(self, rate: float, record: RunRecord | None = None) -> bool:
        """Whether `rate` meets the target (`record`: its run when the caller has it)."""
        seen = self.seen
        if rate in seen:
            return seen[rate]
        guess, arrived = float("nan"), 1.0
        if record is None:
            verdict = Verdict(self.slo, self.target, self.rejected)
            record = run_until(self.workload.at_rate(rate), self.policy, self.setup, verdict)
        if record is None:  # stopped once certain: the bound that decided it
            share, seen[rate], guess, arrived = verdict.bound, verdict.passes, verdict.estimate, verdict.arrived
            self.decided_early.append(rate)
        else:
            share = guess = attainment(record, self.slo)
            seen[rate] = share >= self.target
        if self.steps is not None:
            self.steps.add(rate, seen[rate], share, guess, arrived)
        self.evaluations.append((rate, share))
        if self.on_evaluation is not None:
            self.on_evaluation(rate, share)
        return seen[rate]


def served_rate(record: RunRecord) -> float:
    """Requests completed per second of the run (from the first arrival to the end): an overloaded run's
    service rate, where the search of an overloaded workload looks first (a guess, checked by a run)."""
    span = record.end_s - float(record.arrival_s[0])
    return int(np.count_nonzero(record.status == COMPLETED)) / span if span > 0 else 0.0
