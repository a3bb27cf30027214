"""`kvcalc sim`: continuous batching over the KV block pool under an arrival process."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Annotated

import typer

from ..core.sim import setup as sim_setup
from ..core.sim.checks import MAX_REQUESTS
from ..core.sim.metrics import TIMELINE_COLUMNS, parse_slo, summarize, timeline_rows
from ..core.sim.run import choose_policies, run_policy
from ..core.sim.search import check_attainment, check_search, max_rate
from ..core.sim.setup import DEFAULT_OUTPUT_DIST, DEFAULT_PROMPT_DIST
from .options import (
    ConfigOpt,
    FormatOpt,
    HeadDimOpt,
    JsonOpt,
    KvHeadsOpt,
    LayersOpt,
    ModelOpt,
    check_output_path,
    int_option,
)
from .output import Format, emit, err_console, resolve_format
from .sim_report import build_report


def command(
    trace: Annotated[
        tuple[str, Path] | None,
        typer.Option("--trace", metavar="KIND FILE",
                     help="A trace file: 'azure F' or 'mooncake F' (prefix ids); its own arrivals and lengths."),
    ] = None,
    time_scale: Annotated[
        float, typer.Option("--time-scale", help="With --trace: arrivals x times faster (0.5 = slower).")
    ] = 1.0,
    limit: Annotated[
        int | None, int_option("--limit", help="With --trace: only its first N requests.")
    ] = None,
    rate: Annotated[
        str | None, typer.Option("--rate", metavar="REQ/S",
                                 help="Constructed (no --trace): mean arrival rate, requests/s; inf = all at time 0 "
                                      "(an offline batch; default: 1).")
    ] = None,
    arrival: Annotated[
        str | None, typer.Option("--arrival", help="Constructed: poisson or gamma arrivals (default: poisson).")
    ] = None,
    burstiness: Annotated[
        float | None, typer.Option("--burstiness", help="With --arrival gamma: shape b (1 = Poisson, < 1 burstier).")
    ] = None,
    requests: Annotated[
        int | None,
        int_option("--requests", help=f"Constructed: number of requests, at most {MAX_REQUESTS:,} (default: 1,000)."),
    ] = None,
    prompt_dist: Annotated[
        str | None,
        typer.Option("--prompt-dist",
                     help=f"Constructed prompt lengths (as frag --dist; default: {DEFAULT_PROMPT_DIST})."),
    ] = None,
    output_dist: Annotated[
        str | None,
        typer.Option("--output-dist",
                     help=f"Constructed output lengths (as frag --dist; default: {DEFAULT_OUTPUT_DIST})."),
    ] = None,
    model: ModelOpt = None,
    config: ConfigOpt = None,
    layers: LayersOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    dtype: Annotated[str, typer.Option("--dtype", help="KV precision: fp32, fp16, bf16, fp8, int8, int4.")] = "fp16",
    weight_dtype: Annotated[
        str, typer.Option("--weight-dtype", help="Weight precision (bytes per parameter).")
    ] = "bf16",
    weights_bytes: Annotated[
        str | None, typer.Option("--weights-bytes", help="Weights per replica, e.g. 26GB (overrides).")
    ] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="A100-40GB, A100-80GB, H100-SXM or H200 (default: A100-40GB).")
    ] = None,
    gpu_memory: Annotated[str | None, typer.Option("--gpu-memory", help="Custom GPU: memory, e.g. 80GiB.")] = None,
    bandwidth: Annotated[str | None, typer.Option("--bandwidth", help="Custom GPU: HBM bytes/s, e.g. 3.35e12.")] = None,
    flops: Annotated[
        float | None, typer.Option("--flops", help="Custom GPU: dense bf16 FLOP/s, e.g. 989e12 (finite).")
    ] = None,
    tp: Annotated[
        int, int_option("--tp", help="Tensor-parallel GPUs per replica: divides the KV heads or is a multiple of "
                                       "them (as kvcalc size).")
    ] = 1,
    memory_utilization: Annotated[float, typer.Option("--memory-utilization", help="Share of GPU memory used.")] = 0.9,
    workspace_bytes: Annotated[
        str | None, typer.Option("--workspace-bytes", help="Activation workspace (overrides the estimate).")
    ] = None,
    block: Annotated[int, int_option("--block", "-b", help="Paged: block size in tokens.")] = 16,
    policy: Annotated[
        str | None,
        typer.Option("--policy", help="paged, reserve-max, reserve-pow2 or reserve-oracle (default: paged)."),
    ] = None,
    compare: Annotated[
        str | None, typer.Option("--compare", help="Instead of --policy: several distinct policies side by side, "
                                                   "comma-separated.")
    ] = None,
    max_batched_tokens: Annotated[int, int_option("--max-batched-tokens", help="Token budget per step.")] = 8192,
    max_seqs: Annotated[int, int_option("--max-seqs", help="Most running requests.")] = 256,
    max_model_len: Annotated[
        int | None,
        int_option("--max-model-len",
                     help="Longest request, prompt + output tokens (default: the model's max_position_embeddings)."),
    ] = None,
    preempt: Annotated[str, typer.Option("--preempt", help="recompute or swap.")] = "recompute",
    swap_bandwidth: Annotated[
        str | None,
        typer.Option("--swap-bandwidth",
                     help="With --preempt swap: swap bytes/s over the host link "
                          f"(default: {sim_setup.Options.swap_bandwidth})."),
    ] = None,
    cancel_fraction: Annotated[
        float, typer.Option("--cancel-fraction", help="Share of requests cancelled midway.")
    ] = 0.0,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Drop requests without a first token after s seconds "
                                                     "(inf = no timeout, the default).")
    ] = None,
    seed: Annotated[
        int | None,
        int_option("--seed", help="Seed of the constructed samples and of --cancel-fraction's picks (default: "
                                  f"{sim_setup.Options.seed}); runs are reproducible."),
    ] = None,
    compute_eff: Annotated[float, typer.Option("--compute-eff", help="Share of peak FLOP/s reached.")] = 0.6,
    weight_eff: Annotated[float, typer.Option("--weight-eff", help="Share of bandwidth when reading weights.")] = 0.8,
    attn_eff: Annotated[float, typer.Option("--attn-eff", help="Share of bandwidth when reading KV.")] = 0.8,
    step_overhead_ms: Annotated[float, typer.Option("--step-overhead-ms", help="Fixed time per step, ms.")] = 0.5,
    calibrate: Annotated[
        Path | None, typer.Option("--calibrate", help="kvcalc bench --json output: sets --attn-eff.")
    ] = None,
    slo: Annotated[
        str | None, typer.Option("--slo", help="Targets, each once, e.g. ttft=2,tpot=100ms,e2e=60 (seconds).")
    ] = None,
    find_max_rate: Annotated[
        bool, typer.Option("--max-rate", help="Search each policy's highest rate under --slo.")
    ] = False,
    target_attainment: Annotated[
        float | None, typer.Option("--attainment", help="With --max-rate: share of requests that must meet the SLO "
                                                        "(default: 0.9).")
    ] = None,
    no_prefix_caching: Annotated[bool, typer.Option("--no-prefix-caching", help="Ignore Mooncake prefix ids.")] = False,
    no_fast_forward: Annotated[bool, typer.Option("--no-fast-forward", help="Simulate every step one by one.")] = False,
    timeline: Annotated[Path | None, typer.Option("--timeline", help="Write the memory/queue timeline as CSV.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Memory over time and latency CDFs (.png/.svg).")] = None,
    json_flag: JsonOpt = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """Simulate serving: continuous batching over the KV pool; TTFT, TPOT, E2E, goodput, memory, max rate.

    Latencies come from a roofline step-time model, not a measurement.
    Default: OPT-13B on one A100-40GB, 1,000 ShareGPT-like constructed requests at 1 request/s.
    """
    if plot is not None:
        from .chart import check_plot_target

        check_plot_target(plot)
    if timeline is not None:
        check_output_path("--timeline", timeline)
    _check_ignored(preempt, swap_bandwidth, trace, seed, cancel_fraction)
    policies = choose_policies(policy, compare)
    slo_spec = parse_slo(slo)
    target_attainment = check_attainment(find_max_rate, target_attainment)
    if find_max_rate:
        check_search(slo_spec, target_attainment)
    setup = sim_setup.build(
        sim_setup.Options(
            trace=trace,
            time_scale=time_scale,
            limit=limit,
            rate=rate,
            arrival=arrival,
            burstiness=burstiness,
            requests=requests,
            prompt_dist=prompt_dist,
            output_dist=output_dist,
            model=model,
            config=config,
            layers=layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            weight_dtype=weight_dtype,
            weights_bytes=weights_bytes,
            gpu=gpu,
            gpu_memory=gpu_memory,
            bandwidth=bandwidth,
            flops=flops,
            tp=tp,
            memory_utilization=memory_utilization,
            workspace_bytes=workspace_bytes,
            block=block,
            max_batched_tokens=max_batched_tokens,
            max_seqs=max_seqs,
            max_model_len=max_model_len,
            preempt=preempt,
            swap_bandwidth=sim_setup.Options.swap_bandwidth if swap_bandwidth is None else swap_bandwidth,
            cancel_fraction=cancel_fraction,
            timeout=timeout,
            seed=sim_setup.Options.seed if seed is None else seed,
            compute_eff=compute_eff,
            weight_eff=weight_eff,
            attn_eff=attn_eff,
            step_overhead_ms=step_overhead_ms,
            calibrate=calibrate,
            prefix_caching=not no_prefix_caching,
            fast_forward=not no_fast_forward,
        )
    )
    records, summaries = {}, {}
    for name in policies:
        record = _run_with_progress(setup, name, record_timeline=timeline is not None or plot is not None)
        records[name] = record
        summaries[name] = summarize(record, slo_spec, setup.plan.kv_bytes_per_token)
    searches = {}
    if find_max_rate:
        for name in policies:
            err_console.print(f"searching the max rate of {name} …", highlight=False)
            searches[name] = max_rate(
                setup.workload, name, setup.sim, slo_spec, target_attainment
            )
    if timeline is not None:
        _write_timeline(timeline, records)
        err_console.print(f"wrote {timeline}", highlight=False)
    if plot is not None:
        from .sim_plot import write_sim_plot

        write_sim_plot(plot, records, f"{setup.workload.kind} workload: {setup.workload.description}")
        err_console.print(f"wrote {plot}", highlight=False)
    report = build_report(setup, policies, summaries, searches, slo_spec, target_attainment)
    emit(report, resolve_format(json_flag, fmt))


def _check_ignored(preempt: str, swap_bandwidth: str | None, trace, seed: int | None, cancel_fraction: float) -> None:
    """Refuse options that were given but would change nothing (the defaults are None so a given value shows)."""
    if swap_bandwidth is not None and preempt.strip().lower() != "swap":
        raise ValueError(f"--swap-bandwidth applies to --preempt swap (--preempt {preempt} never swaps): "
                         "add --preempt swap or drop --swap-bandwidth")
    if seed is not None and trace is not None and cancel_fraction == 0:
        raise ValueError("--seed with --trace only picks the cancelled requests, and there are none: the trace "
                         "fixes arrivals and lengths; add --cancel-fraction or drop --seed")


def _run_with_progress(setup, name: str, record_timeline: bool):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(f"simulating {name}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}% of arrivals"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    ) as progress:
        task = progress.add_task(name, total=1.0)
        record = run_policy(
            setup.workload,
            name,
            setup.sim,
            record_timeline=record_timeline,
            progress=lambda share: progress.update(task, completed=share),
        )
    return record


def _write_timeline(path: Path, records: dict) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", *TIMELINE_COLUMNS])
        for name, record in records.items():
            for row in timeline_rows(record):
                writer.writerow([name, *row])
