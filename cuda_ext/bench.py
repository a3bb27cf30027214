"""The `kvcalc bench` harness: correctness against a float64 reference, then paged vs contiguous timing.

Two back ends run the same harness:
  * "cuda": the CUDA extension (ops.py), timed with CUDA events (timing.py), plus torch SDPA on the
    contiguous cache and FlexAttention over the paged cache where torch has it;
  * "cpu": the pure-torch references of reference.py in float32 at small sizes ("reference
    implementation on CPU"), timed with the wall clock — a check that anyone can run, not a kernel figure.

Bytes moved per decode step: bench_inputs.py, with the inputs and the back-end interface; the correctness grid:
bench_correctness.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..core.errors import ParameterError
from ..core.units import format_int_short
from .bench_correctness import (
    GRID_BLOCK_SIZES,
    GRID_DTYPES,
    GRID_GROUPS,
    GRID_HEAD_DIMS,
    GRID_KV_HEADS,
    TOLERANCE,
    CorrectnessRow,
    correctness_grid,
    correctness_summary,
)
from .bench_inputs import Backend, DecodeInputs, bytes_moved, make_inputs, torch_dtype

__all__ = ["CPU_LABEL", "CPU_SHAPES", "CPU_TIMING_THREADS", "CUDA_SHAPES", "GRID_KV_HEADS", "SWEEP_BLOCK_SIZES",
           "SWEEP_SHAPE", "TOLERANCE", "Backend", "BenchConfig", "CorrectnessRow", "DecodeInputs", "TimingRow",
           "bytes_moved", "correctness_grid", "correctness_summary", "make_inputs", "pinned_cpu_threads",
           "run_bench", "torch_dtype", "total_steps"]

CUDA_SHAPES = ((1, 32768), (8, 8192), (32, 4096), (64, 4096), (128, 2048), (256, 1024))
CPU_SHAPES = ((1, 2048), (4, 512), (8, 256))
SWEEP_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SWEEP_SHAPE = {"cuda": (64, 4096), "cpu": (4, 512)}
CPU_LABEL = "reference implementation on CPU"
MAX_RUNS = 100_000  # timed or warm-up runs of one shape: a median is stable long before; 1e18 would never end
IDENTICAL_WHY = (
    "bit-identical: paged and contiguous run the same kernel code with the same tiles, split points and "
    "accumulation order; only the address of each 16-byte load differs"
)
CPU_IDENTICAL_WHY = "bit-identical: the paged reference gathers K/V through the table, then runs the same math"


@dataclass(frozen=True)
class BenchConfig:
    device: str  # "cuda" or "cpu"
    dtype: str = "bf16"
    head_dim: int = 128
    num_q_heads: int = 32
    num_kv_heads: int = 8
    block_size: int = 16
    shapes: tuple[tuple[int, int], ...] = CUDA_SHAPES  # (batch, context) pairs
    iters: int = 50
    warmup: int = 5
    sweep_block: bool = False
    correctness: bool = True
    flex: bool = True  # time FlexAttention's paged attention where torch has it (compiles on first use)
    num_splits: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ParameterError(f"device {self.device!r} is not one of cuda, cpu", "device")
        if self.dtype not in TOLERANCE:
            raise ParameterError(f"dtype {self.dtype!r} is not supported by the kernel; use fp16 or bf16", "dtype")
        if self.head_dim not in (64, 128, 256):
            raise ParameterError(f"head_dim {format_int_short(self.head_dim)} is not supported; use 64, 128 or 256",
                                 "head_dim")
        if self.num_kv_heads < 1:
            raise ParameterError(f"num_kv_heads {format_int_short(self.num_kv_heads)} must be at least 1",
                                 "num_kv_heads")
        if self.num_q_heads < 1 or self.num_q_heads % self.num_kv_heads or not 1 <= self.group <= 16:
            raise ParameterError(f"num_q_heads {format_int_short(self.num_q_heads)} must be 1 to 16 times num_kv_heads "
                                 f"{format_int_short(self.num_kv_heads)} (the kernel's GQA group sizes)", "num_q_heads",
                                 "num_kv_heads")
        if not 1 <= self.block_size <= 256 or self.block_size & (self.block_size - 1):
            raise ParameterError(f"block_size {format_int_short(self.block_size)} must be a power of two in 1..256",
                                 "block_size")
        for batch, context in self.shapes:
            if batch < 1 or context < 1:
                raise ParameterError(f"batch {format_int_short(batch)} and context {format_int_short(context)} must "
                                     "both be at least 1", "batch", "context")
        if self.iters < 1:
            raise ParameterError(f"iters {self.iters} must be at least 1 (timed runs; the median is reported)",
                                 "iters")
        if self.warmup < 0:
            raise ParameterError(f"warmup {self.warmup} must be 0 or more", "warmup")
        for name, runs in (("iters", self.iters), ("warmup", self.warmup)):
            if runs > MAX_RUNS:
                raise ParameterError(f"{name} {format_int_short(runs)} is more than {MAX_RUNS:,} runs of each shape "
                                     "(a median is stable long before, and a CUDA run records two events a run): "
                                     f"lower {name}", name)
        if self.num_splits is not None and not 1 <= self.num_splits <= 1024:
            raise ParameterError(f"num_splits {format_int_short(self.num_splits)} must lie in 1..1024", "num_splits")
        if self.seed < 0:
            raise ParameterError(f"seed {self.seed} must be 0 or more", "seed")

    @property
    def group(self) -> int:
        return self.num_q_heads // max(self.num_kv_heads, 1)


@dataclass(frozen=True)
class TimingRow:
    """One timed shape; `to_dict()` is its record in the JSON's "timing" / "block_sweep" lists: these fields
    in order, then `extras` (an optional comparator's time, e.g. sdpa_us, and its *_error when it failed)."""

    batch: int
    context: int
    block_size: int
    paged_us: float
    contiguous_us: float
    paged_over_contiguous: float
    bytes: int
    achieved_tbps: float
    fraction_of_copy: float | None
    timed_outputs_match: bool
    extras: tuple[tuple[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extras"}
        return {**fields, **dict(self.extras)}


def _document_head(config: BenchConfig, backend: Backend, device_info: dict[str, Any],
                   copy_tbps: float | None) -> dict[str, Any]:
    """The JSON document's first keys, its correctness and timing lists still empty."""
    return {
        "device": device_info,
        "implementation": backend.label,
        "config": {
            "dtype": config.dtype, "head_dim": config.head_dim, "num_q_heads": config.num_q_heads,
            "num_kv_heads": config.num_kv_heads, "block_size": config.block_size, "iters": config.iters,
            "warmup": config.warmup, "seed": config.seed, "num_splits": config.num_splits,
        },
        "copy_tbps": copy_tbps,
        "correctness": [],
        "timing": [],
    }


def _correctness_part(doc: dict[str, Any], config: BenchConfig, backend: Backend, device: Any,
                      tick: Callable[[str], None]) -> list[CorrectnessRow]:
    """Runs the correctness grid (unless skipped) into `doc`: its rows and the paged-vs-contiguous verdict."""
    if not config.correctness:
        return []
    grid = correctness_grid(backend, device, config.seed, tick)
    doc["correctness"] = [row.to_dict() for row in grid]
    max_diff = max(row.paged_vs_contiguous_max_diff for row in grid)
    why = IDENTICAL_WHY if config.device == "cuda" else CPU_IDENTICAL_WHY
    doc["paged_vs_contiguous"] = {
        "bit_identical": max_diff == 0.0,
        "max_diff": max_diff,
        "explanation": why if max_diff == 0.0 else f"not bit-identical (max diff {max_diff:.3g}): a failure",
    }
    return grid


def _time_extras(x: DecodeInputs, extra_timers: dict[str, Callable[[DecodeInputs], Callable[[], Any] | None]] | None,
                 time_op: Callable[..., float]) -> list[tuple[str, Any]]:
    """Each optional comparator's time (SDPA, FlexAttention), or None and its error: one must not sink the run."""
    extras: list[tuple[str, Any]] = []
    for name, make in (extra_timers or {}).items():
        try:
            op = make(x)
            extras.append((name, time_op(op, None) if op is not None else None))
        except Exception as exc:
            extras.append((name, None))
            extras.append((name.removesuffix("_us") + "_error",
                           f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"))
    return extras


def run_bench(config: BenchConfig, backend: Backend, *, time_op: Callable[..., float], device: Any,
              device_info: dict[str, Any], copy_tbps: float | None, tick: Callable[[str], None],
              extra_timers: dict[str, Callable[[DecodeInputs], Callable[[], Any] | None]] | None = None
              ) -> dict[str, Any]:
    """Runs the suite and returns the JSON document of `kvcalc bench`."""
    import torch

    doc = _document_head(config, backend, device_info, copy_tbps)
    grid = _correctness_part(doc, config, backend, device, tick)
    gen = torch.Generator(device=device).manual_seed(config.seed + 1)

    def measure(batch: int, context: int, block_size: int, with_extras: bool) -> TimingRow:
        tick(f"timing batch={batch} context={context} block={block_size}")
        lens = [context] * batch
        x = make_inputs(lens, config.num_q_heads, config.num_kv_heads, config.head_dim, block_size,
                        torch_dtype(config.dtype), device, gen)
        expected = backend.paged(x, config.num_splits).clone()  # validated once; timed launches skip the checks
        out = torch.empty_like(x.q)
        timed = dataclasses.replace(x, out=out)  # with `out`: no checks, no allocation per run
        poison = lambda: out.fill_(float("nan"))  # noqa: E731
        paged_us = time_op(lambda: backend.paged(timed, config.num_splits), poison)
        # The output was poisoned before the last timed run: it must hold the full, same answer again.
        outputs_match = bool(torch.equal(timed.out, expected))
        contiguous_us = time_op(lambda: backend.contiguous(timed, config.num_splits), poison)
        outputs_match = outputs_match and bool(torch.equal(timed.out, expected))
        moved = bytes_moved(lens, config.num_q_heads, config.num_kv_heads, config.head_dim, block_size)
        tbps = moved / (paged_us * 1e-6) / 1e12
        extras = _time_extras(x, extra_timers if with_extras else None, time_op)
        return TimingRow(
            batch=batch, context=context, block_size=block_size, paged_us=paged_us, contiguous_us=contiguous_us,
            paged_over_contiguous=paged_us / contiguous_us, bytes=moved, achieved_tbps=tbps,
            fraction_of_copy=tbps / copy_tbps if copy_tbps else None, timed_outputs_match=outputs_match,
            extras=tuple(extras),
        )

    timing = [measure(batch, context, config.block_size, with_extras=True) for batch, context in config.shapes]
    doc["timing"] = [row.to_dict() for row in timing]
    sweep: list[TimingRow] = []
    if config.sweep_block:
        batch, context = SWEEP_SHAPE[config.device]
        sweep = [measure(batch, context, bs, with_extras=False) for bs in SWEEP_BLOCK_SIZES]
        doc["block_sweep"] = [row.to_dict() for row in sweep]
    timed_rows = timing + sweep
    # `passed`: every check that ran passed; `correctness_checked` says whether the reference grid was one of
    # them (--skip-correctness leaves only the timed outputs compared with their own first run).
    doc["correctness_checked"] = config.correctness
    # Paged and contiguous run the same arithmetic on the same shapes (see IDENTICAL_WHY / CPU_IDENTICAL_WHY),
    # so a difference between them is a paging bug, not rounding: it fails the run, one verdict.
    identical = doc.get("paged_vs_contiguous", {}).get("bit_identical", True)
    doc["passed"] = identical and all(row.passed for row in grid) and all(
        row.timed_outputs_match for row in timed_rows)
    return doc


CPU_TIMING_THREADS = 1
CPU_TIMING_NOTE = (
    "CPU times: the pure-torch reference implementation, torch pinned to 1 thread (with its default threads one "
    "shape swung 1.15-3.3x between runs: they busy-wait while another process holds a core); a check of the "
    "harness, paged beside contiguous in one run, not a performance figure.")


@contextlib.contextmanager
def pinned_cpu_threads() -> Iterator[dict[str, Any]]:
    """Run the CPU timings on CPU_TIMING_THREADS intra-op torch thread(s), restored afterwards; yields what the
    JSON's device record says about it (threads used, torch's default, and the note)."""
    import torch

    default = torch.get_num_threads()
    torch.set_num_threads(CPU_TIMING_THREADS)
    try:
        yield {"threads": CPU_TIMING_THREADS, "threads_default": default, "threads_pinned": True,
               "timing_note": CPU_TIMING_NOTE}
    finally:
        torch.set_num_threads(default)


def total_steps(config: BenchConfig) -> int:
    grid = len(GRID_DTYPES) * len(GRID_HEAD_DIMS) * len(GRID_GROUPS) * len(GRID_BLOCK_SIZES)
    copy_ceiling = 1 if config.device == "cuda" else 0
    return copy_ceiling + (grid if config.correctness else 0) + len(config.shapes) + (
        len(SWEEP_BLOCK_SIZES) if config.sweep_block else 0)
