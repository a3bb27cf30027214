"""`kvcalc plan`: the cheapest deployment that serves a workload under an SLO, a search of `sim --max-rate` runs.

The workload, model and SLO options are `kvcalc sim`'s own (the aliases of cli/sim_flags.py, as cli/sim.py declares
them); the space, prices, execution and output options are the command's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from . import sim_flags as opt
from .options import FormatOpt, JsonOpt, int_option
from .output import Format, emit, err_console, resolve_format, warn_notes
from .sim_flags import sim_options

if TYPE_CHECKING:
    from ..core.sim.options import SimOptions

GpuCostOpt = Annotated[list[str] | None, typer.Option(
    "--gpu-cost", metavar="NAME=PRICE", help="A GPU to consider and its price per GPU-hour (repeat for each; "
    "kvcalc has no built-in prices), e.g. --gpu-cost H100-SXM=4.5.")]
GpusOpt = Annotated[str | None, typer.Option(
    "--gpu", help="Only these of the priced GPUs, comma-separated (default: every priced one).")]
TpsOpt = Annotated[str, typer.Option("--tp", help="Tensor-parallel degrees to try, comma-separated.")]
BlocksOpt = Annotated[str, typer.Option("--block", "-b", help="Block sizes (tokens) to try.")]
BatchedTokensOpt = Annotated[str, typer.Option("--max-batched-tokens", help="Token budgets per step to try.")]
KvDtypesOpt = Annotated[str, typer.Option("--dtype", help="KV precisions to try, e.g. bf16,fp8.")]
ReplicasOpt = Annotated[str, typer.Option(
    "--replicas", help="Replica counts to try; each replica gets 1/replicas of the workload's rate.")]
JobsOpt = Annotated[int | None, int_option(
    "--jobs", "-j", help="Local worker processes (default: every core this process may use).")]
RayOpt = Annotated[str | None, typer.Option(
    "--ray", metavar="auto|ADDRESS", help="Run one Ray task per point: auto (a local or RAY_ADDRESS cluster) "
    "or a cluster address; needs pip install 'kvcalc[ray]'.")]
CacheDirOpt = Annotated[Path | None, typer.Option(
    "--cache-dir", help="Where finished points are kept (default: ~/.cache/kvcalc/plan).")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the point cache.")]
PlotOpt = Annotated[Path | None, typer.Option(
    "--plot", help="Cost per hour against the SLO metric, fronts marked (.png/.svg).")]


def command(
    trace: opt.TraceOpt = None, time_scale: opt.TimeScaleOpt = 1.0, limit: opt.LimitOpt = None,
    rate: opt.RateOpt = None, arrival: opt.ArrivalOpt = None, burstiness: opt.BurstinessOpt = None,
    requests: opt.RequestsOpt = None, prompt_dist: opt.PromptDistOpt = None, output_dist: opt.OutputDistOpt = None,
    model: opt.ModelOpt = None, config: opt.ConfigOpt = None, layers: opt.LayersOpt = None,
    kv_heads: opt.KvHeadsOpt = None, head_dim: opt.HeadDimOpt = None, weight_dtype: opt.WeightDtypeOpt = None,
    weights_bytes: opt.WeightsBytesOpt = None,
    memory_utilization: opt.MemoryUtilizationOpt = None, max_seqs: opt.MaxSeqsOpt = None,
    max_model_len: opt.MaxModelLenOpt = None, seed: opt.SimSeedOpt = None, slo: opt.SloOpt = None,
    target_attainment: opt.AttainmentOpt = None, gpu_cost: GpuCostOpt = None, gpu: GpusOpt = None,
    tp: TpsOpt = "1,2,4", block: BlocksOpt = "16", max_batched_tokens: BatchedTokensOpt = "8192",
    kv_dtype: KvDtypesOpt = "bf16", replicas: ReplicasOpt = "1,2,4", jobs: JobsOpt = None, ray: RayOpt = None,
    cache_dir: CacheDirOpt = None, no_cache: NoCacheOpt = False, plot: PlotOpt = None,
    json_flag: JsonOpt = False, fmt: FormatOpt = Format.table,
) -> None:
    """Plan a deployment: the cheapest GPU, TP, block size, batching, KV precision and replicas under an SLO.

    Every point is a `kvcalc sim --max-rate` run (printed for the chosen point, to reproduce it).
    Costs come only from --gpu-cost. Latencies come from sim's roofline step-time model, not a measurement.
    """
    base = sim_options(locals())
    from .plan_inputs import PlanOptions, plan_inputs, run_plan_timed
    from .plan_report import build_report, write_plan_plot

    fmt = resolve_format(json_flag, fmt)
    inputs = plan_inputs(base, PlanOptions(
        gpu_cost=gpu_cost, gpu=gpu, tp=tp, block=block, max_batched_tokens=max_batched_tokens, kv_dtype=kv_dtype,
        replicas=replicas, jobs=jobs, ray=ray, cache_dir=cache_dir, no_cache=no_cache, plot=plot))
    _warn_model_notes(base)
    result = run_plan_timed(inputs)
    if plot is not None:
        write_plan_plot(plot, result)
        err_console.print(f"wrote {plot}", highlight=False)
    emit(build_report(result), fmt)


def _warn_model_notes(base: SimOptions) -> None:
    """The model's notes (config fields defaulted or ignored, the checkpoint's KV format) on stderr, as size, frag,
    share and sim print them; the search reads the same model in each point's run."""
    from ..core.model.models import resolve_model

    spec = resolve_model(base.model, base.config, base.layers, base.kv_heads, base.head_dim)
    if spec is not None:
        warn_notes(spec.notes)
