"""The `kvcalc bench` harness: correctness against a float64 reference, then paged vs contiguous timing.

Two back ends run the same harness:
  * "cuda": the CUDA extension (ops.py), timed with CUDA events (timing.py), plus torch SDPA on the
    contiguous cache and FlexAttention over the paged cache where torch has it;
  * "cpu": the pure-torch references of reference.py in float32 at small sizes ("reference
    implementation on CPU"), timed with the wall clock — a check that anyone can run, not a kernel figure.

Bytes moved per decode step (what `bytes` counts): K and V of every live token, q, out, the live
block-table entries and seq_lens. Achieved TB/s = bytes / paged time (1 TB = 1e12 bytes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..core.errors import ParameterError
from ..core.units import format_int_short

CUDA_SHAPES = ((1, 32768), (8, 8192), (32, 4096), (64, 4096), (128, 2048), (256, 1024))
CPU_SHAPES = ((1, 2048), (4, 512), (8, 256))
SWEEP_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SWEEP_SHAPE = {"cuda": (64, 4096), "cpu": (4, 512)}
TOLERANCE = {"fp16": 2e-3, "bf16": 1e-2}  # max |err| / max |reference|
GRID_DTYPES = ("fp16", "bf16")
GRID_HEAD_DIMS = (64, 128, 256)
GRID_GROUPS = (1, 4, 16)
GRID_BLOCK_SIZES = (1, 16, 256)
GRID_KV_HEADS = 2
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


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


@dataclass(frozen=True)
class DecodeInputs:
    """One decode step's inputs in both layouts (make_inputs), the same K/V in each.

    q             [batch, num_q_heads, head_dim]
    k_cache       [num_blocks, block_size, num_kv_heads, head_dim]  the paged layout; v_cache the same
    block_tables  [batch, max_blocks] int32, physical block ids, unused entries -1
    seq_lens      [batch] int32
    k             [batch, max_len, num_kv_heads, head_dim]  the contiguous layout; v the same
    out           [batch, num_q_heads, head_dim] or None: where a timed run writes (no checks, no allocation);
                  None on untimed runs, which validate and allocate
    """

    q: Any
    k_cache: Any
    v_cache: Any
    block_tables: Any
    seq_lens: Any
    k: Any
    v: Any
    out: Any | None = None


def make_inputs(lens: list[int], num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: Any,
                device: Any, gen: Any) -> DecodeInputs:
    """Random q/K/V (standard normal) made on `device` with `gen` (a generator on that device), physical
    blocks in a random order, unused table entries -1, and the same K/V in the contiguous layout with
    max_len = the table capacity."""
    import torch

    from .reference import gather_paged_kv

    batch = len(lens)
    blocks = [math.ceil(n / block_size) for n in lens]
    max_blocks = max([*blocks, 1])
    num_blocks = sum(blocks) + 1
    order = torch.randperm(num_blocks, generator=gen, device=gen.device).cpu()
    tables = torch.full((batch, max_blocks), -1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = order[used:used + n].to(torch.int32)
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, dtype=dtype, device=device)
    v_cache = torch.randn(shape, generator=gen, dtype=dtype, device=device)
    q = torch.randn(batch, num_q_heads, head_dim, generator=gen, dtype=dtype, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    capacity = max_blocks * block_size
    return DecodeInputs(
        q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables.to(device), seq_lens=seq_lens.to(device),
        k=gather_paged_kv(k_cache, tables, seq_lens, capacity), v=gather_paged_kv(v_cache, tables, seq_lens, capacity),
    )


def bytes_moved(lens: list[int], num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int | None,
                elem_bytes: int = 2) -> int:
    """Unique bytes one decode step must move; `block_size` None: the contiguous layout (no block tables)."""
    kv = 2 * sum(lens) * num_kv_heads * head_dim * elem_bytes
    q_and_out = 2 * len(lens) * num_q_heads * head_dim * elem_bytes
    tables = 4 * sum(math.ceil(n / block_size) for n in lens) if block_size is not None else 0
    return kv + q_and_out + tables + 4 * len(lens)  # + seq_lens


class Backend:
    """Runs paged/contiguous decode for one input set; subclasses decide how and time it."""

    label: str

    def paged(self, x: DecodeInputs, num_splits: int | None) -> Any:
        raise NotImplementedError

    def contiguous(self, x: DecodeInputs, num_splits: int | None) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class CorrectnessRow:
    """One case of the correctness grid; `to_dict()` is its record in the JSON's "correctness" list."""

    dtype: str
    head_dim: int
    group_size: int
    block_size: int
    lengths: tuple[int, ...]
    max_abs_err: float
    rel_err: float  # max |err| / max |reference|
    tolerance: float
    paged_vs_contiguous_max_diff: float
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "lengths": list(self.lengths)}


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


def correctness_grid(backend: Backend, device: Any, seed: int, tick: Callable[[str], None]) -> list[CorrectnessRow]:
    """Every dtype x head dim x group x block size, with ragged lengths: 0, 1, mid-block, several blocks."""
    import torch

    from .reference import decode_attention_reference

    gen = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for dtype in GRID_DTYPES:
        for head_dim in GRID_HEAD_DIMS:
            for group in GRID_GROUPS:
                for block_size in GRID_BLOCK_SIZES:
                    tick(f"correctness {dtype} d={head_dim} group={group} block={block_size}")
                    lens = [0, 1, 2 * block_size + 3 if block_size > 1 else 5, 300, 700]
                    x = make_inputs(lens, GRID_KV_HEADS * group, GRID_KV_HEADS, head_dim, block_size,
                                    torch_dtype(dtype), device, gen)
                    paged = backend.paged(x, None)
                    contiguous = backend.contiguous(x, None)
                    ref = decode_attention_reference(x.q, x.k, x.v, x.seq_lens)
                    err = float((paged.double() - ref).abs().max())
                    rel = err / max(float(ref.abs().max()), 1e-30)
                    diff = float((paged.double() - contiguous.double()).abs().max())
                    zeros_ok = bool(torch.count_nonzero(paged[0]) == 0)
                    rows.append(CorrectnessRow(
                        dtype=dtype, head_dim=head_dim, group_size=group, block_size=block_size,
                        lengths=tuple(lens), max_abs_err=err, rel_err=rel, tolerance=TOLERANCE[dtype],
                        paged_vs_contiguous_max_diff=diff,
                        passed=bool(rel < TOLERANCE[dtype] and zeros_ok and math.isfinite(err)),
                    ))
    return rows


def correctness_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The grid's rows grouped by (dtype, head dim), in grid order: the worst errors and how many cases passed."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["dtype"], row["head_dim"]), []).append(row)
    return [
        {"dtype": dtype, "head_dim": dim, "cases": len(cases), "max_rel_err": max(r["rel_err"] for r in cases),
         "tolerance": cases[0]["tolerance"],
         "max_paged_vs_contiguous_diff": max(r["paged_vs_contiguous_max_diff"] for r in cases),
         "passed_cases": sum(r["passed"] for r in cases)}
        for (dtype, dim), cases in groups.items()
    ]


def run_bench(config: BenchConfig, backend: Backend, *, time_op: Callable[..., float], device: Any,
              device_info: dict[str, Any], copy_tbps: float | None, tick: Callable[[str], None],
              extra_timers: dict[str, Callable[[DecodeInputs], Callable[[], Any] | None]] | None = None
              ) -> dict[str, Any]:
    """Runs the suite and returns the JSON document of `kvcalc bench`."""
    import torch

    doc: dict[str, Any] = {
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
    grid: list[CorrectnessRow] = []
    if config.correctness:
        grid = correctness_grid(backend, device, config.seed, tick)
        doc["correctness"] = [row.to_dict() for row in grid]
        max_diff = max(row.paged_vs_contiguous_max_diff for row in grid)
        why = IDENTICAL_WHY if config.device == "cuda" else CPU_IDENTICAL_WHY
        doc["paged_vs_contiguous"] = {
            "bit_identical": max_diff == 0.0,
            "max_diff": max_diff,
            "explanation": why if max_diff == 0.0 else f"not bit-identical (max diff {max_diff:.3g}): a failure",
        }
    gen = torch.Generator(device=device).manual_seed(config.seed + 1)

    def measure(batch: int, context: int, block_size: int, with_extras: bool) -> TimingRow:
        tick(f"timing batch={batch} context={context} block={block_size}")
        lens = [context] * batch
        x = make_inputs(lens, config.num_q_heads, config.num_kv_heads, config.head_dim, block_size,
                        torch_dtype(config.dtype), device, gen)
        expected = backend.paged(x, config.num_splits).clone()  # validated once; timed launches skip the checks
        timed = dataclasses.replace(x, out=torch.empty_like(x.q))  # with `out`: no checks, no allocation per run
        poison = lambda: timed.out.fill_(float("nan"))  # noqa: E731
        paged_us = time_op(lambda: backend.paged(timed, config.num_splits), poison)
        # The output was poisoned before the last timed run: it must hold the full, same answer again.
        outputs_match = bool(torch.equal(timed.out, expected))
        contiguous_us = time_op(lambda: backend.contiguous(timed, config.num_splits), poison)
        outputs_match = outputs_match and bool(torch.equal(timed.out, expected))
        moved = bytes_moved(lens, config.num_q_heads, config.num_kv_heads, config.head_dim, block_size)
        tbps = moved / (paged_us * 1e-6) / 1e12
        extras: list[tuple[str, Any]] = []
        for name, make in (extra_timers or {}).items() if with_extras else ():
            try:  # an optional comparator (SDPA, FlexAttention) must not sink the run: record why it failed
                op = make(x)
                extras.append((name, time_op(op, None) if op is not None else None))
            except Exception as exc:
                extras.append((name, None))
                extras.append((name.removesuffix("_us") + "_error",
                               f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"))
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
