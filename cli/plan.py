"""`kvcalc plan`: the cheapest deployment that serves a workload under an SLO, a search of `sim --max-rate` runs.

The workload, model and SLO options are `kvcalc sim`'s own (built from SimOptions, as cli/sim.py builds
them); the space, prices, execution and output options are the command's.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.sim.options import SimOptions
from .options import FormatOpt, JsonOpt, int_option
from .output import Format, emit, err_console, resolve_format
from .sim import _parameters as _sim_parameters

# The `kvcalc sim` options a plan takes as they are (the others are the space's, or fixed by the plan).
SIM_FIELDS = ("trace", "time_scale", "limit", "rate", "arrival", "burstiness", "requests", "prompt_dist",
              "output_dist", "seed", "model", "config", "layers", "kv_heads", "head_dim", "weight_dtype",
              "memory_utilization", "max_seqs", "max_model_len", "slo", "target_attainment")
_OWN = [
    ("gpu_cost", Annotated[list[str] | None, typer.Option(
        "--gpu-cost", metavar="NAME=PRICE", help="A GPU to consider and its price per GPU-hour (repeat for each; "
        "kvcalc has no built-in prices), e.g. --gpu-cost H100-SXM=4.5.")], None),
    ("gpu", Annotated[str | None, typer.Option(
        "--gpu", help="Only these of the priced GPUs, comma-separated (default: every priced one).")], None),
    ("tp", Annotated[str, typer.Option("--tp", help="Tensor-parallel degrees to try, comma-separated.")], "1,2,4"),
    ("block", Annotated[str, typer.Option("--block", "-b", help="Block sizes (tokens) to try.")], "16"),
    ("max_batched_tokens", Annotated[str, typer.Option(
        "--max-batched-tokens", help="Token budgets per step to try.")], "8192"),
    ("kv_dtype", Annotated[str, typer.Option("--dtype", help="KV precisions to try, e.g. bf16,fp8.")], "bf16"),
    ("replicas", Annotated[str, typer.Option(
        "--replicas", help="Replica counts to try; each replica gets 1/replicas of the workload's rate.")], "1,2,4"),
    ("jobs", Annotated[int | None, int_option(
        "--jobs", "-j", help="Local worker processes (default: every core this process may use).")], None),
    ("ray", Annotated[str | None, typer.Option(
        "--ray", metavar="auto|ADDRESS", help="Run one Ray task per point: auto (a local or RAY_ADDRESS cluster) "
        "or a cluster address; needs pip install 'kvcalc[ray]'.")], None),
    ("cache_dir", Annotated[Path | None, typer.Option(
        "--cache-dir", help="Where finished points are kept (default: ~/.cache/kvcalc/plan).")], None),
    ("no_cache", Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the point cache.")], False),
    ("plot", Annotated[Path | None, typer.Option(
        "--plot", help="Cost per hour against the SLO metric, fronts marked (.png/.svg).")], None),
    ("json_flag", JsonOpt, False),
    ("fmt", FormatOpt, Format.table),
]


def _parameters() -> list[inspect.Parameter]:
    sim = [p for p in _sim_parameters() if p.name in SIM_FIELDS]
    own = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
           for name, annotation, default in _OWN]
    return sim + own


def command(**values: Any) -> None:
    """Plan a deployment: the cheapest GPU, TP, block size, batching, KV precision and replicas under an SLO.

    Every point is a `kvcalc sim --max-rate` run (printed for the chosen point, to reproduce it).
    Costs come only from --gpu-cost. Latencies come from sim's roofline step-time model, not a measurement.
    """
    from .. import __version__
    from ..core.plan.cache import PointCache, code_fingerprint, default_cache_dir
    from ..core.plan.planner import PlanRequest, run_plan
    from ..core.plan.space import Space, check_gpus, parse_dtypes, parse_ints, parse_prices
    from ..core.sim.simulate import available_cpus
    from .chart import check_plot_target
    from .plan_report import build_report, write_plan_plot
    from .progress import progress_bar

    own = {name: values.pop(name) for name, _, _ in _OWN}
    base = SimOptions(**{f.name: values[f.name] for f in fields(SimOptions) if f.name in values})
    fmt = resolve_format(own["json_flag"], own["fmt"])
    if own["plot"] is not None:
        check_plot_target(own["plot"])
    if own["jobs"] is not None and own["jobs"] < 1:
        raise ValueError(f"--jobs {own['jobs']} must be at least 1")
    if own["ray"] is not None and own["jobs"] is not None:
        raise ValueError("give --jobs (local processes) or --ray (Ray tasks), not both")
    if own["ray"] is not None and not own["ray"].strip():
        raise ValueError("--ray '': give auto or a cluster address, e.g. --ray auto")
    if own["no_cache"] and own["cache_dir"] is not None:
        raise ValueError("give --cache-dir or --no-cache, not both")
    prices = parse_prices(own["gpu_cost"] or [])
    gpus = check_gpus([g for g in own["gpu"].split(",")] if own["gpu"] is not None else [], prices)
    space = Space(
        gpus=gpus, tp=parse_ints(own["tp"], "tp", highest=1024), block_sizes=parse_ints(own["block"], "block"),
        max_batched_tokens=parse_ints(own["max_batched_tokens"], "max_batched_tokens"),
        kv_dtypes=parse_dtypes(own["kv_dtype"]), replicas=parse_ints(own["replicas"], "replicas", highest=4096))
    if own["ray"] is not None:
        from ..core.plan.execute import import_ray

        import_ray()  # before any work: a missing extra is one line, not a failure after the cached points
    cache = None if own["no_cache"] else PointCache(own["cache_dir"] or default_cache_dir())
    request = PlanRequest(base, space, prices, f"{__version__}+{code_fingerprint()}")
    jobs = available_cpus() if own["jobs"] is None else own["jobs"]
    total = len(space.points())
    start = time.perf_counter()
    with progress_bar(f"plan: {total} points (max-rate searches)", total=total) as advance:
        result = run_plan(request, jobs=jobs, ray_address=own["ray"], cache=cache, progress=advance)
    where = f"Ray ({own['ray']})" if own["ray"] is not None else f"{jobs} local process{'es' if jobs > 1 else ''}"
    err_console.print(f"plan: {total} points, {result.cached} from the cache, {total - result.cached} computed "
                      f"on {where} in {time.perf_counter() - start:.1f} s", highlight=False)
    if own["plot"] is not None:
        write_plan_plot(own["plot"], result)
        err_console.print(f"wrote {own['plot']}", highlight=False)
    emit(build_report(result), fmt)


command.__signature__ = inspect.Signature(_parameters())  # type: ignore[attr-defined]

