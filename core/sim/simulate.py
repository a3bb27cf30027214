"""`kvcalc sim` as one call: every policy of a SimJob run on the same workload and settings, summarised,
and (with `find_max_rate`) each policy's highest rate under the SLO.

    job = build(SimOptions(...))                   # setup.py: every option checked, nothing run yet
    result = simulate(job, progress=..., workers=4)  # progress: arrivals taken in, work_units(job) in all

or its two parts, run_policies and search_max_rates (each reports its own progress), then
Simulation.from_runs.

The policies' runs are independent and deterministic, so with `workers` > 1 they run in that many
processes at once, with results identical to running them one after another. Processes only pay off for
large runs: a new one imports numpy and kvcalc again (about a second), while a run of a few thousand
requests takes about as long, so below PARALLEL_MIN_REQUESTS the runs stay in this process. Workers are
spawned (not forked: the caller may run threads, such as a progress bar's), so the caller's main module
must be importable — a script or `python -m`, not code piped to `python -`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .metrics import RunSummary, Slo, summarize
from .record import RunRecord
from .run import run_policy
from .search import RateSearch, max_rate
from .settings import SimSetup
from .setup import SimJob
from .workload import Workload

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

PARALLEL_MIN_REQUESTS = 5_000


@dataclass(frozen=True, eq=False)
class Simulation:
    job: SimJob
    records: dict[str, RunRecord]  # policy -> its run, in the order of job.policies
    summaries: dict[str, RunSummary]
    searches: dict[str, RateSearch]  # empty without find_max_rate

    @classmethod
    def from_runs(cls, job: SimJob, records: dict[str, RunRecord], searches: dict[str, RateSearch]) -> Simulation:
        kv_bytes_per_token = job.plan.kv_bytes_per_token
        summaries = {name: summarize(record, job.slo, kv_bytes_per_token) for name, record in records.items()}
        return cls(job, records, summaries, searches)


def work_units(job: SimJob) -> int:
    """What `run_policies` reports progress in: arrivals, over every policy's run."""
    return len(job.policies) * len(job.workload)


def available_cpus() -> int:
    """The processors this process may run on (its affinity, where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - systems without affinity (macOS, Windows)
        return os.cpu_count() or 1


def simulate(job: SimJob, *, record_timeline: bool = False, progress: Callable[[int], None] | None = None,
             workers: int = 1) -> Simulation:
    """Every policy's run and, with `find_max_rate`, its max-rate search; `progress` as run_policies'."""
    records = run_policies(job, record_timeline=record_timeline, progress=progress, workers=workers)
    searches = search_max_rates(job, workers=workers, records=records) if job.find_max_rate else {}
    return Simulation.from_runs(job, records, searches)


def run_policies(job: SimJob, *, record_timeline: bool = False, progress: Callable[[int], None] | None = None,
                 workers: int = 1) -> dict[str, RunRecord]:
    """policy -> its run; `progress` is called with the arrivals taken in since its last call."""
    names = list(job.policies)
    calls = [(job.workload, name, job.sim, record_timeline) for name in names]
    with _Runner(_workers(job, workers), progress) as runner:
        return dict(zip(names, runner.map(_run, calls), strict=True))


def search_max_rates(job: SimJob, *, progress: Callable[[int], None] | None = None,
                     workers: int = 1, records: dict[str, RunRecord] | None = None) -> dict[str, RateSearch]:
    """policy -> its max-rate search (search.py); `progress` is called once per simulated run. `records`:
    the policies' runs of the workload as it is (run_policies'), which each search starts from instead of
    running them again."""
    names = list(job.policies)
    records = records or {}
    calls = [(job.workload, name, job.sim, job.slo, job.target_attainment, records.get(name))
             for name in names]
    with _Runner(_workers(job, workers), progress) as runner:
        return dict(zip(names, runner.map(_search, calls), strict=True))


def _workers(job: SimJob, workers: int) -> int:
    if workers > 1 and len(job.policies) > 1 and len(job.workload) >= PARALLEL_MIN_REQUESTS:
        return min(workers, len(job.policies))
    return 1


# ---- runs here or in worker processes -----------------------------------------------------------------------
_reports: Any = None  # in a worker process: the queue its runs report progress to


def _worker_start(reports: Any) -> None:
    global _reports
    _reports = reports


def _in_worker(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args, _reports.put)


def _run(workload: Workload, name: str, sim: SimSetup, record_timeline: bool,
         progress: Callable[[int], None] | None) -> RunRecord:
    return run_policy(workload, name, sim, record_timeline=record_timeline, progress=progress)


def _search(workload: Workload, name: str, sim: SimSetup, slo: Slo, target: float, first: RunRecord | None,
            progress: Callable[[int], None] | None) -> RateSearch:
    on_evaluation = None if progress is None else lambda rate, share: progress(1)
    return max_rate(workload, name, sim, slo, target, on_evaluation=on_evaluation, first=first)


class _Runner:
    """Calls `fn(*args, progress)` for each argument tuple, in this process or in `workers` spawned ones;
    workers' progress reports come back through a queue and are passed on to `progress` here."""

    def __init__(self, workers: int, progress: Callable[[int], None] | None) -> None:
        self.workers, self.progress = workers, progress
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> _Runner:
        if self.workers > 1:  # multiprocessing loaded here: one process needs none of it
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            context = multiprocessing.get_context("spawn")
            self.reports = context.SimpleQueue()
            self.pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_worker_start,
                                            initargs=(self.reports,))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def map(self, fn: Callable[..., Any], calls: list[tuple]) -> list[Any]:
        """[fn(*args, progress) for args in calls]; a worker's progress goes to the queue."""
        if self.pool is None:
            return [fn(*args, self.progress) for args in calls]
        from concurrent.futures import FIRST_COMPLETED, wait
        futures = [self.pool.submit(_in_worker, fn, *args) for args in calls]
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            self._pass_reports()
        self._pass_reports()
        return [future.result() for future in futures]

    def _pass_reports(self) -> None:
        while not self.reports.empty():
            units = self.reports.get()
            if self.progress is not None:
                self.progress(units)
