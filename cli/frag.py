"""`kvcalc frag`: fixed reservation vs paging for a set of sequence lengths (equations 2 and 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..core.dtypes import DEFAULT_DTYPE, dtype_bits, parse_dtype
from ..core.frag import analyse, block_sizes_for, check_memory
from ..core.inputs.lengths import DEFAULT_SAMPLE_COUNT, load_lengths
from ..core.model.kv_groups import DEFAULT_LAYOUT
from ..core.model.models import resolve_model
from ..core.spec_decode import speculation_from, with_config_drafter
from ..core.units import format_count, format_percent, plural
from .chart import check_plot_target, write_waste_plot
from .frag_report import (
    PER_SEQ_TABLE_MAX,
    bytes_table,
    chart,
    document,
    groups_table,
    header,
    model_notes,
    per_seq_table,
    speculative_note,
    speculative_table,
    token_table,
)
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
    Format,
    Report,
    emit,
    err_console,
    resolve_format,
)
from .progress import progress_bar

PER_SEQ_LIMIT = 50  # per-sequence rows are shown up to this many lengths (or with --per-seq)
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
        tuple[str, str] | None,
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
        bool, typer.Option("--sweep", help="Block sizes 1, 2, 4 … 256 (plus any --block) and a chart of waste; with "
                           "a model, the best block size for bytes held (KV, state and block tables).")
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
    layout: Annotated[
        str | None,
        typer.Option("--layout", metavar="vllm|ideal",
                     help="With a model: how its KV cache groups are paged: vllm (default; vLLM v1's hybrid "
                     "allocator: groups padded to one size, one page size, Mamba hybrids' block raised to hold a "
                     "state) or ideal (each layer type pooled on its own at the block size given, no padding)."),
    ] = None,
    mamba_cache_mode: Annotated[
        str | None,
        typer.Option("--mamba-cache-mode", metavar="none|align",
                     help="With a recurrent model: none (default: one state page per sequence, vLLM without "
                     "prefix caching) or align (two: the running state and the last one saved at a block "
                     "boundary, vLLM's prefix caching of Mamba states)."),
    ] = None,
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
    drafter = None  # the drafter's KV joins the model's (mtp, eagle), as size counts it, or a note says why not
    if spec is not None and speculation is not None:
        spec, drafter = with_config_drafter(spec, speculation.spec_tokens, speculation.method, "frag")
    if spec is None and dtype is not None:
        raise ValueError(
            "--dtype applies to KV bytes: give a model too (--model, --config or --layers/--kv-heads/--head-dim)"
        )
    if mamba_cache_mode not in (None, "none", "align"):
        raise ValueError(f"--mamba-cache-mode {mamba_cache_mode!r} is not one of none, align ('all' needs the "
                         "Mamba kernel's chunk size, which frag does not take)")
    if spec is None and mamba_cache_mode is not None:
        raise ValueError("--mamba-cache-mode applies to a model's recurrent layers: give a model too (--model or "
                         "--config)")
    if spec is not None and mamba_cache_mode is not None and not any(g.state is not None for g in spec.layer_groups):
        raise ValueError(f"--mamba-cache-mode {mamba_cache_mode} applies to a model with recurrent layers (Mamba, "
                         f"linear attention); {spec.name} has none: drop --mamba-cache-mode")
    if spec is None and layout is not None:
        raise ValueError("--layout applies to a model's KV cache groups: give a model too (--model, --config or "
                         "--layers/--kv-heads/--head-dim)")
    dtype_name = parse_dtype(DEFAULT_DTYPE if dtype is None else dtype)  # --dtype "" is an error, not the default
    passes = 1 if speculation is None else 2  # the speculative peaks take a pass of their own
    with progress_bar("paging", total=passes * source.count, enabled=source.count >= PROGRESS_FROM) as advance:
        result = analyse(
            source.tokens, block_sizes, max_len, per_sequence=per_seq or source.count <= PER_SEQ_LIMIT,
            spec=spec, dtype_bits=dtype_bits(dtype_name), progress=advance, speculation=speculation,
            layout=DEFAULT_LAYOUT if layout is None else layout, mamba_cache_mode=mamba_cache_mode or "none",
        )

    report = Report(doc=document(source, result, dtype_name), text=header(source))
    report.tables.append(token_table(result))
    if result.model_bytes is not None:
        report.tables.append(bytes_table(result.model_bytes, dtype_name))
    if result.speculative is not None:
        report.tables.append(speculative_table(result.speculative, report.doc["speculative"]))
    if result.per_sequence is not None:
        report.tables.append(per_seq_table(result.per_sequence, result.fixed.max_len))
    if sweep:
        report.footer.append(chart(result))
    report.notes = [
        "utilisation = Σ n / allocated positions (position utilisation, not device utilisation); "
        "block tables hold int32 ids: exact = Σ ceil(n/B) entries, dense = N × ceil(M/B) entries.",
    ]
    if result.model_bytes is not None:
        if result.model_bytes.kv_cache_groups > 1:
            report.tables.insert(2, groups_table(result.model_bytes))
        report.notes += model_notes(result.model_bytes, sweep)
    if result.speculative is not None:
        report.notes.append(speculative_note(result.speculative, max_len is None))
    if drafter is not None:
        report.notes.append(drafter)
    longest = int(source.tokens.max())
    if spec is not None and spec.max_position_embeddings is not None and longest > spec.max_position_embeddings:
        err_console.print(f"warning: the longest length, {format_count(longest)}, is above {spec.name}'s "
                          f"max_position_embeddings {format_count(spec.max_position_embeddings)}",
                          highlight=False, soft_wrap=True)
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
