"""`simulate`: every policy of a setup, run here or in worker processes with the same results, and the
max-rate searches."""

from __future__ import annotations

import concurrent.futures
import json

import pytest

from kvcalc.core.sim import simulate as simulate_module
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.simulate import run_policies, search_max_rates, simulate, work_units

from .test_sim_engine import assert_same_run


def test_policies_in_worker_processes_give_the_runs_of_this_process(monkeypatch):
    setup = build(SimOptions(requests=300, rate="8", compare="paged,reserve-pow2,reserve-oracle", cancel_fraction=0.2,
                             timeout_s=20.0, gpu="A100-40GB", model="Llama-2-7B"))
    here = run_policies(setup)
    monkeypatch.setattr(simulate_module, "PARALLEL_MIN_REQUESTS", 1)  # processes even for this small run
    reported = []
    there = run_policies(setup, workers=2, progress=reported.append)
    assert list(there) == list(here) == ["paged", "reserve-pow2", "reserve-oracle"]
    for name in here:
        assert_same_run(here[name], there[name])
    assert sum(reported) == work_units(setup) == 3 * 300  # every arrival of every run reported, once


def test_max_rate_searches_in_worker_processes_are_the_same(monkeypatch):
    setup = build(SimOptions(requests=60, rate="2", compare="paged,reserve-max", slo="ttft=1", find_max_rate=True))
    here = search_max_rates(setup)
    monkeypatch.setattr(simulate_module, "PARALLEL_MIN_REQUESTS", 1)
    runs = []
    there = search_max_rates(setup, workers=2, progress=runs.append)
    assert {n: s.evaluations for n, s in here.items()} == {n: s.evaluations for n, s in there.items()}
    assert len(runs) == sum(len(s.evaluations) for s in here.values())  # one report per simulated run


def test_small_runs_stay_in_this_process(monkeypatch):
    setup = build(SimOptions(requests=20, compare="paged,reserve-max"))

    def no_processes(*args, **kw):
        raise AssertionError("a process pool for 20 requests")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_processes)  # simulate imports it when needed
    result = simulate(setup, workers=8)
    assert json.dumps(result.summaries["paged"].to_dict())  # the JSON document of a run
    assert [s.policy for s in result.summaries.values()] == ["paged", "reserve-max"]


@pytest.mark.parametrize(("options", "needle"), [
    (dict(slo=""), "slo '' names no target"),
    (dict(policy="paged", compare="paged"), "give policy paged or compare paged, not both"),
    (dict(max_seqs=0), "max_seqs 0 must be at least 1"),
    (dict(block_size=0), "block_size 0 must be at least 1"),
    (dict(compute_eff=2.0), "compute_eff 2 must be in (0, 1]"),
])
def test_core_errors_name_parameters_not_flags(options, needle):
    with pytest.raises(ValueError) as error:
        build(SimOptions(requests=3, **options))
    assert needle in str(error.value) and "--" not in str(error.value)
    assert error.value.params[0] in needle
