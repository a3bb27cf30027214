"""What the block pool reports (usage, counters) and what it promises (its invariants).

`PoolUsage` is a snapshot: physical blocks by state, logical vs physical blocks (what sharing saves),
useful tokens, tail-block fragmentation and block-table bytes. `PoolStats` holds counters since creation.
`check_pool_invariants` asserts the invariants of DESIGN.md "Block pool semantics" from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from ..blocks import BLOCK_TABLE_ENTRY_BYTES
from .free_queue import FREE_CACHED, FREE_PLAIN, PENDING, USED

if TYPE_CHECKING:
    from .block_pool import BlockPool



@dataclass(frozen=True)
class PoolUsage:
    """Pool state at one moment. Blocks: used + free + pending = num_blocks (free includes cached).

    useful_tokens   token slots written in used physical blocks (a shared block counts once)
    logical_tokens  Σ over live sequences of their tokens (a shared prefix counts once per sequence)
    """

    num_blocks: int
    block_size: int
    used_blocks: int
    cached_free_blocks: int
    free_blocks: int
    pending_free_blocks: int
    num_seqs: int
    logical_blocks: int
    logical_tokens: int
    useful_tokens: int
    max_table_blocks: int

    @property
    def uncached_free_blocks(self) -> int:
        return self.free_blocks - self.cached_free_blocks

    @property
    def physical_blocks(self) -> int:
        return self.used_blocks

    @property
    def shared_saved_blocks(self) -> int:
        """Blocks that sharing saves now: logical - physical."""
        return self.logical_blocks - self.used_blocks

    @property
    def tail_fragmentation_slots(self) -> int:
        """Allocated but unwritten slots in used blocks (the partly filled last blocks)."""
        return self.used_blocks * self.block_size - self.useful_tokens

    @property
    def tail_fragmentation(self) -> float:
        slots = self.used_blocks * self.block_size
        return self.tail_fragmentation_slots / slots if slots else 0.0

    @property
    def block_table_bytes(self) -> int:
        """Exact: one int32 entry per logical block of every live sequence."""
        return self.logical_blocks * BLOCK_TABLE_ENTRY_BYTES

    @property
    def dense_block_table_bytes(self) -> int:
        """A padded [num_seqs, max_table_blocks] int32 tensor, as a kernel launch takes it."""
        return self.num_seqs * self.max_table_blocks * BLOCK_TABLE_ENTRY_BYTES


@dataclass(frozen=True)
class PoolStats:
    """Counters since the pool was created."""

    allocated_blocks: int = 0  # fresh hand-outs (including copy-on-write destinations)
    cow_copies: int = 0
    evictions: int = 0  # cached free blocks handed out for new content
    hit_blocks: int = 0
    hit_tokens: int = 0
    prompt_tokens: int = 0  # tokens of every allocated prompt
    forks: int = 0
    released_finished: int = 0
    released_cancelled: int = 0
    released_timed_out: int = 0
    released_preempted: int = 0

    @classmethod
    def counter_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


def check_pool_invariants(pool: BlockPool) -> None:
    """Raise AssertionError naming the first broken invariant."""
    n, B = pool.num_blocks, pool.block_size
    state, ref = pool.state, pool.ref
    counts = np.bincount(state, minlength=4)
    used, plain, cached, pending = (int(counts[s]) for s in (USED, FREE_PLAIN, FREE_CACHED, PENDING))
    assert used + plain + cached + pending == n, "block states do not add up to the pool"
    assert used == pool.num_used, f"{used} USED blocks, counter says {pool.num_used}"
    assert plain + cached == len(pool.queue), "free-queue length differs from the free blocks"
    assert pending == 0 or pool._in_step, "blocks pending outside a step"
    pool.queue.check()
    assert np.all(ref[state != USED] == 0), "a free or pending block has ref > 0"
    # ref(b) = number of live tables holding b; a table holds a block at most once
    tables = [s.table[: s.num_blocks] for s in pool.seqs.values()]
    held = np.concatenate(tables) if tables else np.empty(0, dtype=np.int64)
    for t in tables:
        assert len(np.unique(t)) == len(t), "a block table holds one block twice"
    expected_ref = np.bincount(held, minlength=n)
    bad = np.flatnonzero(expected_ref != ref)
    assert len(bad) == 0, f"block {bad[:1].tolist()} ref {ref[bad[:1]].tolist()} but held by {expected_ref[bad[:1]]}"
    assert np.all(state[held] == USED), "a live table holds a free block"
    # every holder agrees on how full a block is: nobody wrote a shared block behind the others' back
    for s in pool.seqs.values():
        implied = np.minimum(B, s.num_tokens - B * np.arange(s.num_blocks))
        assert np.array_equal(pool.fill[s.table[: s.num_blocks]], implied), "a block's fill disagrees with a table"
    assert np.all(pool.fill[state == FREE_PLAIN] == 0), "a block on the plain free stack still holds tokens"
    assert pool.useful_tokens == int(pool.fill[state == USED].sum()), "useful-token counter is off"
    assert pool.logical_blocks == len(held), "logical-block counter is off"
    assert pool.logical_tokens == sum(s.num_tokens for s in pool.seqs.values()), "logical-token counter is off"
    # hash entries match their blocks; only full blocks are hashed; the LRU holds only hashed blocks
    pool.index.check()
    keys, vals = pool.index.items()
    assert pool.index.num_live == len(vals), "hash-index live count is off"
    assert np.all(pool.hashed[vals]) and np.array_equal(pool.block_hash[vals], keys), "a hash entry mismatches"
    assert int(pool.hashed.sum()) == len(vals), "a hashed block is missing from the hash index"
    assert np.all(pool.fill[pool.hashed] == B), "a hashed block is not full"
    assert np.all(pool.hashed[state == FREE_CACHED]), "an unhashed block sits in the LRU cache"
    if not pool.seqs and not pool._in_step:
        assert used == 0 and pending == 0, "no sequence is live but blocks are still used"
