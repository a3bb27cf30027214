"""`kvcalc frag`: fixed reservation vs paging for a set of sequence lengths (equations 2 and 3).

The command parses the flags (the options below), checks them (cli/frag_inputs.py), pages the lengths
(core.frag.analyse) and hands the result to one report (cli/frag_report.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..core.dtypes import DEFAULT_DTYPE, dtype_bits
from ..core.frag import FragAnalysis, analyse
from ..core.inputs.lengths import DEFAULT_SAMPLE_COUNT, Lengths
from ..core.model.kv_groups import DEFAULT_LAYOUT
from ..core.units import format_count, format_percent, plural
from .chart import write_waste_plot
from .frag_inputs import PER_SEQ_LIMIT, PROGRESS_FROM, FragInputs, FragOptions, frag_inputs
from .frag_report import PER_SEQ_TABLE_MAX, frag_report
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
from .output import Format, emit, err_console, warn_notes
from .progress import progress_bar

__all__ = ["PER_SEQ_LIMIT", "PROGRESS_FROM", "command"]

LengthsOpt = Annotated[
    str | None, typer.Option("--lengths", help="Comma-separated lengths in tokens, e.g. 37,91,128.")
]
LengthsFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--lengths-file",
        help="A file of lengths: one integer per line; a CSV (with --column); a JSON list (.json); .npy. "
        "'-' reads standard input.",
    ),
]
ColumnOpt = Annotated[str | None, typer.Option("--column", help="The CSV column of --lengths-file.")]
TraceOpt = Annotated[
    tuple[str, str] | None,
    typer.Option(
        "--trace",
        metavar="KIND FILE",
        help="A real trace: 'azure F' (ContextTokens + GeneratedTokens) or 'mooncake F' "
        "(input_length + output_length); F '-' reads standard input.",
    ),
]
PhaseOpt = Annotated[
    str | None, typer.Option("--phase", help="With --trace: total (prompt + output, default) or prompt.")
]
DistOpt = Annotated[
    str | None,
    typer.Option(
        "--dist",
        metavar="SPEC",
        help="A constructed sample, NAME:key=value,...: lognormal:mean=1366,sigma=0.8 (or median=; "
        "sigma of the underlying normal, default 1), uniform:low=1,high=2048 (inclusive), "
        "exponential:mean=500 (geometric on 1, 2, …), zipf:a=1.2,max=4096; lognormal and exponential "
        "take max= (truncated by resampling).",
    ),
]
CountOpt = Annotated[
    int | None, int_option("--count", help=f"With --dist: sample size (default {DEFAULT_SAMPLE_COUNT:,}).")
]
BlockSizesOpt = Annotated[
    list[int] | None,
    int_option("--block", "-b", help="Block size in tokens; repeat for several (default: 16 and 32)."),
]
SweepOpt = Annotated[
    bool, typer.Option("--sweep", help="Block sizes 1, 2, 4 … 256 (plus any --block) and a chart of waste; with "
                       "a model, the best block size for bytes held (KV, state and block tables).")
]
MaxLenOpt = Annotated[
    int | None,
    int_option(
        "--max-len", help="Fixed reservation M per sequence (default: the smallest power of two >= the longest)."
    ),
]
PerSeqOpt = Annotated[
    bool,
    typer.Option(
        "--per-seq",
        help=f"Per-sequence rows even for more than {PER_SEQ_LIMIT} lengths (a table: up to "
        f"{PER_SEQ_TABLE_MAX:,} rows; --json and --format csv: any number).",
    ),
]
FragDtypeOpt = Annotated[
    str | None,
    typer.Option("--dtype", help=f"With a model: KV precision fp32, fp16, bf16, fp8, int8, int4 (default "
                 f"{DEFAULT_DTYPE})."),
]
LayoutOpt = Annotated[
    str | None,
    typer.Option("--layout", metavar="vllm|ideal",
                 help="With a model: how its KV cache groups are paged: vllm (default; vLLM v1's hybrid "
                 "allocator: groups padded to one size, one page size, Mamba hybrids' block raised to hold a "
                 "state) or ideal (each layer type pooled on its own at the block size given, no padding)."),
]
MambaCacheModeOpt = Annotated[
    str | None,
    typer.Option("--mamba-cache-mode", metavar="none|align|all",
                 help="With a recurrent model: none (default: one state page per sequence, vLLM without "
                 "prefix caching), align (two: the running state and the last one saved at a block "
                 "boundary, vLLM's prefix caching of Mamba states) or all (Mamba-2: a page per block, the "
                 "block aligned to the kernel's chunk)."),
]
PlotOpt = Annotated[
    Path | None, typer.Option("--plot", help="Also write a figure of waste vs block size (.png or .svg).")
]


def command(
    lengths: LengthsOpt = None, lengths_file: LengthsFileOpt = None, column: ColumnOpt = None,
    trace: TraceOpt = None, phase: PhaseOpt = None, dist: DistOpt = None, count: CountOpt = None,
    seed: SeedOpt = None, block: BlockSizesOpt = None, sweep: SweepOpt = False, max_len: MaxLenOpt = None,
    per_seq: PerSeqOpt = False, model: ModelOpt = None, config: ConfigOpt = None, dtype: FragDtypeOpt = None,
    layers: LayersOpt = None, kv_heads: KvHeadsOpt = None, head_dim: HeadDimOpt = None, layout: LayoutOpt = None,
    mamba_cache_mode: MambaCacheModeOpt = None, plot: PlotOpt = None, spec_tokens: SpecTokensOpt = None,
    spec_method: SpecMethodOpt = None, json_flag: JsonOpt = False, fmt: FormatOpt = Format.table,
) -> None:
    """Fixed reservation vs paging for sequence lengths: useful, allocated and wasted positions, utilisation,
    block-table bytes, and KV bytes when a model is given. No arguments: the worked example (37, 91, 128,
    201, 511 with blocks 16 and 32, M = 512)."""
    inputs = frag_inputs(FragOptions(
        lengths=lengths, lengths_file=lengths_file, column=column, trace=trace, phase=phase, dist=dist, count=count,
        seed=seed, block=block, sweep=sweep, max_len=max_len, per_seq=per_seq, model=model, config=config,
        dtype=dtype, layers=layers, kv_heads=kv_heads, head_dim=head_dim, layout=layout,
        mamba_cache_mode=mamba_cache_mode, plot=plot, spec_tokens=spec_tokens, spec_method=spec_method,
        json_flag=json_flag, fmt=fmt))
    result = _analyse(inputs)
    emit(frag_report(inputs.source, result, inputs.dtype_name, sweep, max_len is None, inputs.drafter), inputs.fmt)
    if plot is not None:
        _write_plot(plot, inputs.source, result)


def _analyse(inputs: FragInputs) -> FragAnalysis:
    """core.frag.analyse on the checked inputs, with a progress bar for millions of lengths; a warning when the
    longest length is above the model's max_position_embeddings."""
    source, spec, o = inputs.source, inputs.spec, inputs.opts
    if spec is not None:
        warn_notes(spec.notes)
    passes = 1 if inputs.speculation is None else 2  # the speculative peaks take a pass of their own
    with progress_bar("paging", total=passes * source.count, enabled=source.count >= PROGRESS_FROM) as advance:
        result = analyse(
            source.tokens, inputs.block_sizes, o.max_len, per_sequence=inputs.per_sequence, spec=spec,
            dtype_bits=dtype_bits(inputs.dtype_name), progress=advance, speculation=inputs.speculation,
            layout=DEFAULT_LAYOUT if o.layout is None else o.layout, mamba_cache_mode=o.mamba_cache_mode or "none",
        )
    longest = int(source.tokens.max())
    if spec is not None and spec.max_position_embeddings is not None and longest > spec.max_position_embeddings:
        err_console.print(f"warning: the longest length, {format_count(longest)}, is above {spec.name}'s "
                          f"max_position_embeddings {format_count(spec.max_position_embeddings)}",
                          highlight=False, soft_wrap=True)
    return result


def _write_plot(plot: Path, source: Lengths, result: FragAnalysis) -> None:
    fixed = result.fixed
    write_waste_plot(
        plot,
        f"{source.kind} lengths, {plural(source.count, 'sequence')} — fixed reservation to "
        f"M = {format_count(fixed.max_len)} wastes {format_count(fixed.waste_tokens)} positions "
        f"({format_percent(fixed.waste_fraction)})",
        result.block_sizes,
        [p.waste_tokens for p in result.paged],
        [float(p.utilization) for p in result.paged] if (m := result.model_bytes) is None else
        [(k.useful_kv_bytes + k.state_bytes) / k.held_bytes for k in m.paged],
        None if m is None else (m.spec.name, [k.held_bytes for k in m.paged],
                                [k.used_block_size or k.block_size or 0 for k in m.paged]),
    )
    err_console.print(f"wrote {plot}", highlight=False)
