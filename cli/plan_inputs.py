"""`kvcalc plan`'s own flags as given (`PlanOptions`), their combinations checked and turned into the plan's
inputs (`PlanInputs`: the request, the point cache, where the points run), and the timed run of the search."""

from __future__ import annotations

import dataclasses
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .output import err_console

if TYPE_CHECKING:
    from ..core.plan.cache import PointCache
    from ..core.plan.planner import PlanRequest, PlanResult
    from ..core.sim.options import SimOptions


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """The space, price, execution and output flags of `kvcalc plan` as typed (None: not given)."""

    gpu_cost: list[str] | None
    gpu: str | None
    tp: str
    block: str
    max_batched_tokens: str
    kv_dtype: str
    replicas: str
    jobs: int | None
    ray: str | None
    cache_dir: Path | None
    no_cache: bool
    plot: Path | None


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """What the search runs: the request, the cache (None: --no-cache) and the local processes or Ray address."""

    request: PlanRequest
    cache: PointCache | None
    jobs: int
    ray: str | None
    plot: Path | None


def check_plan_options(o: PlanOptions) -> None:
    """The output path and the execution flags' combinations, before any work."""
    from .chart import check_plot_target

    if o.plot is not None:
        check_plot_target(o.plot)
    if o.jobs is not None and o.jobs < 1:
        raise ValueError(f"--jobs {o.jobs} must be at least 1")
    if o.ray is not None and o.jobs is not None:
        raise ValueError("give --jobs (local processes) or --ray (Ray tasks), not both")
    if o.ray is not None and not o.ray.strip():
        raise ValueError("--ray '': give auto or a cluster address, e.g. --ray auto")
    if o.ray is not None:
        check_ray_address(o.ray)
    if o.no_cache and o.cache_dir is not None:
        raise ValueError("give --cache-dir or --no-cache, not both")


def check_ray_address(address: str) -> None:
    """A cluster address must answer before any work: ray.init retries an unreachable one without end (`--ray
    foo:1` ran past 8 minutes printing GCS warnings). auto and local are Ray's own choice, not checked here."""
    text = address.strip()
    if text in ("auto", "local"):
        return
    host, colon, port = text.removeprefix("ray://").rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--ray {address!r}: give auto or a cluster address HOST:PORT (e.g. --ray 10.0.0.1:6379, "
                         "or ray://HOST:10001 for Ray Client)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise ValueError(f"--ray {address}: nothing answers at {host}:{port} ({exc.strerror or exc}); start the "
                         "cluster there (ray start --head) or give --ray auto") from None


def plan_inputs(base: SimOptions, o: PlanOptions) -> PlanInputs:
    """The flags checked (`check_plan_options`), the space and prices parsed, Ray imported when asked for."""
    from .. import __version__
    from ..core.model.layers import check_tp
    from ..core.plan.cache import PointCache, code_fingerprint, default_cache_dir
    from ..core.plan.planner import PlanRequest
    from ..core.plan.space import Space, check_gpus, parse_dtypes, parse_ints, parse_prices
    from ..core.sim.simulate import available_cpus

    check_plan_options(o)
    prices = parse_prices(o.gpu_cost or [])
    gpus = check_gpus([g for g in o.gpu.split(",")] if o.gpu is not None else [], prices)
    space = Space(
        gpus=gpus, tp=tuple(check_tp(tp) for tp in parse_ints(o.tp, "tp", lowest=-(2**63), highest=2**63)),
        block_sizes=parse_ints(o.block, "block"),
        max_batched_tokens=parse_ints(o.max_batched_tokens, "max_batched_tokens"),
        kv_dtypes=parse_dtypes(o.kv_dtype), replicas=parse_ints(o.replicas, "replicas", highest=4096))
    if o.ray is not None:
        from ..core.plan.execute import import_ray

        import_ray()  # before any work: a missing extra is one line, not a failure after the cached points
    cache = None if o.no_cache else PointCache(o.cache_dir or default_cache_dir())
    request = PlanRequest(base, space, prices, f"{__version__}+{code_fingerprint()}")
    jobs = available_cpus() if o.jobs is None else o.jobs
    return PlanInputs(request=request, cache=cache, jobs=jobs, ray=o.ray, plot=o.plot)


def run_plan_timed(inputs: PlanInputs) -> PlanResult:
    """The search under a progress bar, then one stderr line: points, cache hits, where they ran, how long."""
    from ..core.plan.planner import run_plan
    from .progress import progress_bar

    total = len(inputs.request.space.points())
    start = time.perf_counter()
    with progress_bar(f"plan: {total} points (max-rate searches)", total=total) as advance:
        result = run_plan(inputs.request, jobs=inputs.jobs, ray_address=inputs.ray, cache=inputs.cache,
                          progress=advance)
    jobs, ray = inputs.jobs, inputs.ray
    where = f"Ray ({ray})" if ray is not None else f"{jobs} local process{'es' if jobs > 1 else ''}"
    err_console.print(f"plan: {total} points, {result.cached} from the cache, {total - result.cached} computed "
                      f"on {where} in {time.perf_counter() - start:.1f} s", highlight=False)
    return result
