"""The free side of the block pool: which free block is handed out next — vLLM v1's one free queue.

Every free block is in ONE queue (vLLM's FreeKVCacheBlockQueue), in the order it became free:

    at start     every block, in id order (block 0 at the head)
    freeing      a block whose last reference goes is appended at the tail, hashed or not (a request's table
                 tail first, so that a prefix's tail is evicted before its head; a sliding window's blocks in
                 the order its rule drops them)
    hand-out     pops the head: never-used blocks first, then freed ones in the order they were freed; a
                 popped block that still holds a hashed full block (a prefix-cache entry) is evicted then
    cache hit    a free hashed block found by a look-up leaves the queue from wherever it is ("touch")

So a cached block freed before a hash-less one is evicted before it (vLLM's BlockPool.get_new_blocks pops
the head whatever it holds); a free block's state says whether it holds an entry:

    FREE_PLAIN   free, no content to keep (never hashed, or its hash was dropped)
    FREE_CACHED  free, holds a hashed, full block, revivable by a hit until it is handed out again

Why not vLLM's intrusive doubly linked list? It gives the same O(1) operations — append at the tail,
pop at the head, unlink from the middle when a cache hit revives a free block — but every one is a few
Python-level pointer writes per block. Here the queue is a flat array of block ids with *lazy deletion*:
appending writes ids at the tail, a revival only unlinks the block's `stamp` (its entry becomes a tombstone,
recognised because the block's `stamp` no longer points at that position), and popping skips tombstones.
Each of these is O(1) per block (popping amortised: every tombstone is skipped once), and — what matters in
Python — a request's hundreds of blocks are appended, revived or popped with a few numpy calls instead of
hundreds of pointer updates. When the tail reaches the end of the array the live entries are compacted to
the front (O(live), at most once per `capacity` appends, so amortised O(1)).

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
    """One lazily deleted queue over block ids 0..num_blocks-1 (see the module docstring).

    `_eager`: appends write their stamps at once (a subclass that reads them directly); else `_restamp` writes them
    when something reads them — an append is then two slice writes, as a stack's push.

    state   int8  [num_blocks]  shared with the pool (USED / FREE_PLAIN / FREE_CACHED / PENDING)
    stamp   int32 [num_blocks]  position of a free block's live entry in `_lru` (-1 once revived; a handed-out
                                block's old position lies before the head, where no scan looks)
    _lru    int32 [2·num_blocks + 2]  the entries, head at `_head`, next write at `_tail`
    """

    _eager = False

    def __init__(self, num_blocks: int, state: np.ndarray) -> None:
        self._state = state
        state[:] = FREE_PLAIN
        # int32 (half the memory of a multi-million-block pool), handed out as intp: popped ids index the pool's
        # per-block arrays, and numpy converts an int32 index array on every use (a few µs a call)
        self._lru = np.empty(2 * num_blocks + 2, dtype=np.int32)
        self.stamp = np.arange(num_blocks, dtype=np.int32)
        self._lru[:num_blocks] = self.stamp  # at start: every block, in id order
        self._head = 0  # first position that may hold a live entry
        self._tail = num_blocks  # next position to write
        self._stamped = num_blocks  # entries from here to the tail have no stamp yet (`_restamp`)
        self._clean = num_blocks  # every entry from the head to here is live (no tombstone): a pop there is a slice
        self.num_cached = 0
        self._num_free = num_blocks

    @property
    def num_plain(self) -> int:
        return self._num_free - self.num_cached

    def __len__(self) -> int:
        return self._num_free

    # ---- adding -------------------------------------------------------------------------------
    def push_plain(self, block_ids: np.ndarray) -> None:
        """Append hash-less blocks at the tail in the given order (the first one is handed out first)."""
        self._append(block_ids)
        self._state[block_ids] = FREE_PLAIN

    def push_cached(self, block_ids: np.ndarray) -> None:
        """Append blocks that hold cache entries at the tail in the given order (the first one is evicted first)."""
        self._append(block_ids)
        self.num_cached += len(block_ids)
        self._state[block_ids] = FREE_CACHED

    def push(self, block_ids: np.ndarray, cached: np.ndarray, num_cached: int) -> None:
        """Append blocks at the tail in the given order, `cached` [n] bool marking those that hold cache entries
        (`num_cached` of them)."""
        self._append(block_ids)
        self.num_cached += num_cached
        self._state[block_ids] = np.where(cached, np.int8(FREE_CACHED), np.int8(FREE_PLAIN))

    def _append(self, block_ids: np.ndarray) -> None:
        n = len(block_ids)
        if self._tail + n > len(self._lru):
            self._compact()
        self._lru[self._tail : self._tail + n] = block_ids
        if self._clean == self._tail:
            self._clean += n
        if self._eager:
            self.stamp[block_ids] = np.arange(self._tail, self._tail + n, dtype=np.int32)
        self._tail += n
        self._num_free += n

    def _restamp(self) -> None:
        """Write the stamps of the entries appended since the last call (an append writes none: only a revival or
        a scan reads them; a block appended twice keeps the later entry's)."""
        lo = max(self._stamped, self._head)
        if lo < self._tail:
            self.stamp[self._lru[lo : self._tail]] = np.arange(lo, self._tail, dtype=np.int32)
        self._stamped = self._tail

    def uncache(self, block_ids: np.ndarray) -> None:
        """FREE_CACHED blocks whose cache entry the caller dropped stay where they are in the queue, hash-less."""
        self.num_cached -= len(block_ids)
        self._state[block_ids] = FREE_PLAIN

    # ---- removing -------------------------------------------------------------------------------
    def revive(self, block_ids: np.ndarray) -> None:
        """Take FREE_CACHED blocks out of the queue (cache hits); their entries become tombstones."""
        self._restamp()
        if len(block_ids):
            self._clean = min(self._clean, int(self.stamp[block_ids].min()))
        self.stamp[block_ids] = -1
        self.num_cached -= len(block_ids)
        self._num_free -= len(block_ids)
        self._state[block_ids] = USED

    def pop_plain_one(self) -> int:
        """The head block when it holds no cache entry, in scalar steps (USED now); -1, changing nothing, when the
        head is cached (the caller hands it out through `pop`, which evicts) or the queue is empty."""
        lru, stamp, head = self._lru, self.stamp, self._head
        if head >= self._clean:  # maybe a tombstone (no live entry is ever skipped: its stamp is its place)
            self._restamp()
            while head < self._tail and stamp[lru[head]] != head:
                head += 1
            self._clean = max(self._clean, min(head + 1, self._tail))
        self._head = head
        if head == self._tail:
            return -1
        block = int(lru[head])
        if self._state[block] != FREE_PLAIN:
            return -1
        self._head = head + 1
        self._num_free -= 1
        self._state[block] = USED
        return block

    def pop(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Hand out the `n` blocks at the head, in queue order.

        Returns (block ids, the evicted ones among them: those that held a cache entry), intp; the caller checked
        that len(self) >= n. All come back in state USED; evicted blocks still carry their old hash, which the
        caller drops.
        """
        head = self._head
        if head + n > self._clean and self._tail - head == self._num_free:  # no tombstone left at all
            self._clean = self._tail
        if head + n <= self._clean:  # no tombstone among the first n
            blocks = self._lru[head : head + n].astype(np.intp)
            self._head = head + n
        else:
            blocks = self._pop_skipping(n)
        self._num_free -= n  # their entries now lie before the head, where no scan looks (stamps kept)
        evicted = _NO_BLOCKS
        if self.num_cached:
            evicted = blocks[self._state[blocks] == FREE_CACHED]
            self.num_cached -= len(evicted)
        self._state[blocks] = USED
        return blocks, evicted

    def _pop_skipping(self, need: int) -> np.ndarray:
        self._restamp()
        parts = []
        while need:
            window = max(2 * need, 64)
            pos = np.arange(self._head, min(self._head + window, self._tail))
            live = self.stamp[self._lru[pos]] == pos
            live_pos = pos[live]
            self._clean = self._head = int(pos[-1]) + 1
            if len(live_pos) > need:
                live_pos = live_pos[:need]
                self._head = int(live_pos[-1]) + 1
                dead = np.flatnonzero(~live[self._head - int(pos[0]) :])  # the window's rest: clean up to a tombstone
                if len(dead):
                    self._clean = self._head + int(dead[0])
            parts.append(self._lru[live_pos])
            need -= len(live_pos)
        return np.concatenate(parts).astype(np.intp, copy=False)

    # ---- inspection -----------------------------------------------------------------------------
    def live(self, limit: int | None = None) -> np.ndarray:
        """The free blocks in hand-out order (head to tail; the first `limit` of them), int32."""
        if limit is not None and limit <= 0:
            return self._lru[:0]
        self._restamp()
        end = self._tail if limit is None else min(self._tail, self._head + max(2 * limit, 64))
        while True:
            pos = np.arange(self._head, end)
            ids = self._lru[pos]
            ids = ids[self.stamp[ids] == pos]
            if limit is None or len(ids) >= limit or end == self._tail:
                return ids if limit is None else ids[:limit]
            end = min(self._tail, self._head + 2 * (end - self._head))

    def order(self) -> list[int]:
        """Block ids in the order they would be handed out."""
        return self.live().tolist()

    def cached_order(self) -> np.ndarray:
        """The cached free blocks in the order hand-outs evict them (head to tail)."""
        ids = self.live()
        return ids[self._state[ids] == FREE_CACHED]

    def evictions_within(self, m: int) -> np.ndarray:
        """int64 [m + 1]: entry k is how many of the first k hand-outs from now evict a cache entry (past the
        queue's end: all of them)."""
        out = np.zeros(m + 1, dtype=np.int64)
        if self.num_cached and m > 0:
            ids = self.live(m)
            np.cumsum(self._state[ids] == FREE_CACHED, out=out[1 : len(ids) + 1])
            out[len(ids) + 1 :] = out[len(ids)]
        return out

    def check(self) -> None:
        """Assert the queue's own invariants (used by the pool's check_invariants)."""
        live = self.live()
        free = np.flatnonzero((self._state == FREE_PLAIN) | (self._state == FREE_CACHED))
        assert len(live) == self._num_free == len(free), (
            f"the queue holds {len(live)} live entries, counter {self._num_free}, free blocks {len(free)}"
        )
        assert np.array_equal(np.sort(live), free), "queue entries and free blocks differ"
        num_cached = int(np.count_nonzero(self._state == FREE_CACHED))
        assert num_cached == self.num_cached, f"{num_cached} FREE_CACHED blocks, counter {self.num_cached}"
        out = np.ones(len(self.stamp), dtype=bool)
        out[live] = False
        out = np.flatnonzero(out)
        at = self.stamp[out]
        inside = (at >= self._head) & (at < self._tail)
        assert not np.any(self._lru[at[inside]] == out[inside]), "a block out of the queue has a live entry"

    def _compact(self) -> None:
        live = self.live()
        self._lru[: len(live)] = live
        self.stamp[live] = np.arange(len(live), dtype=np.int32)
        self._head = 0
        self._tail = self._stamped = self._clean = len(live)
