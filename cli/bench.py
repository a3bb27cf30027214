"""`kvcalc bench`: the CUDA paged-attention extension against a contiguous-KV baseline.

torch is imported only inside the command body (and kvcalc.cuda_ext), so `kvcalc --help` and the
other commands never load it. Exit codes: 0 all correctness checks passed, 1 a check failed, 2 bad
input, a run too large for the memory there is, or torch missing (the message says how to install it),
3 CUDA asked for but no GPU, no nvcc or no torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..core.dtypes import DEFAULT_DTYPE
from ..core.errors import CudaUnavailableError
from ..core.units import format_bytes
from .options import FormatOpt, JsonOpt, SeedOpt, check_output_path, int_option
from .output import Field, Format, Report, Table, emit, err_console, record_table, resolve_format, to_json
from .progress import progress_bar

if TYPE_CHECKING:
    from ..cuda_ext.bench import BenchConfig

DeviceOpt = Annotated[str, typer.Option("--device", help="cuda (the extension), cpu (the reference "
                                        "implementations at small sizes) or auto (cuda if a GPU is visible).")]
BenchDtypeOpt = Annotated[str, typer.Option("--dtype", help="Precision of the timed runs: bf16 or fp16.")]
IntOpt = int | None
HeadDimOpt = Annotated[int, int_option("--head-dim", help="Head dimension: 64, 128 or 256.")]
QHeadsOpt = Annotated[int, int_option("--q-heads", help="Query heads (a multiple of --kv-heads).")]
KvHeadsOpt = Annotated[int, int_option("--kv-heads", help="KV heads.")]
BatchOpt = Annotated[IntOpt, int_option("--batch", help="Time only this batch size.")]
ContextOpt = Annotated[IntOpt, int_option("--context", help="Time only this context length (tokens).")]
BlockSizeOpt = Annotated[int, int_option("--block", "--block-size", "-b", help="Tokens per KV block (power of two).")]
ItersOpt = Annotated[IntOpt, int_option("--iters", help="Timed runs (median); default cuda 50, cpu 3.")]
WarmupOpt = Annotated[int, int_option("--warmup", help="Untimed runs before timing.")]
SplitsOpt = Annotated[IntOpt, int_option("--splits", help="Force the split-KV count (default: heuristic).")]
SweepBlockOpt = Annotated[bool, typer.Option("--sweep-block", help="Also sweep block sizes 1..256.")]
NoFlexOpt = Annotated[bool, typer.Option("--no-flex", help="Do not time FlexAttention (saves its compile).")]
SkipCorrectnessOpt = Annotated[bool, typer.Option("--skip-correctness", help="Skip the correctness grid.")]
SaveOpt = Annotated[Path | None, typer.Option("--save", help="Also write the JSON document to this file.")]
BENCH_INSTALL = "pip install 'kvcalc[bench]'"
CPU_TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def require_torch(command: str, device: str) -> None:
    """torch is the bench extra (bench and verify need it): its absence is an install step to name, exit 3
    where CUDA was asked for."""
    try:
        import torch  # noqa: F401
    except ImportError:
        if device == "cuda":
            raise CudaUnavailableError(f"--device cuda needs PyTorch with CUDA, which is not installed: "
                                       f"{BENCH_INSTALL}") from None
        raise ValueError(f"kvcalc {command} needs PyTorch, which is not installed: {BENCH_INSTALL} (on a machine "
                         f"without a GPU, first the CPU build: {CPU_TORCH_INSTALL})") from None


def _pick_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    err_console.print("no CUDA device: running the reference implementation on CPU (--device cpu)", style="dim")
    return "cpu"


def _correctness_table(correctness: list[dict[str, Any]]) -> Table:
    """One row per (dtype, head dim) over the grid of cases: the worst errors and how many cases passed."""
    from ..cuda_ext.bench import correctness_summary

    records = correctness_summary(correctness)
    fields = [
        Field("dtype", "dtype"),
        Field("head_dim", "head dim"),
        Field("cases", "cases"),
        Field("max_rel_err", "max rel err", "{:.2e}".format),
        Field("tolerance", "tolerance", "{:.0e}".format),
        Field("max_paged_vs_contiguous_diff", "paged vs contiguous", "{:.2e}".format),
        Field("passed_cases"),
        Field(None, "passed", lambda r: f"{r['passed_cases']}/{r['cases']}"),
    ]
    return record_table("Correctness vs float64 reference (groups 1/4/16 x blocks 1/16/256, lengths 0..700)",
                        fields, records)


def _timing_table(title: str, rows: list[dict[str, Any]], cpu: bool) -> Table:
    """One row per timed shape, as the JSON's rows (µs, bytes, TB/s = 1e12 B/s, fraction of the copy ceiling)."""
    unit = "CPU µs" if cpu else "µs"
    fields = [
        Field("batch", "batch"),
        Field("context", "context"),
        Field("block_size", "block"),
        Field("paged_us", f"paged {unit}", "{:.1f}".format),
        Field("contiguous_us", f"contiguous {unit}", "{:.1f}".format),
        Field("paged_over_contiguous", "paged/contig", "{:.3f}".format),
        Field("bytes", "bytes", format_bytes),
        # One format per column: GPU figures are around 1-5 TB/s, the CPU reference's around 1e-4.
        Field("achieved_tbps", "TB/s", "{:.2e}".format if cpu else "{:.3f}".format),
        Field("fraction_of_copy", "of copy", lambda f: f"{100 * f:.1f} %", missing="-"),
        Field("timed_outputs_match"),
    ]
    if not cpu:
        fields += [Field(key, label, "{:.1f}".format, missing="-")
                   for key, label in (("sdpa_us", "SDPA µs"), ("flex_paged_us", "flex paged µs"))]
    return record_table(title, fields, [{f.key: r.get(f.key) for f in fields if f.key is not None} for r in rows])


def _report(doc: dict[str, Any]) -> Report:
    cpu = doc["device"]["type"] == "cpu"
    tables = []
    if doc["correctness"]:
        tables.append(_correctness_table(doc["correctness"]))
    config = doc["config"]
    shape = f"{config['dtype']}, head dim {config['head_dim']}, {config['num_q_heads']}/{config['num_kv_heads']} heads"
    if doc["timing"]:
        tables.append(_timing_table(f"Decode timing ({shape})", doc["timing"], cpu))
    if doc.get("block_sweep"):
        tables.append(_timing_table(f"Block-size sweep ({shape})", doc["block_sweep"], cpu))
    notes = [f"implementation: {doc['implementation']}"]
    if cpu:
        default = "CPU times are the pure-torch reference implementation on CPU, not a kernel figure."
        notes.append(doc["device"].get("timing_note", default))
    else:
        device = doc["device"]
        notes.append(f"device: {device['name']} (driver {device['driver']}, CUDA {device['cuda']}, torch "
                     f"{device['torch']}); copy ceiling {doc['copy_tbps']:.3f} TB/s measured in this run")
    if "paged_vs_contiguous" in doc:
        notes.append(f"paged vs contiguous: {doc['paged_vs_contiguous']['explanation']}")
    notes.append("bytes: K and V of every live token + q + out + live block-table entries; TB = 1e12 bytes; "
                 "IEC units (KiB, MiB, GiB) for sizes.")
    if not doc["passed"]:
        notes.append("correctness: SOME CHECKS FAILED (see --json)")
    elif doc.get("correctness_checked", True):
        notes.append("correctness: all checks passed")
    else:
        notes.append("correctness: not checked against the reference (--skip-correctness); the timed outputs "
                     "matched their first run")
    return Report(doc=doc, tables=tables, notes=notes)


def _bench_config(device: str, *, dtype: str, head_dim: int, q_heads: int, kv_heads: int, batch: int | None,
                  context: int | None, block_size: int, iters: int | None, warmup: int, splits: int | None,
                  sweep_block: bool, correctness: bool, flex: bool, seed: int | None) -> BenchConfig:
    """The run's configuration on the picked device: the device's shapes (or the one --batch/--context names)
    and its default number of timed runs."""
    from ..cuda_ext.bench import CPU_SHAPES, CUDA_SHAPES, BenchConfig

    shapes: tuple[tuple[int, int], ...] = CUDA_SHAPES if device == "cuda" else CPU_SHAPES
    if batch is not None or context is not None:
        default_batch, default_context = shapes[-1]
        shapes = ((default_batch if batch is None else batch, default_context if context is None else context),)
    assert seed is not None  # defaults to 0; --seed takes only a whole number
    return BenchConfig(
        device=device, dtype=dtype, head_dim=head_dim, num_q_heads=q_heads, num_kv_heads=kv_heads,
        block_size=block_size, shapes=shapes, iters=(50 if device == "cuda" else 3) if iters is None else iters,
        warmup=warmup, sweep_block=sweep_block, correctness=correctness, flex=flex, num_splits=splits, seed=seed,
    )


def command(
    device: DeviceOpt = "auto", dtype: BenchDtypeOpt = DEFAULT_DTYPE, head_dim: HeadDimOpt = 128,
    q_heads: QHeadsOpt = 32, kv_heads: KvHeadsOpt = 8, batch: BatchOpt = None, context: ContextOpt = None,
    block_size: BlockSizeOpt = 16, iters: ItersOpt = None, warmup: WarmupOpt = 3, splits: SplitsOpt = None,
    sweep_block: SweepBlockOpt = False, no_flex: NoFlexOpt = False, skip_correctness: SkipCorrectnessOpt = False,
    save: SaveOpt = None, seed: SeedOpt = 0, json_flag: JsonOpt = False, fmt: FormatOpt = Format.table,
) -> int:
    """Benchmark the CUDA paged-attention kernel against a contiguous-KV baseline (correctness and speed);
    --device cpu runs the reference implementations at small sizes."""
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"--device {device!r} is not one of auto, cuda, cpu")
    if save is not None:
        check_output_path("--save", save)  # before a run of minutes
    require_torch("bench", device)
    from ..cuda_ext.backends import run_suite
    from ..cuda_ext.bench import total_steps

    config = _bench_config(
        _pick_device(device), dtype=dtype, head_dim=head_dim, q_heads=q_heads, kv_heads=kv_heads, batch=batch,
        context=context, block_size=block_size, iters=iters, warmup=warmup, splits=splits, sweep_block=sweep_block,
        correctness=not skip_correctness, flex=not no_flex, seed=seed)
    output_format = resolve_format(json_flag, fmt)
    with progress_bar("kvcalc bench", total_steps(config)) as advance:

        def tick(description: str) -> None:
            advance(1, description=description)

        @contextlib.contextmanager
        def building() -> Iterator[None]:
            # The bar's spinner turns while nvcc runs (one live display: no separate status).
            advance(0, description="building the CUDA extension (nvcc, first use only; about a minute)")
            yield

        doc = run_suite(config, tick, building)
    if save is not None:
        save.write_text(to_json(doc) + "\n")
    emit(_report(doc), output_format)
    return 0 if doc["passed"] else 1
