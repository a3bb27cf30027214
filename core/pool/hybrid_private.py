"""A private hybrid pool's operations: every group's tables of a sequence changed at once, the blocks of all groups
handed out in one hand-out and taken back in one drop.

A hybrid pool is private while no block can be in two tables and no block's id matters to anyone: no prefix
caching, no fork, no speculative slot, one block size for every group (what `kvcalc sim` runs without prefix keys).
A sequence's tables then all have one length, and all tables of one kind of group free the same leading blocks, so
a change is worked out once per sequence and kind. The tables of a sequence are kept as the rows of one array
[groups, capacity] (each group's SeqTable.table a row of it: `_wide`), so that a growth or a free is one numpy call
per sequence and kind, not per group. The tables, counters and invariants are those the one-group operations leave
(hybrid.py, block_pool); only the block ids differ, which nothing reads in a private pool.

    allocate_private(seq, n, computed)  HybridPool.allocate without keys: each group holds the blocks its layers
                                        read from `computed` written tokens on (all of them when 0)
    advance_private(ids, n, chunk)      n tokens each, appended `chunk` at a time: a decode run (chunk 1), or one
                                        append (chunk n) — each group frees what its rule lets go before the last
                                        append, then grows; no block is handed out only to be freed within
    release_private(seq, reason)        HybridPool.release
    first_blocks(group, computed)       PoolGroup.first_block_before_growth over an array of lengths (mode none's
                                        state page: where the decode step's token goes)
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from ..blocks import ceil_div
from .accounting import ReleaseReason
from .append import SeqTable
from .groups import PoolGroup
from .hybrid_layout import HybridLayout
from .pool_tables import NULL_BLOCK, RELEASE_COUNTER
from .prefix_cache import root_hash
from .store import PoolExhaustedError


def first_blocks(group: PoolGroup, computed: np.ndarray, block_size: int, state_mode: str) -> np.ndarray | int:
    """The first block a group's table of a sequence holding `computed` tokens keeps once an append from there
    has freed what the group's rule lets go (PoolGroup.first_block_before_growth, element by element; 0 for a
    group that frees nothing). A state group of mode none: the block the append's token `computed` goes to (its
    one page moves there, PoolGroup.first_block of the step that ends at computed + 1)."""
    B = block_size
    if group.kind == "sliding":
        return np.maximum(computed - group.span + 1, 0) // B
    if group.kind == "chunked":
        return computed // group.span * group.span // B
    if group.kind == "state" and state_mode == "none":  # the one page, moved to where token `computed` goes
        return computed // B
    if group.kind == "state":  # align, all: from the page the append resumes from (groups.PoolGroup.first_block)
        return np.maximum(computed - 1, 0) // B
    return 0


class HybridPrivate(HybridLayout):
    """The private pool's operations (see the module docstring)."""

    @property
    def private(self) -> bool:
        store = self.store
        if store.enable_prefix_caching or store.counters["forks"] or getattr(self, "mixed", False) or (
                getattr(self, "weighted", False)) or self.jumps_hold_resumed:  # align: HybridLayout._resume
            return False
        return not any(pool.spec.tracked for pool in self.pools)

    def kinds(self) -> list[tuple[PoolGroup, list[int]]]:
        """The distinct groups (kind and window) with the indices of their tables, in group order (Gemma-3:
        full [0], sliding [1..6])."""
        memo = self.__dict__.get("_private_kinds")
        if memo is None:
            members: dict[PoolGroup, list[int]] = {}
            for g, group in enumerate(self.groups):
                members.setdefault(PoolGroup(group.kind, group.window), []).append(g)
            memo = self.__dict__["_private_kinds"] = list(members.items())
        return memo

    def _rows(self) -> list[tuple[bool, slice | list[int], int, int]]:
        """Per kind: (frees nothing, its rows of a wide table — a slice when they are adjacent —, how many, the
        first of them)."""
        memo = self.__dict__.get("_private_rows")
        if memo is None:
            memo = []
            for group, members in self.kinds():
                adjacent = members == list(range(members[0], members[-1] + 1))
                memo.append((group.kind == "full",
                             slice(members[0], members[-1] + 1) if adjacent else members, len(members),
                             members[0]))
            self.__dict__["_private_rows"] = memo
        return memo

    def _wide(self, seq_id: Hashable, tables: Sequence[SeqTable], capacity: int = 0) -> np.ndarray:
        """The sequence's tables as the rows of one array of at least `capacity` columns (made so, and each
        group's SeqTable.table pointed at its row, when another operation replaced a table or it is too short)."""
        wide = self.__dict__.setdefault("_private_wide", {})
        table = wide.get(seq_id)
        if table is not None and table.shape[1] >= capacity:
            for seq in tables:
                if seq.table.base is not table:
                    break
            else:
                return table
        held = tables[0].num_blocks
        table = np.empty((len(tables), max(2 * capacity, 2 * held, 8)), dtype=np.int64)
        for row, seq in zip(table, tables, strict=True):
            row[:held] = seq.table[:held]
            seq.table = row
        wide[seq_id] = table
        return table

    def _last_ids(self, seq_id: Hashable, table: np.ndarray, held: int) -> list[int]:
        """The last block of each of the sequence's tables (its wide `table`, `held` entries long), remembered
        while the table is the same array and as long: a decode step reads them to top them up."""
        last = self.__dict__.setdefault("_private_last", {})
        known = last.get(seq_id)
        if known is not None and known[0] is table and known[1] == held:
            return known[2]
        ids = table[:, held - 1].tolist()
        last[seq_id] = (table, held, ids)
        return ids

    def _private_check(self, what: str) -> None:
        if not self.private:
            raise ValueError(f"{what} takes a private pool (no prefix caching, fork, speculative slot or mixed "
                             "block sizes): use the one-sequence operations")

    # ---- allocate, release ------------------------------------------------------------------------
    def _private_firsts(self, num_tokens: int, computed_tokens: int) -> list[int]:
        """Per kind: the first block a new sequence's tables hold (HybridHits._allocate_plan without keys)."""
        B, total = self.block_size, ceil_div(num_tokens, self.block_size)
        return [min(g.first_block(computed_tokens, num_tokens, B, self.state_mode), total) for g, _ in self.kinds()]

    def allocate_private_need(self, num_tokens: int, computed_tokens: int = 0) -> int:
        """Free blocks `allocate_private` takes (what `can_allocate` without keys compares)."""
        total, firsts = ceil_div(num_tokens, self.block_size), self._private_firsts(num_tokens, computed_tokens)
        return sum(len(m) * (total - f) for (_, m), f in zip(self.kinds(), firsts, strict=True))

    def allocate_private(self, seq_id: Hashable, num_tokens: int, computed_tokens: int = 0) -> int:
        """HybridPool.allocate(seq_id, num_tokens, computed_tokens=...) without keys, in a private pool: the
        blocks of every group in one hand-out, the tables one array (`_wide`). Returns the hit tokens: 0."""
        self._private_check("allocate_private")
        if self.has_seq(seq_id):
            raise ValueError(f"sequence {seq_id!r} already has a block table; release it first")
        store, B = self.store, self.block_size
        total, firsts = ceil_div(num_tokens, B), self._private_firsts(num_tokens, computed_tokens)
        need = sum(len(m) * (total - f) for (_, m), f in zip(self.kinds(), firsts, strict=True))
        if need > len(store.queue):
            raise PoolExhaustedError(f"{num_tokens} tokens need {need} blocks over {len(self.groups)} groups, "
                                     f"{len(store.queue)} free")
        blocks = store.hand_out(need)[0]
        table = np.empty((len(self.groups), max(total, 4) * 2), dtype=np.int64)
        fills = np.full(need, B, dtype=store.fill.dtype)
        at = useful = 0
        for (_, rows, count, _), f in zip(self._rows(), firsts, strict=True):
            table[rows, :f] = NULL_BLOCK
            if total > f:
                m = total - f
                table[rows, f:total] = blocks[at : at + count * m].reshape(count, m)
                fills[at + m - 1 : at + count * m : m] = num_tokens - (total - 1) * B
                at += count * m
                useful += count * (num_tokens - f * B)
        store.ref[blocks] = 1
        store.fill[blocks] = fills
        store.num_used += need
        store.useful_tokens += useful
        first_of = [f for (_, members), f in zip(self.kinds(), firsts, strict=True) for _ in members]
        order = [g for _, members in self.kinds() for g in members]
        roots = self._roots()
        for g, f in zip(order, first_of, strict=True):
            pool = self.pools[g]
            pool.seqs[seq_id] = SeqTable(table[g], total, num_tokens, roots[g][0], 0, roots[g][1], 0, f)
            pool.logical_blocks += total - f
            pool.logical_tokens += num_tokens
            pool._epoch += 1
        store.counters["prompt_tokens"] += num_tokens * len(self.groups)
        self.__dict__.setdefault("_private_wide", {})[seq_id] = table
        self._changed()
        return 0

    def _roots(self) -> list[tuple[int, int]]:
        """Per group: (the id of its extra key (group, None), the root hash of a chain under it), as
        PoolTables.allocate gives a table without keys."""
        memo = self.__dict__.get("_private_roots")
        if memo is None:
            ids = [pool.prefix.extra_id((g, None)) for g, pool in enumerate(self.pools)]
            memo = self.__dict__["_private_roots"] = [(i, root_hash(i)) for i in ids]
        return memo

    def release_private(self, seq_id: Hashable, reason: ReleaseReason = ReleaseReason.FINISHED) -> None:
        """HybridPool.release in a private pool: every group's blocks in one drop."""
        counter = RELEASE_COUNTER.get(reason)
        if counter is None:
            raise ValueError(f"unknown release reason {reason!r}: use a ReleaseReason")
        self._private_check("release_private")
        tables = [self.pools[0]._seq(seq_id), *(p.seqs[seq_id] for p in self.pools[1:])]
        store = self.store
        blocks = np.concatenate([s.table[s.num_skipped : s.num_blocks] for s in tables])
        store.ref[blocks] -= 1
        assert not store.ref[blocks].any(), "release_private: a block is held by another table"
        store.drop(blocks, defer=self.pools[0]._in_step)
        for pool, seq in zip(self.pools, tables, strict=True):
            del pool.seqs[seq_id]
            pool.logical_blocks -= seq.num_blocks - seq.num_skipped
            pool.logical_tokens -= seq.num_tokens
            pool._epoch += 1
        store.counters[counter] += len(self.pools)
        self.__dict__.get("_private_wide", {}).pop(seq_id, None)
        self.__dict__.get("_private_last", {}).pop(seq_id, None)
        self._changed()

    # ---- growth -----------------------------------------------------------------------------------
    def advance_private(self, seq_ids: Sequence[Hashable], num_tokens: int, chunk: int, check: bool = True,
                        credit: bool = True) -> bool | None:
        """Every sequence `num_tokens` tokens longer in every group, appended `chunk` at a time (see the module
        docstring), in a private pool. `check`: when the growth does not fit, free only what the groups let go
        before the first append and return False (as `free_skipped_many` then a refused check); without it, a
        growth that does not fit raises PoolExhaustedError and changes nothing. `credit=False` (with `check`): the
        blocks the step frees are not counted as free for its growth; None where it then does not fit, nothing
        changed (the caller grows request by request, as vLLM: GroupedPagedPolicy._grow_in_order)."""
        self._private_check("advance_private")
        if num_tokens <= 0 or not seq_ids:
            return True
        pools = self.pools
        columns = list(zip(pools[0]._live(seq_ids, "appended to"), *([p.seqs[i] for i in seq_ids] for p in pools[1:]),
                           strict=True))
        plan, need, gone = self._private_plan(columns, num_tokens, chunk)
        free_now = len(self.store.queue) + (0 if pools[0]._in_step or not credit else gone)
        if need > free_now and not credit and check:  # frees not credited: nothing done, the caller steps in order
            return None
        if need > free_now:
            if not check:
                raise PoolExhaustedError(f"appending {num_tokens} tokens to {len(seq_ids)} sequences needs {need} "
                                         f"blocks over {len(self.groups)} groups, {free_now} free")
            first = plan if chunk == num_tokens and not self.rolling else self._private_plan(
                columns, num_tokens, num_tokens, refused=True)[0]  # mode none: the one page stays
            self._private_free(seq_ids, columns, first)
            self._changed()
            return False
        wides = self._private_free(seq_ids, columns, plan)
        self._private_grow(seq_ids, columns, wides, plan, num_tokens, need)
        self._changed()
        return True

    def _private_plan(self, columns: list[tuple[SeqTable, ...]], num_tokens: int, chunk: int, refused: bool = False
                      ) -> tuple[list[tuple[int, int, list[int]]], int, int]:
        """(per sequence: its tables' length now and after, and per kind the first block they keep once the last
        append, from num_tokens − chunk tokens on, has freed; the fresh blocks the growth takes; the blocks it frees
        that are held now). Python integers: a decode step holds a few sequences, whose numpy calls would cost more.
        `refused`: what is freed before a growth that does not fit (a state page of mode none is kept then)."""
        B, mode = self.block_size, self.state_mode
        kinds = list(zip(self._rows(), self.kinds(), strict=True))
        plan, need, gone = [], 0, 0
        for c in columns:
            held, tokens = c[0].num_blocks, c[0].num_tokens
            after = -(-(tokens + num_tokens) // B)
            firsts = []
            for (nothing, _, count, lead), (group, _) in kinds:
                skipped = c[lead].num_skipped
                start = tokens + num_tokens - chunk
                end = start if refused else tokens + num_tokens  # mode none: the page of the step's last token
                first = skipped if nothing else max(skipped, group.first_block(start, end, B, mode))
                firsts.append(first)
                need += count * (after - max(held, first))
                gone += count * max(0, min(first, held) - skipped)
            plan.append((held, after, firsts))
        return plan, need, gone

    def _private_free(self, seq_ids: Sequence[Hashable], columns: list[tuple[SeqTable, ...]],
                      plan: list[tuple[int, int, list[int]]]) -> list[np.ndarray]:
        """Free, in every table, the blocks before its kind's first block of `plan` (entries past the table's end
        included: never handed out), in one drop; returns the sequences' wide tables, each wide enough for `plan`."""
        parts, wides = [], []
        freed = [0] * len(self.pools)
        kinds = list(zip(self._rows(), self.kinds(), strict=True))
        for seq_id, c, (held, after, firsts) in zip(seq_ids, columns, plan, strict=True):
            table = self._wide(seq_id, c, after)
            wides.append(table)
            for ((_, rows, _, lead), (_, members)), first in zip(kinds, firsts, strict=True):
                skipped = c[lead].num_skipped
                if first > skipped:
                    if skipped < held:
                        parts.append(table[rows, skipped : min(first, held)].ravel())
                    for g in members:
                        c[g].num_skipped = first
                        freed[g] += first - skipped
        for pool, count in zip(self.pools, freed, strict=True):
            pool.logical_blocks -= count
        if parts:
            store = self.store
            blocks = np.concatenate(parts)
            store.ref[blocks] -= 1
            assert not store.ref[blocks].any(), "advance_private: a freed block is held by another table"
            store.drop(blocks, defer=self.pools[0]._in_step)
        return wides

    def _private_grow(self, seq_ids: Sequence[Hashable], columns: list[tuple[SeqTable, ...]], wides: list[np.ndarray],
                      plan: list[tuple[int, int, list[int]]], num_tokens: int, need: int) -> None:
        """Top up every kept partial last block, then hand out `need` fresh blocks (each table's all full but its
        last) for the tables' new entries from their first kept one on; the entries before it stay NULL_BLOCK."""
        store, B, G = self.store, self.block_size, len(self.pools)
        blocks = store.hand_out(need)[0]
        ids = blocks.tolist()
        fills: list[int] = []  # of the fresh blocks, in hand-out order
        topped: list[int] = []  # the kept partial last blocks
        tops: list[int] = []  # and the tokens each takes
        members = [m for _, m in self.kinds()]
        rows = self._rows()
        last_ids = self.__dict__.setdefault("_private_last", {})
        at = grown = 0
        for seq_id, c, table, (held, after, firsts) in zip(seq_ids, columns, wides, plan, strict=True):
            tokens = c[0].num_tokens
            new = tokens + num_tokens
            grown += after - held
            if tokens % B:  # the old last block of every table that keeps it takes more tokens
                room, last = min(B - tokens % B, num_tokens), self._last_ids(seq_id, table, held)
                if max(firsts) < held:
                    topped += last
                    tops += [room] * G
                else:
                    for group_rows, first in zip(members, firsts, strict=True):
                        if first < held:
                            topped += [last[g] for g in group_rows]
                            tops += [room] * len(group_rows)
            if after > held:
                fill = new - (after - 1) * B
                if max(firsts) <= held:  # every table grows from its end: one write
                    m = after - held
                    table[:, held:after] = blocks[at : at + G * m].reshape(G, m)
                    fills += ([B] * (m - 1) + [fill]) * G
                    last_ids[seq_id] = (table, after, ids[at + m - 1 : at + G * m : m])
                    at += G * m
                else:
                    for (_, r, count, _), first in zip(rows, firsts, strict=True):
                        start = max(held, first)
                        table[r, held:start] = NULL_BLOCK
                        m = after - start
                        table[r, start:after] = blocks[at : at + count * m].reshape(count, m)
                        fills += ([B] * (m - 1) + [fill]) * count
                        at += count * m
            for seq in c:
                seq.num_blocks = after
                seq.num_tokens = new
        assert at == need, f"advance_private: {at} fresh blocks placed, {need} handed out"
        for pool in self.pools:
            pool.logical_blocks += grown
            pool.logical_tokens += num_tokens * len(columns)
        if topped:
            store.fill[topped] += tops
        if need:
            store.ref[blocks] = 1
            store.fill[blocks] = fills
            store.num_used += need
        store.useful_tokens += sum(tops) + sum(fills)
