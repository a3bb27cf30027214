"""`kvcalc share --trace … --capacity …` and `--gpu-cache/--host-cache/--disk-cache`: the prefix-cache hit
rate against capacity, and a GPU → host → disk hierarchy, from one pass of stack distances (core/share)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.gpus import get_gpu
from ..core.inputs.traces import MOONCAKE_BLOCK_TOKENS, read_trace
from ..core.model.models import ModelSpec
from ..core.share.cache_bytes import CachedBlockBytes, cached_block_bytes
from ..core.share.capacity import REACH_FRACTIONS, CapacityCurve, CapacityValue, capacity_curve, parse_capacities
from ..core.share.load_or_recompute import LoadOrRecompute, break_even_bandwidth, step_time_model, tier_verdict
from ..core.share.stack_distance import StackDistances, stack_distances
from ..core.share.tiers import (
    DEFAULT_DISK_BANDWIDTH,
    DEFAULT_HOST_BANDWIDTH,
    MODES,
    HierarchyResult,
    simulate_tiers,
    tier_hit_blocks,
)
from ..core.share.trace_blocks import check_block_size
from ..core.units import format_bytes, format_count, format_percent, parse_bytes
from .output import Field, Format, Report, Table, emit, err_console, quantity_table, record_table
from .progress import progress_bar

DEFAULT_GPU = "H100-SXM"
PAPER_PREFIX_TOKENS = 8192  # Mooncake FAST'25 Eq. 2's example prefix


@dataclass(frozen=True)
class CurveOptions:
    """What the command line asked for, parsed (no trace read yet)."""

    trace: tuple[str, str]
    limit: int | None
    block_sizes: list[int]
    capacities: list[CapacityValue]
    tiers: tuple[CapacityValue, CapacityValue, CapacityValue] | None
    bandwidths: tuple[float, float]
    tier_mode: str
    gpu: str
    tp: int
    plot: Path | None


def _bandwidth(text: str | None, default: float, flag: str) -> float:
    if text is None:
        return default
    raw = text.strip().removesuffix("/s")
    try:
        value = parse_bytes(raw)
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not a bandwidth: write bytes per second, e.g. 25GB/s or 25e9") from None
    return float(value)


def _single(text: str | None, flag: str) -> CapacityValue:
    if text is None:
        return CapacityValue(0, "tokens", "0")
    try:
        values = parse_capacities(text)
    except ValueError as e:
        raise ValueError(str(e).replace("capacity", flag, 1)) from None
    if len(values) != 1:
        raise ValueError(f"{flag} {text!r} gives {len(values)} sizes: give one, e.g. {flag} 40GiB")
    return values[0]


def parse_options(
    trace: tuple[str, str] | None, limit: int | None, block: int, blocks: str | None, capacity: str | None,
    gpu_cache: str | None, host_cache: str | None, disk_cache: str | None, host_bw: str | None,
    disk_bw: str | None, tier_mode: str | None, gpu: str | None, tp: int | None, plot: Path | None,
    spec: ModelSpec | None, bits: int,
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
    block_sizes = _block_sizes(blocks, block)
    if tiered and len(block_sizes) > 1:
        raise ValueError("tiers run at one block size: give --block, not a --blocks list, with --gpu-cache")
    if trace[0].strip().lower() == "mooncake":
        for b in block_sizes:
            check_block_size(b)
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
    for value in [*capacities, *(tiers or ())]:
        if value.unit == "bytes" and spec is None:
            raise ValueError(f"{value.text} is bytes: give a model (--model) to turn bytes into blocks, or tokens "
                             "(e.g. 3M)")
    if tp is not None and not 1 <= tp <= 1024:
        raise ValueError(f"--tp {tp} must be in 1..1,024")
    if gpu is not None and tiers is None:
        raise ValueError("--gpu times the tiers' load-or-recompute rule: add --gpu-cache (and lower tiers)")
    gpu_name = DEFAULT_GPU if gpu is None else gpu
    if spec is not None and tiers is not None:  # an unknown GPU, or weights that do not fit, before any work
        step_time_model(spec, get_gpu(gpu_name, "as --gpu"), bits, block_sizes[0], 1 if tp is None else tp)
    if plot is not None:
        from .chart import check_plot_target

        check_plot_target(plot)
    bandwidths = (_bandwidth(host_bw, DEFAULT_HOST_BANDWIDTH, "--host-bw"),
                  _bandwidth(disk_bw, DEFAULT_DISK_BANDWIDTH, "--disk-bw"))
    return CurveOptions(trace, limit, block_sizes, capacities, tiers, bandwidths, mode, gpu_name,
                        1 if tp is None else tp, plot)


def _block_sizes(blocks: str | None, block: int) -> list[int]:
    if blocks is None:
        return [block]
    sizes = []
    for part in blocks.split(","):
        try:
            sizes.append(int(part.strip()))
        except ValueError:
            raise ValueError(f"--blocks {blocks!r}: write block sizes in tokens, e.g. --blocks 16,64,512") from None
    if any(b < 1 for b in sizes) or len(set(sizes)) != len(sizes):
        raise ValueError(f"--blocks {blocks!r}: give distinct positive block sizes, e.g. 16,64,512")
    return sorted(sizes)


def run(o: CurveOptions, spec: ModelSpec | None, dtype: str, bits: int, fmt: Format) -> None:
    """Read the trace, one stack-distance pass per block size, then the curve, tiers and report."""
    loaded = read_trace(o.trace[0], o.trace[1])
    if o.limit is not None:
        loaded = loaded.head(o.limit)
    per_block = {b: None if spec is None else cached_block_bytes(spec, dtype, bits, b, o.tp) for b in o.block_sizes}
    for b in o.block_sizes:
        bpb = None if per_block[b] is None else per_block[b].bytes_per_block
        for value in [*o.capacities, *(o.tiers or ())]:
            value.blocks(b, bpb)  # a size too small for one block is 0 blocks, which is allowed
    if fmt is Format.table:
        err_console.print(f"stack distances of {loaded.description} at block "
                          f"{', '.join(map(str, o.block_sizes))} …", highlight=False)
    distances: dict[int, StackDistances] = {}
    with progress_bar("stack distances", total=len(loaded) * len(o.block_sizes)) as advance:
        for b in o.block_sizes:
            distances[b] = stack_distances(loaded, b, progress=advance)
    curves = []
    for b in o.block_sizes:
        bpb = None if per_block[b] is None else per_block[b].bytes_per_block
        curves.append(capacity_curve(distances[b], [v.blocks(b, bpb) for v in o.capacities]))
    report = _curve_report(loaded.description, loaded.has_prefix_ids, o, curves, per_block, spec)
    if o.tiers is not None:
        b = o.block_sizes[0]
        _add_tiers(report, o, distances[b], per_block[b], spec, bits)
    if o.plot is not None:
        _write_curve_plot(o.plot, f"{Path(o.trace[1]).name} ({len(loaded):,} requests)", distances, curves)
        report.notes.append(f"figure written to {o.plot}")
    emit(report, fmt)


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
    with_bytes = spec is not None
    fields = [
        Field("block_size", "block"),
        Field("capacity", "capacity"),
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


def _add_tiers(report: Report, o: CurveOptions, d: StackDistances, cbb: CachedBlockBytes | None,
               spec: ModelSpec | None, bits: int) -> None:
    assert o.tiers is not None
    b = d.block_size
    bpb = None if cbb is None else cbb.bytes_per_block
    caps = tuple(v.blocks(b, bpb) for v in o.tiers)
    result = simulate_tiers(d, caps, cbb, o.bandwidths, o.tier_mode)  # type: ignore[arg-type]
    verdicts: list[LoadOrRecompute | None] = [None, None, None]
    paper_break_even = None
    if spec is not None and cbb is not None:
        model = step_time_model(spec, get_gpu(o.gpu), bits, b, o.tp)
        hits = tier_hit_blocks(d, caps, o.tier_mode)  # type: ignore[arg-type]
        start = np.zeros(d.requests, dtype=np.int64)
        for t in range(3):
            if t:
                verdicts[t] = tier_verdict(model, result.tiers[t].name, start * b, hits[t] * b,
                                           int(hits[t].sum()) * cbb.bytes_per_block, o.bandwidths[t - 1])
            start = start + hits[t]
        paper_break_even = break_even_bandwidth(model, PAPER_PREFIX_TOKENS, cbb.bytes_per_block / b)
    report.tables.append(_tier_table(result, verdicts, cbb is not None))
    report.doc["tiers"] = _tier_doc(result, verdicts, cbb, paper_break_even, o)
    if cbb is not None and len(cbb.groups) > 1:
        report.tables.append(_group_table(result, cbb))
    report.notes.append(
        f"tiers ({o.tier_mode}): " + ("a block lives in one tier; GPU evictions are written to host, host "
                                      "evictions to disk; a lower-tier hit is read back and promoted"
                                      if o.tier_mode == "exclusive" else
                                      "each tier is its own LRU; computed blocks are written through to every "
                                      "tier that lacks them (vLLM's offloading connector, LMCache)")
        + f". GB/s per GPU over the trace's {result.duration_s:,.0f} s, peaks in {result.bin_s:g} s bins; host "
        f"{o.bandwidths[0] / 1e9:g} GB/s and disk {o.bandwidths[1] / 1e9:g} GB/s links (--host-bw, --disk-bw).")
    for t in result.tiers[1:]:
        peak = max(t.peak_read_bytes_per_s, t.peak_write_bytes_per_s)
        if cbb is not None and t.bandwidth_bytes_per_s and peak > t.bandwidth_bytes_per_s:
            report.notes.append(f"{t.name}: the peak second asks {peak / 1e9:.2f} GB/s of a "
                                f"{t.bandwidth_bytes_per_s / 1e9:g} GB/s link: those transfers would queue.")
    if paper_break_even is not None:
        report.notes.append(f"load or recompute on {o.gpu} x{o.tp} (kvcalc sim's step-time model): loading an "
                            f"{PAPER_PREFIX_TOKENS:,}-token prefix beats prefilling it above "
                            f"{paper_break_even / 1e9:.2f} GB/s per GPU ({o.tp * paper_break_even / 1e9:.2f} GB/s "
                            "for the group).")


def _rate(num_bytes: int, seconds: float) -> float | None:
    return num_bytes / seconds if seconds > 0 else None


def _tier_doc(result: HierarchyResult, verdicts: list[LoadOrRecompute | None], cbb: CachedBlockBytes | None,
              paper_break_even: float | None, o: CurveOptions) -> dict[str, Any]:
    tiers = []
    for t, v in zip(result.tiers, verdicts, strict=True):
        entry: dict[str, Any] = {
            "tier": t.name, "capacity_blocks": t.capacity_blocks,
            "capacity_tokens": t.capacity_blocks * result.block_size,
            "capacity_bytes": None if cbb is None else t.capacity_blocks * cbb.bytes_per_block,
            "bandwidth_bytes_per_s": t.bandwidth_bytes_per_s, "hit_tokens": t.hit_blocks * result.block_size,
            "hit_rate": t.hit_blocks * result.block_size / result.prompt_tokens if result.prompt_tokens else 0.0,
            "hit_requests": t.hit_requests, "read_blocks": t.read_blocks, "write_blocks": t.write_blocks,
        }
        if cbb is not None:
            entry.update(read_bytes=t.read_bytes, write_bytes=t.write_bytes,
                         mean_read_bytes_per_s=_rate(t.read_bytes, result.duration_s),
                         mean_write_bytes_per_s=_rate(t.write_bytes, result.duration_s),
                         peak_read_bytes_per_s=t.peak_read_bytes_per_s, peak_write_bytes_per_s=t.peak_write_bytes_per_s,
                         read_bytes_by_group=cbb.split(t.read_blocks), write_bytes_by_group=cbb.split(t.write_blocks))
        if v is not None:
            entry.update(load_s=v.load_s, recompute_s=v.recompute_s,
                         break_even_bytes_per_s=v.break_even_bytes_per_s, loading_pays=v.loading_pays)
        tiers.append(entry)
    return {"mode": result.mode, "block_size": result.block_size, "duration_s": result.duration_s,
            "bin_s": result.bin_s, "hit_tokens": result.hit_tokens, "dropped_blocks": result.dropped_blocks,
            "gpu": o.gpu if cbb is not None else None, "tp": o.tp,
            "break_even_bytes_per_s_at_8192": paper_break_even, "by_tier": tiers}


def _gbps(value: float | None) -> str:
    return "—" if value is None else f"{value / 1e9:.2f} GB/s"


def _tier_table(result: HierarchyResult, verdicts: list[LoadOrRecompute | None], with_bytes: bool) -> Table:
    records = []
    for t, v in zip(result.tiers, verdicts, strict=True):
        link = with_bytes and t.name != "gpu"  # GPU "writes" are blocks entering HBM, over no link
        records.append({
            "tier": t.name, "capacity_blocks": t.capacity_blocks, "bandwidth_bytes_per_s": t.bandwidth_bytes_per_s,
            "hit_tokens": t.hit_blocks * result.block_size,
            "hit_rate": t.hit_blocks * result.block_size / result.prompt_tokens if result.prompt_tokens else 0.0,
            "read_blocks": t.read_blocks, "write_blocks": t.write_blocks,
            "read_bytes": t.read_bytes if link else None, "write_bytes": t.write_bytes if link else None,
            "mean_read_bytes_per_s": _rate(t.read_bytes, result.duration_s) if link else None,
            "peak_read_bytes_per_s": t.peak_read_bytes_per_s if link else None,
            "mean_write_bytes_per_s": _rate(t.write_bytes, result.duration_s) if link else None,
            "peak_write_bytes_per_s": t.peak_write_bytes_per_s if link else None,
            "load_s": None if v is None else v.load_s, "recompute_s": None if v is None else v.recompute_s,
            "break_even_bytes_per_s": None if v is None else v.break_even_bytes_per_s,
            "loading_pays": None if v is None else v.loading_pays,
        })
    seconds = lambda s: f"{s:,.1f} s"  # noqa: E731
    fields = [Field("tier"), Field("capacity_blocks", "capacity (blocks)", format_count),
              Field("bandwidth_bytes_per_s", "link", _gbps), Field("hit_tokens", "hit tokens", format_count),
              Field("hit_rate", "hit rate", format_percent), Field("read_blocks", "blocks read", format_count),
              Field("write_blocks", "blocks written", format_count)]
    if with_bytes:
        fields += [Field("read_bytes", "bytes read", format_bytes), Field("write_bytes", "bytes written", format_bytes),
                   Field("mean_read_bytes_per_s", "read, mean", _gbps),
                   Field("peak_read_bytes_per_s", "read, peak", _gbps),
                   Field("mean_write_bytes_per_s", "write, mean", _gbps),
                   Field("peak_write_bytes_per_s", "write, peak", _gbps),
                   Field("load_s", "load its hits", seconds), Field("recompute_s", "recompute them", seconds),
                   Field("break_even_bytes_per_s", "loading pays above", _gbps),
                   Field("loading_pays", "loading pays", lambda p: "yes" if p else "no")]
    title = (f"GPU → host → disk prefix cache ({result.mode}), block {result.block_size}: "
             f"{format_count(result.hit_tokens)} hit tokens")
    return quantity_table(title, ["quantity", *(t.name for t in result.tiers)], fields, records)


def _group_table(result: HierarchyResult, cbb: CachedBlockBytes) -> Table:
    """Bytes read and written per tier, split by KV cache group (what vLLM #56871's per-group split is about)."""
    records = []
    for g in cbb.groups:
        record: dict[str, Any] = {"group": g.label, "layers": g.layers, "block_bytes": g.bytes_per_block}
        for t in result.tiers[1:]:
            record[f"{t.name}_read_bytes"] = t.read_blocks * g.bytes_per_block
            record[f"{t.name}_write_bytes"] = t.write_blocks * g.bytes_per_block
        records.append(record)
    fields = [Field("group", "group"), Field("layers", "layers"), Field("block_bytes", "per block", format_bytes)]
    for t in result.tiers[1:]:
        fields += [Field(f"{t.name}_read_bytes", f"{t.name} read", format_bytes),
                   Field(f"{t.name}_write_bytes", f"{t.name} written", format_bytes)]
    return record_table("tier traffic by KV cache group", fields, records)


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
