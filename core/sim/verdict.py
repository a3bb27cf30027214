"""A max-rate run stopped as soon as its verdict is certain: attainment ≥ target or < target, whatever the
rest of the run does (search.py asks only that).

Attainment is met / counted (metrics.attainment): `met` the requests that complete within every SLO target,
`counted` those not cancelled. At a moment `now` of the run, some outcomes are already fixed:

    missed   a request that can no longer meet the SLO: rejected or timed out (they never complete), completed
             outside a target, or still without a first token (or not finished) while now − arrival already
             exceeds the TTFT (E2E) target — a first token (a finish) comes at the end of a later step, after
             now, and float subtraction is monotone, so its latency exceeds the target too;
    met      a completed request within every target (final).

Only requests that are surely counted enter `missed`: those that will never be cancelled (their cancellation
point is past their output) or that already ended rejected or timed out. A request rejected at arrival is
rejected at every rate (search.attainment_ceiling), so the search hands over how many the workload has
(`rejected`, from its first run): they are missed from the start of the run, not only once they arrive.
Whatever happens later, counted ≤ cu = N − (requests already cancelled), so

    attainment ≤ (cu − missed) / cu    and    attainment ≥ met / cu

(each side a correctly rounded division, monotone in its numerator and denominator as the exact quotients
are). The run fails for certain once (cu − missed) / cu < target, passes for certain once met / cu ≥ target.
The bound that decided it is reported in place of the attainment. `estimate` is a guess of the whole run's
attainment at the stop (the share of the accepted requests that have arrived not yet missed, taken as the share
of all accepted that meet the SLO), which the search uses only to choose its next rate, never as a result.
"""

from __future__ import annotations

import numpy as np

from .metrics import Slo
from .record import CANCELLED, COMPLETED, REJECTED, TIMED_OUT
from .scheduler import Scheduler


class Verdict:
    """The stop condition of one run (engine.Engine.run's `stop`): decided, passes and the deciding bound."""

    def __init__(self, slo: Slo, target: float, rejected: int = 0) -> None:
        self.slo, self.target = slo, target
        self.rejected = rejected  # requests rejected at arrival at any rate, arrived or not
        self.decided = False
        self.passes = False
        self.bound = float("nan")  # the attainment bound that decided the run
        self.estimate = float("nan")  # a guess of the whole run's attainment at the stop (not a bound)
        self.arrived = 1.0  # the share of the requests that had arrived at the stop

    def __call__(self, s: Scheduler) -> bool:
        n = s.next_arrival  # requests that have arrived; the others are all still open
        status = s.status[:n]
        arrival, first, finish = s.arrival_s[:n], s.first_token_s[:n], s.finish_s[:n]
        counted_surely = (s.stop_at[:n] >= s.output_tokens[:n]) | (status == REJECTED) | (status == TIMED_OUT)
        completed = status == COMPLETED
        ok = self._within(completed, arrival, first, finish, s.generated[:n])
        missed = (status == TIMED_OUT) | (completed & ~ok)  # rejections: counted whole, below
        slo, now = self.slo, s.now_s
        if slo.ttft_s is not None:
            missed |= np.isnan(first) & (now - arrival > slo.ttft_s)
        if slo.e2e_s is not None:
            missed |= np.isnan(finish) & (now - arrival > slo.e2e_s)
        rejected_now = int(np.count_nonzero(status == REJECTED))
        assert rejected_now <= self.rejected or not self.rejected, "more rejected than at the first run"
        rejected = max(self.rejected, rejected_now)
        cu = s.num_requests - int(np.count_nonzero(status == CANCELLED))
        if not cu:
            return False
        missed_surely = int(np.count_nonzero(missed & counted_surely & (status != REJECTED)))
        met = int(np.count_nonzero(completed & ok))
        most = (cu - rejected - missed_surely) / cu
        least = met / cu
        if most < self.target:
            self.decided, self.passes, self.bound = True, False, most
        elif least >= self.target:
            self.decided, self.passes, self.bound = True, True, least
        if self.decided:  # the share missed among the accepted requests that have arrived, over all accepted
            self.arrived = n / s.num_requests
            accepted = n - rejected_now - int(np.count_nonzero(status == CANCELLED))
            self.estimate = (cu - rejected) / cu * (1 - missed_surely / accepted) if accepted > 0 else least
        return self.decided

    def _within(self, completed: np.ndarray, arrival: np.ndarray, first: np.ndarray, finish: np.ndarray,
                generated: np.ndarray) -> np.ndarray:
        """Completed requests within every target, as metrics.meets_slo computes it (False elsewhere)."""
        slo = self.slo
        ok = completed.copy()
        ttft = first - arrival
        e2e = finish - arrival
        if slo.ttft_s is not None:
            ok &= ttft <= slo.ttft_s
        if slo.tpot_s is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                tpot = np.where(completed & (generated > 1), (e2e - ttft) / (generated - 1), np.nan)
            ok &= np.isnan(tpot) | (tpot <= slo.tpot_s)
        if slo.e2e_s is not None:
            ok &= e2e <= slo.e2e_s
        return ok
