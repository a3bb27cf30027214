"""Equations 2 and 3 in bytes for a model: what fixed reservation and paging allocate in every layer.

A paged engine allocates one block per B token positions in every full-attention layer, so those layers
hold A_B(n) positions. A sliding-window layer only keeps the last h = min(n, window) positions
[n − h, n): the blocks that still hold one of them are blocks floor((n − h)/B) … ceil(n/B) − 1, i.e.
ceil(n/B) − floor(max(n − window, 0)/B) blocks (engines such as vLLM free the rest); fixed reservation
gives such a layer a ring buffer of min(M, window). Block ids address a block in every layer of a
KV-cache group, so each sequence has one block table per group: one group, or two when a model mixes
full and sliding-window layers (vLLM's hybrid allocator keeps a table per group).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .paging import PASS_CHUNK, FixedReservation, PagedAllocation, exact_sum
from .spec.models import ModelSpec


@dataclass(frozen=True)
class KvBytes:
    """KV bytes of one scheme for a model; `block_size` None means fixed reservation."""

    block_size: int | None
    useful_kv_bytes: int
    allocated_kv_bytes: int
    block_table_bytes_exact: int = 0
    block_table_bytes_dense: int = 0

    @property
    def waste_kv_bytes(self) -> int:
        """Tail-block fragmentation (paged) or reservation waste (fixed)."""
        return self.allocated_kv_bytes - self.useful_kv_bytes


def _layer_positions_to_bytes(layer_positions: int, spec: ModelSpec, dtype_bits: int) -> int:
    bits = layer_positions * spec.scalars_per_token_per_layer * dtype_bits
    if bits % 8:
        raise ValueError(f"{spec.name} at {dtype_bits}-bit leaves a fraction of a byte: pick a wider --dtype")
    return bits // 8


def kv_cache_groups(spec: ModelSpec) -> int:
    """Block tables per sequence: 2 for models that mix full and sliding-window layers, else 1."""
    return 2 if 0 < spec.num_sliding_layers < spec.layers else 1


def useful_kv_bytes(tokens: np.ndarray, spec: ModelSpec, dtype_bits: int) -> int:
    """Σ over sequences of equation 1 (sliding-window layers hold at most `window` tokens)."""
    positions = spec.num_global_layers * exact_sum(tokens)
    if spec.num_sliding_layers:
        window = spec.sliding_window
        held = _chunked_sum(tokens, lambda chunk, out: np.minimum(chunk, window, out=out))
        positions += spec.num_sliding_layers * held
    return _layer_positions_to_bytes(positions, spec, dtype_bits)


def _chunked_sum(tokens: np.ndarray, transform: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> int:
    """Σ transform(chunk) over the lengths, exact; `transform(chunk, out)` writes into a reused scratch, so
    a pass over 10^9 lengths allocates 2 MiB instead of 8 GB."""
    scratch = np.empty(min(tokens.size, PASS_CHUNK), dtype=np.int64)
    return sum(
        exact_sum(transform(tokens[i : i + PASS_CHUNK], scratch[: min(PASS_CHUNK, tokens.size - i)]))
        for i in range(0, tokens.size, PASS_CHUNK)
    )


def fixed_kv_bytes(tokens: np.ndarray, spec: ModelSpec, dtype_bits: int, fixed: FixedReservation) -> KvBytes:
    per_seq = spec.num_global_layers * fixed.max_len
    if spec.num_sliding_layers:
        per_seq += spec.num_sliding_layers * min(fixed.max_len, spec.sliding_window)
    allocated = _layer_positions_to_bytes(fixed.num_seqs * per_seq, spec, dtype_bits)
    return KvBytes(None, useful_kv_bytes(tokens, spec, dtype_bits), allocated)


def paged_kv_bytes(tokens: np.ndarray, spec: ModelSpec, dtype_bits: int, paged: PagedAllocation) -> KvBytes:
    """Bytes for one block size; `paged` is the token-level result for the same `tokens`."""
    b = paged.block_size
    positions = spec.num_global_layers * paged.allocated_tokens
    if spec.num_sliding_layers:
        window = spec.sliding_window

        def freed(chunk: np.ndarray, out: np.ndarray) -> np.ndarray:
            beyond = np.maximum(np.subtract(chunk, window, out=out), 0, out=out)  # positions out of the window
            return np.floor_divide(beyond, b, out=beyond)

        positions += spec.num_sliding_layers * b * (paged.num_blocks - _chunked_sum(tokens, freed))
    groups = kv_cache_groups(spec)
    return KvBytes(
        b,
        useful_kv_bytes(tokens, spec, dtype_bits),
        _layer_positions_to_bytes(positions, spec, dtype_bits),
        groups * paged.block_table_bytes_exact,
        groups * paged.block_table_bytes_dense,
    )
