"""A pool's live block tables: construction, allocate (with its prefix-cache look-up) and release, and the
look-ups every operation starts with (see core/pool/block_pool.py, where the pool's operations are listed).

`PoolTables` is the base of `BlockPool`: a table is created here (allocate: the longest verified cached prefix
reused, the rest taken fresh) and dropped here (release, the one path for every reason); what grows, forks,
reserves or reads a table is in `BlockPool`, and the many-sequence calls in pool_many.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from ..blocks import ceil_div
from .accounting import ReleaseReason
from .append import SeqTable
from .free_queue import FREE_CACHED
from .prefix_cache import root_hash
from .prefix_lookup import NO_PROBE, PrefixIndex, Probe
from .speculative import DEFAULT_ROLLBACK_POLICY, SpeculativeSlots
from .store import BlockKeys, BlockStore, PoolExhaustedError

NULL_BLOCK = -1  # a block-table entry whose block was freed (skip_blocks); never a physical id

# the stats counter of each release reason, looked up by member or by value
RELEASE_COUNTER = {key: r.counter for r in ReleaseReason for key in (r, r.value)}


class PoolTables:
    """The live block tables of a pool of `num_blocks` blocks of `block_size` slots; see core/pool/block_pool.py."""

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
            num_cached = int(np.count_nonzero(hit_state == FREE_CACHED))
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

    # ---- release -------------------------------------------------------------------------------
    def release(self, seq_id: Hashable, reason: ReleaseReason = ReleaseReason.FINISHED) -> None:
        """The one release path (finish, cancel, timeout, preempt). Releasing twice raises ValueError."""
        counter = RELEASE_COUNTER.get(reason) if isinstance(reason, str) else None
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

    def has_seq(self, seq_id: Hashable) -> bool:
        return seq_id in self.seqs

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
