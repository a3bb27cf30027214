"""`kvcalc sim` as one call: every policy of a setup run on the same workload and settings, summarised,
and (with `find_max_rate`) each policy's highest rate under the SLO.

    setup = build(SimOptions(...))          # setup.py: every option checked, nothing run yet
    result = simulate(setup, progress=...)  # progress: called with arrivals taken in (setup.work_units in all)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .metrics import RunSummary, summarize
from .record import RunRecord
from .run import run_policy
from .search import RateSearch, max_rate
from .setup import Setup


@dataclass(frozen=True, eq=False)
class Simulation:
    setup: Setup
    records: dict[str, RunRecord]  # policy -> its run, in the order of setup.policies
    summaries: dict[str, RunSummary]
    searches: dict[str, RateSearch]  # empty without find_max_rate


def work_units(setup: Setup) -> int:
    """What `simulate` reports progress in: arrivals, over every policy's run (the searches aside)."""
    return len(setup.policies) * len(setup.workload)


def simulate(setup: Setup, *, record_timeline: bool = False, progress: Callable[[int], None] | None = None,
             on_search: Callable[[str], None] | None = None) -> Simulation:
    """Run every policy of `setup`; `on_search(policy)` is called before each max-rate search starts."""
    records, summaries = {}, {}
    for name in setup.policies:
        record = run_policy(setup.workload, name, setup.sim, record_timeline=record_timeline, progress=progress)
        records[name] = record
        summaries[name] = summarize(record, setup.slo, setup.plan.kv_bytes_per_token)
    searches = {}
    if setup.find_max_rate:
        for name in setup.policies:
            if on_search is not None:
                on_search(name)
            searches[name] = max_rate(setup.workload, name, setup.sim, setup.slo, setup.target_attainment)
    return Simulation(setup, records, summaries, searches)
