"""Where a plan's points run: in this process, in local worker processes, or as Ray tasks — one call of
evaluate_point per point, with results handed back as each finishes.

Each point is deterministic (seeded workload, no shared state), and results are keyed by the point's
index, so the order in which they finish changes nothing: serial, `jobs` processes and Ray give identical
plans. Local workers are spawned, not forked (the caller may run a progress bar's thread); a new process
imports numpy and kvcalc again (about a second), which a plan of several simulations per point repays.

Ray (`ray_address`: "auto", or a cluster's address such as ray://head:10001) runs one task per point
(num_cpus=1). "auto" is `ray.init()`'s own choice: the cluster in RAY_ADDRESS or one started on this
machine with `ray start`, else a new local runtime. A runtime that is already initialised in this process
is used as it is and left running; one this call started is shut down at the end.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from ..sim.options import SimOptions
from .evaluate import evaluate_point
from .space import Point

RAY_INSTALL_HINT = "pip install 'kvcalc[ray]'"
OnResult = Callable[[int, dict[str, Any]], None]


def run_point(base: SimOptions, point: Point) -> dict[str, Any]:
    """evaluate_point's result as plain JSON values (what the cache stores and reads back, exactly)."""
    return json.loads(json.dumps(evaluate_point(base, point)))


def run_points(base: SimOptions, tasks: Sequence[tuple[int, Point]], on_result: OnResult, *, jobs: int = 1,
               ray_address: str | None = None) -> None:
    """Evaluate each (index, point) and call on_result(index, result) as each finishes."""
    if not tasks:
        return
    if ray_address is not None:
        _run_ray(base, tasks, on_result, ray_address)
    elif jobs <= 1 or len(tasks) == 1:
        for index, point in tasks:
            on_result(index, run_point(base, point))
    else:
        _run_processes(base, tasks, on_result, min(jobs, len(tasks)))


def _run_processes(base: SimOptions, tasks: Sequence[tuple[int, Point]], on_result: OnResult, jobs: int) -> None:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = {pool.submit(run_point, base, point): index for index, point in tasks}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    on_result(futures[future], future.result())
        except BaseException:
            for future in pending:
                future.cancel()
            raise


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError(f"ray_address: Ray is not installed; {RAY_INSTALL_HINT}, or drop ray_address to run in "
                         "local processes") from None
    return ray


def _run_ray(base: SimOptions, tasks: Sequence[tuple[int, Point]], on_result: OnResult, address: str) -> None:
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=None if address == "auto" else address, include_dashboard=False,
                 logging_level="WARNING", log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_point)
        base_ref = ray.put(base)
        refs = {remote.remote(base_ref, point): index for index, point in tasks}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    on_result(refs[ref], _ray_result(ray, ref))
        except BaseException:
            for ref in pending:
                ray.cancel(ref)
            raise
    finally:
        if started:
            ray.shutdown()


def _ray_result(ray, ref) -> dict[str, Any]:
    """ray.get, with a task's own exception raised as it is (Ray wraps it with the worker's traceback, which
    would turn a one-line `error:` into pages)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise
