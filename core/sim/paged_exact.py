"""The paged policy with block tables kept current at every step: what a plan needs to carry slots,
copy-on-write copies and the block ids of swaps, and what forks (parallel sampling) need.

`PagedPolicy` owes decode blocks to the pool and takes them in one append later (fast, and exact for every
count the simulator reports); here every growth is appended at once, so after each scheduler call the
pool's block tables are the requests' real ones. Decisions are the same as the owing policy's: the fit
check counts the same new blocks, plus the copy-on-write copies that only forks can cause:

    a partially filled last block held by h tables (a parent and its forks), g of which grow this step,
    is copied min(g, h − 1) times — every grower copies it except the last holder, which writes in place.

Memory parts come from the pool's own accounting once a fork has happened (a shared tail block then
counts once, not once per table).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ..blocks import ceil_div
from .paged import PagedPolicy


class ExactPagedPolicy(PagedPolicy):
    """PagedPolicy whose block tables are current after every call; supports `fork` (see the module docstring)."""

    exact_block_tables = True

    def __init__(self, num_blocks: int, block_size: int, num_requests: int,
                 prompt_keys: list | np.ndarray | None = None) -> None:
        super().__init__(num_blocks, block_size, num_requests, prompt_keys)
        self.copies: list[tuple[int, int]] = []  # copy-on-write copies not yet taken by a plan
        self.forked = False

    # NOTE: runs through finishes take every request's growth first and its release after; appended at once,
    # that growth could need blocks that only the releases free
    releases_in_segment = False

    def grow_many(self, rids: np.ndarray, totals: np.ndarray, new_blocks: int | None = None,
                  check: bool = True) -> bool:
        blocks = ceil_div(totals, self.block_size)
        if check and new_blocks is None:
            need = int((blocks - self.held_blocks[rids]).sum()) + self._copies_needed(rids, totals)
            if need > self.pool.num_free_blocks:
                return False
        self.held_tokens[rids] = totals
        self.held_blocks[rids] = blocks
        for rid in rids[totals != self.pool_tokens[rids]].tolist():
            self.copies += self._pool_append(rid)
        return True

    def grow(self, rid: int, total: int) -> bool:
        return self.grow_many(np.array([rid]), np.array([total]))

    def _copies_needed(self, rids: np.ndarray, totals: np.ndarray) -> int:
        if not self.forked:
            return 0
        B = self.block_size
        holders = Counter(int(self.pool.block_table(r)[-1]) for r in self._live_ids() if self.pool_tokens[r] % B)
        growing = Counter(int(self.pool.block_table(r)[-1]) for r, t in zip(rids.tolist(), totals.tolist(), strict=True)
                          if t > self.pool_tokens[r] and self.pool_tokens[r] % B)
        return sum(min(g, holders[b] - 1) for b, g in growing.items())

    def fork(self, parent: int, child: int) -> None:
        self.pool.fork(parent, child)
        self.pool_tokens[child] = self.held_tokens[child] = self.pool_tokens[parent]
        self.held_blocks[child] = self.held_blocks[parent]
        self.forked = True

    def block_table(self, rid: int) -> np.ndarray:
        return self.pool.block_table(rid)

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    def parts(self, tokens: np.ndarray, head_rid: int | None) -> tuple[np.ndarray, int]:
        if not self.forked:
            return super().parts(tokens, head_rid)
        usage = self.pool.usage()
        B = self.block_size
        used, cached = usage.used_blocks * B, usage.cached_free_blocks * B
        parts = np.array([usage.useful_tokens, usage.tail_fragmentation_slots, 0, 0, cached,
                          self.capacity_slots - used - cached], dtype=np.int64)
        return parts, usage.block_table_bytes

    def decode_steps_available(self, tokens: np.ndarray) -> tuple[int, np.ndarray | None]:
        assert not self.forked, "fast-forwarded runs do not count copy-on-write: run forks step by step"
        return super().decode_steps_available(tokens)
