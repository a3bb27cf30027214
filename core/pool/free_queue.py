"""The free side of the block pool: which free block is handed out next.

A free block is in exactly one of two places:

    plain stack   free blocks with no content worth keeping (never hashed, or their hash was dropped);
                  handed out first, last-in first-out (order does not matter, nothing is lost).
    LRU queue     free blocks that still hold a hashed, full block of KV (a prefix-cache entry). They
                  stay revivable by a cache hit until handed out again; the least recently freed one is
                  evicted (handed out) first, once the plain stack is empty — lazy eviction.

Why not vLLM's intrusive doubly linked list? It gives the same O(1) operations — append at the tail,
pop at the head, unlink from the middle when a cache hit revives a free block — but every one is a few
Python-level pointer writes per block. Here the queue is a flat array of block ids with *lazy deletion*:
appending writes ids at the tail, a revival only marks the block as no longer free (its entry becomes a
tombstone, recognised because the block's `stamp` no longer points at that position), and popping skips
tombstones. Each of these is O(1) per block (popping amortised: every tombstone is skipped once), and —
what matters in Python — a request's hundreds of blocks are appended, revived or popped with a few numpy
calls instead of hundreds of pointer updates. When the tail reaches the end of the array the live entries
are compacted to the front (O(live), at most once per `capacity` appends, so amortised O(1)).

The pool owns the per-block `state` array; this module only reads and writes it for the blocks it holds.
"""

from __future__ import annotations

import numpy as np

# Per-block states (int8); the pool keeps them in one array shared with this queue.
USED = 0  # ref > 0: in at least one block table
FREE_PLAIN = 1  # free, no content to keep
FREE_CACHED = 2  # free, holds a hashed full block, revivable
PENDING = 3  # ref == 0 but a running step may still read it (deferred free); not reusable yet


_NO_BLOCKS = np.empty(0, dtype=np.intp)


class FreeBlockQueue:
    """Plain stack + lazily deleted LRU array over block ids 0..num_blocks-1.

    state   int8  [num_blocks]  shared with the pool (USED / FREE_PLAIN / FREE_CACHED / PENDING)
    stamp   int32 [num_blocks]  position of a FREE_CACHED block's live entry in `_lru`
    _plain  int32 [num_blocks]  the plain stack (top at _plain_top - 1)
    """

    def __init__(self, num_blocks: int, state: np.ndarray) -> None:
        self._state = state
        state[:] = FREE_PLAIN
        # pop from the end: block 0 first. Stored as int32 (half the memory of a multi-million-block pool),
        # handed out as intp: popped ids index the pool's per-block arrays, and numpy converts an int32 index
        # array on every use (a few µs a call) — the pop copies anyway
        self._plain = np.arange(num_blocks - 1, -1, -1, dtype=np.int32)
        self._plain_top = num_blocks
        self._lru = np.empty(2 * num_blocks + 2, dtype=np.int32)
        self._head = 0  # first position that may hold a live entry
        self._tail = 0  # next position to write
        self.stamp = np.full(num_blocks, -1, dtype=np.int32)
        self.num_cached = 0

    @property
    def num_plain(self) -> int:
        return self._plain_top

    def __len__(self) -> int:
        return self._plain_top + self.num_cached

    # ---- adding -------------------------------------------------------------------------------
    def push_plain(self, block_ids: np.ndarray) -> None:
        n = len(block_ids)
        self._plain[self._plain_top : self._plain_top + n] = block_ids
        self._plain_top += n
        self._state[block_ids] = FREE_PLAIN

    def push_cached(self, block_ids: np.ndarray) -> None:
        """Append at the LRU tail in the given order (the first one is evicted first)."""
        n = len(block_ids)
        if self._tail + n > len(self._lru):
            self._compact()
        self._lru[self._tail : self._tail + n] = block_ids
        self.stamp[block_ids] = np.arange(self._tail, self._tail + n, dtype=np.int32)
        self._tail += n
        self.num_cached += n
        self._state[block_ids] = FREE_CACHED

    # ---- removing -------------------------------------------------------------------------------
    def revive(self, block_ids: np.ndarray) -> None:
        """Take FREE_CACHED blocks out of the LRU (cache hits); their entries become tombstones."""
        self.stamp[block_ids] = -1
        self.num_cached -= len(block_ids)
        self._state[block_ids] = USED

    def pop_plain_one(self) -> int:
        """One block from the plain stack (the caller checked num_plain > 0), in scalar steps."""
        self._plain_top -= 1
        block = int(self._plain[self._plain_top])
        self._state[block] = USED
        return block

    def pop(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Hand out `n` free blocks: plain ones first, then LRU evictions (oldest first).

        Returns (plain_ids, evicted_ids), intp; the caller checked that len(self) >= n. Both come back in
        state USED; evicted blocks still carry their old hash, which the caller drops.
        """
        take_plain = min(n, self._plain_top)
        plain = self._plain[self._plain_top - take_plain : self._plain_top][::-1].astype(np.intp)
        self._plain_top -= take_plain
        need = n - take_plain
        evicted = _NO_BLOCKS
        if need:
            parts = []
            while need:
                window = max(2 * need, 64)
                pos = np.arange(self._head, min(self._head + window, self._tail))
                ids = self._lru[pos].astype(np.intp)
                live = (self._state[ids] == FREE_CACHED) & (self.stamp[ids] == pos)
                live_pos = pos[live]
                if len(live_pos) > need:
                    live_pos = live_pos[:need]
                    self._head = int(live_pos[-1]) + 1
                else:
                    self._head = int(pos[-1]) + 1
                parts.append(self._lru[live_pos])
                need -= len(live_pos)
            evicted = np.concatenate(parts).astype(np.intp, copy=False)
            self.stamp[evicted] = -1
            self.num_cached -= len(evicted)
        self._state[plain] = USED
        if len(evicted):
            self._state[evicted] = USED
        return plain, evicted

    # ---- inspection -----------------------------------------------------------------------------
    def order(self) -> list[int]:
        """Block ids in the order they would be handed out (plain stack, then LRU head to tail)."""
        return self._plain[: self._plain_top][::-1].tolist() + self.cached_order().tolist()

    def cached_order(self) -> np.ndarray:
        """The cached free blocks in the order hand-outs evict them (LRU head to tail)."""
        pos = np.arange(self._head, self._tail)
        ids = self._lru[pos]
        return ids[(self._state[ids] == FREE_CACHED) & (self.stamp[ids] == pos)]

    def check(self) -> None:
        """Assert the queue's own invariants (used by the pool's check_invariants)."""
        plain = self._plain[: self._plain_top]
        assert np.all(self._state[plain] == FREE_PLAIN), "a block on the plain free stack is not FREE_PLAIN"
        assert np.bincount(plain).max(initial=0) <= 1, "a block is twice on the plain free stack"  # O(n), no sort
        assert int(np.sum(self._state == FREE_PLAIN)) == self._plain_top, "FREE_PLAIN blocks missing from the stack"
        pos = np.arange(self._head, self._tail)
        ids = self._lru[pos]
        live = ids[(self._state[ids] == FREE_CACHED) & (self.stamp[ids] == pos)]
        cached = np.flatnonzero(self._state == FREE_CACHED)
        assert len(live) == self.num_cached == len(cached), (
            f"LRU holds {len(live)} live entries, counter {self.num_cached}, FREE_CACHED blocks {len(cached)}"
        )
        assert np.array_equal(np.sort(live), cached), "LRU entries and FREE_CACHED blocks differ"

    def _compact(self) -> None:
        pos = np.arange(self._head, self._tail)
        ids = self._lru[pos]
        live = ids[(self._state[ids] == FREE_CACHED) & (self.stamp[ids] == pos)]
        self._lru[: len(live)] = live
        self.stamp[live] = np.arange(len(live))
        self._head, self._tail = 0, len(live)
