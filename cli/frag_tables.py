"""The tables of `kvcalc frag`: token positions, KV bytes, KV cache groups, speculative peaks, per sequence,
and the waste chart."""

from __future__ import annotations

from typing import Any

from ..core.frag import FragAnalysis, ModelBytes, SpeculativePeaks
from ..core.paging import PerSequence
from ..core.units import format_bytes, format_count, format_percent, plural
from .chart import bar_chart
from .frag_doc import group_doc
from .output import Field, RawTable, Table, record_table

PER_SEQ_TABLE_MAX = 10_000  # a per-sequence table for people (rich, markdown) has at most this many rows


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
        state = "peak_allocated_state_bytes" in records[0]  # a recurrent model: the extra holds its state pages
        fields.append(Field("peak_allocated_kv_bytes", "peak KV", format_bytes))
        if state:
            fields.append(Field("peak_allocated_state_bytes", "peak state", format_bytes))
        fields.append(Field("extra_kv_bytes", "extra (KV + state)" if state else "extra KV", format_bytes))
    fields += [Field(key) for key in common]
    title = (f"Speculative decoding: {plural(speculation.spec_tokens, 'draft')} + "
             f"{plural(speculation.lookahead_slots, 'lookahead slot')} per step ({speculation.method}), peak blocks "
             f"{speculation.formula}")
    return record_table(title, fields, records)


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
    title = f"KV cache groups — layout {model.layout}"
    if len(shown) < len(model.paged):
        title += f", best block size only (B = {model.best.block_size}; --json has every size)"
    return record_table(title, fields, records)


def _group_name(record: dict[str, Any]) -> str:
    if record["kind"] == "state":
        return f"state ({record['source'].replace('_', ' ')})"
    if record["window"] is None:
        return "full (MLA)" if record["source"] == "mla" else "full"
    return f"{record['kind']} {format_count(record['window'])}"


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
