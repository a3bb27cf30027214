"""What the block pool reports (usage, counters) and what it promises (its invariants).

`ReleaseReason` names why a sequence's blocks go back (each has a counter in `PoolStats`). `PoolUsage` is a
snapshot: physical blocks by state, logical vs physical blocks (what sharing saves), useful tokens,
tail-block fragmentation and block-table bytes. `PoolStats` holds counters since creation. What the pool
promises is checked in invariants.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum

from ..blocks import BLOCK_TABLE_ENTRY_BYTES


class ReleaseReason(str, Enum):
    """Why a sequence ends; all of them release through the pool's one path (a str, so "cancelled" works)."""

    FINISHED = "finished"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    PREEMPTED = "preempted"

    @property
    def counter(self) -> str:
        """Its counter in PoolStats."""
        return f"released_{self.value}"


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
    def shared_saved_blocks(self) -> int:
        """Blocks that sharing saves now: logical - physical."""
        return self.logical_blocks - self.used_blocks

    @property
    def tail_fragmentation_slots(self) -> int:
        """Allocated but unwritten slots in used blocks (the partly filled last blocks)."""
        return self.used_blocks * self.block_size - self.useful_tokens

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
