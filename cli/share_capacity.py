"""`kvcalc share --trace … --capacity …` and `--gpu-cache/--host-cache/--disk-cache`: the prefix-cache hit
rate against capacity, and a GPU → host → disk hierarchy, from one pass of stack distances (core/share)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import ParameterError
from ..core.gpus import get_gpu
from ..core.inputs.traces import MOONCAKE_BLOCK_TOKENS, Trace, read_trace
from ..core.model.layers import check_tp
from ..core.model.models import ModelSpec
from ..core.share.cache_bytes import CachedBlockBytes, cached_block_bytes
from ..core.share.capacity import (
    REACH_FRACTIONS,
    CapacityCurve,
    CapacityValue,
    capacity_curve,
    parse_capacities,
)
from ..core.share.load_or_recompute import step_time_model
from ..core.share.saved_states import saved_state_hit_curve
from ..core.share.stack_distance import StackDistances, stack_distances
from ..core.share.tiers import (
    DEFAULT_DISK_BANDWIDTH,
    DEFAULT_HOST_BANDWIDTH,
    MODES,
    parse_bandwidth,
    parse_tier_size,
)
from ..core.share.trace_blocks import check_block_size, check_positive_block_size, check_requests
from ..core.units import format_bytes, format_count, format_percent
from .chart import check_plot_target
from .output import Field, Format, Report, Table, emit, err_console, record_table
from .progress import progress_bar
from .share_tiers import TierOptions, add_tiers

DEFAULT_GPU = "H100-SXM"


@dataclass(frozen=True)
class CurveOptions:
    """What the command line asked for, parsed (no trace read yet)."""

    trace: tuple[str, str]
    limit: int | None
    block_sizes: list[int]
    capacities: list[CapacityValue]
    tiers: TierOptions | None
    tp: int
    plot: Path | None


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
    spec: ModelSpec | None, bits: int, quantization: str | None = None,
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
    return CurveOptions(trace, limit, block_sizes, capacities, tier_options, 1 if tp is None else tp, plot)


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
    loaded = read_trace(o.trace[0], o.trace[1])
    if o.limit is not None:
        loaded = loaded.head(o.limit)
    per_block = {b: None if spec is None else cached_block_bytes(spec, dtype, bits, b, o.tp) for b in o.block_sizes}
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
        cbb = per_block[b]
        bpb = None if cbb is None else cbb.bytes_per_block
        curves.append(capacity_curve(distances[b], [v.blocks(b, bpb) for v in o.capacities]))
    report = _curve_report(loaded.description, loaded.has_prefix_ids, o, curves, per_block, spec)
    _add_saved_state_rule(report, loaded, curves, per_block, distances)
    if o.tiers is not None:
        b = o.block_sizes[0]
        add_tiers(report, o.tiers, distances[b], per_block[b], spec, bits)
    if o.plot is not None:
        _write_curve_plot(o.plot, f"{Path(o.trace[1]).name} ({len(loaded):,} requests)", distances, curves)
        report.notes.append(f"figure written to {o.plot}")
    emit(report, fmt)


def _add_saved_state_rule(report: Report, loaded: Trace, curves: list[CapacityCurve],
                          per_block: dict[int, CachedBlockBytes | None], distances: dict[int, StackDistances]) -> None:
    """For a recurrent hybrid: the hit rate at every capacity when states are saved only where prompts end."""
    records = []
    for doc, curve in zip(report.doc["curves"], curves, strict=True):
        cbb = per_block[curve.block_size]
        if cbb is None or not cbb.state_bytes:
            continue
        points = [*curve.points, curve.ceiling]
        hits = saved_state_hit_curve(loaded, distances[curve.block_size], [p.capacity_blocks for p in points])
        for point_doc, blocks in zip(doc["points"], hits[:-1], strict=True):
            point_doc["hit_rate_states_at_prompt_ends"] = blocks * curve.block_size / max(curve.prompt_tokens, 1)
        for point, blocks in zip(points, hits, strict=True):
            records.append({"block_size": curve.block_size, "capacity_blocks": point.capacity_blocks,
                            "every_block": curve.hit_rate(point),
                            "prompt_ends": blocks * curve.block_size / max(curve.prompt_tokens, 1)})
        rate = hits[-1] * curve.block_size / max(curve.prompt_tokens, 1)
        doc["unbounded_hit_rate_states_at_prompt_ends"] = rate
        report.notes.append(
            f"block {curve.block_size}: if states are saved only where a prompt's full blocks end (vLLM's align "
            f"mode, one prefill chunk), the unbounded hit rate is {format_percent(rate)}, not "
            f"{format_percent(curve.hit_rate(curve.ceiling))}; per capacity in the table above (a capacity in bytes "
            "counts a state in every block: saving fewer, the same bytes hold more blocks, so that column is a "
            "lower bound there)"
            + (" (below block 512 a Mooncake trace hides how a prompt continues inside its last hash id: read "
               "this at --block 512)" if curve.block_size < MOONCAKE_BLOCK_TOKENS and loaded.kind == "mooncake"
               else "") + ".")
    if records:
        report.tables.append(record_table(
            "recurrent states saved only where prompts end (align, one prefill chunk) vs at every block", [
                Field("block_size", "block"),
                Field("capacity_blocks", "capacity (blocks)", lambda c: "unbounded" if c is None else format_count(c)),
                Field("every_block", "hit rate, a state per block", format_percent),
                Field("prompt_ends", "hit rate, states at prompt ends", format_percent)], records))


def _capacity_bytes(blocks: int | None, cbb: CachedBlockBytes | None) -> int | None:
    return None if blocks is None or cbb is None else blocks * cbb.bytes_per_block


def _curve_report(description: str, has_ids: bool, o: CurveOptions, curves: list[CapacityCurve],
                  per_block: dict[int, CachedBlockBytes | None], spec: ModelSpec | None) -> Report:
    records, reach_records, doc_curves = [], [], []
    for curve in curves:
        cbb = per_block[curve.block_size]
        points = []
        for value, point in zip([*o.capacities, None], [*curve.points, curve.ceiling], strict=True):
            points.append({
                "block_size": curve.block_size,
                "capacity": "unbounded" if value is None else value.text,
                "capacity_blocks": point.capacity_blocks,
                "capacity_tokens": point.capacity_tokens,
                "capacity_bytes": _capacity_bytes(point.capacity_blocks, cbb),
                "hit_tokens": point.hit_tokens,
                "hit_rate": curve.hit_rate(point),
                "share_of_unbounded": curve.share_of_ceiling(point),
            })
        records += points
        reach = {}
        reach_record: dict[str, Any] = {"block_size": curve.block_size, "unbounded_hit_rate":
                                        curve.hit_rate(curve.ceiling)}
        for f in REACH_FRACTIONS:
            blocks = curve.reach[f]
            key = f"{round(f * 100)}pct"
            reach[key] = {"capacity_blocks": blocks,
                          "capacity_tokens": None if blocks is None else blocks * curve.block_size,
                          "capacity_bytes": _capacity_bytes(blocks, cbb)}
            reach_record[f"tokens_{key}"] = reach[key]["capacity_tokens"]
            reach_record[f"bytes_{key}"] = reach[key]["capacity_bytes"]
        reach_records.append(reach_record)
        doc_curves.append({"block_size": curve.block_size, "requests": curve.requests,
                           "prompt_tokens": curve.prompt_tokens, "unbounded_hit_tokens": curve.ceiling.hit_tokens,
                           "unbounded_hit_rate": curve.hit_rate(curve.ceiling), "reach": reach,
                           "cached_block_bytes": None if cbb is None else cbb.bytes_per_block, "points": points[:-1]})
    tables = _curve_tables(records, reach_records, with_bytes=spec is not None)
    doc: dict[str, Any] = {"trace": description, "has_prefix_ids": has_ids, "curves": doc_curves}
    if spec is not None:
        first = per_block[curves[0].block_size]
        assert first is not None
        doc["model"] = {"name": first.model, "dtype": first.dtype, "tp": first.tp,
                        "cached_block_bytes_by_group": {str(b): dict((g.label, g.bytes_per_block) for g in c.groups)
                                                        for b, c in per_block.items() if c is not None}}
    report = Report(doc=doc, tables=tables, text=[description])
    report.notes += _curve_notes(o, has_ids, per_block)
    return report


def _curve_tables(records: list[dict[str, Any]], reach_records: list[dict[str, Any]], *,
                  with_bytes: bool) -> list[Table]:
    """The hit-rate-per-capacity table and the capacity-per-share-of-hits table (bytes columns with a model)."""
    fields = [
        Field("block_size", "block"),
        Field(None, "capacity", lambda r: r["capacity"]),  # as typed; CSV has blocks, tokens and bytes
        Field("capacity_blocks"),
        Field("capacity_tokens", "tokens", format_count),
        Field("capacity_bytes", "bytes" if with_bytes else None, format_bytes),
        Field("hit_tokens", "hit tokens", format_count),
        Field("hit_rate", "hit rate", format_percent),
        Field("share_of_unbounded", "of unbounded", format_percent),
    ]
    tables: list[Table] = [record_table("prefix-cache hit rate against capacity (LRU, requests one at a time)",
                                        fields, records)]
    reach_fields = [Field("block_size", "block"), Field("unbounded_hit_rate", "unbounded hit rate", format_percent)]
    for f in REACH_FRACTIONS:
        key = f"{round(f * 100)}pct"
        reach_fields.append(Field(f"tokens_{key}", f"{round(f * 100)} % of it: tokens", format_count))
        reach_fields.append(Field(f"bytes_{key}", f"{round(f * 100)} %: bytes" if with_bytes else None, format_bytes))
    tables.append(record_table("capacity that reaches a share of the unbounded cache's hits", reach_fields,
                               reach_records))
    return tables


def _curve_notes(o: CurveOptions, has_ids: bool, per_block: dict[int, CachedBlockBytes | None]) -> list[str]:
    notes = ["one LRU stack pass (Mattson) gives every capacity: a hit needs the whole prefix chain of full "
             "blocks and never covers a prompt's last token; a request's blocks enter the cache with block 0 most "
             "recent; the running request and its output are not cache. Capacity in blocks = floor(capacity / "
             "block)."]
    if not has_ids:
        notes.append("this trace has no prefix ids (hash_ids): no hits are possible — use a Mooncake trace.")
    elif o.trace[0].strip().lower() == "mooncake" and min(o.block_sizes) < MOONCAKE_BLOCK_TOKENS:
        notes.append(f"Mooncake hashes {MOONCAKE_BLOCK_TOKENS}-token blocks: below block "
                     f"{MOONCAKE_BLOCK_TOKENS}, a shared prefix is only seen to the last whole shared hash id, so "
                     "finer blocks find little more than 512 would (an engine hashing every block finds more).")
    for b, cbb in per_block.items():
        if cbb is None:
            continue
        split = ", ".join(f"{g.label} {format_bytes(g.bytes_per_block)}" for g in cbb.groups)
        windowed = any(g.label.startswith(("sliding", "chunked")) for g in cbb.groups)
        notes.append(f"{cbb.model}, {cbb.dtype}, tp {cbb.tp}: a cached block of {b} tokens is "
                     f"{format_bytes(cbb.bytes_per_block)} per GPU ({split})"
                     + ("; windowed groups keep every block cached, as vLLM does, though a hit needs only the "
                        "window's: an upper bound" if windowed else "") + ". Capacities in bytes are per GPU.")
        if cbb.state_bytes:
            share = format_percent(cbb.state_bytes / cbb.bytes_per_block)
            notes.append(f"block {b}: saved recurrent states are {share}"
                         " of each cached block's bytes: a hit needs a state saved at its boundary, one per block.")
    return notes


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
