"""`kvcalc share --trace … --capacity …` and `--gpu-cache/--host-cache/--disk-cache`: the prefix-cache hit
rate against capacity, and a GPU → host → disk hierarchy, from one pass of stack distances (core/share)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.errors import ParameterError
from ..core.gpus import get_gpu
from ..core.inputs.traces import read_trace
from ..core.model.kv_groups import DEFAULT_LAYOUT, LAYOUTS
from ..core.model.layers import check_tp
from ..core.model.models import ModelSpec
from ..core.share.cache_bytes import cached_block_bytes
from ..core.share.capacity import CapacityCurve, CapacityValue, capacity_curve, parse_capacities
from ..core.share.load_or_recompute import step_time_model
from ..core.share.stack_distance import StackDistances, stack_distances
from ..core.share.tiers import (
    DEFAULT_DISK_BANDWIDTH,
    DEFAULT_HOST_BANDWIDTH,
    MODES,
    parse_bandwidth,
    parse_tier_size,
)
from ..core.share.trace_blocks import check_block_size, check_positive_block_size, check_requests
from .chart import check_plot_target
from .output import Format, emit, err_console
from .progress import progress_bar
from .share_capacity_report import CurveOptions, add_saved_state_rule, curve_report
from .share_tiers import TierOptions, add_tiers

DEFAULT_GPU = "H100-SXM"


def _bandwidth(text: str | None, default: float, flag: str) -> float:
    try:
        return parse_bandwidth(text, default, flag)
    except ParameterError as e:
        raise ValueError(str(e)) from None


def _single(text: str | None, flag: str) -> CapacityValue:
    try:
        return parse_tier_size(text, flag)
    except ParameterError as e:
        raise ValueError(str(e)) from None


def parse_options(
    trace: tuple[str, str] | None, limit: int | None, block: int, blocks: str | None, capacity: str | None,
    gpu_cache: str | None, host_cache: str | None, disk_cache: str | None, host_bw: str | None,
    disk_bw: str | None, tier_mode: str | None, gpu: str | None, tp: int | None, plot: Path | None,
    spec: ModelSpec | None, bits: int, quantization: str | None = None, layout: str | None = None,
) -> CurveOptions:
    """Every input error of the curve and tier options, before any work."""
    tiered = any(v is not None for v in (gpu_cache, host_cache, disk_cache))
    tier_only = [f for f, v in (("--host-bw", host_bw), ("--disk-bw", disk_bw), ("--tier-mode", tier_mode))
                 if v is not None]
    if tier_only and not tiered:
        raise ValueError(f"{', '.join(tier_only)} applies to tiers: add --gpu-cache (and --host-cache, --disk-cache)")
    if trace is None:
        raise ValueError("--capacity and the tier options replay a trace: add --trace mooncake FILE")
    if plot is not None and capacity is None:
        raise ValueError("--plot draws the capacity curve: add --capacity (e.g. --capacity 1M:64M)")
    model_only = [f for f, v in (("--gpu", gpu), ("--tp", tp)) if v is not None]
    if model_only and spec is None:
        raise ValueError(f"{', '.join(model_only)} applies to a model's bytes and prefill time: add --model")
    block_sizes = _block_sizes(blocks, block, trace[0].strip().lower() == "mooncake")
    if tiered and len(block_sizes) > 1:
        raise ValueError("tiers run at one block size: give --block, not a --blocks list, with --gpu-cache")
    capacities = parse_capacities(capacity) if capacity is not None else []
    tiers = None
    if tiered:
        if gpu_cache is None:
            raise ValueError("--host-cache and --disk-cache sit below a GPU cache: add --gpu-cache (0 for none)")
        tiers = (_single(gpu_cache, "--gpu-cache"), _single(host_cache, "--host-cache"),
                 _single(disk_cache, "--disk-cache"))
    mode = "exclusive" if tier_mode is None else tier_mode.strip().lower()
    if mode not in MODES:
        raise ValueError(f"--tier-mode {tier_mode!r} is not one of {', '.join(MODES)}")
    tier_flags = ("--gpu-cache", "--host-cache", "--disk-cache")
    for flag, value in [*(("--capacity", v) for v in capacities), *zip(tier_flags, tiers or (), strict=False)]:
        if value.unit == "bytes" and spec is None:
            raise ValueError(f"{flag} {value.text!r} is bytes: give a model (--model) for its blocks, or tokens (3M)")
    if tp is not None:
        check_tp(tp)
    layout_name = DEFAULT_LAYOUT if layout is None else layout.strip().lower()
    if layout_name not in LAYOUTS:
        raise ValueError(f"--layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if gpu is not None and tiers is None:
        raise ValueError("--gpu times the tiers' load-or-recompute rule: add --gpu-cache (and lower tiers)")
    gpu_name = DEFAULT_GPU if gpu is None else gpu
    if spec is not None and tiers is not None:  # an unknown GPU, or weights that do not fit, before any work
        step_time_model(spec, get_gpu(gpu_name, None), bits, block_sizes[0], 1 if tp is None else tp,
                        quantization)
    if plot is not None:
        check_plot_target(plot)
    bandwidths = (_bandwidth(host_bw, DEFAULT_HOST_BANDWIDTH, "--host-bw"),
                  _bandwidth(disk_bw, DEFAULT_DISK_BANDWIDTH, "--disk-bw"))
    tier_options = None if tiers is None else TierOptions(tiers, bandwidths, mode, gpu_name, 1 if tp is None else tp,
                                                               quantization)
    return CurveOptions(trace, limit, block_sizes, capacities, tier_options, 1 if tp is None else tp, plot,
                        layout_name)


def _block_sizes(blocks: str | None, block: int, mooncake: bool) -> list[int]:
    """--block, or the --blocks list; each a size the trace can key (a bad one of the list named as such)."""
    check = check_block_size if mooncake else check_positive_block_size
    if blocks is None:
        check(block)
        return [block]
    sizes = []
    for part in blocks.split(","):
        try:
            sizes.append(int(part.strip()))
        except ValueError:
            raise ValueError(f"--blocks {blocks!r}: write block sizes in tokens, e.g. --blocks 16,64,512") from None
    if any(b < 1 for b in sizes) or len(set(sizes)) != len(sizes):
        raise ValueError(f"--blocks {blocks!r}: give distinct positive block sizes, e.g. 16,64,512")
    for b in sizes:
        try:
            check(b)
        except ParameterError as exc:
            raise ValueError(f"--blocks {blocks!r}: {str(exc).replace('block_size', 'block', 1)}") from None
    return sorted(sizes)


def run(o: CurveOptions, spec: ModelSpec | None, dtype: str, bits: int, fmt: Format) -> None:
    """Read the trace, one stack-distance pass per block size, then the curve, tiers and report."""
    per_block = {b: None if spec is None else cached_block_bytes(spec, dtype, bits, b, o.tp, layout_name=o.layout)
                 for b in o.block_sizes}  # a block vLLM's layout cannot page at is refused before reading
    loaded = read_trace(o.trace[0], o.trace[1])
    if o.limit is not None:
        loaded = loaded.head(o.limit)
    for b in o.block_sizes:
        cbb = per_block[b]
        bpb = None if cbb is None else cbb.bytes_per_block
        for value in [*o.capacities, *(o.tiers.sizes if o.tiers else ())]:
            value.blocks(b, bpb)  # a size too small for one block is 0 blocks, which is allowed
    for b in o.block_sizes:  # every error in the trace before the status line (e.g. unchained ids above 512)
        check_requests(loaded, b, None)
    if fmt is Format.table:
        err_console.print(f"stack distances of {loaded.description} at block "
                          f"{', '.join(map(str, o.block_sizes))} …", highlight=False)
    distances: dict[int, StackDistances] = {}
    with progress_bar("stack distances", total=len(loaded) * len(o.block_sizes)) as advance:
        for b in o.block_sizes:
            distances[b] = stack_distances(loaded, b, progress=advance)
    curves = []
    for b in o.block_sizes:
        # a capacity in bytes is a GPU pool: under vLLM's layout its ids less the null block (cache_bytes.pool_blocks)
        curves.append(capacity_curve(distances[b], [v.pool_blocks(b, per_block[b]) for v in o.capacities]))
    report = curve_report(loaded.description, loaded.has_prefix_ids, o, curves, per_block, spec)
    add_saved_state_rule(report, loaded, curves, per_block, distances)
    if o.tiers is not None:
        b = o.block_sizes[0]
        add_tiers(report, o.tiers, distances[b], per_block[b], spec, bits)
    if o.plot is not None:
        _write_curve_plot(o.plot, f"{Path(o.trace[1]).name} ({len(loaded):,} requests)", distances, curves)
        report.notes.append(f"figure written to {o.plot}")
    emit(report, fmt)


def _write_curve_plot(path: Path, title: str, distances: dict[int, StackDistances],
                      curves: list[CapacityCurve]) -> None:
    """Hit rate against capacity in tokens, log x: the exact curve on a fine grid, the swept points marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for curve in curves:
        d = distances[curve.block_size]
        swept = [p.capacity_tokens for p in curve.points if p.capacity_tokens]
        low = max(min(swept, default=curve.block_size), curve.block_size)
        high = max(max(swept, default=low * 1000), low * 10)
        grid = np.unique(np.geomspace(low, high, 120).astype(np.int64) // curve.block_size)
        grid = grid[grid > 0]
        rates = [100 * d.total_hit_blocks(int(c)) * curve.block_size / curve.prompt_tokens for c in grid]
        line, = ax.plot(grid * curve.block_size, rates, label=f"block {curve.block_size}")
        ax.plot(swept, [100 * curve.hit_rate(p) for p in curve.points if p.capacity_tokens], "o",
                color=line.get_color())
        ax.axhline(100 * curve.hit_rate(curve.ceiling), color=line.get_color(), ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("prefix-cache capacity (tokens)")
    ax.set_ylabel("token hit rate (%)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(f"{title}: LRU prefix-cache hit rate (dotted: unbounded)", fontsize="small")
    fig.savefig(path)
    plt.close(fig)
