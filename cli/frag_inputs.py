"""`kvcalc frag`'s flags as given (`FragOptions`) and the checked inputs of core.frag.analyse (`FragInputs`):
the lengths loaded (refusing a sample that cannot fit before drawing it), the model with its drafter, and which
flags need a model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..core.dtypes import DEFAULT_DTYPE, parse_dtype
from ..core.frag import block_sizes_for, check_memory
from ..core.inputs.lengths import DEFAULT_SAMPLE_COUNT, Lengths, load_lengths
from ..core.model.models import ModelSpec, resolve_model
from ..core.spec_decode import speculation_from, with_config_drafter
from ..core.units import format_count
from .chart import check_plot_target
from .frag_tables import PER_SEQ_TABLE_MAX
from .output import Format, resolve_format
from .progress import progress_bar

PER_SEQ_LIMIT = 50  # per-sequence rows are shown up to this many lengths (or with --per-seq)
PROGRESS_FROM = 5_000_000  # lengths from which drawing or paging them takes a second or more: show a bar


@dataclasses.dataclass(frozen=True)
class FragOptions:
    """The flags of `kvcalc frag` as typed (None: not given)."""

    lengths: str | None
    lengths_file: Path | None
    column: str | None
    trace: tuple[str, str] | None
    phase: str | None
    dist: str | None
    count: int | None
    seed: int | None
    block: list[int] | None
    sweep: bool
    max_len: int | None
    per_seq: bool
    model: str | None
    config: Path | None
    dtype: str | None
    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    layout: str | None
    mamba_cache_mode: str | None
    plot: Path | None
    spec_tokens: int | None
    spec_method: str | None
    json_flag: bool
    fmt: Format


@dataclasses.dataclass(frozen=True)
class FragInputs:
    """What core.frag.analyse runs on, every combination of flags checked."""

    opts: FragOptions
    fmt: Format
    block_sizes: list[int]
    speculation: Any
    source: Lengths
    spec: ModelSpec | None
    drafter: str | None  # the note on the drafter's KV joined to the model's (mtp, eagle), or why not
    dtype_name: str

    @property
    def per_sequence(self) -> bool:
        return self.opts.per_seq or self.source.count <= PER_SEQ_LIMIT


def frag_inputs(o: FragOptions) -> FragInputs:
    """Parse and check the flags in the order the command always has (the first problem is the one named)."""
    if o.plot is not None:
        check_plot_target(o.plot)
    out_format = resolve_format(o.json_flag, o.fmt)
    block_sizes = block_sizes_for(o.block, o.sweep)
    speculation = speculation_from(o.spec_tokens, o.spec_method)
    source = _load_lengths(o, out_format, len(block_sizes))
    spec = resolve_model(o.model, o.config, o.layers, o.kv_heads, o.head_dim)
    drafter = None
    if spec is not None and speculation is not None:
        spec, drafter = with_config_drafter(spec, speculation.spec_tokens, speculation.method, "frag")
    check_model_options(o, spec)
    dtype_name = parse_dtype(DEFAULT_DTYPE if o.dtype is None else o.dtype)  # --dtype "" is an error, not the default
    return FragInputs(o, out_format, block_sizes, speculation, source, spec, drafter, dtype_name)


def _load_lengths(o: FragOptions, out_format: Format, num_block_sizes: int) -> Lengths:
    drawn = 0
    if o.dist is not None:  # the one source whose size an option sets: refuse what cannot fit before drawing it
        drawn = DEFAULT_SAMPLE_COUNT if o.count is None else o.count
        if drawn >= 1:
            check_per_seq_rows(drawn, o.per_seq, out_format)
            check_memory(drawn, num_block_sizes, o.per_seq or drawn <= PER_SEQ_LIMIT, lengths_held=False)
    with progress_bar("drawing lengths", total=drawn, enabled=drawn >= PROGRESS_FROM) as advance:
        source = load_lengths(o.lengths, o.lengths_file, o.column, o.trace, o.phase, o.dist, o.count, o.seed,
                              progress=advance)
    check_per_seq_rows(source.count, o.per_seq, out_format)
    return source


def check_model_options(o: FragOptions, spec: ModelSpec | None) -> None:
    """--dtype, --layout and --mamba-cache-mode read a model (the last one a recurrent model)."""
    if spec is None and o.dtype is not None:
        raise ValueError(
            "--dtype applies to KV bytes: give a model too (--model, --config or --layers/--kv-heads/--head-dim)"
        )
    mode = o.mamba_cache_mode
    if mode not in (None, "none", "align", "all"):
        raise ValueError(f"--mamba-cache-mode {mode!r} is not one of none, align, all")
    if spec is None and mode is not None:
        raise ValueError("--mamba-cache-mode applies to a model's recurrent layers: give a model too (--model or "
                         "--config)")
    if spec is not None and mode is not None and not any(g.state is not None for g in spec.layer_groups):
        raise ValueError(f"--mamba-cache-mode {mode} applies to a model with recurrent layers (Mamba, "
                         f"linear attention); {spec.name} has none: drop --mamba-cache-mode")
    if spec is None and o.layout is not None:
        raise ValueError("--layout applies to a model's KV cache groups: give a model too (--model, --config or "
                         "--layers/--kv-heads/--head-dim)")


def check_per_seq_rows(num_lengths: int, per_seq: bool, out_format: Format) -> None:
    if per_seq and num_lengths > PER_SEQ_TABLE_MAX and out_format in (Format.table, Format.markdown):
        raise ValueError(
            f"--per-seq with {format_count(num_lengths)} lengths: a table shows at most "
            f"{format_count(PER_SEQ_TABLE_MAX)} rows; use --json or --format csv for every row, or drop --per-seq"
        )
