"""The report of `kvcalc share --trace … --capacity …`: the hit-rate-per-capacity and reach tables, the notes
(what a cached block costs per KV cache group, under which layout), and a recurrent hybrid's states-at-prompt-ends
rule (split from cli/share_capacity.py, which parses the options and runs the stack-distance pass)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.inputs.traces import MOONCAKE_BLOCK_TOKENS, Trace
from ..core.model.kv_groups import DEFAULT_LAYOUT
from ..core.share.capacity import REACH_FRACTIONS, CapacityCurve, CapacityValue
from ..core.share.saved_states import saved_state_hit_curve
from ..core.units import format_bytes, format_count, format_percent
from .output import Field, Report, Table, record_table

if TYPE_CHECKING:
    from ..core.model.models import ModelSpec
    from ..core.share.cache_bytes import CachedBlockBytes
    from ..core.share.stack_distance import StackDistances
    from .share_tiers import TierOptions


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
    layout: str = DEFAULT_LAYOUT  # how a cached block's bytes are paged: vLLM's padded pages, or kvcalc's ideal


def add_saved_state_rule(report: Report, loaded: Trace, curves: list[CapacityCurve],
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
    """The GPU pool that holds `blocks` (vLLM's null block included under its layout: cache_bytes.pool_bytes)."""
    return None if blocks is None or cbb is None else cbb.pool_bytes(blocks)


def curve_report(description: str, has_ids: bool, o: CurveOptions, curves: list[CapacityCurve],
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
        doc["model"] = {"name": first.model, "dtype": first.dtype, "tp": first.tp, "layout": first.layout,
                        "null_blocks": first.null_blocks,
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
                     f"{format_bytes(cbb.bytes_per_block)} per GPU ({split})" + _layout_words(cbb)
                     + ("; windowed groups keep every block cached, as vLLM does, though a hit needs only the "
                        "window's: an upper bound" if windowed else "") + ". Capacities in bytes are per GPU.")
        if cbb.null_blocks and o.capacities:  # the --gpu-cache tier says its own (share_tiers)
            per = cbb.bytes_per_block // cbb.page_bytes
            ids = f"floor(bytes / {format_bytes(cbb.page_bytes)}) − 1"
            notes.append(f"block {b}: bytes are vLLM's pool of block ids of {format_bytes(cbb.page_bytes)} and its "
                         f"null block (block 0, never handed out): a capacity in bytes holds "
                         + (f"{ids} cached blocks" if per == 1 else f"({ids}) // {per} cached blocks ({per} ids each)")
                         + ", and the bytes columns count the null block, as kvcalc sim pages the pool (--layout "
                         "ideal has none).")
        if cbb.state_bytes:
            share = format_percent(cbb.state_bytes / cbb.bytes_per_block)
            notes.append(f"block {b}: saved recurrent states are {share}"
                         " of each cached block's bytes: a hit needs a state saved at its boundary, one per block.")
    return notes


def _layout_words(cbb: CachedBlockBytes) -> str:
    """How the block's bytes are paged: vLLM's padded block ids (the padding said), or kvcalc's ideal pool."""
    if cbb.layout != "vllm":
        return ", ideal layout (each layer type pooled on its own, no padding)"
    if not cbb.padding_bytes:
        return ", vLLM's layout"
    what = "the unused layer slots of its KV cache groups' block ids" + (
        " and the state pages padded to the attention page" if cbb.state_bytes else "")
    return (f", vLLM's layout: {format_bytes(cbb.padding_bytes)} of it padding ({what}; --layout ideal counts "
            f"{format_bytes(cbb.bytes_per_block - cbb.padding_bytes)})")
