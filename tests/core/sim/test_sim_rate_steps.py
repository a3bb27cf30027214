"""The max-rate search's choice of the next rate (core/sim/rate_steps.py): whatever the estimates say, the answer is
a rate seen to pass, its bracket a rate seen to fail within tol above it, no rate is run twice, and the guards bound
the number of runs. Checked on synthetic attainment curves (logistic, with a deterministic jitter that makes them
non-monotone, and estimates distorted as early-stopped runs distort them) against a plain bisection written here."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.sim.rate_steps import SAFE, Steps, close_bracket

TOL = 0.02


class Curve:
    """attainment(R) = c / (1 + exp(s (ln R − ln m))) + jitter(R); a run stopped early reports a bound on the side
    of the target and an estimate off by `bias` (a burst), made when `arrived` of the requests had arrived."""

    def __init__(self, ceiling: float, slope: float, middle: float, jitter: float, bias: float, arrived: float,
                 target: float) -> None:
        self.ceiling, self.slope, self.middle, self.jitter = ceiling, slope, middle, jitter
        self.bias, self.arrived, self.target = bias, arrived, target
        self.runs: list[float] = []

    def attainment(self, rate: float) -> float:
        smooth = self.ceiling / (1 + math.exp(self.slope * (math.log(rate) - math.log(self.middle))))
        wiggle = self.jitter * math.sin(rate * 7919.0)  # not monotone at the scale of tol
        return min(max(smooth + wiggle, 0.0), self.ceiling)

    def passes(self, steps: Steps):
        def run(rate: float) -> bool:
            assert rate not in self.runs, f"{rate} run twice"
            self.runs.append(rate)
            share = self.attainment(rate)
            ok = share >= self.target
            far = abs(share - self.target) > 0.05
            if far:  # stopped early: the bound that decided it, and a distorted estimate
                bound = self.target + (1e-3 if ok else -1e-3)
                steps.add(rate, ok, bound, min(max(share + self.bias, 0.0), 1.0), self.arrived)
            else:
                steps.add(rate, ok, share, share, 1.0)
            return ok
        return run


def bisection(curve: Curve, start: float, max_doublings: int = 12) -> tuple[float, tuple[float, float], int]:
    """The search before rate_steps: double/halve from the start until a pass and a fail, then bisect."""
    runs = 0

    def passes(rate: float) -> bool:
        nonlocal runs
        runs += 1
        return curve.attainment(rate) >= curve.target

    lo: float | None = None
    hi: float | None = None
    if passes(start):
        lo = start
        for _ in range(max_doublings):
            if not passes(lo * 2):
                hi = lo * 2
                break
            lo *= 2
        if hi is None:
            return lo, (lo, math.inf), runs
    else:
        hi = start
        for _ in range(max_doublings):
            if passes(hi / 2):
                lo = hi / 2
                break
            hi /= 2
        if lo is None:
            return 0.0, (0.0, hi), runs
    while hi - lo > TOL * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo, (lo, hi), runs


def search(curve: Curve, start: float, max_doublings: int = 12) -> tuple[float, tuple[float, float]]:
    steps = Steps(curve.target, curve.ceiling, 10_000, TOL)
    run = curve.passes(steps)
    lo, hi = (start, None) if run(start) else (None, start)
    return close_bracket(run, steps, lo, hi, start / 2**max_doublings, start * 2**max_doublings)


curves = st.builds(
    Curve, ceiling=st.floats(0.85, 1.0), slope=st.floats(1.0, 40.0), middle=st.floats(0.05, 50.0),
    jitter=st.sampled_from([0.0, 0.002, 0.02]), bias=st.floats(-0.4, 0.4), arrived=st.floats(0.05, 1.0),
    target=st.floats(0.3, 0.84))


@settings(max_examples=400, deadline=None)
@given(curve=curves, start=st.floats(0.01, 100.0))
def test_answer_is_a_seen_pass_with_a_seen_fail_within_tol(curve: Curve, start: float) -> None:
    rate, (lo, hi) = search(curve, start)
    _, (plain_lo, plain_hi), plain_runs = bisection(curve, start)
    assert rate == lo
    ok = [r for r in curve.runs if curve.attainment(r) >= curve.target]
    failed = [r for r in curve.runs if curve.attainment(r) < curve.target]
    # the same kind of answer as the bisection: none (0), unbounded (inf) or a bracket within tol
    assert (lo == 0) == (plain_lo == 0) and math.isinf(hi) == math.isinf(plain_hi)
    if lo > 0:
        assert lo in ok
    if lo > 0 and not math.isinf(hi):
        assert hi in failed and hi - lo <= TOL * lo
    elif lo == 0:
        assert hi in failed and not ok  # every rate run failed, down to the floor
        assert hi <= start / 2**12
    else:
        assert not failed and lo >= start * 2**12
    # the guards: at most about three times the bisection's runs (it halves at least every third step)
    assert len(curve.runs) <= 3 * plain_runs + 3


@settings(max_examples=200, deadline=None)
@given(curve=curves.filter(lambda c: c.jitter == 0.0), start=st.floats(0.01, 100.0))
def test_on_a_monotone_curve_the_answer_is_the_bisections_crossing(curve: Curve, start: float) -> None:
    """One crossing: both searches bracket it, so their answers lie within tol of each other."""
    _, (lo, hi) = search(curve, start)
    _, (plain_lo, plain_hi), _ = bisection(curve, start)
    if lo > 0 and not math.isinf(hi):
        assert plain_lo <= hi and lo <= plain_hi  # both brackets hold the one crossing


def test_fewer_runs_than_bisection_on_smooth_curves() -> None:
    """Summed over a grid of smooth curves with honest estimates, the secant takes fewer runs than bisection (230
    against 291: most runs of both are the doubling or halving towards a middle up to 500 times off the start)."""
    ours = plain = 0
    for slope in (3.0, 8.0, 20.0):
        for middle in (0.3, 1.0, 5.0):
            for start in (0.1, 2.0, 40.0):
                curve = Curve(1.0, slope, middle, 0.0, 0.0, 1.0, 0.9)
                search(curve, start)
                ours += len(curve.runs)
                plain += bisection(Curve(1.0, slope, middle, 0.0, 0.0, 1.0, 0.9), start)[2]
    assert ours < 0.85 * plain, (ours, plain)


@settings(max_examples=300, deadline=None)
@given(lo=st.floats(1e-4, 1e4), tol=st.sampled_from([0.02, 0.01, 0.1]), passes=st.booleans())
def test_closing_rates_close_the_bracket_in_floats(lo: float, tol: float, passes: bool) -> None:
    """The endgame's rates: lo (1 + tol·SAFE) that fails, or hi / (1 + tol·SAFE) that passes, leaves
    hi − lo ≤ tol · lo in floating point, strictly inside the old bracket."""
    hi = lo * (1 + 3 * tol)
    steps = Steps(0.9, 1.0, 1000, tol)
    steps.add(lo, True, 0.95 if passes else 0.9001, 0.95 if passes else 0.9001, 1.0)
    steps.add(hi, False, 0.89 if passes else 0.5, 0.89 if passes else 0.5, 1.0)
    rate = steps.inside(lo, hi)
    assert lo < rate < hi
    if rate == lo * (1 + tol * SAFE):
        assert rate - lo <= tol * lo
    if rate == hi / (1 + tol * SAFE):
        assert hi - rate <= tol * rate
    narrow = hi / (1 + tol) ** 2 * (1 + 1e-6)  # hi ≤ lo (1 + tol)²: any rate chosen closes it either way
    steps.add(narrow, True, 0.95, 0.95, 1.0)
    inside = steps.inside(narrow, hi)
    assert narrow < inside < hi and hi - inside <= tol * inside and inside - narrow <= tol * narrow


@pytest.mark.parametrize("share", [0.0, 1.0, 0.9, float("nan")])
def test_log_odds_and_estimates_stay_finite(share: float) -> None:
    steps = Steps(0.9, 1.0, 100, TOL)
    steps.add(1.0, share >= 0.9, 0.9 if share >= 0.9 else 0.89, share, 0.5)
    assert math.isfinite(steps.offset(1.0))
    assert 0.5 <= steps.below(1.0) < 1.0 if share < 0.9 else 1.0 < steps.above(1.0) <= 2.0
