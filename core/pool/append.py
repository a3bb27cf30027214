"""A sequence's block table and how it grows: `SeqTable`, and `write_tokens`, the store side of
`BlockPool.append` (the pool checks first, then calls it, then registers any blocks the append completed).

    append(seq, n, keys)     fill the last block, then fresh blocks; when the last block is partially
                             filled and another table holds it too (a fork), it is copied first
                             (copy-on-write: the caller's kernel copies src -> dst) — no block with ref > 1
                             is written
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .prefix_lookup import PrefixIndex
from .store import BlockKeys, BlockStore


@dataclass(slots=True)
class SeqTable:
    """One live sequence: its block table and how far its content is hashed."""

    table: np.ndarray  # int64 [capacity]; table[:num_blocks] is the block table
    num_blocks: int
    num_tokens: int
    extra_id: int
    num_hashed: int  # leading blocks whose chain hash is known
    last_hash: int  # hash of block num_hashed - 1 (the root hash when 0)
    hit_tokens: int = 0
    num_skipped: int = 0  # leading logical blocks freed (a sliding, chunked or state group): NULL_BLOCK entries

    @property
    def blocks(self) -> np.ndarray:
        """int64 [num_blocks - num_skipped]: the blocks the table holds (a view), skipped entries left out."""
        return self.table[self.num_skipped : self.num_blocks]

    def extend(self, blocks: np.ndarray | list[int]) -> None:
        """Append `blocks` to the block table (its capacity doubled past the new length where it is short)."""
        n, m = self.num_blocks, len(blocks)
        if n + m > len(self.table):
            self.table = np.concatenate([self.table, np.empty(2 * (n + m), dtype=np.int64)])
        self.table[n : n + m] = blocks
        self.num_blocks = n + m


def write_tokens(
    store: BlockStore, seq: SeqTable, num_tokens: int, last: int, copy: bool, new_total: int
) -> list[tuple[int, int]]:
    """Reserve slots for `num_tokens` (>= 1) more tokens of `seq`, which the store has room for, growing its
    table to `new_total` blocks: copy its partially filled `last` block (-1: the last block is full) first
    when `copy` (the caller found it shared: no block with ref > 1 is written), fill it, then fresh blocks.
    Returns the copy-on-write copies [(src, dst)]."""
    B, old = store.block_size, seq.num_tokens
    copies: list[tuple[int, int]] = []
    if last >= 0:
        if copy:
            last = copy_last_block(store, seq, last, copies)
        added = min(B - old % B, num_tokens)  # NOTE: inline, not a call: decode appends take this path
        store.fill[last] += added
        store.useful_tokens += added
    if new_total > len(seq.table):
        seq.table = np.concatenate([seq.table, np.empty(2 * new_total, dtype=np.int64)])
    new_blocks = new_total - seq.num_blocks
    if new_blocks:
        last_fill = old + num_tokens - (new_total - 1) * B
        if new_blocks == 1:
            seq.table[seq.num_blocks] = store.take_one(last_fill)
        else:
            seq.table[seq.num_blocks : new_total] = store.take(new_blocks, (new_blocks - 1) * B + last_fill)
    seq.num_blocks, seq.num_tokens = new_total, old + num_tokens
    return copies


def copy_last_block(store: BlockStore, seq: SeqTable, last: int, copies: list[tuple[int, int]]) -> int:
    """Copy-on-write of `seq`'s partially filled last block `last`, which another table holds too (no block
    with ref > 1 is written): `seq` gets a fresh copy, the copy goes into `copies`. Returns the copy's id."""
    dst = store.take_one(int(store.fill[last]))
    store.ref[last] -= 1  # others still hold it (ref was > 1)
    seq.table[seq.num_blocks - 1] = dst
    copies.append((last, dst))
    store.counters["cow_copies"] += 1
    return dst


def completed_keys(prefix: PrefixIndex, seq: SeqTable, old: int, new: int, block_keys: BlockKeys) -> np.ndarray | None:
    """The keys (int64 [k], checked) of the blocks that tokens old..new-1 of `seq` complete, to register once
    they are written; None when nothing is to be registered (no keys, no prefix caching, or the chain of
    hashed blocks stopped before the block of token `old`)."""
    B = prefix.store.block_size
    if block_keys is None or not prefix.store.enable_prefix_caching or seq.num_hashed != old // B:
        # (a state group whose state was written over rejected drafts has num_hashed -1: never hashed again)
        return None
    keys = prefix.key_array(block_keys)
    completed = new // B - seq.num_hashed
    if len(keys) > completed:
        raise ValueError(f"{len(keys)} block keys for {completed} completed blocks")
    return keys


def register_completed(prefix: PrefixIndex, seq: SeqTable, keys: np.ndarray | None) -> None:
    """Register the blocks `keys` name (from `completed_keys`), chained after the sequence's last hashed one."""
    if keys is not None and len(keys):
        seq.last_hash = prefix.register_continuation(seq.table, seq.num_hashed, seq.extra_id, seq.last_hash, keys)
        seq.num_hashed += len(keys)
