"""A private hybrid pool's operations: every group's tables of a sequence changed at once, the blocks of all groups
handed out in one hand-out and taken back in one drop.

A hybrid pool is private while no block can be in two tables and no block's id matters to anyone: no prefix
caching, no fork, no speculative slot, one block size for every group (what `kvcalc sim` runs without prefix keys).
A sequence's tables then all have one length, and all tables of one kind of group free the same leading blocks, so
a change is worked out once per sequence and kind. The tables of a sequence are kept as the rows of one array
[groups, capacity] (each group's SeqTable.table a row of it: `_wide`), so that a growth or a free is one numpy call
per sequence and kind, not per group. The tables, counters and invariants are those the one-group operations leave
(hybrid.py, block_pool); only the block ids differ, which nothing reads in a private pool. Under mamba_cache_mode
align a chunk of more than a block jumps over state pages and may hold the page it resumes from past the table
until the sequence's next step (HybridLayout._resume, weighted.state_jump): the growth keeps and lets go such pages
as stepping does (decode holds what mode all holds).

    allocate_private, release_private   hybrid_private_tables (the base class)
    advance_private(ids, n, chunk)      n tokens each, appended `chunk` at a time: a decode run (chunk 1), or one
                                        append (chunk n) — each group frees what its rule lets go before the last
                                        append, then grows; no block is handed out only to be freed within
    first_blocks(group, computed)       PoolGroup.first_block_before_growth over an array of lengths (mode none's
                                        state page: where the decode step's token goes)
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from .append import SeqTable
from .groups import PoolGroup
from .hybrid_private_tables import PrivateTables
from .pool_tables import NULL_BLOCK
from .state_pages import held_past, jump_holds
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


class HybridPrivate(PrivateTables):
    """The private pool's operations (see the module docstring)."""

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
        jump = self.jumps_hold_resumed and chunk > self.block_size  # align: a state page may be jumped over
        if jump and chunk != num_tokens:
            raise ValueError("advance_private: under align an append of more than a block is one chunk")
        if jump:  # what stepping frees before it checks: each group's rule before growth and the pages held past
            gone = self._private_plan(columns, num_tokens, num_tokens, refused=True)[2] + held_past(  # the tables
                self._resumed, seq_ids)
        elif self._resumed:
            gone += held_past(self._resumed, seq_ids)
        free_now = len(self.store.queue) + (0 if pools[0]._in_step or not credit else gone)
        if need > free_now and not credit and check:  # frees not credited: nothing done, the caller steps in order
            return None
        if need > free_now:
            if not check:
                raise PoolExhaustedError(f"appending {num_tokens} tokens to {len(seq_ids)} sequences needs {need} "
                                         f"blocks over {len(self.groups)} groups, {free_now} free")
            first = plan if chunk == num_tokens and not self.rolling and not jump else self._private_plan(
                columns, num_tokens, num_tokens, refused=True)[0]  # mode none: the one page stays; align: no jump
            self._private_free(seq_ids, columns, first)
            self._changed()
            return False
        wides = self._private_free(seq_ids, columns, plan, num_tokens if jump else 0)
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
                      plan: list[tuple[int, int, list[int]]], jump: int = 0) -> list[np.ndarray]:
        """Free, in every table, the blocks before its kind's first block of `plan` (entries past the table's end
        included: never handed out), in one drop, and the pages held past the tables (align); returns the
        sequences' wide tables, each wide enough for `plan`. `jump`: the tokens of one append (align) over which a
        state table that keeps only its last page holds the page it resumes from past the table
        (state_pages.jump_holds: weighted.state_jump's rule), not freed."""
        parts, wides = [], []
        freed = [0] * len(self.pools)
        kinds = list(zip(self._rows(), self.kinds(), strict=True))
        for seq_id, c, (held, after, firsts) in zip(seq_ids, columns, plan, strict=True):
            table = self._wide(seq_id, c, after)
            wides.append(table)
            if self._resumed and seq_id in self._resumed:  # the last step's: let go at this one (HybridLayout._skip)
                self._let_resumed_go(seq_id)
            for ((_, rows, _, lead), (group, members)), first in zip(kinds, firsts, strict=True):
                skipped = c[lead].num_skipped
                if first > skipped:
                    hold = jump and group.kind == "state" and jump_holds(c[lead].num_tokens, first, after,
                                                                         self.block_size)
                    if skipped < held:
                        parts.append(table[rows, skipped : min(first, held) - hold].ravel())
                    for g in members:
                        c[g].num_skipped = first
                        freed[g] += first - skipped - hold
                        if hold:
                            self._resume(seq_id, g, held - 1, int(table[g, held - 1]))
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
