"""Memory policies of the allocation ablation: where a running request's KV lives.

    paged           the real block pool (core/pool), block size B, prefix caching from Mooncake hash_ids
                    or token ids; blocks are taken when a request crosses a block boundary, so it can run
                    out mid-decode (then the scheduler preempts).
    reserve-max     one contiguous region of the model's max length, reserved at admission;
    reserve-pow2    ... of the next power of two of the request's true length (prompt + output);
    reserve-oracle  ... of exactly its true length (an oracle that knows the output length).
                    Reservations come from a first-fit allocator (alloc.py), so external fragmentation
                    shows up; a reservation never grows, so these never preempt.

The policies live in paged.py and reserve.py and share the interface `MemoryPolicy` ("check, then
change": the calls that return False change nothing). Memory is accounted in token slots of the pool,
split into the parts of `MEMORY_PARTS`; block-table bytes are reported beside them. The scheduler samples
them every step.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..pool.block_pool import ReleaseReason

POLICIES = ("paged", "reserve-max", "reserve-pow2", "reserve-oracle")
MEMORY_PARTS = ("useful", "tail_fragmentation", "reservation_waste", "external_fragmentation", "cached_free", "free")
UNLIMITED_STEPS = 1 << 62


class MemoryPolicy(Protocol):
    """What the scheduler asks of a memory policy. Request ids are row indices of the workload."""

    name: str
    block_size: int
    capacity_slots: int
    exact_block_tables: bool  # block tables are current after every call (plans can carry slots and copies)

    @property
    def releases_in_segment(self) -> bool:
        """Fast-forwarded runs may go past finishes (block identities cannot matter); read only."""
        ...

    def never_fits(self, rid: int, total_tokens: int) -> bool:
        """Reject at arrival: the request's whole KV exceeds the pool."""
        ...

    def hit_tokens(self, rid: int, num_tokens: int) -> int:
        """Prefix-cache hit tokens of an admission computing `num_tokens` (a pure look-up)."""
        ...

    def can_admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool: ...

    def admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        """Memory for `total_tokens` (the first chunk), `start_tokens` of them hits or swapped back in."""
        ...

    def grow_many(self, rids: np.ndarray, totals: np.ndarray, new_blocks: int | None = None,
                  check: bool = True) -> bool:
        """Room for `totals[i]` tokens of each running request, or False and no change."""
        ...

    def grow(self, rid: int, total: int) -> bool: ...

    def release(self, rid: int, reason: ReleaseReason) -> None:
        """The one release path: finished, cancelled, timed out, preempted."""
        ...

    def fork(self, parent: int, child: int) -> None:
        """The child shares every block of the parent (parallel sampling)."""
        ...

    def block_table(self, rid: int) -> np.ndarray:
        """Physical block ids of a live request (only when `exact_block_tables`)."""
        ...

    def take_copies(self) -> list[tuple[int, int]]:
        """Copy-on-write copies (src, dst) made since the last call."""
        ...

    def parts(self, tokens: np.ndarray, head_rid: int | None) -> tuple[np.ndarray, int]:
        """(slots per MEMORY_PARTS [6], block-table bytes) now; running requests hold `tokens` [n]."""
        ...

    def decode_steps_available(self, tokens: np.ndarray) -> tuple[int, np.ndarray | None]:
        """(how many decode steps of requests holding `tokens` fit in memory, a plan for segment_integrals)."""
        ...

    def segment_integrals(self, tokens: np.ndarray, plan: np.ndarray | None, d: np.ndarray, head_rid: int | None,
                          plan_steps: np.ndarray) -> tuple[np.ndarray, float, int]:
        """(Σ_j d_j · parts_j, Σ_j d_j · table bytes_j, new blocks) over a fast-forwarded run of decode steps."""
        ...

    def finish_segment(self, rids: np.ndarray, tokens: np.ndarray, remaining: np.ndarray, d: np.ndarray,
                       useful: np.ndarray) -> tuple[int, np.ndarray, float]:
        """As segment_integrals for a run in which requests leave as they finish (nobody waits)."""
        ...

    def check_whole(self) -> None:
        """After the run: nothing held, invariants hold (AssertionError otherwise)."""
        ...
