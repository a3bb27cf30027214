"""Prefix-cache hits across the layer groups of a hybrid pool, and allocation (see core/pool/hybrid.py).

The hit of a prompt is the longest prefix every group can serve: each chain group's own verified chain, and
for an anchored group (sliding, chunked, a state group in mode align) the blocks of the first full group's
chain that it registered (group_hits). `allocate` pins every group's hits, then allocates group by group, then
registers the anchored groups' blocks and remembers a chain group's recomputed duplicates (group_hits.Canonical).
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from .free_queue import FREE_CACHED
from .group_hits import Canonical, anchored_present, hit_table, register_anchored, valid_hits
from .hybrid_layout import HybridLayout
from .store import BlockKeys, PoolExhaustedError


class HybridHits(HybridLayout):
    """The look-up and allocation of a prompt over every group of a hybrid pool."""

    def _hit_plan(self, num_tokens: int, block_keys: BlockKeys, extra_key: Hashable
                  ) -> tuple[int, list[int], list[np.ndarray | None]]:
        """(the hit in blocks every group serves, each group's own longest hit in blocks, each anchored
        group's hit blocks for that hit (-1 before the first it reads); None for a chain group)."""
        keys = self._keys(block_keys)
        G = len(self.groups)
        if keys is None:
            return 0, [0] * G, [None] * G
        memo = self._plan_memo
        if memo is not None and memo[0] == self.pools[0]._epoch and memo[1] is keys and memo[2] == (
                num_tokens, extra_key):
            return memo[3]
        plan = self._plan(num_tokens, keys, extra_key)
        self._plan_memo = (self.pools[0]._epoch, keys, (num_tokens, extra_key), plan)
        return plan

    def _plan(self, num_tokens: int, keys: BlockKeys, extra_key: Hashable
              ) -> tuple[int, list[int], list[np.ndarray | None]]:
        G, B = len(self.groups), self.block_size
        own = [0 if self.anchored[g] else p.hit_tokens(num_tokens, keys, (g, extra_key)) // B
               for g, p in enumerate(self.pools)]
        hit = min(own[g] for g in range(G) if not self.anchored[g])
        if not any(self.anchored):
            return hit, own, [None] * G
        anchor = self.anchor
        assert anchor is not None  # a group is anchored only where there is a full group (hybrid_layout)
        probe = self.pools[anchor]._probe(num_tokens, keys, (anchor, extra_key))
        anchored = [g for g in range(G) if self.anchored[g]]
        found = anchored_present(self.store, anchored, probe.hits[:hit], probe.hashes[:hit])
        serves = np.ones(hit + 1, dtype=bool)
        present: list[np.ndarray | None] = [None] * G
        for g, row in zip(anchored, found, strict=True):
            present[g] = row
            valid = valid_hits(self.groups[g], row, B)
            own[g] = int(np.flatnonzero(valid)[-1])
            serves &= valid
        hit = int(np.flatnonzero(serves)[-1])
        tables = [None if p is None else hit_table(g, p, hit, B) for g, p in zip(self.groups, present, strict=True)]
        return hit, own, tables

    def _hit_blocks(self, num_tokens: int, block_keys: BlockKeys, extra_key: Hashable) -> int:
        return self._hit_plan(num_tokens, block_keys, extra_key)[0]

    def hit_tokens(self, num_tokens: int, block_keys: BlockKeys = None, extra_key: Hashable = None) -> int:
        """The tokens an allocate of this prompt would find cached in every group; a pure look-up."""
        return self._hit_blocks(num_tokens, block_keys, extra_key) * self.block_size

    def group_hit_tokens(self, num_tokens: int, block_keys: BlockKeys = None,
                         extra_key: Hashable = None) -> list[int]:
        """Each group's own longest hit in tokens (an anchored group's within the full group's chain); a pure
        look-up. The hit every group serves is at most the smallest."""
        return [h * self.block_size for h in self._hit_plan(num_tokens, block_keys, extra_key)[1]]

    def _allocate_plan(self, num_tokens: int, block_keys: BlockKeys, extra_key: Hashable,
                       computed_tokens: int) -> tuple[int, list[int], int, list[np.ndarray | None]]:
        """(hit blocks, first held block per group, free blocks the allocation takes, anchored groups' hits)."""
        hit, _, tables = self._hit_plan(num_tokens, block_keys, extra_key)
        B, mode = self.block_size, self.state_mode
        computed = max(hit * B, computed_tokens)
        firsts = [g.first_block(computed, num_tokens, B, mode) for g in self.groups]
        keys = self._keys(block_keys)
        if keys is None and num_tokens >= 0:  # no hit in any group: each takes its blocks from its first held
            total = self.store.blocks_needed(num_tokens)
            return hit, firsts, sum(total - min(first, total) for first in firsts), tables
        need = 0
        for g, (pool, first) in enumerate(zip(self.pools, firsts, strict=True)):
            table = tables[g]
            if table is not None:  # an anchored group: fresh blocks past the hit, cached hits revived
                held = table[first:]
                need += self.store.blocks_needed(num_tokens) - max(hit, first)
                need += int(np.count_nonzero(self.store.state[held] == FREE_CACHED))
                continue
            need += pool.allocate_need(num_tokens, keys, (g, extra_key), hit, first)
            if hit and first:  # skipped hits are pinned while the groups allocate (see allocate)
                skipped = pool.hit_blocks(num_tokens, keys, (g, extra_key))[: min(first, hit)]
                need += int(np.count_nonzero(self.store.state[skipped] == FREE_CACHED))
        return hit, firsts, need, tables

    def can_allocate(self, num_tokens: int, block_keys: BlockKeys = None, extra_key: Hashable = None,
                     computed_tokens: int = 0) -> bool:
        return self._allocate_plan(num_tokens, block_keys, extra_key, computed_tokens)[2] <= len(self.store.queue)

    def allocate(self, seq_id: Hashable, num_tokens: int, block_keys: BlockKeys = None,
                 extra_key: Hashable = None, computed_tokens: int = 0) -> int:
        """Tables in every group for a prompt of `num_tokens`; returns the hit tokens (the same in every group).
        `computed_tokens`: of them, how many are written already without a hit (KV swapped back in from the
        host, without keys): a sliding group then takes only the blocks of its window."""
        if self.has_seq(seq_id):
            raise ValueError(f"sequence {seq_id!r} already has a block table; release it first")
        if computed_tokens and block_keys is not None:
            raise ValueError("computed_tokens is for KV swapped back in, which has no block keys: give either")
        hit, firsts, need, tables = self._allocate_plan(num_tokens, block_keys, extra_key, computed_tokens)
        if need > len(self.store.queue):
            raise PoolExhaustedError(f"{num_tokens} tokens need {need} blocks over {len(self.groups)} groups, "
                                     f"{len(self.store.queue)} free")
        keys = self._keys(block_keys)
        # NOTE: every group's hits are held before any group takes fresh blocks, which may evict cached ones:
        # a hit of one group must not be evicted by another's allocation (vLLM touches all hits first, too) —
        # the ones a sliding group skips included, since its chain is verified through them
        store, pins = self.store, []
        if hit:
            for g, pool in enumerate(self.pools):
                table = tables[g]
                held = pool.hit_blocks(num_tokens, keys, (g, extra_key))[:hit] if table is None else (
                    table[firsts[g]:])
                if len(held):
                    state = store.state.take(held)
                    store.share(held, state, int(np.count_nonzero(state == FREE_CACHED)))
                    pins.append(held)
        for g, (pool, first) in enumerate(zip(self.pools, firsts, strict=True)):
            got = pool.allocate(seq_id, num_tokens, self._group_keys(g, keys), (g, extra_key), max_hit_blocks=hit,
                                first_block=first, hits=tables[g])
            assert got == hit * self.block_size, f"group {g}: hit {got} tokens, the pool's plan said {hit} blocks"
            self._changed()
        for held in pins:  # the pin: the new tables hold the hits they keep; the others go back to the cache
            store.ref[held] -= 1
            unheld = held[store.ref[held] == 0]
            if len(unheld):
                store.drop(unheld[::-1])
        if keys is not None:
            self._note_canonical(seq_id, num_tokens, keys, extra_key, hit)
            self._register_anchored(seq_id, hit * self.block_size, num_tokens)
        return hit * self.block_size

    def _note_canonical(self, seq_id: Hashable, num_tokens: int, keys: BlockKeys, extra_key: Hashable,
                        hit: int) -> None:
        """Remember the cached blocks each chain group recomputes as duplicates (group_hits.Canonical)."""
        found = {}
        for g, pool in enumerate(self.pools):
            if not self.anchored[g]:
                own = pool.hit_blocks(num_tokens, keys, (g, extra_key))
                if len(own) > hit:
                    found[g] = Canonical(self.store, hit, own[hit:])
        if found:
            self._canonical[seq_id] = found

    def _register_anchored(self, seq_id: Hashable, old: int, new: int) -> None:
        """Index the blocks of anchored groups that a step from `old` to `new` committed tokens completed (see
        group_hits): a window's or chunk's full blocks; a state page where the step ends (align). Then chain a
        chain group's first block after its duplicates to the cached blocks (group_hits.Canonical)."""
        B = self.block_size
        canonical = self._canonical.get(seq_id)
        anchor_canonical = None if canonical is None or self.anchor is None else canonical.get(self.anchor)
        if canonical:
            for g, c in list(canonical.items()):
                if c.relink(self.store, self.pools[g].block_table(seq_id)[: new // B]):
                    del canonical[g]
            if not canonical:
                del self._canonical[seq_id]
        if self.anchor is None or new // B <= old // B:
            return
        anchor_table = self.pools[self.anchor].block_table(seq_id)
        parts: list[tuple[int, np.ndarray, np.ndarray]] = []  # (group, its blocks, their positions)
        for g, (group, pool) in enumerate(zip(self.groups, self.pools, strict=True)):
            seq = pool.seqs[seq_id]
            if not self.anchored[g] or seq.num_hashed < 0:  # a state over rejected drafts: never
                continue
            first = max(new // B - 1 if group.kind == "state" else old // B, seq.num_skipped)
            positions = np.arange(first, new // B)
            parts.append((g, seq.table[positions], positions))
        if not parts:
            return
        positions = np.concatenate([p for _, _, p in parts])
        anchors = anchor_table[positions] if anchor_canonical is None else (
            anchor_canonical.anchors(self.store, anchor_table, positions))
        groups = np.repeat([g for g, _, _ in parts], [len(p) for _, _, p in parts])
        register_anchored(self.store, groups, np.concatenate([b for _, b, _ in parts]), anchors, positions)
        self._changed()

