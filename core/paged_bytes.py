"""Equations 2 and 3 in bytes for a model: what fixed reservation and paging allocate in every layer.

A paged engine allocates one block per B token positions in every full-attention layer, so those layers
hold A_B(n) positions. A sliding-window layer only keeps the last h = min(n, window) positions
[n − h, n): the blocks that still hold one of them are blocks floor((n − h)/B) … ceil(n/B) − 1, i.e.
ceil(n/B) − floor(max(n − window, 0)/B) blocks (engines such as vLLM free the rest); fixed reservation
gives such a layer a ring buffer of min(M, window). Block ids address a block in every layer of a
KV-cache group, so each sequence has one block table per group: one for the full-attention layers and one
per window or chunk size (vLLM's hybrid allocator keeps a table per group). The bits of a held token in
each kind of layer come from the model's layer groups (core/model/layers.py, equation 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .model.layers import bits_to_bytes, window_terms
from .model.models import ModelSpec
from .paging import PASS_CHUNK, FixedReservation, PagedAllocation, exact_sum


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


def kv_cache_groups(spec: ModelSpec) -> int:
    """Block tables per sequence: one per distinct window among the layers that keep KV (full-attention
    layers one, each window or chunk size another; vLLM's hybrid allocator keeps a table per group)."""
    return len(window_terms(spec.layer_groups, 1))


def useful_kv_bytes(tokens: np.ndarray, spec: ModelSpec, dtype_bits: int) -> int:
    """Σ over sequences of equation 1 (each layer holds at most its window or chunk)."""
    bits = 0
    for window, bits_per_token in window_terms(spec.layer_groups, dtype_bits).items():
        if window is None:
            bits += bits_per_token * exact_sum(tokens)
        else:
            bits += bits_per_token * _chunked_sum(tokens, lambda chunk, out, w=window: np.minimum(chunk, w, out=out))
    return bits_to_bytes(bits)


def _chunked_sum(tokens: np.ndarray, transform: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> int:
    """Σ transform(chunk) over the lengths, exact; `transform(chunk, out)` writes into a reused scratch, so
    a pass over 10^9 lengths allocates 2 MiB instead of 8 GB."""
    scratch = np.empty(min(tokens.size, PASS_CHUNK), dtype=np.int64)
    return sum(
        exact_sum(transform(tokens[i : i + PASS_CHUNK], scratch[: min(PASS_CHUNK, tokens.size - i)]))
        for i in range(0, tokens.size, PASS_CHUNK)
    )


def fixed_kv_bytes(tokens: np.ndarray, spec: ModelSpec, dtype_bits: int, fixed: FixedReservation) -> KvBytes:
    per_seq = sum(bits_per_token * (fixed.max_len if window is None else min(fixed.max_len, window))
                  for window, bits_per_token in window_terms(spec.layer_groups, dtype_bits).items())
    return KvBytes(None, useful_kv_bytes(tokens, spec, dtype_bits), bits_to_bytes(fixed.num_seqs * per_seq))


def paged_kv_bytes(tokens: np.ndarray, spec: ModelSpec, dtype_bits: int, paged: PagedAllocation) -> KvBytes:
    """Bytes for one block size; `paged` is the token-level result for the same `tokens`. A chunked layer
    counts as a window of its chunk size (at most C tokens: an upper bound on its current chunk)."""
    b = paged.block_size
    bits = 0
    for window, bits_per_token in window_terms(spec.layer_groups, dtype_bits).items():
        if window is None:
            bits += bits_per_token * paged.allocated_tokens
            continue

        def freed(chunk: np.ndarray, out: np.ndarray, w: int = window) -> np.ndarray:
            beyond = np.maximum(np.subtract(chunk, w, out=out), 0, out=out)  # positions out of the window
            return np.floor_divide(beyond, b, out=beyond)

        bits += bits_per_token * b * (paged.num_blocks - _chunked_sum(tokens, freed))
    groups = kv_cache_groups(spec)
    return KvBytes(
        b,
        useful_kv_bytes(tokens, spec, dtype_bits),
        bits_to_bytes(bits),
        groups * paged.block_table_bytes_exact,
        groups * paged.block_table_bytes_dense,
    )
