"""The computation behind `kvcalc frag`: fixed reservation vs paging for one set of lengths, in one result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import paged_bytes, paging
from .host_memory import check_fits
from .spec.models import ModelSpec
from .units import format_count_short

DEFAULT_BLOCK_SIZES = (16, 32)  # vLLM's default block size and the next one, as in the worked example
# Per-sequence rows leave as Python ints, dicts, table rows and JSON text: about 140 bytes per value with
# --json (measured with tracemalloc over 10^5 rows, records + table + JSON text), besides their int64 columns.
_ROW_OUTPUT_BYTES_PER_VALUE = 150


@dataclass(frozen=True)
class ModelBytes:
    """The same comparison in bytes for `spec` at `dtype_bits` per scalar; `paged` aligns with the token results."""

    spec: ModelSpec
    dtype_bits: int
    fixed: paged_bytes.KvBytes
    paged: list[paged_bytes.KvBytes]

    @property
    def kv_cache_groups(self) -> int:
        return paged_bytes.kv_cache_groups(self.spec)


@dataclass(frozen=True, eq=False)
class FragAnalysis:
    """Fixed reservation to `fixed.max_len` vs paging with each block size (ascending)."""

    fixed: paging.FixedReservation
    paged: list[paging.PagedAllocation]
    per_sequence: paging.PerSequence | None = None
    model_bytes: ModelBytes | None = None

    @property
    def block_sizes(self) -> list[int]:
        return [p.block_size for p in self.paged]


def block_sizes_for(blocks: list[int] | None, sweep: bool) -> list[int]:
    """The union of the given block sizes and (with `sweep`) 1, 2, 4 … 256; 16 and 32 when neither is given."""
    sizes = sorted(set(blocks or ()) | set(paging.SWEEP_BLOCK_SIZES if sweep else ()))
    sizes = sizes or list(DEFAULT_BLOCK_SIZES)
    paging.check_block_sizes(sizes)
    return sizes


def memory_needed(num_lengths: int, num_block_sizes: int, per_sequence: bool, lengths_held: bool) -> int:
    """Bytes `analyse` holds at its peak beyond the lengths (which add 8 a length unless `lengths_held`):
    with per-sequence rows, 2 + 2 per block size int64 columns and their output; otherwise only a pass's
    scratch, which is small enough to leave out."""
    lengths = 0 if lengths_held else 8 * num_lengths
    if not per_sequence:
        return lengths
    columns = 3 + 2 * num_block_sizes  # the row number, n, M − n, then A_B(n) and W_B(n) per block size
    return lengths + num_lengths * columns * (8 + _ROW_OUTPUT_BYTES_PER_VALUE)


def check_memory(num_lengths: int, num_block_sizes: int, per_sequence: bool, lengths_held: bool) -> None:
    """Refuse, before any allocation, an analysis that would not fit in the memory available (the fix
    names `per_sequence`, or `count`: the sample size of `load_lengths`)."""
    rows = " with per-sequence rows" if per_sequence else " (8 bytes each)"
    what = f"{format_count_short(num_lengths)} lengths{rows}"
    needed = memory_needed(num_lengths, num_block_sizes, per_sequence, lengths_held)
    if per_sequence:
        check_fits(needed, what, "drop per_sequence or give fewer lengths", "per_sequence")
    else:
        check_fits(needed, what, "lower count", "count")


def analyse(
    tokens: np.ndarray,
    block_sizes: list[int],
    max_len: int | None = None,
    per_sequence: bool = False,
    spec: ModelSpec | None = None,
    dtype_bits: int = 16,
    progress: Callable[[int], None] | None = None,
) -> FragAnalysis:
    """Equations 2–3 for the lengths `tokens` int64 [N]; `max_len` defaults to the next power of two.
    `progress(n)`: n more lengths through the paging pass (the one that grows with the block sizes)."""
    if max_len is None:
        max_len = paging.default_max_len(int(tokens.max()))
    if per_sequence:
        check_memory(int(tokens.size), len(block_sizes), per_sequence, lengths_held=True)
    fixed, paged = paging.fixed_and_paged(tokens, block_sizes, max_len, progress)
    rows = paging.per_sequence(tokens, block_sizes, max_len) if per_sequence else None
    model_bytes = None
    if spec is not None:
        model_bytes = ModelBytes(
            spec,
            dtype_bits,
            paged_bytes.fixed_kv_bytes(tokens, spec, dtype_bits, fixed),
            [paged_bytes.paged_kv_bytes(tokens, spec, dtype_bits, p) for p in paged],
        )
    return FragAnalysis(fixed, paged, rows, model_bytes)
