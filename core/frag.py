"""The computation behind `kvcalc frag`: fixed reservation vs paging for one set of lengths, in one result."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import paging
from .spec.models import ModelSpec

DEFAULT_BLOCK_SIZES = (16, 32)  # vLLM's default block size and the next one, as in the worked example


@dataclass(frozen=True)
class ModelBytes:
    """The same comparison in bytes for `spec` at `dtype_bits` per scalar; `paged` aligns with the token results."""

    spec: ModelSpec
    dtype_bits: int
    fixed: paging.KvBytes
    paged: list[paging.KvBytes]

    @property
    def kv_cache_groups(self) -> int:
        return paging.kv_cache_groups(self.spec)


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


def analyse(
    tokens: np.ndarray,
    block_sizes: list[int],
    max_len: int | None = None,
    per_sequence: bool = False,
    spec: ModelSpec | None = None,
    dtype_bits: int = 16,
) -> FragAnalysis:
    """Equations 2–3 for the lengths `tokens` int64 [N]; `max_len` defaults to the next power of two."""
    if max_len is None:
        max_len = paging.default_max_len(int(tokens.max()))
    fixed = paging.fixed_reservation(tokens, max_len)
    paged = paging.paged_allocations(tokens, block_sizes, max_len)
    rows = paging.per_sequence(tokens, block_sizes, max_len) if per_sequence else None
    model_bytes = None
    if spec is not None:
        model_bytes = ModelBytes(
            spec,
            dtype_bits,
            paging.fixed_kv_bytes(tokens, spec, dtype_bits, fixed),
            [paging.paged_kv_bytes(tokens, spec, dtype_bits, p) for p in paged],
        )
    return FragAnalysis(fixed, paged, rows, model_bytes)
