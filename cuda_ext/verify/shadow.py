"""The content check: which token's K/V each physical slot holds, tracked beside the real KV cache.

The model's K/V at position p is a function of the tokens 0..p of its sequence, so every slot carries
the identity of that prefix (a chained hash, `prefix_ids`) and the position. The executor writes them with
every token, moves them with every copy-on-write copy and swap, and before each forward pass reads each
scheduled request's context back through its block table: a slot that holds another prefix (a block
reused while still read, a shared block written without a copy, a cache hit on stale content) is found
here by identity, independently of whether the model's tokens happen to change.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_EMPTY = -1


def prefix_ids(token_ids: Sequence[int]) -> np.ndarray:
    """int64 [len]: element p identifies the prefix token_ids[: p + 1] (a chained hash; equal prefixes,
    equal ids)."""
    out = np.empty(len(token_ids), dtype=np.int64)
    h = 0x2545F4914F6CDD1D
    for p, token in enumerate(token_ids):
        h = hash((h, int(token)))
        out[p] = h
    return out


class ShadowKV:
    """Per physical slot: the prefix id and position of the token whose K/V it holds (-1: never written)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.ident = np.full(num_blocks * block_size, _EMPTY, dtype=np.int64)
        self.pos = np.full(num_blocks * block_size, _EMPTY, dtype=np.int64)

    def _slots(self, block_ids: Sequence[int]) -> np.ndarray:
        blocks = np.asarray(block_ids, dtype=np.int64)
        return (blocks[:, None] * self.block_size + np.arange(self.block_size)).reshape(-1)

    def write(self, slots: np.ndarray, idents: np.ndarray, positions: np.ndarray) -> None:
        self.ident[slots] = idents
        self.pos[slots] = positions

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        if not pairs:
            return
        src, dst = self._slots([s for s, _ in pairs]), self._slots([d for _, d in pairs])
        self.ident[dst], self.pos[dst] = self.ident[src], self.pos[src]  # sources read before writes

    def save(self, block_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        slots = self._slots(block_ids)
        return self.ident[slots].copy(), self.pos[slots].copy()

    def restore(self, saved: tuple[np.ndarray, np.ndarray], block_ids: Sequence[int]) -> None:
        slots = self._slots(block_ids)
        self.ident[slots], self.pos[slots] = saved

    def first_wrong(self, table: np.ndarray, expected: np.ndarray) -> int | None:
        """The first position p < len(expected) whose slot through `table` does not hold prefix
        expected[: p + 1] at position p, or None when the whole context is right."""
        n = len(expected)
        if n == 0:
            return None
        positions = np.arange(n)
        slots = table[positions // self.block_size] * self.block_size + positions % self.block_size
        bad = np.flatnonzero((self.ident[slots] != expected) | (self.pos[slots] != positions))
        return int(bad[0]) if len(bad) else None
