"""`kvcalc frag`: fixed reservation vs paging for a set of sequence lengths (equations 2 and 3)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.dtypes import DEFAULT_DTYPE, dtype_bits, parse_dtype
from ..core.frag import FragAnalysis, ModelBytes, SpeculativePeaks, analyse, block_sizes_for, check_memory
from ..core.inputs.lengths import DEFAULT_SAMPLE_COUNT, Lengths, load_lengths
from ..core.paging import PerSequence
from ..core.spec.models import resolve_model
from ..core.spec_decode import SPEC_METHODS, speculation_from
from ..core.units import format_bytes, format_count, format_percent, plural
from .chart import bar_chart, check_plot_target, write_waste_plot
from .options import (
    ConfigOpt,
    FormatOpt,
    HeadDimOpt,
    JsonOpt,
    KvHeadsOpt,
    LayersOpt,
    ModelOpt,
    SeedOpt,
    SpecMethodOpt,
    SpecTokensOpt,
    int_option,
)
from .output import (
    Field,
    Format,
    RawTable,
    Report,
    Table,
    emit,
    err_console,
    record_table,
    resolve_format,
)
from .progress import progress_bar

PER_SEQ_LIMIT = 50  # per-sequence rows are shown up to this many lengths (or with --per-seq)
PER_SEQ_TABLE_MAX = 10_000  # a per-sequence table for people (rich, markdown) has at most this many rows
PROGRESS_FROM = 5_000_000  # lengths from which drawing or paging them takes a second or more: show a bar


def command(
    lengths: Annotated[
        str | None, typer.Option("--lengths", help="Comma-separated lengths in tokens, e.g. 37,91,128.")
    ] = None,
    lengths_file: Annotated[
        Path | None,
        typer.Option(
            "--lengths-file",
            help="A file of lengths: one integer per line; a CSV (with --column); a JSON list (.json); .npy. "
            "'-' reads standard input.",
        ),
    ] = None,
    column: Annotated[str | None, typer.Option("--column", help="The CSV column of --lengths-file.")] = None,
    trace: Annotated[
        tuple[str, Path] | None,
        typer.Option(
            "--trace",
            metavar="KIND FILE",
            help="A real trace: 'azure F' (ContextTokens + GeneratedTokens) or 'mooncake F' "
            "(input_length + output_length); F '-' reads standard input.",
        ),
    ] = None,
    phase: Annotated[
        str | None, typer.Option("--phase", help="With --trace: total (prompt + output, default) or prompt.")
    ] = None,
    dist: Annotated[
        str | None,
        typer.Option(
            "--dist",
            metavar="SPEC",
            help="A constructed sample, NAME:key=value,...: lognormal:mean=1366,sigma=0.8 (or median=; "
            "sigma of the underlying normal, default 1), uniform:low=1,high=2048 (inclusive), "
            "exponential:mean=500 (geometric on 1, 2, …), zipf:a=1.2,max=4096; lognormal and exponential "
            "take max= (truncated by resampling).",
        ),
    ] = None,
    count: Annotated[
        int | None, int_option("--count", help=f"With --dist: sample size (default {DEFAULT_SAMPLE_COUNT:,}).")
    ] = None,
    seed: SeedOpt = None,
    block: Annotated[
        list[int] | None,
        int_option("--block", "-b", help="Block size in tokens; repeat for several (default: 16 and 32)."),
    ] = None,
    sweep: Annotated[
        bool, typer.Option("--sweep", help="Block sizes 1, 2, 4 … 256 (plus any --block) and a chart of waste.")
    ] = False,
    max_len: Annotated[
        int | None,
        int_option(
            "--max-len", help="Fixed reservation M per sequence (default: the smallest power of two >= the longest)."
        ),
    ] = None,
    per_seq: Annotated[
        bool,
        typer.Option(
            "--per-seq",
            help=f"Per-sequence rows even for more than {PER_SEQ_LIMIT} lengths (a table: up to "
            f"{PER_SEQ_TABLE_MAX:,} rows; --json and --format csv: any number).",
        ),
    ] = False,
    model: ModelOpt = None,
    config: ConfigOpt = None,
    dtype: Annotated[
        str | None,
        typer.Option("--dtype", help=f"With a model: KV precision fp32, fp16, bf16, fp8, int8, int4 (default "
                     f"{DEFAULT_DTYPE})."),
    ] = None,
    layers: LayersOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Also write a figure of waste vs block size (.png or .svg).")
    ] = None,
    spec_tokens: SpecTokensOpt = None,
    spec_method: SpecMethodOpt = None,
    json_flag: JsonOpt = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """Fixed reservation vs paging for sequence lengths: useful, allocated and wasted positions, utilisation,
    block-table bytes, and KV bytes when a model is given. No arguments: the worked example (37, 91, 128,
    201, 511 with blocks 16 and 32, M = 512)."""
    if plot is not None:
        check_plot_target(plot)
    out_format = resolve_format(json_flag, fmt)
    block_sizes = block_sizes_for(block, sweep)
    speculation = speculation_from(spec_tokens, spec_method)
    drawn = 0
    if dist is not None:  # the one source whose size an option sets: refuse what cannot fit before drawing it
        drawn = DEFAULT_SAMPLE_COUNT if count is None else count
        if drawn >= 1:
            _check_per_seq_rows(drawn, per_seq, out_format)
            check_memory(drawn, len(block_sizes), per_seq or drawn <= PER_SEQ_LIMIT, lengths_held=False)
    with progress_bar("drawing lengths", total=drawn, enabled=drawn >= PROGRESS_FROM) as advance:
        source = load_lengths(lengths, lengths_file, column, trace, phase, dist, count, seed, progress=advance)
    _check_per_seq_rows(source.count, per_seq, out_format)
    spec = resolve_model(model, config, layers, kv_heads, head_dim)
    if spec is None and dtype is not None:
        raise ValueError(
            "--dtype applies to KV bytes: give a model too (--model, --config or --layers/--kv-heads/--head-dim)"
        )
    dtype_name = parse_dtype(DEFAULT_DTYPE if dtype is None else dtype)  # --dtype "" is an error, not the default
    passes = 1 if speculation is None else 2  # the speculative peaks take a pass of their own
    with progress_bar("paging", total=passes * source.count, enabled=source.count >= PROGRESS_FROM) as advance:
        result = analyse(
            source.tokens, block_sizes, max_len, per_sequence=per_seq or source.count <= PER_SEQ_LIMIT,
            spec=spec, dtype_bits=dtype_bits(dtype_name), progress=advance, speculation=speculation,
        )

    report = Report(doc=_document(source, result, dtype_name), text=_header(source))
    report.tables.append(_token_table(result))
    if result.model_bytes is not None:
        report.tables.append(_bytes_table(result.model_bytes, dtype_name))
    if result.speculative is not None:
        report.tables.append(_speculative_table(result.speculative, report.doc["speculative"]))
    if result.per_sequence is not None:
        report.tables.append(_per_seq_table(result.per_sequence, result.fixed.max_len))
    if sweep:
        report.footer.append(_chart(result))
    report.notes = [
        "utilisation = Σ n / allocated positions (position utilisation, not device utilisation); "
        "block tables hold int32 ids: exact = Σ ceil(n/B) entries, dense = N × ceil(M/B) entries.",
    ]
    if result.model_bytes is not None:
        model_spec, groups = result.model_bytes.spec, result.model_bytes.kv_cache_groups
        note = "bytes in IEC units (KiB = 2^10 B); one block table per sequence"
        if model_spec.sliding_window is not None and model_spec.num_sliding_layers:
            note += (
                f" per KV-cache group ({groups}); sliding-window layers keep only the blocks that hold one of the "
                f"last {format_count(model_spec.sliding_window)} tokens"
            )
        report.notes.append(note + ".")
        if model_spec.num_sliding_layers:
            report.notes.append(
                "The token-position table (and the per-sequence rows) ignore sliding windows: every layer holds "
                "every position; the KV bytes table applies them."
            )
    if result.speculative is not None:
        report.notes.append(_speculative_note(result.speculative, max_len is None))
    emit(report, out_format)
    if plot is not None:
        fixed = result.fixed
        write_waste_plot(
            plot,
            f"{source.kind} lengths, {plural(source.count, 'sequence')} — fixed reservation to "
            f"M = {format_count(fixed.max_len)} wastes {format_count(fixed.waste_tokens)} positions "
            f"({format_percent(fixed.waste_fraction)})",
            result.block_sizes,
            [p.waste_tokens for p in result.paged],
            [float(p.utilization) for p in result.paged],
        )
        err_console.print(f"wrote {plot}", highlight=False)


def _check_per_seq_rows(num_lengths: int, per_seq: bool, out_format: Format) -> None:
    if per_seq and num_lengths > PER_SEQ_TABLE_MAX and out_format in (Format.table, Format.markdown):
        raise ValueError(
            f"--per-seq with {format_count(num_lengths)} lengths: a table shows at most "
            f"{format_count(PER_SEQ_TABLE_MAX)} rows; use --json or --format csv for every row, or drop --per-seq"
        )


def _document(source: Lengths, result: FragAnalysis, dtype_name: str) -> dict[str, Any]:
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
        spec = model.spec
        doc["model"] = {
            "name": spec.name,
            "attention": spec.attention,
            "dtype": dtype_name,
            "bits_per_scalar": model.dtype_bits,
            "bytes_per_token": spec.bytes_per_token(model.dtype_bits),
            "sliding_window": spec.sliding_window,
            "num_sliding_layers": spec.num_sliding_layers,
            "kv_cache_groups": model.kv_cache_groups,
        }
        doc["fixed"].update(
            useful_kv_bytes=model.fixed.useful_kv_bytes,
            allocated_kv_bytes=model.fixed.allocated_kv_bytes,
            reservation_waste_bytes=model.fixed.waste_kv_bytes,
        )
        for entry, kv in zip(doc["paged"], model.paged, strict=True):
            entry.update(
                useful_kv_bytes=kv.useful_kv_bytes,
                allocated_kv_bytes=kv.allocated_kv_bytes,
                fragmentation_bytes=kv.waste_kv_bytes,
                block_table_bytes_exact=kv.block_table_bytes_exact,
                block_table_bytes_dense=kv.block_table_bytes_dense,
            )
    if result.speculative is not None:
        doc["speculative"] = _speculative_doc(result.speculative)
    if result.per_sequence is not None:
        doc["per_seq"] = result.per_sequence.records()
    return doc


def _speculative_doc(peaks: SpeculativePeaks) -> dict[str, Any]:
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


def _speculative_table(peaks: SpeculativePeaks, doc: dict[str, Any]) -> Table:
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


def _speculative_note(peaks: SpeculativePeaks, default_max_len: bool) -> str:
    speculation = peaks.speculation
    note = (f"Speculative peak: each step reserves 1 + K + λ = {speculation.slots_per_step} slots past the committed "
            f"tokens (λ = {speculation.lookahead_slots} lookahead slots: {SPEC_METHODS[speculation.method]}); a "
            f"sequence of n tokens can run its last step from n − 1, so it holds up to n + {speculation.extra_slots}. "
            "concurrency vs plain = blocks / peak blocks: the share of these sequences that a pool sized for them "
            "holds at their peaks.")
    if default_max_len:
        note += " M is the smallest power of two that holds the longest peak."
    return note


def _two_decimals(value: Fraction) -> str:
    """An exact mean with two decimals and thousands separators, never through a float (a mean of 3·10^18-token
    lengths has more digits than a double holds)."""
    hundredths = round(value * 100)
    sign = "-" if hundredths < 0 else ""
    return f"{sign}{abs(hundredths) // 100:,}.{abs(hundredths) % 100:02d}"


def _header(source: Lengths) -> list[str]:
    return [
        f"Lengths — {source.description}",
        f"{plural(source.count, 'sequence')}, {plural(source.total, 'token')}; min {format_count(source.min)}, "
        f"max {format_count(source.max)}, mean {_two_decimals(source.mean)}",
    ]


def _scheme(record: dict[str, Any]) -> str:
    if record["scheme"] == "fixed":
        return "fixed" if record.get("max_len") is None else f"fixed, M = {format_count(record['max_len'])}"
    return f"paged, B = {record['block_size']}"


def _token_table(result: FragAnalysis) -> Table:
    fixed = result.fixed
    records: list[dict[str, Any]] = [{
        "scheme": "fixed", "max_len": fixed.max_len, "block_size": None, "blocks": None,
        "useful": fixed.useful_tokens, "allocated": fixed.allocated_tokens, "waste": fixed.waste_tokens,
        "utilization": float(fixed.utilization), "block_table_bytes_exact": None, "block_table_bytes_dense": None,
    }]
    # Block tables are one per sequence, or one per KV-cache group when a model mixes full and
    # sliding-window layers: with a model, the model's figures (as the JSON's paged entries carry them).
    tables = [(kv.block_table_bytes_exact, kv.block_table_bytes_dense) for kv in result.model_bytes.paged] \
        if result.model_bytes is not None else [(p.block_table_bytes_exact, p.block_table_bytes_dense)
                                                for p in result.paged]
    records += [{
        "scheme": "paged", "max_len": None, "block_size": p.block_size, "blocks": p.num_blocks,
        "useful": p.useful_tokens, "allocated": p.allocated_tokens, "waste": p.waste_tokens,
        "utilization": float(p.utilization), "block_table_bytes_exact": exact, "block_table_bytes_dense": dense,
    } for p, (exact, dense) in zip(result.paged, tables, strict=True)]
    fields = [
        Field(None, "scheme", _scheme),
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


def _bytes_table(model: ModelBytes, dtype_name: str) -> Table:
    """KV bytes per scheme; CSV keys as the JSON's: reservation_waste_bytes (fixed), fragmentation_bytes (paged)."""
    bytes_per_token = model.spec.bytes_per_token(model.dtype_bits)
    fixed = model.fixed
    common = {"model": model.spec.name, "dtype": dtype_name, "bytes_per_token": bytes_per_token}
    records: list[dict[str, Any]] = [{
        "scheme": "fixed", "block_size": None, "useful_kv_bytes": fixed.useful_kv_bytes,
        "reservation_waste_bytes": fixed.waste_kv_bytes, "fragmentation_bytes": None,
        "waste_kv_bytes": fixed.waste_kv_bytes, "block_table_bytes_exact": None, "block_table_bytes_dense": None,
        "allocated_kv_bytes": fixed.allocated_kv_bytes, **common,
    }]
    records += [{
        "scheme": "paged", "block_size": kv.block_size, "useful_kv_bytes": kv.useful_kv_bytes,
        "reservation_waste_bytes": None, "fragmentation_bytes": kv.waste_kv_bytes, "waste_kv_bytes": kv.waste_kv_bytes,
        "block_table_bytes_exact": kv.block_table_bytes_exact, "block_table_bytes_dense": kv.block_table_bytes_dense,
        "allocated_kv_bytes": kv.allocated_kv_bytes, **common,
    } for kv in model.paged]
    fields = [
        Field(None, "scheme", _scheme),
        Field("scheme"),
        Field("block_size"),
        Field("useful_kv_bytes", "useful KV", format_bytes),
        Field("reservation_waste_bytes"),
        Field("fragmentation_bytes"),
        Field(None, "waste (reservation / tail blocks)", lambda r: format_bytes(r["waste_kv_bytes"])),
        Field("block_table_bytes_exact", "block tables (exact)", format_bytes),
        Field("block_table_bytes_dense", "block tables (dense)", format_bytes),
        Field("allocated_kv_bytes", "KV allocated", format_bytes),
        Field("model"),
        Field("dtype"),
        Field("bytes_per_token"),
    ]
    title = f"KV bytes — {model.spec.name}, {dtype_name} ({format_bytes(bytes_per_token)} per token)"
    return record_table(title, fields, records)


def _per_seq_table(rows: PerSequence, max_len: int) -> Table:
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


def _chart(result: FragAnalysis) -> str:
    return bar_chart(
        f"Tail-block waste vs block size (fixed reservation wastes {format_count(result.fixed.waste_tokens)} "
        "positions)",
        [f"B = {p.block_size}" for p in result.paged],
        [p.waste_tokens for p in result.paged],
        [f"{format_count(p.waste_tokens)} ({format_percent(p.waste_fraction)} of allocated)" for p in result.paged],
    )
