"""`kvcalc sim`: continuous batching over the KV block pool under an arrival process.

The options are those of `core.sim.options.SimOptions`, one flag per field, declared as `Annotated` aliases in
cli/sim_flags.py (`kvcalc plan` reuses those it shares); only the output options are the command's own.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.blocks import DEFAULT_BLOCK_SIZE
from ..core.dtypes import DEFAULT_DTYPE
from ..core.model.vllm_memory import DEFAULT_MAX_NUM_BATCHED_TOKENS
from ..core.notes import concat
from ..core.sim.options import SimOptions
from . import sim_flags as opt
from .options import check_output_path
from .output import Format, emit, err_console, resolve_format, warn_notes
from .sim_flags import sim_options

PROGRESS_FROM = 5_000  # arrivals over all policies: about 2 s of simulation on a 2-core machine

TimelineOpt = Annotated[Path | None, typer.Option("--timeline", help="Write the memory/queue timeline as CSV.")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Memory over time and latency CDFs (.png/.svg).")]


def command(
    # the workload: a trace, or a constructed arrival process
    trace: opt.TraceOpt = None, time_scale: opt.TimeScaleOpt = 1.0, limit: opt.LimitOpt = None,
    rate: opt.RateOpt = None, arrival: opt.ArrivalOpt = None, burstiness: opt.BurstinessOpt = None,
    requests: opt.RequestsOpt = None, prompt_dist: opt.PromptDistOpt = None, output_dist: opt.OutputDistOpt = None,
    # the model and its KV
    model: opt.ModelOpt = None, config: opt.ConfigOpt = None, layers: opt.LayersOpt = None,
    kv_heads: opt.KvHeadsOpt = None, head_dim: opt.HeadDimOpt = None, dtype: opt.KvDtypeOpt = DEFAULT_DTYPE,
    weight_dtype: opt.WeightDtypeOpt = None, weights_bytes: opt.WeightsBytesOpt = None,
    # the GPU, its memory plan (as vLLM plans it) and the step-time roofline
    gpu: opt.GpuOpt = None, gpu_memory: opt.GpuMemoryOpt = None, bandwidth: opt.BandwidthOpt = None,
    flops: opt.FlopsOpt = None, tp: opt.TpOpt = 1, memory_utilization: opt.MemoryUtilizationOpt = None,
    vllm_version: opt.VllmVersionOpt = None, quantization: opt.QuantizationOpt = None,
    workspace_bytes: opt.WorkspaceBytesOpt = None,
    # the KV pool
    block_size: opt.SimBlockOpt = DEFAULT_BLOCK_SIZE, layout: opt.LayoutOpt = None,
    mamba_cache_mode: opt.MambaCacheModeOpt = None, policy: opt.PolicyOpt = None, compare: opt.CompareOpt = None,
    # the scheduler: batch limits, preemption, cancellations and timeouts
    max_batched_tokens: opt.MaxBatchedTokensOpt = DEFAULT_MAX_NUM_BATCHED_TOKENS, max_seqs: opt.MaxSeqsOpt = None,
    max_model_len: opt.MaxModelLenOpt = None, preempt: opt.PreemptOpt = "recompute",
    swap_bandwidth: opt.SwapBandwidthOpt = None, cancel_fraction: opt.CancelFractionOpt = 0.0,
    timeout_s: opt.TimeoutOpt = None, seed: opt.SimSeedOpt = None,
    # the step-time model's efficiencies, SLO targets, and the run's switches
    compute_eff: opt.ComputeEffOpt = 0.6, weight_eff: opt.WeightEffOpt = 0.8, attn_eff: opt.AttnEffOpt = 0.8,
    step_overhead_ms: opt.StepOverheadMsOpt = 0.5, calibrate: opt.CalibrateOpt = None, slo: opt.SloOpt = None,
    find_max_rate: opt.MaxRateOpt = False, target_attainment: opt.AttainmentOpt = None,
    no_prefix_caching: opt.NoPrefixCachingOpt = False, no_fast_forward: opt.NoFastForwardOpt = False,
    # KV tiers below the GPU, then speculative decoding
    host_cache: opt.HostCacheOpt = None, disk_cache: opt.DiskCacheOpt = None, host_bw: opt.HostBwOpt = None,
    disk_bw: opt.DiskBwOpt = None, spec_tokens: opt.SimSpecTokensOpt = None,
    spec_acceptance: opt.SpecAcceptanceOpt = None, spec_method: opt.SimSpecMethodOpt = None,
    draft_cost: opt.DraftCostOpt = None, rollback_policy: opt.RollbackPolicyOpt = None,
    # output
    timeline: TimelineOpt = None, plot: PlotOpt = None, json_flag: opt.JsonOpt = False,
    fmt: opt.FormatOpt = Format.table,
) -> None:
    """Simulate serving: continuous batching over the KV pool; TTFT, TPOT, E2E, goodput, memory, max rate.

    Latencies come from a roofline step-time model, not a measurement.
    Default: OPT-13B on one A100-40GB, 1,000 ShareGPT-like constructed requests at 1 request/s.
    """
    _run(sim_options(locals()), timeline, plot, json_flag, fmt)


def _run(options: SimOptions, timeline: Path | None, plot: Path | None, json_flag: bool, fmt: Format) -> None:
    """The command's work once its parameters are SimOptions: check the output paths, build and run the job,
    write the timeline/plot, print the report."""
    from ..core.sim.setup import build
    from .sim_report import build_report

    if plot is not None:
        from .chart import check_plot_target

        check_plot_target(plot)
    if timeline is not None:
        check_output_path("--timeline", timeline)
    job = build(options)
    if job.unservable is not None:  # vLLM would not start: one max-length request does not fit the pool
        raise job.unservable
    warn_notes(job.spec.notes)  # the model's notes, as size, frag and share print them
    warn_notes([concat("vLLM would not start: ", r) for r in job.start_refusals])  # as size --gpu warns
    result, plain, tier_comparison = _simulate(job, record_timeline=timeline is not None or plot is not None)
    if timeline is not None:
        _write_timeline(timeline, result.records)
        err_console.print(f"wrote {timeline}", highlight=False)
    if plot is not None:
        from .sim_plot import write_sim_plot

        write_sim_plot(plot, result.records, f"{job.workload.kind} workload: {job.workload.description}")
        err_console.print(f"wrote {plot}", highlight=False)
    report = build_report(result, plain)
    if tier_comparison is not None:
        from .sim_tiers_report import add_tier_comparison

        add_tier_comparison(report, tier_comparison)
    emit(report, resolve_format(json_flag, fmt))


def _simulate(job: Any, record_timeline: bool) -> tuple[Any, Any, Any]:
    """Every policy's runs, max-rate searches, tier comparison and runs without speculation, as the job asks:
    (the Simulation, the summaries without speculation or None, the tier comparison or None)."""
    from ..core.sim.simulate import Simulation, available_cpus, run_policies, search_max_rates, work_units
    from .progress import progress_bar

    workers = available_cpus()
    units = work_units(job)
    with progress_bar(f"simulating {', '.join(job.policies)} (arrivals)", total=units,
                      enabled=units >= PROGRESS_FROM) as advance:
        records = run_policies(job, record_timeline=record_timeline, progress=advance, workers=workers)
    searches = {}
    if job.find_max_rate:
        for name in job.policies:
            err_console.print(f"searching the max rate of {name} …", highlight=False)
        with progress_bar("max-rate search (simulated runs)", total=None) as advance:
            searches = search_max_rates(job, progress=advance, workers=workers, records=records)
    tier_comparison = None
    if job.sim.tiers is not None:  # the same runs with and without each tier (core/sim/tiers_compare.py)
        from ..core.sim.tiers_compare import compare_tiers

        with progress_bar("the same workload with and without each tier (arrivals)", total=None) as advance:
            tier_comparison = compare_tiers(job, records, searches, progress=advance)
    result = Simulation.from_runs(job, records, searches)
    plain = None
    if job.sim.speculation is not None:
        from ..core.sim.setup import without_speculation

        plain_job = without_speculation(job)
        with progress_bar("the same runs without speculation (arrivals)", total=units,
                          enabled=units >= PROGRESS_FROM) as advance:
            plain_records = run_policies(plain_job, progress=advance, workers=workers)
        plain = Simulation.from_runs(plain_job, plain_records, {}).summaries
    return result, plain, tier_comparison


def _write_timeline(path: Path, records: dict) -> None:
    from ..core.sim.metrics import TIMELINE_COLUMNS, timeline_rows

    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        groups = max((len(r.group_block_s) for r in records.values() if r.group_block_s is not None), default=0)
        writer.writerow(["policy", *TIMELINE_COLUMNS, *(f"group{g}_blocks" for g in range(groups))])
        for name, record in records.items():
            for row in timeline_rows(record):
                writer.writerow([name, *row])
