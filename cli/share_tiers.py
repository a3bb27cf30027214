"""The tier part of `kvcalc share --gpu-cache … --host-cache … --disk-cache …`: per-tier hits and traffic,
the split by KV cache group, and whether loading beats recomputing (core/share/tiers.py,
load_or_recompute.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.errors import ParameterError
from ..core.gpus import get_gpu
from ..core.model.models import ModelSpec
from ..core.share.cache_bytes import CachedBlockBytes, vllm_cache_groups
from ..core.share.capacity import CapacityValue
from ..core.share.load_or_recompute import LoadOrRecompute, break_even_bandwidth, step_time_model, tier_verdict
from ..core.share.stack_distance import StackDistances
from ..core.share.tiers import HierarchyResult, TierResult, simulate_tiers, tier_hit_blocks
from ..core.units import format_bytes, format_count, format_percent
from .output import Field, Report, Table, quantity_table, record_table

PAPER_PREFIX_TOKENS = 8192  # Mooncake FAST'25 Eq. 2's example prefix


@dataclass(frozen=True)
class TierOptions:
    """The tier options as parsed: GPU, host and disk sizes, host and disk bandwidths (bytes/s per GPU), the
    hierarchy's rule, and the GPUs that time a recompute."""

    sizes: tuple[CapacityValue, CapacityValue, CapacityValue]
    bandwidths: tuple[float, float]
    mode: str
    gpu: str
    tp: int
    quantization: str | None = None  # the checkpoint's (hardware.checkpoint_weights): gpt-oss's mxfp4 experts


def add_tiers(report: Report, o: TierOptions, d: StackDistances, cbb: CachedBlockBytes | None,
               spec: ModelSpec | None, bits: int) -> None:
    b = d.block_size
    bpb = None if cbb is None else cbb.bytes_per_block
    # the GPU tier is vLLM's pool under its layout: its block ids less the null block (cache_bytes.pool_blocks);
    # host and disk hold whole cached blocks
    gpu_blocks = o.sizes[0].pool_blocks(b, cbb)
    host_blocks, disk_blocks = (v.blocks(b, bpb) for v in o.sizes[1:])
    caps = (gpu_blocks, host_blocks, disk_blocks)
    result = simulate_tiers(d, caps, cbb, o.bandwidths, o.mode)
    verdicts: list[LoadOrRecompute | None] = [None, None, None]
    paper_break_even = None
    if spec is not None and cbb is not None:
        model = step_time_model(spec, get_gpu(o.gpu), bits, b, o.tp, o.quantization)
        hits = tier_hit_blocks(d, caps, o.mode)
        start = np.zeros(d.requests, dtype=np.int64)
        for t in range(3):
            if t:
                verdicts[t] = tier_verdict(model, result.tiers[t].name, start * b, hits[t] * b,
                                           result.tiers[t].read_bytes, o.bandwidths[t - 1])
            start = start + hits[t]
        paper_break_even = break_even_bandwidth(model, PAPER_PREFIX_TOKENS, cbb.bytes_per_block / b)
    report.tables.append(_tier_table(result, verdicts, cbb is not None))
    report.doc["tiers"] = _tier_doc(result, verdicts, cbb, paper_break_even, o)
    _null_block_note(report, o.sizes[0], cbb, gpu_blocks)
    if cbb is not None and len(cbb.groups) > 1:
        report.tables.append(_group_table(result, cbb))
    if spec is not None and caps[1]:
        try:
            groups = vllm_cache_groups(spec, bits, b, o.tp)
        except ParameterError:  # a model vLLM's layout cannot page (kvcalc frag --layout vllm says why): no note
            groups = None
        report.doc["tiers"]["vllm_cache_groups"] = groups
        if groups is not None and groups > 1:
            report.notes.append(
                f"vLLM #56871: its native CPU offloading stores each (block hash, group) as a row of every group, "
                f"so with {spec.name}'s {groups} KV cache groups (vLLM's layout) its host tier holds 1/{groups} "
                f"of this one: {format_count(caps[1] // groups)} blocks, not {format_count(caps[1])} (to see its "
                f"hits, give --host-cache {o.sizes[1].text} / {groups}).")
    report.notes.append(
        f"tiers ({o.mode}): " + ("a block lives in one tier; GPU evictions are written to host, host "
                                      "evictions to disk; a lower-tier hit is read back and promoted"
                                      if o.mode == "exclusive" else
                                      "each tier is its own LRU; computed blocks are written through to every "
                                      "tier that lacks them (vLLM's offloading connector, LMCache)")
        + f". GB/s per GPU over the trace's {result.duration_s:,.0f} s, peaks in {result.bin_s:g} s bins; host "
        f"{o.bandwidths[0] / 1e9:g} GB/s and disk {o.bandwidths[1] / 1e9:g} GB/s links (--host-bw, --disk-bw).")
    for tier in result.tiers[1:]:
        peak = max(tier.peak_read_bytes_per_s, tier.peak_write_bytes_per_s)
        if cbb is not None and tier.bandwidth_bytes_per_s and peak > tier.bandwidth_bytes_per_s:
            report.notes.append(f"{tier.name}: the peak second asks {peak / 1e9:.2f} GB/s of a "
                                f"{tier.bandwidth_bytes_per_s / 1e9:g} GB/s link: those transfers would queue.")
    if paper_break_even is not None:
        report.notes.append(f"load or recompute on {o.gpu} x{o.tp} (kvcalc sim's step-time model): loading an "
                            f"{PAPER_PREFIX_TOKENS:,}-token prefix beats prefilling it above "
                            f"{paper_break_even / 1e9:.2f} GB/s per GPU ({o.tp * paper_break_even / 1e9:.2f} GB/s "
                            "for the group).")


def _null_block_note(report: Report, size: CapacityValue, cbb: CachedBlockBytes | None, gpu_blocks: int) -> None:
    """A GPU tier in bytes under vLLM's layout is its pool: the null block said (JSON null_blocks)."""
    null = cbb.null_blocks if cbb is not None and size.unit == "bytes" else 0
    report.doc["tiers"]["by_tier"][0]["null_blocks"] = null
    if cbb is not None and null:
        ids = size.amount // cbb.page_bytes
        per = cbb.bytes_per_block // cbb.page_bytes
        report.notes.append(
            f"gpu tier: --gpu-cache {size.text} is vLLM's pool of {ids:,} block ids of {format_bytes(cbb.page_bytes)}, "
            f"less its null block (block 0, never handed out): {gpu_blocks:,} cached blocks of {per} id"
            f"{'' if per == 1 else 's'} each, as kvcalc sim pages it (--layout ideal has no null block).")


def _rate(num_bytes: int, seconds: float) -> float | None:
    return num_bytes / seconds if seconds > 0 else None


def _tier_doc(result: HierarchyResult, verdicts: list[LoadOrRecompute | None], cbb: CachedBlockBytes | None,
              paper_break_even: float | None, o: TierOptions) -> dict[str, Any]:
    tiers = []
    for t, v in zip(result.tiers, verdicts, strict=True):
        entry: dict[str, Any] = {
            "tier": t.name, "capacity_blocks": t.capacity_blocks,
            "capacity_tokens": t.capacity_blocks * result.block_size,
            "capacity_bytes": None if cbb is None else (cbb.pool_bytes(t.capacity_blocks) if t.name == "gpu" else
                                                        t.capacity_blocks * cbb.bytes_per_block),
            "bandwidth_bytes_per_s": t.bandwidth_bytes_per_s, "hit_tokens": t.hit_blocks * result.block_size,
            "hit_rate": t.hit_blocks * result.block_size / result.prompt_tokens if result.prompt_tokens else 0.0,
            "hit_requests": t.hit_requests, "read_blocks": t.read_blocks, "write_blocks": t.write_blocks,
        }
        if cbb is not None:
            entry.update(read_bytes=t.read_bytes, write_bytes=t.write_bytes,
                         mean_read_bytes_per_s=_rate(t.read_bytes, result.duration_s),
                         mean_write_bytes_per_s=_rate(t.write_bytes, result.duration_s),
                         peak_read_bytes_per_s=t.peak_read_bytes_per_s, peak_write_bytes_per_s=t.peak_write_bytes_per_s,
                         read_bytes_by_group=_read_split(t, cbb), write_bytes_by_group=cbb.split(t.write_blocks))
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
            record[f"{t.name}_read_bytes"] = _read_split(t, cbb)[g.label]
            record[f"{t.name}_write_bytes"] = t.write_blocks * g.bytes_per_block
        records.append(record)
    fields = [Field("group", "group"), Field("layers", "layers"), Field("block_bytes", "per block", format_bytes)]
    for t in result.tiers[1:]:
        fields += [Field(f"{t.name}_read_bytes", f"{t.name} read", format_bytes),
                   Field(f"{t.name}_write_bytes", f"{t.name} written", format_bytes)]
    return record_table("tier traffic by KV cache group", fields, records)


def _read_split(t: TierResult, cbb: CachedBlockBytes) -> dict[str, int]:
    """A tier's read bytes per group (TierResult.read_bytes_by_group: the blocks each hit needs of the group, as
    vLLM allocates them: a sliding group its window's, a chunked one the current chunk's, a state group one state
    per hit that ends in this tier)."""
    return {g.label: (t.read_bytes_by_group or {}).get(g.label, 0) for g in cbb.groups}
