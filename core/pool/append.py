"""Growing and sharing a sequence's block table: `append` (with copy-on-write of a shared, partially
filled last block) and `fork` — a mixin of `BlockPool`.

    fork(parent, child)      the child's table is a copy of the parent's; every block's ref += 1
    append(seq, n, keys)     fill the last block, then fresh blocks; when the last block is partially
                             filled and another table holds it too, it is copied first (copy-on-write:
                             the caller's kernel copies src -> dst) — no block with ref > 1 is written
    keys                     optionally name the blocks the append completes: they are registered in the
                             prefix cache, chained after the sequence's last hashed block

Check, then change: `can_append` asks; a failing append raises before changing anything.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..blocks import ceil_div
from .prefix_cache import chain_hashes
from .store import PoolExhaustedError

if TYPE_CHECKING:
    from .block_pool import BlockPool
    from .store import BlockKeys


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


class AppendAndFork:
    """`append`, `can_append` and `fork` of `BlockPool` (see the module docstring)."""

    def can_append(self: BlockPool, seq_id: Hashable, num_tokens: int) -> bool:
        return self._append_blocks_from_queue(self._seq(seq_id), num_tokens) <= len(self.queue)

    def append(
        self: BlockPool, seq_id: Hashable, num_tokens: int, block_keys: BlockKeys = None
    ) -> list[tuple[int, int]]:
        """Reserve slots for `num_tokens` more tokens; returns the copy-on-write copies [(src, dst)].

        `block_keys` optionally names the content of the blocks this append completes, in order.
        """
        seq = self._seq(seq_id)
        if num_tokens < 0:
            raise ValueError(f"cannot append a negative number of tokens ({num_tokens})")
        if num_tokens == 0:
            return []
        B, old = self.block_size, seq.num_tokens
        new_total = ceil_div(old + num_tokens, B)
        last = int(seq.table[seq.num_blocks - 1]) if old % B else -1
        copy = last >= 0 and self._needs_copy(last)  # = _append_blocks_from_queue, keeping what it reads
        need = new_total - seq.num_blocks + copy
        if need > len(self.queue):
            raise PoolExhaustedError(f"appending {num_tokens} tokens needs {need} blocks, {len(self.queue)} free")
        keys = None
        if block_keys is not None and self.enable_prefix_caching and seq.num_hashed == old // B:
            keys = self._key_array(block_keys)
            completed = (old + num_tokens) // B - seq.num_hashed
            if len(keys) > completed:
                raise ValueError(f"{len(keys)} block keys for {completed} completed blocks")
        self._epoch += 1
        copies: list[tuple[int, int]] = []
        if last >= 0:
            if copy:
                dst = self._take_one()
                self.fill[dst] = self.fill[last]
                self.ref[last] -= 1  # others still hold it (ref was > 1)
                self.useful_tokens += int(self.fill[dst])
                seq.table[seq.num_blocks - 1] = dst
                copies.append((last, dst))
                self._stats["cow_copies"] += 1
                last = dst
            assert not self._needs_copy(last), f"writing into block {last} held by {self.ref[last]} tables"
            added = min(B - old % B, num_tokens)
            self.fill[last] += added
            self.useful_tokens += added
        if new_total > len(seq.table):
            seq.table = np.concatenate([seq.table, np.empty(2 * new_total, dtype=np.int64)])
        if new_total - seq.num_blocks == 1:
            b = self._take_one()
            last_fill = old + num_tokens - (new_total - 1) * B
            self.fill[b] = last_fill
            self.useful_tokens += last_fill
            seq.table[seq.num_blocks] = b
            fresh = ()
        else:
            fresh = self._take(new_total - seq.num_blocks)
        if len(fresh):
            last_fill = old + num_tokens - (new_total - 1) * B
            self.fill[fresh] = B
            self.fill[fresh[-1]] = last_fill
            self.useful_tokens += (len(fresh) - 1) * B + last_fill
            seq.table[seq.num_blocks : new_total] = fresh
        self.logical_blocks += new_total - seq.num_blocks
        self.logical_tokens += num_tokens
        seq.num_blocks, seq.num_tokens = new_total, old + num_tokens
        if keys is not None and len(keys):
            hashes = chain_hashes(seq.last_hash, keys)
            first = seq.num_hashed
            seq.num_hashed += len(keys)
            seq.last_hash = int(hashes[-1])
            homes = self._continued_homes(seq.table, first, hashes)
            self._register(seq.table, first, seq.extra_id, hashes, keys, homes)
        return copies

    def fork(self: BlockPool, parent_id: Hashable, child_id: Hashable) -> None:
        """The child shares every block of the parent (no copy until one of them writes a shared block)."""
        parent = self._seq(parent_id)
        if child_id in self.seqs:
            raise ValueError(f"sequence {child_id!r} already has a block table; pick a new id for the fork")
        self._epoch += 1
        table = parent.table.copy()
        self.ref[table[: parent.num_blocks]] += 1
        self.seqs[child_id] = SeqTable(
            table, parent.num_blocks, parent.num_tokens, parent.extra_id, parent.num_hashed, parent.last_hash
        )
        self.logical_blocks += parent.num_blocks
        self.logical_tokens += parent.num_tokens
        self._stats["forks"] += 1

    def _needs_copy(self: BlockPool, block_id: int) -> bool:
        """A partially filled last block held by another table must be copied before we write it."""
        return bool(self.ref[block_id] > 1)

    def _append_blocks_from_queue(self: BlockPool, seq: SeqTable, num_tokens: int) -> int:
        if num_tokens <= 0:
            return 0
        B = self.block_size
        new = self.blocks_needed(seq.num_tokens + num_tokens) - seq.num_blocks
        copy = seq.num_tokens % B != 0 and self._needs_copy(int(seq.table[seq.num_blocks - 1]))
        return new + int(copy)
