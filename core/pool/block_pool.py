"""The KV block pool: per-sequence block tables over physical blocks, prefix cache, fork and copy-on-write.

The data structure (vLLM v1's block pool plus copy-on-write for forks):

    sequence "a"  tokens: |0 ........ 15|16 ....... 31|32 .. 36|          block_size B = 16
    block table   logical:      0              1           2
                  physical:   [ 7 ]          [ 2 ]       [ 9 ]  -> slot of token t = (table[t // B], t % B)

    pool of num_blocks physical blocks, each with
        ref      number of live block tables holding it (fork: ref += 1 per child table)
        version  raised each time the block is handed out for new content (fresh allocation, CoW copy);
                 a reader holding (id, version) detects a stale reference (`is_current`). A prefix-cache
                 revival hands out the *same* content, so it keeps the version.
        hash     for full blocks whose content key the caller gave: chained hash (see prefix_cache)
        fill     tokens written in it (B for a full block)

    a block is USED (ref > 0), PENDING (released during a step that may still read it), or free:
        plain stack  free, no content worth keeping          -> handed out first
        LRU queue    free, holds a hashed full block          -> revivable by a hit; evicted oldest-first
    (see free_queue for why the LRU is a lazily deleted array rather than an intrusive linked list)

Where it lives: block_store (per-block arrays; handing blocks out and back), prefix_lookup (content keys,
hashing, verified look-up, registration), block_append (append with copy-on-write, fork), pool_serve (one
request start to finish in one call), and here: sequences, release, the deferred-free window, reading.

Operations, all "check, then change" (a failed operation changes nothing; `can_*` asks first):

    allocate(seq, n, keys)   a prompt of n tokens; the longest verified cached prefix of full blocks is
                             reused (never the block of the last prompt token: it must be recomputed to
                             produce logits); returns the hit tokens. O(blocks) numpy work.
    append(seq, n, keys)     reserve slots for n more tokens (one decode token, a prefill chunk, or a whole
                             output); returns the copy-on-write copies [(src, dst)] a kernel must perform.
    fork(parent, child)      the child shares every block of the parent (ref += 1 each).
    release(seq, reason)     the one path for finish / cancel / timeout / preemption; a second release
                             of the same sequence raises (double free). Blocks whose ref drops to 0 go
                             to the free side — or, inside `step()`, wait until the step ends.
    serve(n, keys, m)        allocate n, append m, release, in one call (a replay's requests, one at a time).
    hit_tokens(n, keys)      the hits an allocate would get now, without changing anything.
    usage(), stats()         O(live sequences) accounting; check_invariants() O(pool) for tests.

Content keys: one per *full* block, an exact identity of its tokens — an int64 numpy array (e.g. Mooncake
`hash_id * (512 // B) + sub`) or a sequence of hashable objects (e.g. tuples of token ids), which the pool
interns to exact integer ids. One pool uses one kind. Keys may cover only a leading part of the full
blocks; blocks without a key are never hashed, and the chain stops there. `extra_key` (model, adapter)
seeds the chain, so different extra keys never share blocks. A replay of many prompts hashes them all at
once with `hash_prompts(keys, offsets)` and passes `.prompt(i)` (a `HashedKeys`) as block_keys: the same
look-up, verification and registration, without hashing each prompt again.

API changes (additive only, after the first commit):
    - `hit_tokens(num_tokens, block_keys, extra_key)`: the public prefix look-up (instead of `_probe`).
    - `hash_prompts(keys, offsets, extra_key)` and `HashedKeys` block keys (batch hashing for replays);
      `serve(num_tokens, block_keys, num_output_tokens, extra_key)`.
    - `hashed` is a property (a fresh bool array), computed from `block_slot`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

import numpy as np

from ..blocks import ceil_div
from .accounting import PoolStats, PoolUsage, check_pool_invariants
from .append import AppendAndFork, SeqTable
from .free_queue import FREE_CACHED, PENDING, USED
from .prefix_cache import HashedKeys, HashedPrompts, root_hash
from .prefix_lookup import PrefixLookup
from .serve import ServeOneRequest
from .store import BlockKeys, BlockStore, PoolExhaustedError

__all__ = [
    "BlockKeys", "BlockPool", "BlockRef", "HashedKeys", "HashedPrompts", "PoolExhaustedError", "PoolStats",
    "PoolUsage", "ReleaseReason",
]


class ReleaseReason(str, Enum):
    FINISHED = "finished"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    PREEMPTED = "preempted"


# the stats counter of each release reason, looked up by member or by value
_RELEASED = {key: f"released_{r.value}" for r in ReleaseReason for key in (r, r.value)}


@dataclass(frozen=True)
class BlockRef:
    """A reader's handle on a block's content: stale once the block is handed out for new content."""

    block_id: int
    version: int


class BlockPool(AppendAndFork, ServeOneRequest, PrefixLookup, BlockStore):
    """A fixed pool of `num_blocks` blocks of `block_size` token slots. See the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True) -> None:
        super().__init__(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching)
        self.seqs: dict[Hashable, SeqTable] = {}
        self._pending: list[np.ndarray] = []
        self._in_step = False
        self.logical_blocks = 0
        self.logical_tokens = 0

    @property
    def num_pending_free_blocks(self) -> int:
        return self.num_blocks - self.num_used - len(self.queue)

    # ---- check, then allocate -------------------------------------------------------------------
    def hit_tokens(self, num_tokens: int, block_keys: BlockKeys = None, extra_key: Hashable = None) -> int:
        """Prefix-cache hit tokens an `allocate` of this prompt would get now; a pure look-up (memoised,
        so a following can_allocate / allocate of the same arguments does not look up again)."""
        return len(self._probe(num_tokens, block_keys, extra_key)[0]) * self.block_size

    def can_allocate(self, num_tokens: int, block_keys: BlockKeys = None, extra_key: Hashable = None) -> bool:
        hits = self._probe(num_tokens, block_keys, extra_key)[0]
        return self._prompt_blocks_from_queue(num_tokens, hits) <= len(self.queue)

    def allocate(
        self, seq_id: Hashable, num_tokens: int, block_keys: BlockKeys = None, extra_key: Hashable = None
    ) -> int:
        """Give `seq_id` a block table for a prompt of `num_tokens`; returns the prefix-cache hit tokens."""
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id!r} already has a block table; release it first")
        hits, hashes, keys, homes, present, slots, extra_id = self._probe(num_tokens, block_keys, extra_key)
        B, num_hits = self.block_size, len(hits)
        total = ceil_div(num_tokens, B)
        if num_hits:  # = _prompt_blocks_from_queue, keeping the hits' states for below
            hit_state = self.state.take(hits)
            num_cached = np.count_nonzero(hit_state == FREE_CACHED)
            need = total - num_hits + num_cached
        else:
            need = total
        if need > len(self.queue):
            raise PoolExhaustedError(f"{num_tokens} tokens need more than the {len(self.queue)} free blocks")
        self._epoch += 1
        extra_id = self._extra_id(extra_key)
        if num_hits:
            if num_cached == num_hits:  # all of them revived from the cache (ref 0 -> 1)
                self.queue.revive(hits)
                self.ref[hits] = 1
                num_revived = num_hits
            else:
                revived = hits[hit_state != USED]
                self.queue.revive(hits[hit_state == FREE_CACHED])
                self.state[revived] = USED  # the PENDING ones, too
                self.ref[hits] += 1
                num_revived = len(revived)
            self.num_used += num_revived
            self.useful_tokens += B * num_revived
        evictions = self._stats["evictions"]
        fresh = self._take(total - num_hits)
        if len(fresh):
            self.fill[fresh] = B
            self.fill[fresh[-1]] = num_tokens - (total - 1) * B
        self.useful_tokens += num_tokens - num_hits * B  # fresh blocks hold every other token
        table = np.empty(max(total, 4) * 2, dtype=np.int64)
        if num_hits:
            table[:num_hits] = hits
        table[num_hits:total] = fresh
        seq = SeqTable(table, total, num_tokens, extra_id, len(keys), root_hash(extra_id), num_hits * B)
        if len(keys):
            seq.last_hash = int(hashes[-1])
            if num_hits < len(keys):
                present = present[num_hits:]
                if self._stats["evictions"] != evictions:
                    present = self._present_after_evictions(present)
                rest = slice(num_hits, None)
                self._register(table, num_hits, extra_id, hashes[rest], keys[rest], homes[rest], present, slots[rest])
        self.seqs[seq_id] = seq
        self.logical_blocks += total
        self.logical_tokens += num_tokens
        self._stats["hit_blocks"] += num_hits
        self._stats["hit_tokens"] += seq.hit_tokens
        self._stats["prompt_tokens"] += num_tokens
        return seq.hit_tokens

    # ---- release -------------------------------------------------------------------------------
    def release(self, seq_id: Hashable, reason: ReleaseReason = ReleaseReason.FINISHED) -> None:
        """The one release path (finish, cancel, timeout, preempt). Releasing twice raises ValueError."""
        counter = _RELEASED.get(reason) if isinstance(reason, str) else None
        if counter is None:
            raise ValueError(f"unknown release reason {reason!r}: use a ReleaseReason")
        seq = self.seqs.pop(seq_id, None)
        if seq is None:
            raise ValueError(f"sequence {seq_id!r} is not live: released twice (double free) or never allocated")
        self._epoch += 1
        table = seq.table[: seq.num_blocks]
        refs = self.ref[table]
        refs -= 1
        self.ref[table] = refs
        if not np.count_nonzero(refs):
            # the common case, no block shared: all of them drop (every ref is 0, so none went below), and
            # together they hold exactly the sequence's tokens (each holder agrees on every block's fill)
            self._drop(table[::-1], seq.num_tokens)  # tail first: the tail is the least shareable
        else:
            assert refs.min() >= 0, "a reference count went below zero"
            self._drop(table[refs == 0][::-1])
        self.logical_blocks -= seq.num_blocks
        self.logical_tokens -= seq.num_tokens
        self._stats[counter] += 1

    # ---- the deferred-free window ---------------------------------------------------------------
    def begin_step(self) -> None:
        """From now on, blocks released are not reusable until `end_step` (a running step may read them)."""
        if self._in_step:
            raise ValueError("begin_step called twice: end the running step first")
        self._in_step = True

    def end_step(self) -> None:
        if not self._in_step:
            raise ValueError("end_step without begin_step")
        self._in_step = False
        self._epoch += 1
        for chunk in self._pending:
            self._free(chunk[self.state[chunk] == PENDING])
        self._pending.clear()

    @contextmanager
    def step(self) -> Iterator[None]:
        self.begin_step()
        try:
            yield
        finally:
            self.end_step()

    # ---- reading --------------------------------------------------------------------------------
    def block_table(self, seq_id: Hashable) -> np.ndarray:
        seq = self._seq(seq_id)
        return seq.table[: seq.num_blocks].copy()

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._seq(seq_id).num_tokens

    def has_seq(self, seq_id: Hashable) -> bool:
        return seq_id in self.seqs

    def block_ref(self, block_id: int) -> BlockRef:
        return BlockRef(int(block_id), int(self.version[block_id]))

    def is_current(self, ref: BlockRef) -> bool:
        """True while the block still holds the content the reference was taken on."""
        return int(self.version[ref.block_id]) == ref.version

    def free_queue_order(self) -> list[int]:
        return self.queue.order()

    def usage(self) -> PoolUsage:
        max_table = max((s.num_blocks for s in self.seqs.values()), default=0)
        return PoolUsage(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            used_blocks=self.num_used,
            cached_free_blocks=self.queue.num_cached,
            free_blocks=len(self.queue),
            pending_free_blocks=self.num_pending_free_blocks,
            num_seqs=len(self.seqs),
            logical_blocks=self.logical_blocks,
            logical_tokens=self.logical_tokens,
            useful_tokens=self.useful_tokens,
            max_table_blocks=max_table,
        )

    def stats(self) -> PoolStats:
        return PoolStats(**self._stats)

    def check_invariants(self) -> None:
        """Assert every invariant of DESIGN.md "Block pool semantics"; O(pool + table entries)."""
        check_pool_invariants(self)

    # ---- internals ------------------------------------------------------------------------------
    def _seq(self, seq_id: Hashable) -> SeqTable:
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise ValueError(f"sequence {seq_id!r} is not live (never allocated, or released)")
        return seq

    def _prompt_blocks_from_queue(self, num_tokens: int, hits: np.ndarray) -> int:
        if not len(hits):
            return self.blocks_needed(num_tokens)
        return self.blocks_needed(num_tokens) - len(hits) + np.count_nonzero(self.state[hits] == FREE_CACHED)

    def _drop(self, blocks: np.ndarray, num_tokens: int | None = None) -> None:
        """Blocks whose ref reached 0 (holding `num_tokens` tokens, when the caller knows): free now, or
        pending until the step ends."""
        self.num_used -= len(blocks)
        self.useful_tokens -= int(np.add.reduce(self.fill[blocks])) if num_tokens is None else num_tokens
        if self._in_step:
            self.state[blocks] = PENDING
            self._pending.append(blocks)
        else:
            self._free(blocks)
