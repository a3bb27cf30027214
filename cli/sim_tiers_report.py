"""The tier part of `kvcalc sim --host-cache … --disk-cache …`: each rung (GPU only, + host, + disk) side by
side — hits per tier under load beside the one-at-a-time replay's, bytes moved, load waits, TTFT, throughput
and the max rate under the SLO (core/sim/tiers_compare.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.sim.tiers import DISK, HOST
from ..core.sim.tiers_compare import TierComparison, TierRung
from ..core.units import format_bytes, format_count, format_percent
from .output import Field, Report, quantity_table, record_table


def _rate(hit_blocks: int, c: TierComparison) -> float:
    return hit_blocks * c.block_size / c.prompt_tokens if c.prompt_tokens else 0.0


def _reads(tiers: Any, t: Any, tier: int) -> dict[str, int]:
    """Bytes read from `tier` per KV cache group: what each load's hit needs of the group (TierTotals.read_group_bytes:
    a full group every loaded block, a sliding one its window's, a chunked one the current chunk's, a state group
    the one state at the hit's boundary)."""
    return {g.label: t.read_group_bytes[tier].get(g.label, 0) for g in tiers.block_bytes.groups}


def _rung_doc(rung: TierRung, c: TierComparison) -> dict[str, Any]:
    t, s, per_block = rung.totals, rung.summary, rung.tiers.bytes_per_block
    reads = [_reads(rung.tiers, t, i) for i in (HOST, DISK)]
    hits = (int(t.gpu_hit_blocks.sum()), int(t.host_hit_blocks.sum()), int(t.disk_hit_blocks.sum()))
    loaders = (t.host_hit_blocks + t.disk_hit_blocks) > 0
    duration = rung.record.end_s - float(rung.record.arrival_s.min()) if len(rung.record.arrival_s) else 0.0
    return {
        "label": rung.label, "host_cache_blocks": rung.tiers.host_blocks, "disk_cache_blocks": rung.tiers.disk_blocks,
        "host_cache_bytes": rung.tiers.host_blocks * per_block, "disk_cache_bytes": rung.tiers.disk_blocks * per_block,
        "gpu_hit_rate": _rate(hits[0], c), "host_hit_rate": _rate(hits[1], c), "disk_hit_rate": _rate(hits[2], c),
        "hit_rate": _rate(sum(hits), c), "hit_tokens": sum(hits) * c.block_size,
        "replay_gpu_hit_rate": None if rung.replay_hit_blocks is None else _rate(rung.replay_hit_blocks[0], c),
        "replay_hit_rate": None if rung.replay_hit_blocks is None else _rate(sum(rung.replay_hit_blocks), c),
        "recomputed_tier_blocks": int(t.recomputed_blocks.sum()), "loading_requests": int(loaders.sum()),
        "mean_load_wait_s": float(t.wait_s[loaders].mean()) if loaders.any() else None,
        "host_read_bytes": sum(reads[HOST].values()), "disk_read_bytes": sum(reads[DISK].values()),
        "host_write_bytes": t.write_bytes[HOST], "disk_write_bytes": t.write_bytes[DISK],
        "dropped_blocks": t.dropped_blocks,
        "host_link_busy": t.link_busy_s[HOST] / duration if duration > 0 else None,
        "disk_link_busy": t.link_busy_s[DISK] / duration if duration > 0 else None,
        "ttft_mean_s": s.ttft_s.mean, "ttft_p50_s": s.ttft_s.p50, "ttft_p99_s": s.ttft_s.p99,
        "throughput_rps": s.throughput_rps, "output_tokens_per_s": s.output_tokens_per_s,
        "max_rate_rps": None if rung.search is None else rung.search.max_rate_rps,
        "read_bytes_by_group": {tier: reads[i] for i, tier in enumerate(("host", "disk"))},
    }


def _ms(v: float | None) -> str:
    return "—" if v is None or v != v else f"{v * 1e3:,.1f}"


def _share(v: float | None) -> str:
    return "—" if v is None else format_percent(v)


FIELDS = [
    Field("host_cache_bytes", "host cache", format_bytes), Field("disk_cache_bytes", "disk cache", format_bytes),
    Field("gpu_hit_rate", "hit rate: GPU", format_percent), Field("host_hit_rate", "hit rate: host", format_percent),
    Field("disk_hit_rate", "hit rate: disk", format_percent), Field("hit_rate", "hit rate, all tiers", format_percent),
    Field("replay_gpu_hit_rate", "one at a time (share): GPU", _share),
    Field("replay_hit_rate", "one at a time (share): all tiers", _share),
    Field("loading_requests", "requests that loaded", format_count),
    Field("recomputed_tier_blocks", "lower-tier blocks recomputed", format_count),
    Field("mean_load_wait_s", "mean load wait (ms)", _ms),
    Field("host_read_bytes", "host read", format_bytes), Field("disk_read_bytes", "disk read", format_bytes),
    Field("host_write_bytes", "host written", format_bytes), Field("disk_write_bytes", "disk written", format_bytes),
    Field("host_link_busy", "host link busy", _share), Field("disk_link_busy", "disk link busy", _share),
    Field("ttft_mean_s", "TTFT mean (ms)", _ms), Field("ttft_p50_s", "TTFT p50 (ms)", _ms),
    Field("ttft_p99_s", "TTFT p99 (ms)", _ms),
    Field("throughput_rps", "throughput (req/s)", lambda v: f"{v:,.3f}"),
    Field("output_tokens_per_s", "output tokens/s", lambda v: f"{v:,.0f}"),
]


def add_tier_comparison(report: Report, c: TierComparison) -> None:
    docs = [_rung_doc(r, c) for r in c.rungs]
    fields = list(FIELDS)
    if any(r.search is not None for r in c.rungs):
        fields.append(Field("max_rate_rps", "max rate under the SLO (req/s)",
                            lambda v: "—" if v is None else f"{v:,.3f}"))
    report.tables.append(quantity_table(
        f"prefix-cache tiers below the GPU pool ({format_count(c.gpu_cache_blocks)} blocks of {c.block_size} tokens)",
        ["", *(d["label"] for d in docs)], fields, docs))
    last = c.rungs[-1].tiers
    if len(last.block_bytes.groups) > 1:
        t = c.rungs[-1].totals
        reads = [_reads(last, t, i) for i in (HOST, DISK)]
        records = [{"group": g.label, "per_block": g.bytes_per_block, "host": reads[HOST][g.label],
                    "disk": reads[DISK][g.label]} for g in last.block_bytes.groups]
        report.tables.append(record_table("tier reads by KV cache group", [
            Field("group", "group"), Field("per_block", "per block", format_bytes),
            Field("host", "host read", format_bytes), Field("disk", "disk read", format_bytes)], records))
        report.notes.append(_tier_block_note(last.block_bytes) + "; each group's block is written through when "
                            "a request computes it and held on its own, as vLLM's offloading keys (hash, group); a "
                            "hit needs and a load reads of each group only the blocks the hit needs (a sliding group "
                            "its window's, a chunked group the current chunk's, a state group the one state at the "
                            "hit's boundary)")
        if t.unresolved_blocks:
            report.notes.append(f"{format_count(t.unresolved_blocks)} evicted blocks whose KV cache group could not be "
                                "told (their anchor block was handed out twice since) were counted as the full group's")
    report.doc["tiers"] = {"mode": "inclusive", "block_size": c.block_size, "gpu_cache_blocks": c.gpu_cache_blocks,
                           "bytes_per_block": last.bytes_per_block, "host_bytes_per_s": last.host_bytes_per_s,
                           "disk_bytes_per_s": last.disk_bytes_per_s, "rungs": docs}
    report.notes.append(_replay_note(docs[0], c))
    if np.isnan(docs[0]["ttft_mean_s"]):
        report.notes.append("no request completed in the GPU-only run: its TTFT is undefined")


def _tier_block_note(cbb: Any) -> str:
    """What one tier block (the unit of its size) holds on a hybrid: every group's block of its tokens, paged as the
    pool pages it."""
    head = (f"a tier's size in blocks counts every KV cache group's block of {cbb.block_size:,} tokens: "
            f"{format_bytes(cbb.bytes_per_block)} per GPU")
    if cbb.layout != "vllm":
        return head + ", ideal layout (each layer type on its own, no padding)"
    if not cbb.padding_bytes:
        return head + ", vLLM's layout (no padding)"
    what = "its groups' unused layer slots" + (" and state pages padded to the attention page"
                                                  if cbb.state_bytes else "")
    return (head + f", as vLLM's layout pages it: {format_bytes(cbb.padding_bytes)} of it padding ({what}; "
            f"--layout ideal holds {format_bytes(cbb.bytes_per_block - cbb.padding_bytes)})")


def _replay_note(gpu_only: dict[str, Any], c: TierComparison) -> str:
    """The GPU-only run's hit rate beside share's one-at-a-time replay of the same trace, or why there is none."""
    if gpu_only["replay_gpu_hit_rate"] is None:
        return (f"one at a time (share): — because the block of {c.block_size:,} tokens does not tile the trace's "
                "512-token hash ids: share's replay keys blocks only exactly (a block dividing 512 or a multiple of "
                "it), while this run keys each block by the id of its last token (its hits a lower bound)")
    load, alone = gpu_only["gpu_hit_rate"], gpu_only["replay_gpu_hit_rate"]
    return (f"hit rate under load vs one at a time: with the GPU pool alone, {format_percent(load)} of prompt tokens "
            f"hit under this run's load, {format_percent(alone)} in share's one-at-a-time replay with a cache of the "
            f"same {format_count(c.gpu_cache_blocks)} blocks ({(load - alone) * 100:+.2f} points). Under load, running "
            "requests hold blocks the cache cannot use (fewer hits), and a block's recency is set when its request "
            "releases it, not when it arrives (either way).")
