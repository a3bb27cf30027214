"""The max-rate search (core/sim/search.py): a target no rate can reach is reported after one run with its
reason; a reachable one starts from the run already done and never runs a rate twice."""

from __future__ import annotations

import numpy as np
import pytest

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
])
def test_a_run_stopped_early_has_the_whole_runs_verdict(options):
    """At every rate, the verdict of a run stopped early (verdict.Verdict) is the whole run's, and its bound
    lies between the target and the whole run's attainment: at most it when it fails, at least when it passes."""
    setup = build(SimOptions(requests=400, rate="2", find_max_rate=True, **options))
    target = setup.target_attainment
    stopped = 0
    for rate in (0.5, 1, 2, 4, 8, 16, 64):
        w = setup.workload.at_rate(rate)
        whole = attainment(run_policy(w, "paged", setup.sim), setup.slo)
        verdict = Verdict(setup.slo, target)
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
