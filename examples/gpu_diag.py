"""Kernel diagnostics for a GPU session, after examples/gpu_check.sh: what limits the decode kernel.

    python3 examples/gpu_diag.py OUT_DIR [--budget-s 60]

Writes OUT_DIR/diag.json and prints a table. Three sweeps, each at bf16, head dim 128, block 16, timed
like `kvcalc bench` (CUDA events, L2 flushed, median):
  * group: 8 KV heads with 8, 16, 32, 64, 128 query heads at (64, 4K). Same K/V bytes, more math per byte:
    flat times mean memory-bound, times that grow with the group mean issue-bound (the math, shuffles and
    shared-memory traffic per tile limit it, not HBM).
  * splits: (1, 32K) with 1..128 split-KV partitions, and the heuristic's choice marked: is the
    heuristic near the best split count?
  * shape: achieved TB/s against a device-to-device copy for the issue's shapes, contiguous layout only
    (paging excluded), to separate kernel efficiency from paging overhead.
Each measurement that fails is recorded with its error; the script stops a sweep when the time budget
is spent. Never a product path: a helper for whoever tunes the kernel next.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvcalc.cuda_ext.bench import DecodeInputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("gpu_diag: no CUDA device visible to torch; nothing to measure", file=sys.stderr)
        return 3

    from kvcalc.cuda_ext import ops
    from kvcalc.cuda_ext.bench import bytes_moved, make_inputs
    from kvcalc.cuda_ext.timing import CudaTimer

    device = torch.device("cuda")
    timer = CudaTimer(device)
    gen = torch.Generator(device=device).manual_seed(0)
    start = time.monotonic()
    props = torch.cuda.get_device_properties(device)
    copy_tbps = timer.copy_tbps(iters=args.iters, warmup=3)
    doc: dict[str, Any] = {"device": props.name, "sm_count": props.multi_processor_count, "copy_tbps": copy_tbps,
                           "group": [], "splits": [], "shape": []}

    def time_it(batch: int, context: int, q_heads: int, splits: int | None, paged: bool) -> dict[str, Any]:
        row: dict[str, Any] = {"batch": batch, "context": context, "q_heads": q_heads, "kv_heads": 8,
                               "splits": splits, "layout": "paged" if paged else "contiguous"}
        try:
            x = make_inputs([context] * batch, q_heads, 8, 128, 16, torch.bfloat16, device, gen)
            x = dataclasses.replace(x, out=torch.empty_like(x.q))
            us = timer.median_us(lambda: _launch(ops, x, splits, paged), iters=args.iters, warmup=3)
            moved = bytes_moved([context] * batch, q_heads, 8, 128, 16 if paged else None)
            tbps = moved / (us * 1e-6) / 1e12
            row.update(us=us, bytes=moved, tbps=tbps, fraction_of_copy=tbps / copy_tbps)
        except Exception as exc:  # record and go on: a diagnostic must not sink the session's run
            row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return row

    sm = props.multi_processor_count
    heuristic = ops.choose_num_splits(1, 8, 32768, sm)
    sweeps = _sweeps(heuristic)
    for name, cases in sweeps.items():
        for case in cases:
            if time.monotonic() - start > args.budget_s:
                doc.setdefault("skipped", []).append(f"{name} {case}: time budget of {args.budget_s:g} s spent")
                continue
            doc[name].append(time_it(*case))
            torch.cuda.empty_cache()
    doc["heuristic_splits_1x32k"] = heuristic
    doc["elapsed_s"] = time.monotonic() - start
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "diag.json").write_text(json.dumps(doc, indent=2) + "\n")

    _print_table(doc, list(sweeps))
    return 0


def _sweeps(heuristic: int) -> dict[str, list[tuple[int, int, int, int | None, bool]]]:
    """Each sweep's cases (batch, context, query heads, splits or None for the heuristic's, paged)."""
    return {
        "group": [(64, 4096, q, None, True) for q in (8, 16, 32, 64, 128)],
        "splits": [(1, 32768, 32, s, True) for s in sorted({1, 2, 4, 8, 16, 32, 64, 128, heuristic})],
        "shape": [(b, c, 32, None, False) for b, c in ((1, 32768), (8, 8192), (32, 4096), (64, 4096), (128, 2048),
                                                       (256, 1024))],
    }


def _print_table(doc: dict[str, Any], sweeps: list[str]) -> None:
    """diag.json's rows as a table on stdout, sweep by sweep (a failed measurement shows its error)."""
    print(f"{doc['device']}, {doc['sm_count']} SMs, copy {doc['copy_tbps']:.3f} TB/s; heuristic splits at 1x32K: "
          f"{doc['heuristic_splits_1x32k']}")
    print(f"{'sweep':<7} {'batch':>5} {'ctx':>6} {'qh':>4} {'splits':>6} {'layout':>10} {'us':>9} {'TB/s':>6} "
          f"{'%copy':>6}")
    for name in sweeps:
        for r in doc[name]:
            tail = (f"{r['us']:9.1f} {r['tbps']:6.3f} {100 * r['fraction_of_copy']:5.1f}%" if "us" in r
                    else r.get("error", ""))
            print(f"{name:<7} {r['batch']:5d} {r['context']:6d} {r['q_heads']:4d} {r['splits']!s:>6} "
                  f"{r['layout']:>10} {tail}")


def _launch(ops: Any, x: DecodeInputs, splits: int | None, paged: bool) -> Any:
    """One unchecked launch into x.out (shapes come from make_inputs, which the harness validates)."""
    if paged:
        return ops.paged_decode_attention(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens,
                                          num_splits=splits, out=x.out, validate=False)
    return ops.contiguous_decode_attention(x.q, x.k, x.v, x.seq_lens, num_splits=splits, out=x.out,
                                           validate=False)


if __name__ == "__main__":
    sys.exit(main())
