"""The max-rate search (core/sim/search.py): a target no rate can reach is reported after one run with its
reason; a reachable one starts from the run already done and never runs a rate twice."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.sim import search as search_module
from kvcalc.core.sim.metrics import attainment
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.record import REJECTED
from kvcalc.core.sim.run import run_policy, run_until
from kvcalc.core.sim.search import attainment_ceiling, max_rate
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.simulate import run_policies, search_max_rates
from kvcalc.core.sim.verdict import Verdict


@pytest.fixture
def counted_runs(monkeypatch):
    """The rates the search simulates (its calls of run_policy), in order."""
    rates = []

    def counting(workload, policy, setup, **kw):
        rates.append(workload.mean_rate_per_s)
        return run_policy(workload, policy, setup, **kw)

    def counting_until(workload, policy, setup, stop, **kw):
        rates.append(workload.mean_rate_per_s)
        return run_until(workload, policy, setup, stop, **kw)

    monkeypatch.setattr(search_module, "run_policy", counting)
    monkeypatch.setattr(search_module, "run_until", counting_until)
    return rates


def short_context_setup(target: float = 0.9):
    # 200 constructed requests, max length 512: the prompt + output lengths above 512 are rejected at
    # arrival, whatever the rate
    return build(SimOptions(requests=200, rate="2", slo="ttft=5", find_max_rate=True, max_model_len=512,
                            target_attainment=target))


def test_unattainable_target_is_reported_after_one_run_with_its_reason(counted_runs):
    setup = short_context_setup()
    w = setup.workload
    too_long = int(np.count_nonzero(w.prompt_tokens + w.output_tokens > 512))
    assert too_long > 0.1 * len(w)  # more than 1 - 0.9 of them: 0.9 is out of reach
    search = max_rate(w, "paged", setup.sim, setup.slo, 0.9)
    assert len(counted_runs) == 1 and len(search.evaluations) == 1
    assert search.max_rate_rps == 0.0
    share = (len(w) - too_long) / len(w)
    assert search.unattainable == (
        f"{too_long:,} of {len(w):,} requests ({too_long / len(w):.1%}) are rejected at any rate (longer than the "
        f"model's max length: {too_long:,}), so at most {share:.1%} can meet the SLO, below the 90.0% target")
    # handed the run already done, the search runs nothing at all
    counted_runs.clear()
    first = run_policies(setup)["paged"]
    again = search_max_rates(setup, records={"paged": first})["paged"]
    assert counted_runs == [] and again.unattainable == search.unattainable


def test_ceiling_is_the_share_not_rejected():
    setup = short_context_setup()
    record = run_policy(setup.workload, "paged", setup.sim)
    rejected = int(np.count_nonzero(record.status == REJECTED))
    ceiling, reason = attainment_ceiling(record, 0.5)
    assert ceiling == (len(record.status) - rejected) / len(record.status) and reason is None  # 0.5 is reachable


def test_reachable_target_reuses_the_first_run_and_runs_no_rate_twice(counted_runs):
    setup = short_context_setup(target=0.5)  # the rejected share is below 1/2: the search goes on
    w = setup.workload
    alone = max_rate(w, "paged", setup.sim, setup.slo, 0.5)
    runs_alone = len(counted_runs)
    assert alone.unattainable is None and alone.max_rate_rps > 0
    assert runs_alone == len(alone.evaluations) == len({rate for rate, _ in alone.evaluations})
    counted_runs.clear()
    first = run_policy(w, "paged", setup.sim)
    reused = max_rate(w, "paged", setup.sim, setup.slo, 0.5, first=first)
    assert reused.evaluations == alone.evaluations and reused.max_rate_rps == alone.max_rate_rps
    assert len(counted_runs) == runs_alone - 1  # the first run was not done again


@pytest.mark.parametrize("options", [
    dict(slo="ttft=1,tpot=60ms", target_attainment=0.7),
    dict(slo="e2e=20", target_attainment=0.5, cancel_fraction=0.2),
    dict(slo="ttft=0.5", target_attainment=0.8, timeout_s="3"),
    dict(slo="ttft=1", target_attainment=0.85, max_model_len=900),  # ~9 % rejected at any rate
    dict(slo="ttft=1,tpot=60ms", target_attainment=0.6, max_model_len=700, cancel_fraction=0.1),
])
def test_a_run_stopped_early_has_the_whole_runs_verdict(options):
    """At every rate, the verdict of a run stopped early (verdict.Verdict, told how many requests the first run
    rejected at arrival) is the whole run's, and its bound lies between the target and the whole run's
    attainment: at most it when it fails, at least when it passes."""
    setup = build(SimOptions(requests=400, rate="2", find_max_rate=True, **options))
    target = setup.target_attainment
    rejected = int(np.count_nonzero(run_policy(setup.workload, "paged", setup.sim).status == REJECTED))
    assert rejected > (20 if "max_model_len" in options else 0)  # the default lengths too reject a few
    stopped = 0
    for rate in (0.5, 1, 2, 4, 8, 16, 64):
        w = setup.workload.at_rate(rate)
        whole = attainment(run_policy(w, "paged", setup.sim), setup.slo)
        verdict = Verdict(setup.slo, target, rejected)
        early = run_until(w, "paged", setup.sim, verdict)
        if early is not None:  # never decided before the end: the whole run was done
            assert attainment(early, setup.slo) == whole
            continue
        stopped += 1
        assert verdict.passes == (whole >= target)
        assert (whole >= verdict.bound >= target) if verdict.passes else (whole <= verdict.bound < target)
    assert stopped >= 2  # the check is not vacuous


def test_search_answer_and_verdicts_match_whole_runs():
    """Every rate the search ran has the verdict of its whole run, and the bracket is within the resolution."""
    setup = build(SimOptions(requests=300, rate="4", slo="ttft=1,tpot=80ms", find_max_rate=True,
                             target_attainment=0.8))
    search = max_rate(setup.workload, "paged", setup.sim, setup.slo, 0.8)
    assert search.decided_early and search.unattainable is None
    for i, (rate, share) in enumerate(search.evaluations):
        w = setup.workload if i == 0 else setup.workload.at_rate(rate)
        whole = attainment(run_policy(w, "paged", setup.sim), setup.slo)
        assert (whole >= 0.8) == (share >= 0.8), rate  # each rate's verdict is its whole run's
        assert whole == share or rate in search.decided_early
    lo, hi = search.bracket_rps
    assert lo == search.max_rate_rps and hi - lo <= search.resolution * lo


def bisection_search(workload, setup, target: float, rel_tol: float = 0.02, max_doublings: int = 12):
    """The search before rate_steps, on whole runs: from R0 double while passing or halve while failing, then
    bisect; (max rate, bracket) or None when the first run shows the target out of reach."""
    def passes(rate: float) -> bool:
        return attainment(run_policy(workload.at_rate(rate), "paged", setup.sim), setup.slo) >= target

    start = workload.unit_arrival_s[-1] / workload.arrival_s[-1]
    first = run_policy(workload, "paged", setup.sim)
    if attainment(first, setup.slo) < target and attainment_ceiling(first, target)[1] is not None:
        return None
    lo = hi = None
    if attainment(first, setup.slo) >= target:
        lo = start
        for _ in range(max_doublings):
            if not passes(lo * 2):
                hi = lo * 2
                break
            lo *= 2
        if hi is None:
            return lo, (lo, float("inf"))
    else:
        hi = start
        for _ in range(max_doublings):
            if passes(hi / 2):
                lo = hi / 2
                break
            hi /= 2
        if lo is None:
            return 0.0, (0.0, hi)
    while hi - lo > rel_tol * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo, (lo, hi)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), target=st.sampled_from([0.5, 0.8, 0.9, 0.97]),
       slo=st.sampled_from(["ttft=1,tpot=60ms", "ttft=0.5", "e2e=20", "ttft=2,tpot=100ms"]),
       max_len=st.sampled_from([None, 700]), rate=st.sampled_from(["0.5", "4", "30"]))
def test_search_against_plain_bisection(seed, target, slo, max_len, rate):
    """On small constructed workloads (some with requests rejected at any rate): the same kind of answer as the
    plain bisection on whole runs (out of reach, none, unbounded or a bracket), every rate listed run exactly once,
    each rate's verdict its whole run's (so lo really passes and hi really fails), the bracket within 2 %."""
    setup = build(SimOptions(requests=100, rate=rate, slo=slo, find_max_rate=True, target_attainment=target,
                             seed=seed, max_model_len=max_len))
    w = setup.workload
    ran: list[float] = []

    def counting_until(workload, policy, sim, stop, **kw):
        ran.append(workload.mean_rate_per_s)
        return run_until(workload, policy, sim, stop, **kw)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search_module, "run_until", counting_until)
        first = run_policy(w, "paged", setup.sim)
        search = max_rate(w, "paged", setup.sim, setup.slo, target, first=first)
    plain = bisection_search(w, setup, target)
    rates = [r for r, _ in search.evaluations]
    assert len(rates) == len(set(rates)) == len(ran) + 1  # the first run handed over, every other one run once
    assert [w.at_rate(r).mean_rate_per_s for r in rates[1:]] == ran
    if plain is None:
        assert search.unattainable is not None and len(rates) == 1
        return
    assert search.unattainable is None
    verdicts = {}
    for i, rate in enumerate(rates):
        whole = attainment(run_policy(w if i == 0 else w.at_rate(rate), "paged", setup.sim), setup.slo)
        verdicts[rate] = whole >= target
        assert verdicts[rate] == (dict(search.evaluations)[rate] >= target), rate
    lo, hi = search.bracket_rps
    plain_lo, plain_hi = plain[1]
    assert (lo == 0) == (plain_lo == 0) and np.isinf(hi) == np.isinf(plain_hi)
    assert lo == search.max_rate_rps
    assert verdicts[lo] if lo > 0 else not any(verdicts.values())  # 0: no rate run passed
    if not np.isinf(hi):
        assert not verdicts[hi] and (hi - lo <= 0.02 * lo or lo == 0)


def test_known_rejections_decide_a_failing_run_earlier():
    """Told how many requests are rejected at any rate, a failing run is certain no later than without, and
    strictly earlier at some rate (the rejections still to arrive are counted from the start); a passing run
    stops at the same point (only misses move)."""
    setup = build(SimOptions(requests=400, rate="2", slo="ttft=1", find_max_rate=True, target_attainment=0.85,
                             max_model_len=900))
    rejected = int(np.count_nonzero(run_policy(setup.workload, "paged", setup.sim).status == REJECTED))
    earlier = 0
    for rate in (1, 2, 4, 8, 16):
        w = setup.workload.at_rate(rate)
        told, blind = Verdict(setup.slo, 0.85, rejected), Verdict(setup.slo, 0.85)
        run_until(w, "paged", setup.sim, told)
        run_until(w, "paged", setup.sim, blind)
        assert told.decided == blind.decided or (told.decided and not blind.decided)
        if told.decided and blind.decided:
            assert told.passes == blind.passes
            assert told.arrived <= blind.arrived if not told.passes else told.arrived == blind.arrived
            earlier += told.arrived < blind.arrived
    assert earlier >= 1
