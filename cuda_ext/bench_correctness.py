"""The correctness grid of `kvcalc bench` (bench.py): every dtype x head dim x group x block size against the
float64 reference, and its summary per (dtype, head dim)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .bench_inputs import Backend, make_inputs, torch_dtype

TOLERANCE = {"fp16": 2e-3, "bf16": 1e-2}  # max |err| / max |reference|
GRID_DTYPES = ("fp16", "bf16")
GRID_HEAD_DIMS = (64, 128, 256)
GRID_GROUPS = (1, 4, 16)
GRID_BLOCK_SIZES = (1, 16, 256)
GRID_KV_HEADS = 2


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
