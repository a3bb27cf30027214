"""A private hybrid pool's tables made and dropped whole (the base of hybrid_private.HybridPrivate, whose module
docstring says what a private pool is): every group's table of a new sequence in one hand-out, all of a sequence's
blocks in one drop, and the kinds of group the private operations work out once each.

    private                             whether the pool is private (no prefix caching, fork, speculative slot,
                                        mixed block size or weighted table; mode align too: a jump's page held
                                        past the table, HybridLayout._resume, is kept by the growth and release)
    allocate_private(seq, n, computed)  HybridPool.allocate without keys: each group holds the blocks its layers
                                        read from `computed` written tokens on (all of them when 0)
    release_private(seq, reason)        HybridPool.release
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from ..blocks import ceil_div
from .accounting import ReleaseReason
from .append import SeqTable
from .groups import PoolGroup
from .hybrid_layout import HybridLayout
from .pool_tables import NULL_BLOCK, RELEASE_COUNTER
from .prefix_cache import root_hash
from .store import PoolExhaustedError


class PrivateTables(HybridLayout):
    """A private pool's allocation and release (see the module docstring)."""

    @property
    def private(self) -> bool:
        store = self.store
        if store.enable_prefix_caching or store.counters["forks"] or getattr(self, "mixed", False) or (
                getattr(self, "weighted", False)):  # (align's pages held past a table: advance_private keeps them)
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
        past = [self._pop_resumed(seq_id, g) for g in sorted(self._resumed.get(seq_id, ()))]  # align: HybridLayout
        blocks = np.concatenate([s.table[s.num_skipped : s.num_blocks] for s in tables] + [  # ._resume's pages
            np.array(past, dtype=np.int64)])
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

