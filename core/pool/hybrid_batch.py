"""Many sequences of a hybrid pool at once: a decode step's appends and the blocks each group's rule lets go,
evaluated once per kind of group instead of once per sequence (see core/pool/hybrid.py). Each is the same
change as the one-sequence operations in that order, or refuses the pools where it would not be.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from .append import SeqTable
from .hybrid_private import HybridPrivate
from .pool_tables import NULL_BLOCK
from .state_pages import crosses, roll_need, roll_page
from .store import PoolExhaustedError
from .weighted import state_jump, weighted_append_need


class HybridBatch(HybridPrivate):
    """`append_many`, `free_skipped_many` and the private-pool fast paths of a hybrid pool."""

    def append_many(self, seq_ids: Sequence[Hashable], num_tokens: int) -> None:
        """`append(seq, num_tokens)` (no block keys, no copies to report) for each sequence in one call per
        group: a decode step. Only for a pool whose blocks are in one table each (no fork yet, no open
        reservation); check, then change, over all groups together."""
        if self.store.counters["forks"] or any(p.spec.tracked for p in self.pools):
            raise ValueError("append_many takes a pool without forks or speculative slots: append one at a time")
        if num_tokens <= 0 or not seq_ids:
            return
        if self.weighted or self._jumps(num_tokens):  # weighted tables, align's jumps: one at a time (weighted.py)
            self.free_skipped_many(seq_ids)
            if (need := self.append_many_need(seq_ids, num_tokens)) > len(self.store.queue):
                raise PoolExhaustedError(f"appending {num_tokens} tokens to {len(seq_ids)} sequences needs {need} "
                                         f"units, {len(self.store.queue)} free")
            for seq_id in seq_ids:
                for g, pool in enumerate(self.pools):
                    if self.rolled[g]:  # mode none: the one state page moves in place (state_pages)
                        self._roll_many(g, (seq_id,), num_tokens)
                    elif self._jump(g, seq_id, num_tokens) is None:
                        pool.append(seq_id, num_tokens)
            self._changed()
            return
        if self.mixed:  # groups of different tokens per block (group_blocks): one at a time, checked first
            self.free_skipped_many(seq_ids)
            if (need := self.append_many_need(seq_ids, num_tokens)) > len(self.store.queue):
                raise PoolExhaustedError(f"appending {num_tokens} tokens to {len(seq_ids)} sequences needs {need} "
                                         f"blocks, {len(self.store.queue)} free")
            for g, (pool, scale) in enumerate(zip(self.pools, self.scales, strict=True)):  # mixed: no state group
                if self.rolled[g]:  # (groups.pool_groups); weighted: a state table of mode none moves its page
                    self._roll_many(g, seq_ids, num_tokens)
                    continue
                for seq_id in seq_ids:
                    pool.append(seq_id, num_tokens * scale)
            self._changed()
            return
        self.free_skipped_many(seq_ids)
        B = self.block_size
        tables = self.pools[0]._live(seq_ids, "appended to")
        grow = sum(-(-(s.num_tokens + num_tokens) // B) - s.num_blocks for s in tables)
        need = grow * (len(self.groups) - sum(self.rolled))  # every table of a sequence has the same length
        if need > len(self.store.queue):
            raise PoolExhaustedError(f"appending {num_tokens} tokens to {len(seq_ids)} sequences needs {need} "
                                     f"blocks over {len(self.groups)} groups, {len(self.store.queue)} free")
        for g, pool in enumerate(self.pools):
            if self.rolled[g]:
                self._roll_many(g, seq_ids, num_tokens)
            else:
                pool.append_many(seq_ids, num_tokens)
        self._changed()

    def _jumps(self, num_tokens: int) -> bool:
        """Whether an append of `num_tokens` may jump over state pages (mode align, more than a block: the step
        takes only its last page, groups.PoolGroup.first_block / weighted.state_jump)."""
        return num_tokens > self.block_size and self.state_mode == "align" and any(
            g.kind == "state" for g in self.groups)

    def _jump(self, g: int, seq_id: Hashable, num_tokens: int) -> tuple[int, int] | None:
        """weighted.state_jump (None: a plain append is right), the entries it jumps over NULL_BLOCK (vLLM's null
        blocks between the pages); the page it resumes from keeps its entry (masked by block_table as any freed
        one) while the step runs: the state a step resumes from is read there (it is pending inside a step)."""
        seq = self.pools[g]._seq(seq_id)
        held = seq.num_blocks
        move = state_jump(self, g, seq_id, num_tokens)
        if move is not None:
            seq.table[held : seq.num_skipped] = NULL_BLOCK
        return move

    def _rolls(self, g: int, seq_id: Hashable, num_tokens: int) -> SeqTable | None:
        """The sequence's table of group g when an append of `num_tokens` moves its one state page (mode none,
        no open reservation or kept page: state_pages.roll_page); None otherwise."""
        if not self.rolled[g]:
            return None
        pool = self.pools[g]
        seq = pool._seq(seq_id)
        if pool.spec.tracked and pool.spec.tracks(seq_id):
            return None
        return seq if crosses(seq, num_tokens, self.block_size) else None

    def _roll_many(self, g: int, seq_ids: Sequence[Hashable], num_tokens: int) -> None:
        """Append `num_tokens` to each sequence's table of group g, a state group of mode none whose pages no fork
        shares: its one page moves along in place when the sequence grows into a new block (state_pages)."""
        pool, B = self.pools[g], self.block_size
        for seq_id in seq_ids:
            seq = pool.seqs[seq_id]
            if crosses(seq, num_tokens, B):
                freed = roll_page(pool.store, seq, num_tokens, pool._in_step)[0]
                pool.logical_tokens += num_tokens
                pool.logical_blocks -= freed
                pool._epoch += 1
            else:
                pool.append(seq_id, num_tokens)

    def free_skipped_many(self, seq_ids: Sequence[Hashable], one_drop: bool = True) -> None:
        """`free_skipped` of each sequence (none with speculative slots), the rule evaluated once per kind of
        group for all sequences at once; `one_drop` (and every block in one table): one `skip_many` per kind
        instead of BlockPool.skip_blocks per sequence (the same blocks freed in the same order)."""
        if self.mixed or self._resumed:  # groups of different tokens per block (group_blocks), a page an align jump
            self.pools[0]._live(seq_ids, "freed")  # resumed from (HybridLayout._skip lets it go): one at a time
            for seq_id in seq_ids:
                self._skip(seq_id)
            return
        B = self.block_size
        kinds: dict[tuple[str, int], list[int]] = {}  # (kind, window; 0 for a state group)
        for g, group in enumerate(self.groups):
            if group.kind != "full":
                kinds.setdefault((group.kind, group.window or 0), []).append(g)
        if not kinds:
            return
        seqs = self.pools[0]._live(seq_ids, "freed")
        tokens = np.fromiter((s.num_tokens for s in seqs), np.int64, len(seqs))
        # NOTE: the one-drop path only without a prefix cache (as in `kvcalc sim` without keys): with one, the
        # per-sequence path keeps the exact order verify's scenarios were written against
        private = one_drop and not (self.store.enable_prefix_caching or self.store.counters["forks"])
        for (kind, window), members in kinds.items():
            if kind == "sliding":
                first = np.maximum(tokens - window + 1, 0) // B
            elif kind == "chunked":
                first = tokens // window * window // B
            else:  # a state group, every mode: from the page the next step resumes from (groups.py)
                first = np.maximum(tokens - 1, 0) // B
            if private and not any(self.pools[g].spec.tracked for g in members):
                self.skip_many(members, seq_ids, first.tolist())
                continue
            for g in members:
                pool = self.pools[g]
                skipped = np.fromiter((s.num_skipped for s in pool._live(seq_ids, "freed")), np.int64, len(seqs))
                for i in np.flatnonzero(first > skipped).tolist():
                    pool.skip_blocks(seq_ids[i], int(first[i]))
                self._changed()

    def grow_private_many(self, seq_ids: Sequence[Hashable], num_tokens: int) -> None:
        """`BlockPool.append_many(seq_ids, num_tokens)` in every group, without freeing anything first, all
        groups at once: a run of decode steps brought up to date at once. Only for a pool whose
        blocks are in one table each (no fork, no prefix-cache hit, no speculative slot), so no block is
        copied: each table's partial last block is written in place, its fresh blocks are full but the last."""
        store, B = self.store, self.block_size
        if store.counters["forks"] or store.counters["hit_blocks"] or any(p.spec.tracked for p in self.pools):
            raise ValueError("grow_private_many takes a pool whose blocks are in one table each: append instead")
        if self.weighted or self._jumps(num_tokens):  # weighted tables: each group's hand-outs; a state group's jump
            self.append_many(seq_ids, num_tokens)
            return
        if self.mixed and num_tokens > 0 and seq_ids:  # groups of different tokens per block: one at a time
            if (need := self.append_many_need(seq_ids, num_tokens)) > len(store.queue):
                raise PoolExhaustedError(f"appending {num_tokens} tokens to {len(seq_ids)} sequences needs {need} "
                                         f"blocks, {len(store.queue)} free")
            for pool, scale in zip(self.pools, self.scales, strict=True):
                for seq_id in seq_ids:
                    pool.append(seq_id, num_tokens * scale)
            self._changed()
            return
        if num_tokens <= 0 or not seq_ids:
            return
        self.pools[0]._live(seq_ids, "appended to")  # every group holds the same sequences
        pools = [p for p, rolled in zip(self.pools, self.rolled, strict=True) if not rolled]  # mode none: in place
        tables = [[p.seqs[i] for i in seq_ids] for p in pools]
        count, groups = len(seq_ids), len(pools)
        old = np.fromiter((t.num_tokens for t in tables[0]), np.int64, count)
        grow = -(-(old + num_tokens) // B) - np.fromiter((t.num_blocks for t in tables[0]), np.int64, count)
        per = int(grow.sum())  # every group's tables have the same length
        need = per * groups
        if need > len(store.queue):
            raise PoolExhaustedError(f"appending {num_tokens} tokens to {count} sequences needs {need} blocks over "
                                     f"{groups} groups, {len(store.queue)} free")
        old_mod = old % B
        partial = np.flatnonzero(old_mod)
        if len(partial):
            ends = partial.tolist()
            last = [s.table[s.num_blocks - 1] for t in tables for s in map(t.__getitem__, ends)]
            # each group's partial blocks get the same tokens: a (groups, partial) index broadcasts the row
            store.fill[np.array(last, np.int64).reshape(groups, len(ends))] += np.minimum(B - old_mod[partial],
                                                                                          num_tokens)
        if need:
            self._grow_fresh(tables, grow, old + num_tokens, per)
        store.useful_tokens += num_tokens * count * groups
        for g in range(len(self.pools)) if self.rolling else ():
            if self.rolled[g]:
                self._roll_many(g, seq_ids, num_tokens)
        for t, pool in zip(tables, pools, strict=True):
            for seq in t:
                seq.num_tokens += num_tokens
            pool.logical_blocks += per
            pool.logical_tokens += num_tokens * count
        self._changed()

    def _grow_fresh(self, tables: list[list[SeqTable]], grow: np.ndarray, new_tokens: np.ndarray, per: int) -> None:
        """Hand out `per` fresh blocks per group (grow[i] to sequence i, in order) and append them to the
        tables: the block ids of BlockPool.append_many group by group, in group order."""
        store, B, groups = self.store, self.block_size, len(tables)
        need = per * groups
        if store.enable_prefix_caching:  # evictions: one hand-out per group
            blocks = np.concatenate([store.hand_out(per)[0] for _ in range(groups)])
        else:  # plain blocks only, popped from the top: one pop of G·per is G pops of per, in order
            blocks = store.hand_out(need)[0]
        store.ref[blocks] = 1
        store.num_used += need
        growing = np.flatnonzero(grow)
        sizes = grow[growing]
        fill = np.full(per, B, dtype=store.fill.dtype)
        fill[np.cumsum(sizes) - 1] = (new_tokens[growing] - 1) % B + 1
        store.fill[blocks.reshape(groups, per)] = fill  # the same fills in every group
        grow_at = growing.tolist()
        if len(grow_at) == per:  # one block each (a decode run's usual case): plain ints, no slices
            block_list = blocks.tolist()
            at = 0
            for t in tables:
                for i in grow_at:
                    seq = t[i]
                    n = seq.num_blocks
                    if n + 1 > len(seq.table):
                        seq.table = np.concatenate([seq.table, np.empty(2 * (n + 1), dtype=np.int64)])
                    seq.table[n] = block_list[at]
                    seq.num_blocks = n + 1
                    at += 1
            return
        size_list, at = sizes.tolist(), 0
        for t in tables:
            for i, k in zip(grow_at, size_list, strict=True):
                t[i].extend(blocks[at : at + k])
                at += k

    def skip_many(self, groups: Sequence[int], seq_ids: Sequence[Hashable], first_blocks: Sequence[int]) -> int:
        """`BlockPool.skip_blocks(seq, first)` for each sequence, in order, in each of `groups` (group indices,
        in order), in one drop (the blocks skip_blocks would free, in its order). Only for a pool whose blocks
        are in one table each (no fork, no speculative slot, no prefix-cache hit); returns how many were freed."""
        store, B = self.store, self.block_size
        pools = [self.pools[g] for g in groups]
        if store.counters["forks"] or store.counters["hit_blocks"] or any(p.spec.tracked for p in pools) or self.mixed:
            raise ValueError("skip_many takes a pool whose blocks are in one table each, of one size: skip one at a "
                             "time")
        first_tables = pools[0]._live(seq_ids, "freed")  # every group holds the same sequences
        tables = [first_tables, *([p.seqs[i] for i in seq_ids] for p in pools[1:])]
        firsts = [min(f, s.num_blocks) for s, f in zip(tables[0], first_blocks, strict=True)]  # lengths alike
        for i, (seq_id, first) in enumerate(zip(seq_ids, firsts, strict=True)):
            if first * B > tables[0][i].num_tokens and any(first > t[i].num_skipped for t in tables):
                raise ValueError(f"sequence {seq_id!r}: block {first - 1} holds unwritten slots and cannot be skipped")
        parts = []
        for pool, seqs in zip(pools, tables, strict=True):
            freed = 0
            for seq, first in zip(seqs, firsts, strict=True):
                skipped = seq.num_skipped
                if first > skipped:
                    parts.append(seq.table[skipped:first][::-1])  # skip_blocks drops a tail first
                    freed += first - skipped
                    seq.num_skipped = first
            pool.logical_blocks -= freed
        if not parts:
            return 0
        gone = np.concatenate(parts)
        store.ref[gone] -= 1
        assert not store.ref[gone].any(), "skip_many: a skipped block is held by another table"
        store.drop(gone, defer=pools[0]._in_step)
        self._changed()
        return len(gone)

    def append_many_need(self, seq_ids: Sequence[Hashable], num_tokens: int) -> int:
        """Free blocks `append_many` takes (after freeing what the groups let go, which it does first)."""
        if self.weighted or self._jumps(num_tokens):  # units, a state group's jump (weighted.py)
            self.pools[0]._live(seq_ids, "appended to")
            return sum(weighted_append_need(self, seq_id, num_tokens) for seq_id in seq_ids)
        if self.mixed:  # groups of different tokens per block (group_blocks)
            self.pools[0]._live(seq_ids, "appended to")
            return sum(p.append_need(seq_id, num_tokens * s) if (seq := self._rolls(g, seq_id, num_tokens)) is None
                       else roll_need(p.store, seq)
                       for g, (p, s) in enumerate(zip(self.pools, self.scales, strict=True))
                       for seq_id in seq_ids)
        B = self.block_size
        tables = self.pools[0]._live(seq_ids, "appended to")
        if self.rolling and (self.store.counters["forks"] or any(p.spec.tracked for p in self.pools)):
            return sum(p.append_need(seq_id, num_tokens) if (seq := self._rolls(g, seq_id, num_tokens)) is None
                       else roll_need(p.store, seq) for g, p in enumerate(self.pools) for seq_id in seq_ids)
        grown = len(self.groups) - sum(self.rolled)  # a state page of mode none moves in place (state_pages)
        return grown * sum(-(-(s.num_tokens + num_tokens) // B) - s.num_blocks for s in tables)

