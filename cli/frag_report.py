"""The document, tables, notes and chart of `kvcalc frag` (kept apart from the command's option parsing)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from ..core.frag import FragAnalysis, ModelBytes, SpeculativePeaks
from ..core.inputs.lengths import Lengths
from ..core.paged_bytes import GroupBytes
from ..core.paging import PerSequence
from ..core.spec_decode import SPEC_METHODS
from ..core.units import format_bytes, format_count, format_percent, plural
from .chart import bar_chart
from .output import Field, RawTable, Table, record_table

PER_SEQ_TABLE_MAX = 10_000  # a per-sequence table for people (rich, markdown) has at most this many rows


def document(source: Lengths, result: FragAnalysis, dtype_name: str) -> dict[str, Any]:
    fixed = result.fixed
    doc: dict[str, Any] = {
        "lengths": {
            "count": source.count,
            "total": source.total,
            "min": source.min,
            "max": source.max,
            "mean": float(source.mean),
            "source": source.description,
            "kind": source.kind,
        },
        "fixed": {
            "max_len": fixed.max_len,
            "useful": fixed.useful_tokens,
            "allocated": fixed.allocated_tokens,
            "waste": fixed.waste_tokens,
            "utilization": float(fixed.utilization),
        },
        "paged": [
            {
                "block_size": p.block_size,
                "blocks": p.num_blocks,
                "useful": p.useful_tokens,
                "allocated": p.allocated_tokens,
                "waste": p.waste_tokens,
                "utilization": float(p.utilization),
                "block_table_bytes_exact": p.block_table_bytes_exact,
                "block_table_bytes_dense": p.block_table_bytes_dense,
            }
            for p in result.paged
        ],
    }
    model = result.model_bytes
    if model is not None:
        doc["model"] = model_doc(model, dtype_name)
        doc["fixed"].update(
            useful_kv_bytes=model.fixed.useful_kv_bytes,
            allocated_kv_bytes=model.fixed.allocated_kv_bytes,
            reservation_waste_bytes=model.fixed.waste_kv_bytes,
            state_bytes=model.fixed.state_bytes,
            allocated_state_bytes=model.fixed.allocated_state_bytes,
            held_bytes=model.fixed.held_bytes,
        )
        for entry, kv, layout in zip(doc["paged"], model.paged, model.layouts, strict=True):
            entry.update(
                used_block_size=kv.used_block_size,
                block_size_reason=layout.reason,
                engine_accepts=kv.engine_accepts,
                useful_kv_bytes=kv.useful_kv_bytes,
                allocated_kv_bytes=kv.allocated_kv_bytes,
                fragmentation_bytes=kv.fragmentation_bytes,
                padding_bytes=kv.padding_bytes,
                state_bytes=kv.state_bytes,
                allocated_state_bytes=kv.allocated_state_bytes,
                block_table_bytes_exact=kv.block_table_bytes_exact,
                block_table_bytes_dense=kv.block_table_bytes_dense,
                held_bytes=kv.held_bytes,
                groups=[group_doc(g) for g in kv.groups],
            )
        best = model.best
        doc["best_block_size"] = {
            "objective": BEST_OBJECTIVE, "block_size": best.block_size, "used_block_size": best.used_block_size,
            "held_bytes": best.held_bytes, "among": list(best.candidates),
        }
    if result.speculative is not None:
        doc["speculative"] = speculative_doc(result.speculative)
    if result.per_sequence is not None:
        doc["per_seq"] = result.per_sequence.records()
    return doc


STATE_PAGES = {
    "none": "one state page per sequence (no prefix caching of the state)",
    "align": "two state pages per sequence, the running state and the last one saved at a block boundary "
             "(prefix caching)",
    "all": "one state page per block",
}
BEST_OBJECTIVE = "fewest bytes held: KV and recurrent state allocated, plus exact block tables"


def model_doc(model: ModelBytes, dtype_name: str) -> dict[str, Any]:
    spec, layout = model.spec, model.layouts[0]
    return {
        "name": spec.name,
        "attention": spec.attention,
        "dtype": dtype_name,
        "bits_per_scalar": model.dtype_bits,
        "bytes_per_token": spec.bytes_per_token(model.dtype_bits),
        "sliding_window": spec.sliding_window,
        "num_sliding_layers": spec.num_sliding_layers,
        "kv_cache_groups": model.kv_cache_groups,
        "layout": layout.layout,
        "group_size": layout.group_size,
        "state_bytes_per_seq": model.state_bytes_per_seq,
    }


def group_doc(g: GroupBytes) -> dict[str, Any]:
    group = g.group
    return {
        "kind": group.kind, "source": group.source, "window": group.window, "layers": group.layers,
        "padded_layers": group.padded_layers, "block_tables": group.tables, "block_tokens": group.block_tokens,
        "block_bytes": group.block_bytes, "blocks": g.block_ids, "useful_bytes": g.useful_bytes,
        "allocated_bytes": g.allocated_bytes, "padding_bytes": g.padding_bytes,
        "block_table_bytes": g.block_table_bytes,
    }


def speculative_doc(peaks: SpeculativePeaks) -> dict[str, Any]:
    speculation = peaks.speculation
    entries = []
    for p in peaks.block_sizes:
        entry: dict[str, Any] = {
            "block_size": p.block_size,
            "blocks": p.plain.num_blocks,
            "peak_blocks": p.peak.num_blocks,
            "extra_blocks": p.extra_blocks,
            "extra_fraction": float(p.extra_fraction),
            "peak_allocated": p.peak.allocated_tokens,
            "peak_utilization": float(p.peak.utilization),
            "concurrency_ratio": float(p.concurrency),
        }
        if p.peak_bytes is not None:
            entry.update(peak_allocated_kv_bytes=p.peak_bytes.allocated_kv_bytes, extra_kv_bytes=p.extra_kv_bytes)
        entries.append(entry)
    return {
        "spec_tokens": speculation.spec_tokens,
        "method": speculation.method,
        "lookahead_slots": speculation.lookahead_slots,
        "slots_per_step": speculation.slots_per_step,
        "extra_slots_per_seq": speculation.extra_slots,
        "peak_blocks_formula": speculation.formula,
        "paged": entries,
    }


def speculative_table(peaks: SpeculativePeaks, doc: dict[str, Any]) -> Table:
    """Blocks at the speculative peak per block size; CSV keys as the JSON's speculative.paged entries."""
    speculation = peaks.speculation
    common = {k: doc[k] for k in ("spec_tokens", "method", "lookahead_slots", "extra_slots_per_seq")}
    records = [{**entry, **common} for entry in doc["paged"]]
    fields = [
        Field("block_size", "block size"),
        Field("blocks", "blocks", format_count),
        Field("peak_blocks", "peak blocks", format_count),
        Field("extra_blocks", "extra blocks", format_count),
        Field("extra_fraction", "extra", format_percent),
        Field("peak_allocated", "peak allocated", format_count),
        Field("peak_utilization", "peak utilisation", format_percent),
        Field("concurrency_ratio", "concurrency vs plain", format_percent),
    ]
    if peaks.block_sizes[0].peak_bytes is not None:
        fields += [Field("peak_allocated_kv_bytes", "peak KV", format_bytes),
                   Field("extra_kv_bytes", "extra KV", format_bytes)]
    fields += [Field(key) for key in common]
    title = (f"Speculative decoding: {plural(speculation.spec_tokens, 'draft')} + "
             f"{plural(speculation.lookahead_slots, 'lookahead slot')} per step ({speculation.method}), peak blocks "
             f"{speculation.formula}")
    return record_table(title, fields, records)


def speculative_note(peaks: SpeculativePeaks, default_max_len: bool) -> str:
    speculation = peaks.speculation
    note = (f"Speculative peak: each step reserves 1 + K + λ = {speculation.slots_per_step} slots past the committed "
            f"tokens (λ = {speculation.lookahead_slots} lookahead slots: {SPEC_METHODS[speculation.method]}); a "
            f"sequence of n tokens can run its last step from n − 1, so it holds up to n + {speculation.extra_slots}. "
            "concurrency vs plain = blocks / peak blocks: the share of these sequences that a pool sized for them "
            "holds at their peaks.")
    if default_max_len:
        note += " M is the smallest power of two that holds the longest peak."
    return note


def two_decimals(value: Fraction) -> str:
    """An exact mean with two decimals and thousands separators, never through a float (a mean of 3·10^18-token
    lengths has more digits than a double holds)."""
    hundredths = round(value * 100)
    sign = "-" if hundredths < 0 else ""
    return f"{sign}{abs(hundredths) // 100:,}.{abs(hundredths) % 100:02d}"


def header(source: Lengths) -> list[str]:
    return [
        f"Lengths — {source.description}",
        f"{plural(source.count, 'sequence')}, {plural(source.total, 'token')}; min {format_count(source.min)}, "
        f"max {format_count(source.max)}, mean {two_decimals(source.mean)}",
    ]


def scheme(record: dict[str, Any]) -> str:
    if record["scheme"] == "fixed":
        return "fixed" if record.get("max_len") is None else f"fixed, M = {format_count(record['max_len'])}"
    return f"paged, B = {record['block_size']}"


def token_table(result: FragAnalysis) -> Table:
    fixed = result.fixed
    records: list[dict[str, Any]] = [{
        "scheme": "fixed", "max_len": fixed.max_len, "block_size": None, "blocks": None,
        "useful": fixed.useful_tokens, "allocated": fixed.allocated_tokens, "waste": fixed.waste_tokens,
        "utilization": float(fixed.utilization), "block_table_bytes_exact": None, "block_table_bytes_dense": None,
    }]
    # Block tables are one per sequence, or one per KV cache group of a model: with a model, the model's
    # figures (as the JSON's paged entries carry them), unless its layout pages another block size than the
    # row's (a Mamba hybrid under vllm), where the row keeps its own positions' table.
    tables = [(p.block_table_bytes_exact, p.block_table_bytes_dense) for p in result.paged]
    if result.model_bytes is not None:
        tables = [(kv.block_table_bytes_exact, kv.block_table_bytes_dense) if kv.used_block_size == p.block_size
                  else own for kv, p, own in zip(result.model_bytes.paged, result.paged, tables, strict=True)]
    records += [{
        "scheme": "paged", "max_len": None, "block_size": p.block_size, "blocks": p.num_blocks,
        "useful": p.useful_tokens, "allocated": p.allocated_tokens, "waste": p.waste_tokens,
        "utilization": float(p.utilization), "block_table_bytes_exact": exact, "block_table_bytes_dense": dense,
    } for p, (exact, dense) in zip(result.paged, tables, strict=True)]
    fields = [
        Field(None, "scheme", scheme),
        Field("scheme"),
        Field("max_len"),
        Field("block_size"),
        Field("blocks", "blocks", format_count),
        Field("useful", "useful", format_count),
        Field("allocated", "allocated", format_count),
        Field("waste", "waste", format_count),
        Field("utilization", "utilisation", format_percent),
        Field("block_table_bytes_exact", "block tables (exact)", format_bytes),
        Field("block_table_bytes_dense", "block tables (dense)", format_bytes),
    ]
    return record_table("Fixed reservation vs paging (token positions)", fields, records)


def scheme_used(record: dict[str, Any]) -> str:
    """'paged, B = 16', or 'paged, B = 16 → 544' when the layout pages attention in other blocks."""
    text = scheme(record)
    used = record.get("used_block_size")
    if record["scheme"] == "paged" and used is not None and used != record["block_size"]:
        text += f" → {format_count(used)}"
    return text


def bytes_table(model: ModelBytes, dtype_name: str) -> Table:
    """Bytes per scheme; CSV keys as the JSON's: reservation_waste_bytes (fixed), fragmentation_bytes (paged)."""
    bytes_per_token = model.spec.bytes_per_token(model.dtype_bits)
    fixed = model.fixed
    common = {"model": model.spec.name, "dtype": dtype_name, "bytes_per_token": bytes_per_token,
              "layout": model.layout}
    records: list[dict[str, Any]] = [{
        "scheme": "fixed", "block_size": None, "used_block_size": None, "useful_kv_bytes": fixed.useful_kv_bytes,
        "state_bytes": fixed.state_bytes, "reservation_waste_bytes": fixed.waste_kv_bytes,
        "fragmentation_bytes": None, "waste_kv_bytes": fixed.waste_kv_bytes, "padding_bytes": 0,
        "block_table_bytes_exact": None, "block_table_bytes_dense": None,
        "allocated_kv_bytes": fixed.allocated_kv_bytes, "allocated_state_bytes": fixed.allocated_state_bytes,
        "held_bytes": fixed.held_bytes, **common,
    }]
    records += [{
        "scheme": "paged", "block_size": kv.block_size, "used_block_size": kv.used_block_size,
        "useful_kv_bytes": kv.useful_kv_bytes, "state_bytes": kv.state_bytes, "reservation_waste_bytes": None,
        "fragmentation_bytes": kv.fragmentation_bytes, "waste_kv_bytes": kv.fragmentation_bytes,
        "padding_bytes": kv.padding_bytes, "block_table_bytes_exact": kv.block_table_bytes_exact,
        "block_table_bytes_dense": kv.block_table_bytes_dense, "allocated_kv_bytes": kv.allocated_kv_bytes,
        "allocated_state_bytes": kv.allocated_state_bytes, "held_bytes": kv.held_bytes, **common,
    } for kv in model.paged]
    state = model.has_state
    padding = any(kv.padding_bytes for kv in model.paged)
    fields = [
        Field(None, "scheme", scheme_used),
        Field("scheme"),
        Field("block_size"),
        Field("used_block_size"),
        Field("useful_kv_bytes", "useful KV", format_bytes),
        Field("state_bytes", "recurrent state" if state else None, format_bytes),
        Field("reservation_waste_bytes"),
        Field("fragmentation_bytes"),
        Field(None, "waste (reservation / tail blocks)", lambda r: format_bytes(r["waste_kv_bytes"])),
        Field("padding_bytes", "padding" if padding else None, format_bytes),
        Field("block_table_bytes_exact", "block tables (exact)", format_bytes),
        Field("block_table_bytes_dense", "block tables (dense)", format_bytes),
        Field("allocated_kv_bytes", "KV allocated", format_bytes),
        Field("allocated_state_bytes", "state allocated" if state else None, format_bytes),
        Field("held_bytes", "held", format_bytes),
        Field("model"),
        Field("dtype"),
        Field("bytes_per_token"),
        Field("layout"),
    ]
    title = (f"KV bytes — {model.spec.name}, {dtype_name} ({format_bytes(bytes_per_token)} per token), "
             f"layout {model.layout}")
    return record_table(title, fields, records)


def groups_table(model: ModelBytes) -> Table:
    """Each KV cache group for each block size (the best one only when more than two were asked for);
    CSV keys as the JSON's paged[].groups entries, with the block size."""
    shown = model.paged if len(model.paged) <= 2 else [kv for kv in model.paged
                                                         if kv.block_size == model.best.block_size]
    records = [{"block_size": kv.block_size, **group_doc(g)} for kv in shown for g in kv.groups]
    fields = [
        Field("block_size", "B", format_count),
        Field(None, "group", _group_name),
        Field("kind"),
        Field("source"),
        Field("window"),
        Field("layers", "layers", format_count),
        Field("padded_layers", "padded to", format_count),
        Field("block_tables", "tables", format_count),
        Field("block_tokens", "tokens per block", format_count),
        Field("block_bytes", "block", format_bytes),
        Field("blocks", "blocks held", format_count),
        Field("useful_bytes", "useful", format_bytes),
        Field("allocated_bytes", "allocated", format_bytes),
        Field("padding_bytes", "padding", format_bytes),
        Field("block_table_bytes", "block tables", format_bytes),
    ]
    return record_table(f"KV cache groups — layout {model.layout}", fields, records)


def _group_name(record: dict[str, Any]) -> str:
    if record["kind"] == "state":
        return f"state ({record['source'].replace('_', ' ')})"
    if record["window"] is None:
        return "full (MLA)" if record["source"] == "mla" else "full"
    return f"{record['kind']} {format_count(record['window'])}"


def model_notes(model: ModelBytes, sweep: bool) -> list[str]:
    """What the bytes tables assume: the layout and why its block size, windows and chunks, the state, the
    best block size."""
    layout = model.layouts[0]
    raised: dict[int, list[str]] = {}  # used block size -> the sizes given that the layout raised to it
    for kv in model.paged:
        if kv.used_block_size != kv.block_size:
            assert kv.used_block_size is not None  # a paged scheme's layout always says its block size
            raised.setdefault(kv.used_block_size, []).append(str(kv.block_size))
    if raised:
        mapping = "; ".join(f"B = {', '.join(given)} → {format_count(used)}" for used, given in raised.items())
        first = next(lay for kv, lay in zip(model.paged, model.layouts, strict=True)
                     if kv.used_block_size != kv.block_size)
        notes = [f"Layout {layout.layout}: {mapping}. Why, for B = {first.requested_block_size}: {first.reason}."]
    else:
        common = layout.reason.removeprefix(f"block {layout.block_size}: as given; ")
        notes = [f"Layout {layout.layout}: the block sizes as given; {common}."]
    kinds = {g.kind for g in layout.groups}
    text = (f"Bytes in IEC units (KiB = 2^10 B); one block table per sequence per KV cache group "
            f"({model.kv_cache_groups})")
    if "sliding" in kinds:
        text += "; sliding-window layers keep only the blocks that hold one of the last W tokens"
    if "chunked" in kinds:
        text += ("; chunked layers keep only the current chunk (blocks before C · floor((n − 1)/C) are freed), "
                 "not the last C tokens")
    if kinds & {"sliding", "chunked"}:
        text += "; a freed block stays in its table as a null entry (vLLM's tables keep their length)"
    notes.append(text + ".")
    if model.has_state:
        notes.append(
            f"Recurrent state: {format_bytes(model.state_bytes_per_seq)} per sequence across its recurrent layers, "
            f"its own column; mamba_cache_mode {layout.mamba_cache_mode!r}: {STATE_PAGES[layout.mamba_cache_mode]}; "
            "state allocated includes the padding of each state page.")
    if kinds & {"sliding", "chunked"} or model.has_state:
        notes.append("The token-position table (and the per-sequence rows) ignore windows, chunks and states: "
                     "every layer holds every position at the block size asked for; the KV bytes tables apply "
                     "them at the block size used.")
    best = model.best
    if len(best.candidates) > 1:
        used = f" (paged as {format_count(best.used_block_size)})" if best.used_block_size != best.block_size else ""
        among = "the sizes vLLM's block_size accepts" if layout.layout == "vllm" else "the sizes given"
        notes.append(f"Best block size for {BEST_OBJECTIVE}: B = {best.block_size}{used}, "
                     f"{format_bytes(best.held_bytes)}; chosen among {among}: "
                     f"{', '.join(str(b) for b in best.candidates)}.")
    elif sweep or len(model.paged) > 1:
        notes.append(f"Best block size: only B = {best.block_size} of those given is one vLLM accepts.")
    return notes


def per_seq_table(rows: PerSequence, max_len: int) -> Table:
    """One row per sequence; CSV keys as the JSON's per_seq (seq: the 1-based row number).

    Every cell is a plain int, so the display and the CSV share one list of row tuples built column-wise
    (a dict and a display string per row cost seconds at 10^6 rows).
    """
    columns = rows.columns()
    labels = ["#", "n", f"M − n (M = {format_count(max_len)})"]
    for b in rows.allocated:
        labels += [f"A_{b}(n)", f"W_{b}(n)"]
    data: list[Any] = list(zip(range(1, rows.tokens.size + 1), *rows.rows_by_column(), strict=True))
    # People see thousands separators; only a table of at most PER_SEQ_TABLE_MAX rows is ever shown to them.
    shown = [[format_count(v) for v in row] for row in data] if len(data) <= PER_SEQ_TABLE_MAX else data
    return Table("Per sequence (token positions)", labels, shown, raw=RawTable(["seq", *columns], data))


def chart(result: FragAnalysis) -> str:
    return bar_chart(
        f"Tail-block waste vs block size (fixed reservation wastes {format_count(result.fixed.waste_tokens)} "
        "positions)",
        [f"B = {p.block_size}" for p in result.paged],
        [p.waste_tokens for p in result.paged],
        [f"{format_count(p.waste_tokens)} ({format_percent(p.waste_fraction)} of allocated)" for p in result.paged],
    )
