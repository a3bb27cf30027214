"""The hybrid block pool: one physical pool, one block table per layer group per sequence.

    HybridPool                          one BlockStore + one PrefixIndex, shared
      ├── group 0  BlockPool (full)     the tables of its layers: grow with the sequence
      ├── group 1  BlockPool (sliding)  ... free the blocks that fell out of the window (skip_blocks)
      └── group 2  BlockPool (state)    ... one page per block boundary, older pages freed (see groups)

Each group is a `BlockPool` over the shared store: the same code that runs a single-group pool runs
every group here, with the group's rule (core/pool/groups.py) for which leading blocks it may free. Block
ids are unique across groups (one store), so copy-on-write copies are plain (src, dst) pairs. A group's
prefix-cache chains are seeded with its index, so no two groups ever share a block.

Operations, "check, then change" over all groups together (a failed operation changes nothing, except
`free_skipped`, which only frees what no layer reads any more, as vLLM's remove_skipped_blocks):

    allocate(seq, n, keys)   the hit is the longest prefix that every group can serve (each group's
                             verified chain, the shortest wins; a state group serves only in mode all);
                             each group then holds only what its layers read: a sliding group the blocks
                             of the last W tokens before the hit, a state group its pages (see groups)
    append(seq, n, keys)     free_skipped, then the sum over groups of the blocks each takes must fit
    fork(parent, child)      every group's table shared; a state page is copied before either branch
                             writes it (copy-on-write: the copy is each branch's own state)
    release(seq, reason)     every group through BlockPool's one release path
    reserve / commit         per group; a state group's chain stops at a rollback (a state computed over
                             rejected drafts is never reachable by hash)
    check_invariants()       the pool's invariants over every group's tables at once, then each group's

With one full group this is a BlockPool and nothing else: `kvcalc` uses a plain BlockPool there.

Where each part lives: the construction, the keys each group takes and each group's rule applied (`_skip`) in
hybrid_layout (`HybridLayout`, the base); the prefix hits across groups, `allocate` and the registration of the
anchored groups' blocks in hybrid_hits (`HybridHits`); the decode steps of many sequences at once in
hybrid_batch (`HybridBatch`); reading, append, fork, release, speculative slots and the checks here.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .accounting import PoolStats, PoolUsage, ReleaseReason
from .groups import PoolGroup
from .hybrid_batch import HybridBatch
from .hybrid_hits import HybridHits
from .invariants import check_pool_invariants
from .speculative import check_speculative
from .state_pages import held_counts, roll_need, roll_page, with_resumed
from .store import BlockKeys, PoolExhaustedError
from .weighted import weighted_append_need, weighted_usage


@dataclass(frozen=True)
class GroupUsage:
    """One group's part of the pool now: the distinct blocks its tables hold (no block is in two groups),
    its table entries and its logical tokens."""

    group: PoolGroup
    held_blocks: int  # distinct physical blocks its live tables hold
    table_entries: int  # Σ over its live tables of their length, NULL entries included
    logical_tokens: int


class HybridPool(HybridHits, HybridBatch):
    """`num_blocks` blocks of `block_size` slots shared by `groups`; see the module docstring. Constructed by
    HybridLayout (hybrid_layout); its prefix hits and allocate in HybridHits (hybrid_hits), its many-sequence
    decode steps in HybridBatch (hybrid_batch)."""

    # ---- reading --------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.store.queue)

    @property
    def num_used(self) -> int:
        return self.store.num_used

    @property
    def seq_ids(self) -> list[Hashable]:
        return list(self.pools[0].seqs)

    def num_tokens(self, seq_id: Hashable) -> int:
        return self.pools[0].num_tokens(seq_id) // self.scales[0]  # a group's pool counts store slots (group_blocks)

    def block_tables(self, seq_id: Hashable) -> list[np.ndarray]:
        """One table per group (NULL_BLOCK where a group freed the block; state_pages.with_resumed)."""
        return with_resumed(self._resumed, seq_id, [p.block_table(seq_id) for p in self.pools])

    def held_blocks(self, seq_id: Hashable) -> list[int]:
        """Blocks each group's table of the sequence holds now (its NULL entries not counted): what a swap of
        the sequence to the host copies, group by group — the window of a sliding group, the current chunk of a
        chunked one, the state pages of a state group."""
        self.pools[0]._seq(seq_id)  # not live: the error names it
        return held_counts(self._resumed, seq_id, [p.seqs for p in self.pools])  # (a page a jump resumed from too)

    def swap_bytes(self, seq_id: Hashable, page_bytes: int) -> list[int]:
        """Bytes a swap of the sequence moves each way, per group: `held_blocks` × `page_bytes`, the bytes of one
        block id in one table (KVLayout.page_bytes: every table's block id has that size in both layouts)."""
        return [blocks * page_bytes for blocks in self.held_blocks(seq_id)]

    def group_usage(self) -> list[GroupUsage]:
        # NOTE: without prefix-cache hits or forks no block is in two tables, so a group's distinct blocks are
        # the blocks its tables hold (a counter); otherwise they are counted (O(table entries + blocks))
        shared = self.store.counters["hit_blocks"] or self.store.counters["forks"]
        distinct = self._distinct_blocks() if shared else [p.logical_blocks for p in self.pools]
        return [GroupUsage(group, held, sum(s.num_blocks for s in pool.seqs.values()), pool.logical_tokens // scale)
                for group, pool, scale, held in zip(self.groups, self.pools, self.scales, distinct, strict=True)]

    def _distinct_blocks(self) -> list[int]:
        """Distinct blocks each group's live tables hold: every held block marked with its group (a block id is
        in one group only: one store), then counted per group, in one pass over all the tables."""
        tables = self._held_arrays()  # (a page a jump resumed from too)
        held = [t for group in tables for t in group]
        if not held:
            return [0] * len(self.pools)
        sizes = [sum(map(len, group)) for group in tables]
        owner = np.full(self.store.num_blocks, -1, dtype=np.int64)
        owner[np.concatenate(held)] = np.repeat(np.arange(len(self.pools)), sizes)
        return np.bincount(owner[owner >= 0], minlength=len(self.pools)).tolist()

    def usage(self) -> PoolUsage:
        """The store's usage; logical blocks and tokens summed over groups (max table: the longest of any). With
        groups of different tokens per block (group_blocks) tokens are store slots: a block holds block_size =
        the lcm of the groups' blocks, a token of a group of B_g-token blocks fills block_size / B_g of them."""
        store = self.store
        # weighted tables: blocks in units, tokens in the units' slots (a token of a block of weight w fills w)
        useful, cached = weighted_usage(store) if self.weighted else (store.useful_tokens, store.queue.num_cached)
        return PoolUsage(
            num_blocks=self.num_blocks, block_size=store.block_size, used_blocks=store.num_used,
            cached_free_blocks=cached, free_blocks=len(store.queue),
            pending_free_blocks=store.num_pending_blocks, num_seqs=len(self.pools[0].seqs),
            logical_blocks=sum(p.logical_blocks for p in self.pools),
            logical_tokens=sum(p.logical_tokens for p in self.pools),
            useful_tokens=useful + self.state_slack(),  # a state page: a whole state (state_pages)
            max_table_blocks=max((s.num_blocks for s in self.pools[0].seqs.values()), default=0),  # all alike
        )

    def stats(self) -> PoolStats:
        """Counters since creation: blocks (hand-outs, copies, evictions) once each; what happens to sequences
        (hits, prompts, forks, releases) once per sequence, not once per group."""
        counters = dict(self.store.counters)
        per_group = len(self.groups)
        for name in ("hit_blocks", "hit_tokens", "prompt_tokens", "forks", *(r.counter for r in ReleaseReason)):
            counters[name] //= per_group
        if self.mixed:  # a group's pool counts its tokens in store slots, its hit blocks in its own blocks
            slots = sum(self.scales)
            counters["hit_tokens"] = self.store.counters["hit_tokens"] // slots
            counters["prompt_tokens"] = self.store.counters["prompt_tokens"] // slots
            counters["hit_blocks"] = counters["hit_tokens"] // self.block_size
        return PoolStats(**counters)

    # ---- check, then grow -----------------------------------------------------------------------
    def free_skipped(self, seq_id: Hashable) -> int:
        """Free, in every group, the blocks that the sequence's next tokens will not read (left the window, an
        old chunk, a state page older than the one the next step resumes from); returns how many table
        entries were freed. `append` and `reserve` call it first, so that what they take may reuse them."""
        return self._skip(seq_id)

    def append_need(self, seq_id: Hashable, num_tokens: int) -> int:
        """Free blocks an append takes once `free_skipped` has run (Σ over groups)."""
        if self.weighted or self._jumps(num_tokens):  # a block costs its group's weight in units, a state group's
            return weighted_append_need(self, seq_id, num_tokens)  # chunk may jump; none: the page moves (roll_need)
        return sum(p.append_need(seq_id, num_tokens * s) if (seq := self._rolls(g, seq_id, num_tokens)) is None
                   else roll_need(p.store, seq)  # mode none: the one state page moves in place (state_pages)
                   for g, (p, s) in enumerate(zip(self.pools, self.scales, strict=True)))

    def append_need_many(self, seq_ids: Sequence[Hashable], adds: Sequence[int]) -> int:
        """Σ append_need(seq, add) (each after `free_skipped`): a step's check of every sequence at once. With one
        block size and no speculative slot every group's table of a sequence has its length, so the new blocks are
        the first group's times the groups; a copy of a partial, shared last block is looked up in one take."""
        if self.mixed or self.weighted or (self.rolling and self.store.counters["forks"]) or any(
                p.spec.tracked for p in self.pools) or self._jumps(max(adds, default=0)):
            return sum(self.append_need(s, a) for s, a in zip(seq_ids, adds, strict=True))
        B, grow, partial, first = self.block_size, 0, [], self.pools[0]
        for seq_id, add in zip(seq_ids, adds, strict=True):
            seq = first._seq(seq_id)
            if add > 0:
                grow += -(-(seq.num_tokens + add) // B) - seq.num_blocks
                if seq.num_tokens % B:
                    partial.append(seq_id)
        need = grow * (len(self.pools) - sum(self.rolled))  # mode none's state page moves in place (no fork)
        if partial:
            last = [int(t.table[t.num_blocks - 1]) for p in self.pools for t in map(p.seqs.__getitem__, partial)]
            need += int(np.count_nonzero(self.store.ref.take(last) > 1))
        return need

    def can_append(self, seq_id: Hashable, num_tokens: int) -> bool:
        self.free_skipped(seq_id)
        return self.append_need(seq_id, num_tokens) <= len(self.store.queue)

    def append(self, seq_id: Hashable, num_tokens: int, block_keys: BlockKeys = None) -> list[tuple[int, int]]:
        """Slots for `num_tokens` more tokens in every group; returns the copy-on-write copies [(src, dst)]."""
        self.free_skipped(seq_id)
        if num_tokens == 0:
            return []
        need = self.append_need(seq_id, num_tokens)
        if need > len(self.store.queue):
            raise PoolExhaustedError(f"appending {num_tokens} tokens needs {need} blocks over {len(self.groups)} "
                                     f"groups, {len(self.store.queue)} free")
        return self.append_fitting(seq_id, num_tokens, block_keys)

    def append_fitting(self, seq_id: Hashable, num_tokens: int, block_keys: BlockKeys = None
                       ) -> list[tuple[int, int]]:
        """`append` once its checks are done: `free_skipped(seq_id)` ran and `append_need` fits (a caller that
        checked many sequences at once); the same change, without evaluating the group rules and needs again."""
        if num_tokens == 0:
            return []
        keys = self._keys(block_keys)
        copies: list[tuple[int, int]] = []
        B, old = self.block_size, self.num_tokens(seq_id)
        if self.coarse is not None:
            self.coarse.note(seq_id, old, keys, B, self.pools[0])
        for g, (group, pool) in enumerate(zip(self.groups, self.pools, strict=True)):
            if (seq := self._rolls(g, seq_id, num_tokens)) is not None:  # mode none: the one page moves
                freed, grown = roll_page(pool.store, seq, num_tokens, pool._in_step)
                pool.logical_tokens += num_tokens
                pool.logical_blocks -= freed
                pool._epoch += 1
            elif (self.weighted or (group.kind == "state" and self.state_mode == "align")) and (
                    move := self._jump(g, seq_id, num_tokens)) is not None:
                copies.append(move)  # align: a state group's chunk takes only the pages it keeps (weighted.state_jump)
                self._changed()
                continue
            else:
                grown = pool.append(seq_id, num_tokens * self.scales[g], self._group_keys(g, keys, seq_id))
                if self.rolled[g]:  # kept speculative pages took the growth: the page it resumed from goes now
                    pool.skip_blocks(seq_id, group.first_block_before_growth(old + num_tokens, B, self.state_mode))
            copies += grown
            if seq is None and group.kind == "state" and old and (old - 1) // B != (old + num_tokens - 1) // B:
                # the running state moves into a new page: it starts as a copy of the page it resumes from
                table = pool.seqs[seq_id].table
                move = (int(table[(old - 1) // B]), int(table[(old + num_tokens - 1) // B]))
                if move not in grown:
                    copies.append(move)
            self._changed()
        if keys is not None:
            self._register_anchored(seq_id, old, old + num_tokens)
        return copies

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """The child shares every group's blocks; a state page is copied when either branch writes it."""
        for pool in self.pools:
            pool.fork(parent_id, child_id)
        self._fork_resumed(parent_id, child_id)
        if self.coarse is not None:
            self.coarse.fork(parent_id, child_id)
        self._changed()

    def release(self, seq_id: Hashable, reason: ReleaseReason = ReleaseReason.FINISHED) -> None:
        self.pools[0]._seq(seq_id)  # not live: the error names it before any group changes
        for g, pool in enumerate(self.pools):
            pool.release(seq_id, reason)
            self._let_resumed_go(seq_id, (g,))  # a page a jump resumed from: after its table, freed tail first
        if self.coarse is not None:
            self.coarse.forget(seq_id)
        self._changed()

    # ---- speculative slots ----------------------------------------------------------------------
    def can_reserve(self, seq_id: Hashable, num_slots: int) -> bool:
        self._skip(seq_id)
        return num_slots <= 0 or self.reserve_need(seq_id, num_slots) <= len(self.store.queue)

    def reserve_need(self, seq_id: Hashable, num_slots: int) -> int:
        return sum(p.reserve_need(seq_id, num_slots * s) * w
                   for p, s, w in zip(self.pools, self.scales, self.weights, strict=True))

    def reserve(self, seq_id: Hashable, num_slots: int) -> list[tuple[int, int]]:
        """`num_slots` speculative slots in every group (never hashed) until `commit`. A state group keeps its
        page until the commit: a rollback returns to the state it holds."""
        self._skip(seq_id)
        need = self.reserve_need(seq_id, num_slots)
        if need > len(self.store.queue):
            raise PoolExhaustedError(f"{num_slots} slots need {need} blocks, {len(self.store.queue)} free")
        copies = []
        for pool, s in zip(self.pools, self.scales, strict=True):
            copies += pool.reserve(seq_id, num_slots * s)
            self._changed()
        return copies

    def commit(self, seq_id: Hashable, num_accepted: int, block_keys: BlockKeys = None) -> int:
        """Keep the first `num_accepted` slots in every group; returns the slots rolled back. A state group
        whose pages were written over rejected drafts stops hashing this sequence (vLLM #48375)."""
        res = self.pools[0].reservation(seq_id)
        if res is None:
            raise ValueError(f"sequence {seq_id!r} has no open reservation: a reservation is committed once")
        if not 0 <= num_accepted <= res.num_slots // self.scales[0]:
            raise ValueError(f"num_accepted {num_accepted} is outside 0..{res.num_slots // self.scales[0]}, the "
                             "reserved slots")
        keys = self._keys(block_keys)
        B, old = self.block_size, self.pools[0].committed_tokens(seq_id) // self.scales[0]
        if self.coarse is not None:
            self.coarse.note(seq_id, old, keys, self.block_size, self.pools[0])
        rolled_back = 0
        for g, (group, pool) in enumerate(zip(self.groups, self.pools, strict=True)):
            rolled_back = pool.commit(seq_id, num_accepted * self.scales[g], self._group_keys(g, keys, seq_id))
            rolled_back //= self.scales[g]
            if group.kind == "state" and rolled_back:
                pool.stop_hashing(seq_id)
            if self.rolled[g]:  # mode none: the page the reservation resumed from goes now, one page is held
                pool.skip_blocks(seq_id, group.first_block_before_growth(old + num_accepted, B, self.state_mode))
            self._changed()
        if keys is not None:
            self._register_anchored(seq_id, old, old + num_accepted)
        return rolled_back

    # ---- checks ---------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Every invariant of the pool over all groups' tables at once, and each group's speculative rules
        and group rule (no table holds a block its group rule lets go, past the current step's growth)."""
        tables = [t for p in self.pools for t in p.tables()]
        spare = [k for p in self.pools for k in p.spec.kept.values()]
        check_pool_invariants(
            self.store, tables, in_step=False, logical_blocks=sum(p.logical_blocks for p in self.pools),
            logical_tokens=sum(p.logical_tokens for p in self.pools), spare=spare, resumed=self._resumed_now(),
        )
        ids = set(self.pools[0].seqs)
        for group, pool, B, s in zip(self.groups, self.pools, self.group_blocks, self.scales, strict=True):
            assert set(pool.seqs) == ids, f"group {group.name} holds other sequences than group 0"
            check_speculative(pool.spec, pool.seqs)
            for seq_id, seq in pool.seqs.items():
                assert seq.num_tokens // s == self.num_tokens(seq_id), "groups disagree on a length"
                assert seq.num_tokens % s == 0, f"group {group.name}: a token takes {s} slots, not a part of them"
                n, skipped = pool.committed_tokens(seq_id) // s, seq.num_skipped
                # never freed early: the next token (position n) reads every block from `skipped` on
                if group.kind == "sliding":
                    assert skipped * B <= max(0, n - group.span + 1), (
                        f"sliding group: sequence {seq_id!r} freed a block inside its window")
                elif group.kind == "chunked":
                    assert skipped * B <= n // group.span * group.span, (
                        f"chunked group: sequence {seq_id!r} freed a block of its current chunk")
                elif group.kind == "state":  # the running state's page is held
                    assert n == 0 or skipped <= (n - 1) // B, (
                        f"state group: sequence {seq_id!r} freed the page of its running state")
                else:
                    assert skipped == 0, f"full group: sequence {seq_id!r} freed a block"

