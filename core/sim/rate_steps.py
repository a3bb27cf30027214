"""Where the max-rate search (search.py) runs next: a guess only, which changes how many runs the search takes, never
what it may answer (the highest rate seen to pass, from a bracket of a rate seen to pass and one seen to fail).

Attainment against the arrival rate R is a falling S-curve from the ceiling c (the share not rejected at arrival)
towards 0. On a logistic curve a(R) = c / (1 + exp(s · (ln R − m))) the log-odds y(a) = ln((c − a) / a) is a
straight line in ln R, so the rate where a(R) = target is found by interpolating y between two runs (a secant in
(ln R, y)), or from one run with a typical slope (TYPICAL_SLOPE). Each run gives its whole attainment, or for one
stopped once its verdict was certain, verdict.Verdict.estimate (clamped to the side of the target its verdict
says). Guards keep the search no worse than halving:

    - no run yet failed: at most double the highest pass; none yet passed: at most halve the lowest fail (the
      bracket then takes at most the old doubling/halving's runs, and at least tol per run);
    - inside a bracket [lo, hi] the guess is Illinois' (the end kept twice in a row has its log-odds halved, so
      one end cannot stay put for ever), kept MARGIN of the width from either end, and when two steps did not
      halve the bracket the next bisects it, so it halves at least every third step. (Bisecting after every
      step that does not halve it costs runs: a good guess lands just beside the target, on one side, and
      shrinks the bracket from that side only — OPT-13B at attainment 0.7 took 8 runs instead of 7.);
    - the endgame: a run at lo · (1 + tol) closes the bracket if it fails, one at hi / (1 + tol) if it passes, and
      any rate between those two (once hi ≤ lo · (1 + tol)²) closes it either way. A guess that close to an end
      is moved onto that closing rate.

Every rate returned lies strictly inside the bracket (or beyond its one known end), so no rate is run twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

TYPICAL_SLOPE = 8.0  # d log-odds / d ln R near the target: 6–11 on the Azure conversation trace (OPT-13B, Llama-3-8B)
SATURATED_STEP = 0.75  # below an overloaded run's served rate, failing far under the target: the next rate (the
# target lies under the rate the server saturates at, 0.71 of it for OPT-13B on the Azure conversation trace)
FAR = 3.0  # log-odds this far from the target's (odds 20 times off): a saturated run, whose slope says nothing
MARGIN = 0.15  # a guess inside a bracket keeps this share of its width (in ln R) from either end: on a noisy curve
# a guess next to an end mostly lands beside it and wastes a run (the closing rates below may still be nearer)
RELIABLE = 0.75  # an estimate from a run stopped before this share of its requests arrived: its bursts may differ
SAFE = 1 - 1e-9  # the closing rates sit this much inside tol, so float rounding cannot leave hi − lo > tol · lo


@dataclass
class Steps:
    """The search's runs so far: (rate, attainment or estimate, passes), and the guards' state."""

    target: float
    ceiling: float  # the highest attainment any rate can give (search.attainment_ceiling)
    counted: int  # requests measured against the SLO: the log-odds of a share are clamped half a request inside
    tol: float
    points: dict[float, tuple[float, bool, bool, bool]] = field(default_factory=dict)
    # rate -> (attainment or estimate, passes, whole enough for a slope, far from the target: FAR in log-odds)
    kept: list[str] = field(default_factory=list)  # the bracket end each step kept ("lo"/"hi")
    widths: list[float] = field(default_factory=list)  # the bracket's width in ln R before each step inside it
    ends: list[float] = field(default_factory=list)  # outside a bracket: ± ln of its one known end before each step
    served: float = math.nan  # an overloaded first run's served rate (search.served_rate), when the search ran it

    def add(self, rate: float, passes: bool, bound: float, estimate: float, arrived: float) -> None:
        """A run's outcome: its attainment (bound = estimate, arrived = 1), or for a run stopped once certain the
        bound that decided it, verdict.Verdict's estimate and the share of the requests it had taken in. The
        estimate assumes the rest of the run misses as its start did, but a run stopped early stopped on a burst
        of misses: the share used is the estimate weighted by the share arrived, the bound by the rest. An
        estimate made before RELIABLE of the requests arrived is not used for a slope."""
        if math.isnan(estimate):  # nan: nothing decided among the arrived requests
            estimate = bound
        estimate = min(estimate, bound) if not passes else max(estimate, bound)
        share = bound + (estimate - bound) * arrived
        far = abs(self.log_odds(estimate) - self.log_odds(self.target)) > FAR
        self.points[rate] = (share, passes, arrived >= RELIABLE, far)

    def log_odds(self, share: float) -> float:
        half = 0.5 / max(self.counted, 1)
        a = min(max(share, half), self.ceiling - half)
        return math.log((self.ceiling - a) / a) if 0 < a < self.ceiling else 0.0

    def offset(self, rate: float) -> float:
        """Log-odds of the run at `rate` above the target's (> 0: fails, ≤ 0: passes)."""
        return self.log_odds(self.points[rate][0]) - self.log_odds(self.target)

    def below(self, hi: float) -> float:
        """Next rate when every run so far failed (`hi` the lowest): from hi's log-odds along a secant through
        it and the next fail (both whole enough) or the typical slope; within [hi / 2, hi / (1 + tol)], and
        hi / 2 when the last two steps did not halve hi."""
        _, _, whole, far = self.points[hi]
        if self._slow(math.log(hi)):
            guess = hi / 2
        elif far:  # far below the target: no slope to read; below a saturated run's served rate, step down less
            guess = hi * SATURATED_STEP if hi == self.served else hi / 2
        else:
            slope = TYPICAL_SLOPE
            above = sorted(r for r, (_, ok, w, _) in self.points.items() if not ok and w and r > hi)
            if whole and above:  # the curve steepens towards the target: never below the typical slope
                measured = (self.offset(above[0]) - self.offset(hi)) / math.log(above[0] / hi)
                slope = min(max(measured, TYPICAL_SLOPE), TYPICAL_SLOPE * 4)
            guess = hi * math.exp(-self.offset(hi) / slope)
        return min(max(guess, hi / 2), hi / (1 + self.tol * SAFE))

    def above(self, lo: float) -> float:
        """Next rate when every run so far passed (`lo` the highest): the typical slope from it, within
        [lo · (1 + tol), 2 lo], and 2 lo when the last two steps did not double lo."""
        far = self.points[lo][3]  # far above the target (nobody waits): no slope to read, double
        guess = 2 * lo if self._slow(-math.log(lo)) or far else lo * math.exp(-self.offset(lo) / TYPICAL_SLOPE)
        return min(max(guess, lo * (1 + self.tol * SAFE)), 2 * lo)

    def _slow(self, position: float) -> bool:
        """Outside a bracket: whether the last two steps moved the one known end by less than a factor 2 (each
        step's `position`, ± ln of that end, falls)."""
        seen = self.ends
        slow = len(seen) >= 2 and position > seen[-2] - math.log(2)
        seen.append(position)
        return slow

    def inside(self, lo: float, hi: float) -> float:
        """Next rate inside the bracket [lo, hi] (lo passed, hi failed, hi − lo > tol · lo)."""
        f_lo, f_hi = self.offset(lo), self.offset(hi)
        _, _, whole_lo, far_lo = self.points[lo]
        _, _, whole_hi, far_hi = self.points[hi]
        use_lo, use_hi = whole_lo and not far_lo, whole_hi and not far_hi
        kept = self.kept
        if len(kept) >= 2 and kept[-1] == kept[-2]:  # Illinois: the end kept twice in a row weighs half
            f_lo, f_hi = (f_lo / 2, f_hi) if kept[-1] == "lo" else (f_lo, f_hi / 2)
        width = math.log(hi / lo)
        if use_lo and use_hi:
            t = -f_lo / (f_hi - f_lo) if f_hi > f_lo else 0.5
        elif use_lo or use_hi:  # from the end whose estimate holds, at the typical slope
            t = -f_lo / TYPICAL_SLOPE / width if use_lo else 1 - f_hi / TYPICAL_SLOPE / width
        else:
            t = 0.5
        guess = lo * math.exp(width * min(max(t, MARGIN), 1 - MARGIN))
        if len(self.widths) >= 2 and width > self.widths[-2] / 2:  # two steps did not halve it: bisect
            guess = (lo + hi) / 2
        closes_if_fails, closes_if_passes = lo * (1 + self.tol * SAFE), hi / (1 + self.tol * SAFE)
        if closes_if_passes <= closes_if_fails:  # any rate between the two closes the bracket
            return min(max(guess, closes_if_passes), closes_if_fails)
        if guess <= closes_if_fails:
            return closes_if_fails
        if guess >= closes_if_passes:
            return closes_if_passes
        return guess

    def moved(self, lo: float, hi: float, passed: bool) -> None:
        """Record a step inside the bracket [lo, hi]: its width before, and which end stayed (hi if it passed)."""
        self.widths.append(math.log(hi / lo))
        self.kept.append("hi" if passed else "lo")


def close_bracket(passes: Callable[[float], bool], steps: Steps, lo: float | None, hi: float | None, floor: float,
                  cap: float) -> tuple[float, tuple[float, float]]:
    """(the highest rate seen to pass, its bracket): runs `passes(rate)` (which tells `steps` each outcome) at the
    rates `steps` chooses until a pass lo and a fail hi lie within tol (hi − lo ≤ tol · lo). Given lo or hi (or
    both) already run. No pass down to `floor`: (0, (0, the lowest fail)); no fail up to `cap`: (cap, (cap, inf))."""
    while lo is None or hi is None or hi - lo > steps.tol * lo:
        if lo is None:
            assert hi is not None  # the search starts from one run at least
            if hi <= floor:
                return 0.0, (0.0, hi)
            rate = max(steps.below(hi), floor)
        elif hi is None:
            if lo >= cap:
                return lo, (lo, math.inf)
            rate = min(steps.above(lo), cap)
        else:
            rate = steps.inside(lo, hi)
        passed = passes(rate)
        if lo is not None and hi is not None:
            steps.moved(lo, hi, passed)
        lo, hi = (rate, hi) if passed else (lo, rate)
    return lo, (lo, hi)
