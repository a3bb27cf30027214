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

`BlockPool` holds the parts and calls them:

    store    BlockStore (store): the per-block arrays, the free queue and the hash index; hands blocks
             out, shares and takes them back
    prefix   PrefixIndex (prefix_lookup): content keys, chain hashes, the verified look-up of a prompt's
             cached prefix, the registration of full blocks
    seqs     the live sequences (SeqTable, append): block table, tokens, how far hashed

Every public operation is a method here, so this module is longer than the parts it calls: what the pool
does can be read in one class, and how the store and the prefix index do their part in theirs.

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
    serve(n, keys, m)        allocate n, append m, release, in one call (a replay's requests, one at a time;
                             see serve).
    append_many, fork_many, release_many
                             append / fork / release of many sequences in one call: the same changes as
                             one at a time in that order (see batch), without a dozen numpy calls each.
    reserve(seq, k)          k temporary (speculative) slots past the committed tokens, never hashed;
    commit(seq, j, keys)     the first j become committed tokens, the other k − j are rolled back: kept
                             for the next step (rollback_policy "keep", vLLM v1) or their blocks wholly
                             past the committed length freed ("free", SGLang). See speculative.
    hit_tokens(n, keys)      the hits an allocate would get now, without changing anything.
    usage(), stats()         O(live sequences) accounting; check_invariants() O(pool) for tests.

Content keys: one per *full* block, an exact identity of its tokens — an int64 numpy array (e.g. Mooncake
`hash_id * (512 // B) + sub`) or a sequence of hashable objects (e.g. tuples of token ids), which the pool
interns to exact integer ids. One pool uses one kind. Keys may cover only a leading part of the full
blocks; blocks without a key are never hashed, and the chain stops there. `extra_key` (model, adapter)
seeds the chain, so different extra keys never share blocks. A replay of many prompts hashes them all at
once with `hash_prompts(keys, offsets)` and passes `.prompt(i)` (a `HashedKeys`) as block_keys: the same
look-up, verification and registration, without hashing each prompt again.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..blocks import ceil_div
from .accounting import PoolStats, PoolUsage, ReleaseReason
from .append import SeqTable, completed_keys, register_completed, write_tokens
from .batch import append_many, fork_many, release_many
from .free_queue import FREE_CACHED
from .invariants import check_pool_invariants
from .prefix_cache import HashedKeys, HashedPrompts, root_hash
from .prefix_lookup import NO_PROBE, PrefixIndex, Probe
from .serve import serve_request
from .speculative import (
    DEFAULT_ROLLBACK_POLICY,
    Reservation,
    SpeculativeSlots,
    SpeculativeStats,
    SpeculativeUsage,
    check_speculative,
)
from .store import BlockKeys, BlockStore, PoolExhaustedError

__all__ = [
    "NULL_BLOCK", "BlockKeys", "BlockPool", "BlockRef", "HashedKeys", "HashedPrompts", "PoolExhaustedError",
    "PoolStats", "PoolUsage", "ReleaseReason", "Reservation", "SpeculativeStats", "SpeculativeUsage",
]

# the stats counter of each release reason, looked up by member or by value
NULL_BLOCK = -1  # a block-table entry whose block was freed (skip_blocks); never a physical id

_RELEASED = {key: r.counter for r in ReleaseReason for key in (r, r.value)}


@dataclass(frozen=True)
class BlockRef:
    """A reader's handle on a block's content: stale once the block is handed out for new content."""

    block_id: int
    version: int


class BlockPool:
    """A fixed pool of `num_blocks` blocks of `block_size` token slots. See the module docstring."""

    def __init__(
        self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
        rollback_policy: str = DEFAULT_ROLLBACK_POLICY, shared: tuple[BlockStore, PrefixIndex] | None = None,
    ) -> None:
        # `shared`: the store and prefix index of a hybrid pool (core/pool/hybrid.py), of which this is one
        # layer group's block tables; num_blocks and block_size are then the store's
        if shared is None:
            self.store = BlockStore(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching)
            self.prefix = PrefixIndex(self.store)
        else:
            self.store, self.prefix = shared
        self.spec = SpeculativeSlots(self.store, self.prefix, rollback_policy)
        self.num_blocks = self.store.num_blocks
        self.block_size = self.store.block_size
        self.seqs: dict[Hashable, SeqTable] = {}
        self.logical_blocks = 0  # Σ over live sequences of the blocks their tables hold
        self.logical_tokens = 0
        self._in_step = False
        self._epoch = 0  # bumped by every change; keys the memo of the last look-up (can_allocate -> allocate)
        self._memo: tuple | None = None

    @property
    def num_used(self) -> int:
        return self.store.num_used

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: plain free + cached free (evictable)."""
        return len(self.store.queue)

    @property
    def num_cached_free_blocks(self) -> int:
        return self.store.queue.num_cached

    # ---- check, then allocate -------------------------------------------------------------------
    def hit_tokens(self, num_tokens: int, block_keys: BlockKeys = None, extra_key: Hashable = None) -> int:
        """Prefix-cache hit tokens an `allocate` of this prompt would get now; a pure look-up (memoised,
        so a following can_allocate / allocate of the same arguments does not look up again)."""
        return len(self._probe(num_tokens, block_keys, extra_key).hits) * self.block_size

    def allocate_need(self, num_tokens: int, block_keys: BlockKeys = None, extra_key: Hashable = None,
                      max_hit_blocks: int | None = None, first_block: int = 0) -> int:
        """Free blocks an `allocate` with these arguments takes now (a hybrid pool sums it over its groups)."""
        hits = self._probe(num_tokens, block_keys, extra_key).hits
        if max_hit_blocks is not None:
            hits = hits[:max_hit_blocks]
        total = self.store.blocks_needed(num_tokens)
        fresh_from = max(len(hits), min(first_block, total))
        held = hits[first_block:]
        return total - fresh_from + int(np.count_nonzero(self.store.state[held] == FREE_CACHED))

    def hit_blocks(self, num_tokens: int, block_keys: BlockKeys = None, extra_key: Hashable = None) -> np.ndarray:
        """The cached blocks an `allocate` would reuse now, in table order (a pure look-up)."""
        return self._probe(num_tokens, block_keys, extra_key).hits

    def can_allocate(self, num_tokens: int, block_keys: BlockKeys = None, extra_key: Hashable = None) -> bool:
        hits = self._probe(num_tokens, block_keys, extra_key).hits
        need = self.store.blocks_needed(num_tokens)
        if len(hits):
            need += np.count_nonzero(self.store.state[hits] == FREE_CACHED) - len(hits)
        return need <= len(self.store.queue)

    def allocate(
        self, seq_id: Hashable, num_tokens: int, block_keys: BlockKeys = None, extra_key: Hashable = None,
        max_hit_blocks: int | None = None, first_block: int = 0, hits: np.ndarray | None = None,
    ) -> int:
        """Give `seq_id` a block table for a prompt of `num_tokens`; returns the prefix-cache hit tokens.

        For a layer group of a hybrid pool (core/pool/hybrid.py): `max_hit_blocks` caps the hit (the hit is
        the shortest that every group can serve); the table holds no block before `first_block` (NULL_BLOCK
        entries: a window, chunk or state that the prompt's layers never read), which is at most the hit
        when the prompt has block keys. `hits`: the hit blocks a hybrid pool found for a group that keeps no
        whole chain (its entries before `first_block` unread), instead of a look-up of `block_keys`."""
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id!r} already has a block table; release it first")
        probe = self._probe(num_tokens, block_keys, extra_key) if hits is None else NO_PROBE._replace(hits=hits)
        if max_hit_blocks is not None and len(probe.hits) > max_hit_blocks:
            probe = probe._replace(hits=probe.hits[:max_hit_blocks])
        store, hits = self.store, probe.hits
        B, num_hits = self.block_size, len(hits)
        total = ceil_div(num_tokens, B)
        fresh_from = num_hits
        if first_block:
            if len(probe.keys) and first_block > num_hits:
                raise ValueError(f"first_block {first_block} is past the {num_hits} hit blocks of a keyed prompt")
            first_block = min(first_block, total)
            hits = hits[first_block:]
            fresh_from = max(num_hits, first_block)
        need = total - fresh_from
        if len(hits):  # cached hits come off the free queue; hits held by others or pending do not
            hit_state = store.state.take(hits)
            num_cached = np.count_nonzero(hit_state == FREE_CACHED)
            need += num_cached
        if need > len(store.queue):
            raise PoolExhaustedError(f"{num_tokens} tokens need more than the {len(store.queue)} free blocks")
        self._epoch += 1
        extra_id = self.prefix.extra_id(extra_key)
        if len(hits):
            store.share(hits, hit_state, num_cached)
        evictions = store.counters["evictions"]
        fresh = store.take(total - fresh_from, num_tokens - fresh_from * B)
        table = np.empty(max(total, 4) * 2, dtype=np.int64)
        if num_hits:  # skipped hits too: a block registered later is chained after its parent's id
            table[:num_hits] = probe.hits
        if first_block > num_hits:
            table[num_hits:first_block] = NULL_BLOCK
        table[fresh_from:total] = fresh
        seq = SeqTable(table, total, num_tokens, extra_id, len(probe.keys), root_hash(extra_id), num_hits * B,
                       first_block)
        if len(probe.keys):
            seq.last_hash = int(probe.hashes[-1])
            if num_hits < len(probe.keys):
                self.prefix.register_prompt(table, probe, store.counters["evictions"] != evictions)
        self.seqs[seq_id] = seq
        self.logical_blocks += total - first_block
        self.logical_tokens += num_tokens
        counters = store.counters
        counters["hit_blocks"] += num_hits
        counters["hit_tokens"] += seq.hit_tokens
        counters["prompt_tokens"] += num_tokens
        return seq.hit_tokens

    # ---- check, then grow -----------------------------------------------------------------------
    def can_append(self, seq_id: Hashable, num_tokens: int) -> bool:
        seq = self._seq(seq_id)
        if num_tokens <= 0:
            return True
        if self.spec.tracked and self.spec.tracks(seq_id):
            return seq_id not in self.spec.reservations and self.can_reserve(seq_id, num_tokens)
        return self._append_need(seq, num_tokens) <= len(self.store.queue)

    def append_need(self, seq_id: Hashable, num_tokens: int) -> int:
        """Free blocks an append of `num_tokens` takes now: its new blocks (kept speculative blocks first) and
        the copy of a shared, partially filled last block. A hybrid pool sums this over its groups."""
        seq = self._seq(seq_id)
        if num_tokens <= 0:
            return 0
        if self.spec.tracked and self.spec.tracks(seq_id):
            return self.spec.need(seq_id, seq, num_tokens, self._copies_last(seq))
        return self._append_need(seq, num_tokens)

    def append(self, seq_id: Hashable, num_tokens: int, block_keys: BlockKeys = None) -> list[tuple[int, int]]:
        """Reserve slots for `num_tokens` more tokens; returns the copy-on-write copies [(src, dst)] (see append).

        `block_keys` optionally names the content of the blocks this append completes, in order: they are
        registered in the prefix cache, chained after the sequence's last hashed block.
        """
        seq = self._seq(seq_id)
        if num_tokens < 0:
            raise ValueError(f"cannot append a negative number of tokens ({num_tokens})")
        if num_tokens == 0:
            return []
        if self.spec.tracked and self.spec.tracks(seq_id):  # kept blocks are written first (see speculative)
            copies, fresh = self.spec.append(seq_id, seq, num_tokens, block_keys, self._copies_last(seq))
            self._grown(fresh, num_tokens)
            return copies
        store, B, old = self.store, self.block_size, seq.num_tokens
        # NOTE: _copies_last and _append_need inlined: decode calls this once per block boundary of every
        # sequence, and each call costs a few percent of it
        last = int(seq.table[seq.num_blocks - 1]) if old % B else -1
        copy = last >= 0 and self._needs_copy(last)
        new_total = ceil_div(old + num_tokens, B)
        need = new_total - seq.num_blocks + copy
        if need > len(store.queue):
            raise PoolExhaustedError(f"appending {num_tokens} tokens needs {need} blocks, {len(store.queue)} free")
        keys = None if block_keys is None else completed_keys(self.prefix, seq, old, old + num_tokens, block_keys)
        self._epoch += 1
        self.logical_blocks += new_total - seq.num_blocks
        self.logical_tokens += num_tokens
        copies = write_tokens(store, seq, num_tokens, last, copy, new_total)
        if keys is not None:
            register_completed(self.prefix, seq, keys)
        return copies

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """The child shares every block of the parent (no copy until one of them writes a shared block)."""
        parent = self._seq(parent_id)
        if child_id in self.seqs:
            raise ValueError(f"sequence {child_id!r} already has a block table; pick a new id for the fork")
        self.spec.refuse_reserved([parent_id], "forked")
        self._epoch += 1
        table = parent.table.copy()
        self.store.ref[table[parent.num_skipped : parent.num_blocks]] += 1
        self.seqs[child_id] = SeqTable(
            table, parent.num_blocks, parent.num_tokens, parent.extra_id, parent.num_hashed, parent.last_hash,
            num_skipped=parent.num_skipped,
        )
        self.logical_blocks += parent.num_blocks - parent.num_skipped
        self.logical_tokens += parent.num_tokens
        self.store.counters["forks"] += 1

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
        store = self.store
        if self.spec.tracked:
            self.logical_blocks -= self.spec.release(seq_id, defer=self._in_step)
        skipped = seq.num_skipped
        table = seq.table[skipped : seq.num_blocks]
        refs = store.ref[table]
        refs -= 1
        store.ref[table] = refs
        if not np.count_nonzero(refs):
            # the common case, no block shared: all of them drop (every ref is 0, so none went below), and
            # together they hold exactly the sequence's tokens (each holder agrees on every block's fill)
            held_tokens = seq.num_tokens - skipped * self.block_size  # skipped blocks were full
            store.drop(table[::-1], held_tokens, defer=self._in_step)  # tail first: the least shareable
        else:
            assert refs.min() >= 0, "a reference count went below zero"
            store.drop(table[refs == 0][::-1], defer=self._in_step)
        self.logical_blocks -= seq.num_blocks - skipped
        self.logical_tokens -= seq.num_tokens
        store.counters[counter] += 1

    # ---- many sequences at once -----------------------------------------------------------------
    def append_many(self, seq_ids: Sequence[Hashable], num_tokens: int) -> list[tuple[int, int]]:
        """`append(seq, num_tokens)` (no block keys) for each sequence, in order, in one call; returns every
        copy-on-write copy [(src, dst)] in that order. Check, then change, for all of them together."""
        seqs = self._live(seq_ids, "appended to")
        if num_tokens < 0:
            raise ValueError(f"cannot append a negative number of tokens ({num_tokens})")
        if self.spec.tracked and any(self.spec.tracks(s) for s in seq_ids):
            raise ValueError("append_many takes no sequence with speculative slots (reserved or kept): append "
                             "those one at a time")
        if num_tokens == 0 or not seqs:
            return []
        copies, new_blocks = append_many(self.store, seqs, num_tokens)
        self._epoch += 1
        self.logical_blocks += new_blocks
        self.logical_tokens += num_tokens * len(seqs)
        return copies

    def fork_many(self, parent_ids: Sequence[Hashable], child_ids: Sequence[Hashable]) -> None:
        """`fork(parent, child)` for each pair, in order, in one call (a parent may be forked several times)."""
        if len(parent_ids) != len(child_ids):
            raise ValueError(f"{len(parent_ids)} parents for {len(child_ids)} children: give one parent per child")
        parents = self._tables(parent_ids)  # a parent may come several times
        self.spec.refuse_reserved(parent_ids, "forked")
        if len(set(child_ids)) < len(child_ids) or any(c in self.seqs for c in child_ids):
            raise ValueError("every child needs a new id: one is live already or given twice")
        children = fork_many(self.store, parents)
        self._epoch += 1
        self.seqs.update(zip(child_ids, children, strict=True))
        self.logical_blocks += sum(c.num_blocks - c.num_skipped for c in children)
        self.logical_tokens += sum(c.num_tokens for c in children)
        self.store.counters["forks"] += len(children)

    def release_many(self, seq_ids: Sequence[Hashable], reason: ReleaseReason = ReleaseReason.FINISHED) -> None:
        """`release(seq, reason)` for each sequence, in order, in one call."""
        counter = _RELEASED.get(reason) if isinstance(reason, str) else None
        if counter is None:
            raise ValueError(f"unknown release reason {reason!r}: use a ReleaseReason")
        seqs = self._live(seq_ids, "released (double free)")
        if self.spec.tracked and any(self.spec.tracks(s) for s in seq_ids):
            for seq_id in seq_ids:  # kept blocks drop before each table: one at a time keeps that order
                self.release(seq_id, reason)
            return
        self._epoch += 1
        for seq_id in seq_ids:
            del self.seqs[seq_id]
        release_many(self.store, seqs, defer=self._in_step)
        self.logical_blocks -= sum(s.num_blocks - s.num_skipped for s in seqs)
        self.logical_tokens -= sum(s.num_tokens for s in seqs)
        self.store.counters[counter] += len(seqs)

    def serve(
        self, num_tokens: int, block_keys: BlockKeys = None, num_output_tokens: int = 0, extra_key: Hashable = None
    ) -> tuple[int, int]:
        """allocate + append + release of one request; returns (hit tokens, blocks in use while it ran)."""
        if self._in_step:
            raise ValueError("serve runs a request start to finish: call it outside a step")
        if num_output_tokens < 0:
            raise ValueError(f"cannot append a negative number of tokens ({num_output_tokens})")
        result = serve_request(self.store, self.prefix, self._probe(num_tokens, block_keys, extra_key), num_tokens,
                               num_output_tokens)
        self._epoch += 1
        return result

    def hash_prompts(self, block_keys: np.ndarray, offsets: np.ndarray, extra_key: Hashable = None) -> HashedPrompts:
        """Many prompts' keys hashed at once, for `allocate`, `serve` or `hit_tokens` (see PrefixIndex)."""
        return self.prefix.hash_prompts(block_keys, offsets, extra_key)

    # ---- speculative slots (see speculative) ----------------------------------------------------
    def reserve_need(self, seq_id: Hashable, num_slots: int) -> int:
        """Free blocks a `reserve` of `num_slots` takes now."""
        seq = self._seq(seq_id)
        return 0 if num_slots <= 0 else self.spec.need(seq_id, seq, num_slots, self._copies_last(seq))

    def stop_hashing(self, seq_id: Hashable) -> None:
        """No block the sequence completes from now on is hashed (a state group's pages after a rollback
        hold a state computed over rejected drafts: no hit may ever restore it)."""
        self._seq(seq_id).num_hashed = -1

    def can_reserve(self, seq_id: Hashable, num_slots: int) -> bool:
        seq = self._seq(seq_id)
        return num_slots <= 0 or self.spec.need(seq_id, seq, num_slots, self._copies_last(seq)) <= len(self.store.queue)

    def reserve(self, seq_id: Hashable, num_slots: int) -> list[tuple[int, int]]:
        """`num_slots` temporary slots past the committed tokens (drafts, lookahead) until `commit`; returns
        the copy-on-write copies [(src, dst)]. PoolExhaustedError, changing nothing, when they do not fit."""
        seq = self._seq(seq_id)
        copies, fresh = self.spec.reserve(seq_id, seq, num_slots, self._copies_last(seq))
        self._grown(fresh, num_slots)
        return copies

    def commit(self, seq_id: Hashable, num_accepted: int, block_keys: BlockKeys = None) -> int:
        """The first `num_accepted` reserved slots become committed tokens, the others are rolled back;
        returns how many were. `block_keys` names the blocks the committed tokens complete, as for append."""
        seq = self._seq(seq_id)
        rolled_back, freed = self.spec.commit(seq_id, seq, num_accepted, block_keys, defer=self._in_step)
        self._epoch += 1
        self.logical_tokens -= rolled_back
        self.logical_blocks -= freed
        return rolled_back

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
        self.store.free_pending()

    @contextmanager
    def step(self) -> Iterator[None]:
        self.begin_step()
        try:
            yield
        finally:
            self.end_step()

    # ---- reading --------------------------------------------------------------------------------
    def block_table(self, seq_id: Hashable) -> np.ndarray:
        """int64 [blocks of its tokens]: logical block i -> physical id; NULL_BLOCK (-1) where a sliding,
        chunked or state group freed the block (see skip_blocks)."""
        seq = self._seq(seq_id)
        table = seq.table[: seq.num_blocks].copy()
        table[: seq.num_skipped] = NULL_BLOCK
        return table

    def num_skipped_blocks(self, seq_id: Hashable) -> int:
        return self._seq(seq_id).num_skipped

    # ---- a layer group that forgets (sliding window, chunked local attention, recurrent state) ---------
    def skip_blocks(self, seq_id: Hashable, first_block: int) -> int:
        """Free the sequence's blocks before logical block `first_block` (its layers never read them again:
        outside a sliding window, before the current chunk, an older state); their table entries become
        NULL_BLOCK. Returns how many were freed now. Only whole, written blocks can be skipped."""
        seq = self._seq(seq_id)
        first_block = min(first_block, seq.num_blocks)
        if first_block <= seq.num_skipped:
            return 0
        if first_block * self.block_size > self.spec.committed(seq_id, seq):
            raise ValueError(f"sequence {seq_id!r}: block {first_block - 1} holds uncommitted slots and cannot be "
                             "skipped")
        self._epoch += 1
        store = self.store
        gone = seq.table[seq.num_skipped : first_block]
        refs = store.ref[gone]
        refs -= 1
        store.ref[gone] = refs
        store.drop(gone[refs == 0][::-1], defer=self._in_step)
        seq.num_skipped = first_block
        self.logical_blocks -= len(gone)
        return len(gone)

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._seq(seq_id).num_tokens

    def has_seq(self, seq_id: Hashable) -> bool:
        return seq_id in self.seqs

    def committed_tokens(self, seq_id: Hashable) -> int:
        """`num_tokens` less the slots of an open reservation."""
        return self.spec.committed(seq_id, self._seq(seq_id))

    def reservation(self, seq_id: Hashable) -> Reservation | None:
        self._seq(seq_id)
        return self.spec.reservations.get(seq_id)

    def kept_blocks(self, seq_id: Hashable) -> list[int]:
        """Blocks the sequence holds past its table (rolled back under policy keep), in position order."""
        self._seq(seq_id)
        return self.spec.kept[seq_id].tolist() if seq_id in self.spec.kept else []

    def block_ref(self, block_id: int) -> BlockRef:
        return BlockRef(int(block_id), int(self.store.version[block_id]))

    def is_current(self, ref: BlockRef) -> bool:
        """True while the block still holds the content the reference was taken on."""
        return int(self.store.version[ref.block_id]) == ref.version

    def free_queue_order(self) -> list[int]:
        return self.store.queue.order()

    def usage(self) -> PoolUsage:
        store = self.store
        return PoolUsage(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            used_blocks=store.num_used,
            cached_free_blocks=store.queue.num_cached,
            free_blocks=len(store.queue),
            pending_free_blocks=store.num_pending_blocks,
            num_seqs=len(self.seqs),
            logical_blocks=self.logical_blocks,
            logical_tokens=self.logical_tokens,
            useful_tokens=store.useful_tokens,
            max_table_blocks=max((s.num_blocks for s in self.seqs.values()), default=0),
        )

    def stats(self) -> PoolStats:
        return PoolStats(**self.store.counters)

    def speculative_usage(self) -> SpeculativeUsage:
        return self.spec.usage(self.seqs)

    def speculative_stats(self) -> SpeculativeStats:
        return self.spec.stats()

    def check_invariants(self) -> None:
        """Assert every invariant the pool promises (see invariants and speculative); O(pool + table entries)."""
        check_pool_invariants(
            self.store, self.tables(), in_step=self._in_step,
            logical_blocks=self.logical_blocks, logical_tokens=self.logical_tokens,
            spare=list(self.spec.kept.values()),
        )
        check_speculative(self.spec, self.seqs)

    def tables(self) -> list[tuple[np.ndarray, int, int]]:
        """(held blocks, tokens, skipped blocks) of every live sequence, for the invariants."""
        return [(s.blocks, s.num_tokens, s.num_skipped) for s in self.seqs.values()]

    # ---- internals ------------------------------------------------------------------------------
    def _seq(self, seq_id: Hashable) -> SeqTable:
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise ValueError(f"sequence {seq_id!r} is not live (never allocated, or released)")
        return seq

    def _tables(self, seq_ids: Sequence[Hashable]) -> list[SeqTable]:
        try:
            return [self.seqs[s] for s in seq_ids]
        except KeyError as missing:
            raise ValueError(f"sequence {missing.args[0]!r} is not live (never allocated, or released)") from None

    def _live(self, seq_ids: Sequence[Hashable], what: str) -> list[SeqTable]:
        """The tables of `seq_ids`, each named once (`what` is done to each: not twice in one call)."""
        seqs = self._tables(seq_ids)
        if len(set(seq_ids)) < len(seqs):
            raise ValueError(f"a sequence is named twice: it cannot be {what} twice in one call")
        return seqs

    def _append_need(self, seq: SeqTable, num_tokens: int) -> int:
        """Free blocks an append of `num_tokens` >= 1 takes: its new blocks, and a copy of the last one first
        when `_copies_last`."""
        return ceil_div(seq.num_tokens + num_tokens, self.block_size) - seq.num_blocks + self._copies_last(seq)

    def _copies_last(self, seq: SeqTable) -> bool:
        """Writing past the sequence's tokens copies its last block first: it is partially filled and shared."""
        return seq.num_tokens % self.block_size != 0 and self._needs_copy(int(seq.table[seq.num_blocks - 1]))

    def _grown(self, fresh_blocks: int, num_tokens: int) -> None:
        if num_tokens:
            self._epoch += 1
            self.logical_blocks += fresh_blocks
            self.logical_tokens += num_tokens

    def _needs_copy(self, block_id: int) -> bool:
        """Another table holds this block too: writing into it must copy it first."""
        return bool(self.store.ref[block_id] > 1)

    def _probe(self, num_tokens: int, block_keys: BlockKeys, extra_key: Hashable) -> Probe:
        """The prefix index's look-up of a prompt, memoised until the pool next changes."""
        if num_tokens < 0:
            raise ValueError(f"a prompt cannot have a negative number of tokens ({num_tokens})")
        if block_keys is None or not self.store.enable_prefix_caching:
            return NO_PROBE
        memo = self._memo
        if memo is not None and memo[0] == self._epoch and memo[1] is block_keys and memo[2:4] == (
            num_tokens,
            extra_key,
        ):
            return memo[4]
        result = self.prefix.probe(num_tokens, block_keys, extra_key)
        self._memo = (self._epoch, block_keys, num_tokens, extra_key, result)
        return result
