"""The KV block pool: physical blocks, per-sequence block tables, prefix cache, fork and copy-on-write.

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
    hit_tokens(n, keys)      the hits an allocate would get now, without changing anything.
    usage(), stats()         O(live sequences) accounting; check_invariants() O(pool) for tests.

Content keys: one per *full* block, an exact identity of its tokens — an int64 numpy array (e.g. Mooncake
`hash_id * (512 // B) + sub`) or a sequence of hashable objects (e.g. tuples of token ids), which the pool
interns to exact integer ids. One pool uses one kind. Keys may cover only a leading part of the full
blocks; blocks without a key are never hashed, and the chain stops there. `extra_key` (model, adapter)
seeds the chain, so different extra keys never share blocks.

API changes (additive only, after the first commit):
    - `hit_tokens(num_tokens, block_keys, extra_key)`: the public prefix look-up (instead of `_probe`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum

import numpy as np

from kvcalc.core.free_queue import FREE_CACHED, PENDING, USED, FreeBlockQueue
from kvcalc.core.pool_accounting import PoolStats, PoolUsage, check_pool_invariants
from kvcalc.core.prefix_cache import HashIndex, chain_hashes, root_hash

__all__ = ["BlockPool", "BlockRef", "PoolExhaustedError", "PoolStats", "PoolUsage", "ReleaseReason"]

BlockKeys = Sequence[Hashable] | np.ndarray | None


class ReleaseReason(str, Enum):
    FINISHED = "finished"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    PREEMPTED = "preempted"


# the stats counter of each release reason, looked up by member or by value
_RELEASED = {key: f"released_{r.value}" for r in ReleaseReason for key in (r, r.value)}


_NO_IDS = np.empty(0, dtype=np.int64)
_NO_IDS.flags.writeable = False
_NO_HASHES = np.empty(0, dtype=np.uint64)
_NO_HASHES.flags.writeable = False
_NO_PROBE = (_NO_IDS, _NO_HASHES, _NO_IDS, None)  # `_probe` without keys: nothing to look up, nothing to memoise


class PoolExhaustedError(RuntimeError):
    """An allocation that does not fit; ask `can_allocate` / `can_append` first. Nothing was changed."""


@dataclass(frozen=True)
class BlockRef:
    """A reader's handle on a block's content: stale once the block is handed out for new content."""

    block_id: int
    version: int


@dataclass(slots=True)
class _Seq:
    table: np.ndarray  # int64 [capacity]; table[:num_blocks] is the block table
    num_blocks: int
    num_tokens: int
    extra_id: int
    num_hashed: int  # leading blocks whose chain hash is known
    last_hash: int  # hash of block num_hashed - 1 (the root hash when 0)
    hit_tokens: int = 0


class BlockPool:
    """A fixed pool of `num_blocks` blocks of `block_size` token slots. See the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a pool needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.enable_prefix_caching = enable_prefix_caching
        n = self.num_blocks
        self.state = np.zeros(n, dtype=np.int8)
        self.ref = np.zeros(n, dtype=np.int32)
        self.version = np.zeros(n, dtype=np.int64)  # int64: a long simulation hands blocks out many times
        self.fill = np.zeros(n, dtype=np.int32)
        self.hashed = np.zeros(n, dtype=bool)
        self.block_hash = np.zeros(max(n, 2), dtype=np.uint64)  # >= 2: the index reads [-1], [-2] harmlessly
        self.key = np.zeros(n, dtype=np.int64)
        self.parent_id = np.full(n, -1, dtype=np.int32)  # -1: the root (block 0 of a chain)
        self.parent_ver = np.zeros(n, dtype=np.int64)  # parent's version, or the extra-key id at the root
        self.queue = FreeBlockQueue(n, self.state)
        self.block_home = np.zeros(max(n, 2), dtype=np.int32)  # home slot of a hashed block in the index
        self.index = HashIndex(n if enable_prefix_caching else 1, self.block_hash, self.block_home)
        self.seqs: dict[Hashable, _Seq] = {}
        self._pending: list[np.ndarray] = []
        self._in_step = False
        self._key_kind: str | None = None
        self._interned: dict[Hashable, int] = {}
        self._extras: dict[Hashable, int] = {None: 0}
        self._epoch = 0  # bumped by every change; keys the can_allocate -> allocate memo
        self._memo: tuple | None = None
        # running totals so that usage() is O(live sequences)
        self.num_used = 0
        self.useful_tokens = 0
        self.logical_blocks = 0
        self.logical_tokens = 0
        self._stats = {k: 0 for k in PoolStats.counter_names()}

    # ---- sizes ----------------------------------------------------------------------------------
    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: plain free + cached free (evictable)."""
        return len(self.queue)

    @property
    def num_cached_free_blocks(self) -> int:
        return self.queue.num_cached

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
        hits, hashes, keys, found = self._probe(num_tokens, block_keys, extra_key)
        num_hits = len(hits)
        total = -(-num_tokens // self.block_size)
        if num_hits:  # = _prompt_blocks_from_queue, keeping the hits' states for below
            hit_state = self.state[hits]
            need = total - num_hits + np.count_nonzero(hit_state == FREE_CACHED)
        else:
            need = total
        if need > len(self.queue):
            raise PoolExhaustedError(f"{num_tokens} tokens need more than the {len(self.queue)} free blocks")
        self._epoch += 1
        extra_id = self._extra_id(extra_key)
        if num_hits:
            revived = hits[hit_state != USED]
            cached = hits[hit_state == FREE_CACHED]  # FREE_CACHED blocks are not USED: a part of `revived`
            self.queue.revive(cached)
            self.state[revived] = USED
            self.ref[hits] += 1
            self.num_used += len(revived)
            self.useful_tokens += self.block_size * len(revived)
        evictions = self._stats["evictions"]
        fresh = self._take(total - num_hits)
        # an evicted entry may have been one of ours, or sat on a probe run: look again
        evicted = self._stats["evictions"] != evictions
        if len(fresh):
            self.fill[fresh] = self.block_size
            self.fill[fresh[-1]] = num_tokens - (total - 1) * self.block_size
        self.useful_tokens += num_tokens - num_hits * self.block_size  # fresh blocks hold every other token
        table = np.empty(max(total, 4) * 2, dtype=np.int64)
        if num_hits:
            table[:num_hits] = hits
        table[num_hits:total] = fresh
        seq = _Seq(table, total, num_tokens, extra_id, len(keys), root_hash(extra_id))
        if len(keys):
            seq.last_hash = int(hashes[-1])
            homes, present, slots = (a[len(hits) :] for a in found)
            if evicted:
                # the look-up is still right after deletions, except for entries deleted since: an evicted
                # block's hash is absent now, and its slot (a tombstone now, on the hash's probe run) is a
                # valid place to insert it again — no second look-up
                gone = (present >= 0) & ~self.hashed[np.maximum(present, 0)]
                present = np.where(gone, -1, present)
            rest = (homes, present, slots)
            self._register(seq, len(hits), hashes[len(hits) :], keys[len(hits) :], rest)
        seq.hit_tokens = len(hits) * self.block_size
        self.seqs[seq_id] = seq
        self.logical_blocks += total
        self.logical_tokens += num_tokens
        self._stats["hit_blocks"] += len(hits)
        self._stats["hit_tokens"] += seq.hit_tokens
        self._stats["prompt_tokens"] += num_tokens
        return seq.hit_tokens

    # ---- check, then append ---------------------------------------------------------------------
    def can_append(self, seq_id: Hashable, num_tokens: int) -> bool:
        return self._append_blocks_from_queue(self._seq(seq_id), num_tokens) <= len(self.queue)

    def append(self, seq_id: Hashable, num_tokens: int, block_keys: BlockKeys = None) -> list[tuple[int, int]]:
        """Reserve slots for `num_tokens` more tokens; returns the copy-on-write copies [(src, dst)].

        `block_keys` optionally names the content of the blocks this append completes, in order.
        """
        seq = self._seq(seq_id)
        if num_tokens < 0:
            raise ValueError(f"cannot append a negative number of tokens ({num_tokens})")
        if num_tokens == 0:
            return []
        B, old = self.block_size, seq.num_tokens
        new_total = -(-(old + num_tokens) // B)
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
            self._register(seq, first, hashes, keys)
        return copies

    # ---- fork and release -----------------------------------------------------------------------
    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """The child shares every block of the parent (no copy until one of them writes a shared block)."""
        parent = self._seq(parent_id)
        if child_id in self.seqs:
            raise ValueError(f"sequence {child_id!r} already has a block table; pick a new id for the fork")
        self._epoch += 1
        table = parent.table.copy()
        self.ref[table[: parent.num_blocks]] += 1
        self.seqs[child_id] = _Seq(
            table, parent.num_blocks, parent.num_tokens, parent.extra_id, parent.num_hashed, parent.last_hash
        )
        self.logical_blocks += parent.num_blocks
        self.logical_tokens += parent.num_tokens
        self._stats["forks"] += 1

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
    def _seq(self, seq_id: Hashable) -> _Seq:
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise ValueError(f"sequence {seq_id!r} is not live (never allocated, or released)")
        return seq

    def _needs_copy(self, block_id: int) -> bool:
        """A partially filled last block held by another table must be copied before we write it."""
        return bool(self.ref[block_id] > 1)

    def _prompt_blocks_from_queue(self, num_tokens: int, hits: np.ndarray) -> int:
        if not len(hits):
            return self.blocks_needed(num_tokens)
        return self.blocks_needed(num_tokens) - len(hits) + np.count_nonzero(self.state[hits] == FREE_CACHED)

    def _append_blocks_from_queue(self, seq: _Seq, num_tokens: int) -> int:
        if num_tokens <= 0:
            return 0
        B = self.block_size
        new = self.blocks_needed(seq.num_tokens + num_tokens) - seq.num_blocks
        copy = seq.num_tokens % B != 0 and self._needs_copy(int(seq.table[seq.num_blocks - 1]))
        return new + int(copy)

    def _probe(self, num_tokens: int, block_keys: BlockKeys, extra_key: Hashable):
        """(hit block ids [h], chain hashes uint64 [k], keys int64 [k], index `find` of the hashes); memoised."""
        if num_tokens < 0:
            raise ValueError(f"a prompt cannot have a negative number of tokens ({num_tokens})")
        if block_keys is None or not self.enable_prefix_caching:
            return _NO_PROBE
        memo = self._memo
        if memo is not None and memo[0] == self._epoch and memo[1] is block_keys and memo[2:4] == (
            num_tokens,
            extra_key,
        ):
            return memo[4]
        keys = self._key_array(block_keys)
        if len(keys) > num_tokens // self.block_size:
            raise ValueError(
                f"{len(keys)} block keys for a {num_tokens}-token prompt, which has only "
                f"{num_tokens // self.block_size} full blocks of {self.block_size}"
            )
        extra_id = self._extra_id(extra_key)
        hashes = chain_hashes(root_hash(extra_id), keys)
        max_hit = min(len(keys), max(num_tokens - 1, 0) // self.block_size)
        positions = np.arange(len(keys))
        homes = self.index.home_slots(hashes[positions & ~15], positions)
        found, slots = self.index.find(hashes, homes)  # all of them: allocate inserts misses without a 2nd look
        cand = found[:max_hit]
        if max_hit and cand[-1] < 0:  # verify only up to the first block not in the index: no hit after it
            cand = cand[: int(np.argmin(cand >= 0))]
            max_hit = len(cand)
        c = np.maximum(cand, 0)
        parent_ok = np.concatenate(([-1], cand[:-1]))
        parent_ver = np.concatenate(([extra_id], self.version[c[:-1]]))
        ok = (cand >= 0) & (self.key[c] == keys[:max_hit])
        ok &= (self.parent_id[c] == parent_ok[:max_hit]) & (self.parent_ver[c] == parent_ver[:max_hit])
        num_hit = int(np.argmin(ok)) if np.count_nonzero(ok) < max_hit else max_hit
        result = (cand[:num_hit], hashes, keys, (homes, found, slots))
        self._memo = (self._epoch, block_keys, num_tokens, extra_key, result)
        return result

    def _take(self, n: int) -> np.ndarray:
        """Hand out n free blocks for new content: ref 1, version + 1; evicted cache entries dropped."""
        if n == 0:
            return np.empty(0, dtype=np.int64)
        plain, evicted = self.queue.pop(n)
        if len(evicted):
            found, slots = self.index.find(self.block_hash[evicted], self.block_home[evicted])
            assert np.array_equal(found, evicted), "an evicted block's hash entry points elsewhere"
            self.index.delete_slots(slots)
            self.hashed[evicted] = False
            self._stats["evictions"] += len(evicted)
        blocks = np.concatenate([plain, evicted]) if len(evicted) else plain
        self.version[blocks] += 1
        self.ref[blocks] = 1
        self.num_used += n
        self._stats["allocated_blocks"] += n
        return blocks

    def _take_one(self) -> int:
        """`_take(1)`; a content-free block in scalar steps. NOTE: the array path costs a dozen numpy
        calls, too many for decode, which needs one block per block boundary of every sequence."""
        if not self.queue.num_plain:
            return int(self._take(1)[0])
        block = self.queue.pop_plain_one()
        self.version[block] += 1
        self.ref[block] = 1
        self.num_used += 1
        self._stats["allocated_blocks"] += 1
        return block

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

    def _free(self, blocks: np.ndarray) -> None:
        if not self.enable_prefix_caching:  # then nothing is ever hashed
            self.fill[blocks] = 0
            self.queue.push_plain(blocks)
            return
        keep = self.hashed[blocks]
        num_keep = np.count_nonzero(keep)
        if num_keep == len(blocks):
            self.queue.push_cached(blocks)
            return
        plain = blocks[~keep] if num_keep else blocks
        self.fill[plain] = 0
        self.queue.push_plain(plain)
        if len(plain) < len(blocks):
            self.queue.push_cached(blocks[keep])

    def _register(
        self,
        seq: _Seq,
        first: int,
        hashes: np.ndarray,
        keys: np.ndarray,
        found: tuple[np.ndarray, np.ndarray | None, np.ndarray | None] | None = None,
    ) -> None:
        """Hash the full blocks table[first : first + len(keys)] of `seq` (written by it, ref 1)."""
        if len(keys) == 0:
            return
        blocks = seq.table[first : first + len(keys)]
        parents = seq.table[max(first - 1, 0) : first + len(keys) - 1]
        parent_ids = np.concatenate(([-1], parents)) if first == 0 else parents
        parent_vers = self.version[np.maximum(parent_ids, 0)]
        if first == 0:
            parent_vers[0] = seq.extra_id
        if found is None:  # append: home slots from the hash of each block's line base, maybe earlier
            positions = first + np.arange(len(keys))
            base = positions & ~15
            in_batch = base >= first
            base_hashes = np.where(
                in_batch, hashes[np.maximum(base - first, 0)], self.block_hash[seq.table[np.minimum(base, first)]]
            )
            found = (self.index.home_slots(base_hashes, positions), None, None)
        # the index reads hashes and home slots from here; meaningful only where hashed
        self.block_hash[blocks] = hashes
        self.block_home[blocks] = found[0]
        inserted = self.index.insert(hashes, blocks, *found)
        b = blocks[inserted]
        self.hashed[b] = True
        self.key[b] = keys[inserted]
        self.parent_id[b] = parent_ids[inserted]
        self.parent_ver[b] = parent_vers[inserted]

    def _key_array(self, block_keys: Sequence[Hashable] | np.ndarray) -> np.ndarray:
        is_int = isinstance(block_keys, np.ndarray)
        kind = "int" if is_int else "object"
        if self._key_kind is None:
            self._key_kind = kind
        elif self._key_kind != kind:
            raise ValueError(f"this pool takes {self._key_kind} block keys; do not mix int64 arrays and objects")
        if is_int:
            if block_keys.dtype.kind not in "iu":
                raise ValueError(f"block keys as an array must be integers, got dtype {block_keys.dtype}")
            return block_keys.astype(np.int64, copy=False)
        interned = self._interned
        return np.fromiter((interned.setdefault(k, len(interned)) for k in block_keys), np.int64, len(block_keys))

    def _extra_id(self, extra_key: Hashable) -> int:
        return self._extras.setdefault(extra_key, len(self._extras))
