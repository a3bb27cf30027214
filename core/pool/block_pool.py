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

    a block is USED (ref > 0), PENDING (released during a step that may still read it), or free: in ONE free
    queue (vLLM v1's FreeKVCacheBlockQueue), never-used blocks first, then in the order they were freed; a
    hand-out pops the head, evicting its cache entry if it holds a hashed full block; a hit revives a free
    hashed block from wherever it is (see free_queue, and why it is a lazily deleted array rather than an
    intrusive linked list)

`BlockPool` holds the parts and calls them:

    store    BlockStore (store): the per-block arrays, the free queue and the hash index; hands blocks
             out, shares and takes them back
    prefix   PrefixIndex (prefix_lookup): content keys, chain hashes, the verified look-up of a prompt's
             cached prefix, the registration of full blocks
    seqs     the live sequences (SeqTable, append): block table, tokens, how far hashed

`BlockPool` is built on two bases, each a concept: `PoolTables` (pool_tables: construction, allocate,
release, the look-ups every operation starts with) and `ManySequences` (pool_many: the many-sequence calls and
serve); growth, forks, speculative slots, the deferred-free window, reading and the checks are here.

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

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..blocks import ceil_div
from .accounting import PoolStats, PoolUsage, ReleaseReason
from .append import SeqTable, completed_keys, register_completed, write_tokens
from .invariants import check_pool_invariants
from .pool_many import ManySequences
from .pool_tables import NULL_BLOCK
from .prefix_cache import HashedKeys, HashedPrompts
from .speculative import Reservation, SpeculativeStats, SpeculativeUsage, check_speculative
from .store import BlockKeys, PoolExhaustedError

__all__ = [
    "NULL_BLOCK", "BlockKeys", "BlockPool", "BlockRef", "HashedKeys", "HashedPrompts", "PoolExhaustedError",
    "PoolStats", "PoolUsage", "ReleaseReason", "Reservation", "SpeculativeStats", "SpeculativeUsage",
]


@dataclass(frozen=True)
class BlockRef:
    """A reader's handle on a block's content: stale once the block is handed out for new content."""

    block_id: int
    version: int


class BlockPool(ManySequences):
    """A fixed pool of `num_blocks` blocks of `block_size` token slots. See the module docstring."""

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
