"""Prefix-cache hits across the layer groups of a hybrid pool, and allocation (see core/pool/hybrid.py).

The hit of a prompt is the longest prefix every group can serve: each chain group's own verified chain, and
for an anchored group (sliding, chunked, a state group in mode align) the blocks of the first full group's
chain that it registered (group_hits). `allocate` pins every group's hits, then allocates group by group, then
registers the anchored groups' blocks.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from ..blocks import ceil_div
from .free_queue import FREE_CACHED
from .group_hits import (
    anchor_positions,
    anchored_lookup,
    anchored_present,
    first_needed_at,
    hit_table,
    register_anchored,
    valid_hits,
    valid_token_hits,
)
from .hybrid_layout import HybridLayout
from .store import BlockKeys, PoolExhaustedError


def _same_keys(a: BlockKeys, b: BlockKeys) -> bool:
    """The same keys: one object, or two views of the same memory (a prompt's keys sliced once per caller: the
    scheduler's probe, the prefix statistics and the allocation each slice them anew), or equal lists."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return (a.base is not None and a.base is b.base and a.shape == b.shape and a.strides == b.strides
                and a.dtype == b.dtype and a.ctypes.data == b.ctypes.data)
    return type(a) is list and type(b) is list and len(a) == len(b) and a == b


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
        # NOTE: a few plans per epoch: a scheduler step asks for the waiting head's whole prompt (its hit) and for
        # its first chunk (can it be admitted), then again as it admits it
        epoch, at = self.pools[0]._epoch, (num_tokens, extra_key)
        if self._plan_memo is None or self._plan_memo[0] != epoch:
            self._plan_memo = (epoch, [])
        plans: list = self._plan_memo[1]
        for memo_keys, memo_at, memo_plan in plans:
            if memo_at == at and _same_keys(memo_keys, keys):
                return memo_plan
        plan = None if self.mixed else self._prefix_plan(plans, num_tokens, keys, extra_key)
        if plan is None:
            plan = (self._hits_mixed if self.mixed else self._hits_one_size)(num_tokens, keys, extra_key)
        plans.append((keys, at, plan))
        if len(plans) > 4:
            del plans[0]
        return plan

    def _prefix_plan(self, plans: list, num_tokens: int, keys: BlockKeys, extra_key: Hashable
                     ) -> tuple[int, list[int], list[np.ndarray | None]] | None:
        """The plan of a prompt's first chunk from its whole prompt's kept plan (None: none applies), where the chunk
        still reaches the whole prompt's chain hit c (the least of the chain groups' own hits; c ≤ cap, the chunk's
        most hit blocks): each chain group's verified chain is the same prefix, cut at cap, so the chain hit is c
        again, and the anchored groups' look-ups under it are the same, and so is all that follows from them."""
        if not isinstance(keys, np.ndarray):
            return None
        cap = min(len(keys), max(num_tokens - 1, 0) // self.block_size)
        chain = [g for g in range(len(self.groups)) if not self.anchored[g]]
        for memo_keys, (memo_tokens, memo_extra), (hit, own, tables) in plans:
            if (memo_extra == extra_key and isinstance(memo_keys, np.ndarray) and memo_tokens >= num_tokens
                    and min(own[g] for g in chain) <= cap and len(memo_keys) >= len(keys)
                    and _same_keys(memo_keys[: len(keys)], keys)):
                return hit, [o if self.anchored[g] else min(o, cap) for g, o in enumerate(own)], tables
        return None

    def _hits_one_size(self, num_tokens: int, keys: BlockKeys, extra_key: Hashable
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
        if (whole := self._hits_at_top(hit, own, anchored, probe.hits, probe.hashes)) is not None:
            return whole
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

    def _hits_at_top(self, hit: int, own: list[int], anchored: list[int], anchor_hits: np.ndarray,
                     anchor_hashes: np.ndarray) -> tuple[int, list[int], list[np.ndarray | None]] | None:
        """`_hits_one_size`'s plan when every anchored group serves the whole chain hit `hit` (then each one's own
        hit is `hit` too), from the blocks each reads for it alone (a window, a chunk, a state page: not the
        whole chain); None where one does not."""
        B = self.block_size
        firsts = [first_needed_at(self.groups[g], hit, B) for g in anchored]
        low = min(firsts)
        found = anchored_present(self.store, anchored, anchor_hits[low:hit], anchor_hashes[low:hit], low)
        if any((found[i, first - low :] < 0).any() for i, first in enumerate(firsts)):
            return None
        tables: list[np.ndarray | None] = [None] * len(self.groups)
        own = list(own)
        for i, (g, first) in enumerate(zip(anchored, firsts, strict=True)):
            table = np.full(hit, -1, dtype=np.intp)
            table[first:hit] = found[i, first - low :]
            tables[g], own[g] = table, hit
        return hit, own, tables

    def _hits_mixed(self, num_tokens: int, keys: BlockKeys, extra_key: Hashable
                    ) -> tuple[int, list[int], list[np.ndarray | None]]:
        """`_hits_one_size` where the groups' blocks hold different tokens (group_blocks): every hit a multiple of
        the lcm of their blocks, L; an anchored group's block looked up under the anchor block holding its last
        token."""
        G, b, align = len(self.groups), self.block_size, self.store.block_size  # store slots: lcm of the blocks
        own = [0 if self.anchored[g] else p.hit_tokens(num_tokens * s, self._group_keys(g, keys), (g, extra_key)) // s
               for g, (p, s) in enumerate(zip(self.pools, self.scales, strict=True))]  # tokens
        top = min(own[g] for g in range(G) if not self.anchored[g]) // align * align
        if not any(self.anchored):
            return top // b, [t // b for t in own], [None] * G
        anchor = self.anchor
        assert anchor is not None  # a group is anchored only where there is a full group (hybrid_layout)
        probe = self.pools[anchor]._probe(num_tokens * self.scales[anchor], self._group_keys(anchor, keys),
                                          (anchor, extra_key))
        candidates = np.arange(0, top + 1, align)
        serves = np.ones(len(candidates), dtype=bool)
        present: list[np.ndarray | None] = [None] * G
        for g in (g for g in range(G) if self.anchored[g]):
            size = self.group_blocks[g]
            positions = np.arange(top // size)
            at, subs = anchor_positions(positions, size, self.group_blocks[anchor])
            present[g] = row = anchored_lookup(self.store, g, positions, probe.hits[at], subs, probe.hashes[at])
            valid = valid_token_hits(self.groups[g], row, size, candidates)
            own[g] = int(candidates[np.flatnonzero(valid)[-1]])
            serves &= valid
        hit = int(candidates[np.flatnonzero(serves)[-1]])
        tables = [None if p is None else hit_table(group, p, hit // size, size)
                  for group, p, size in zip(self.groups, present, self.group_blocks, strict=True)]
        return hit // b, [t // b for t in own], tables

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
        mode, sizes = self.state_mode, self.group_blocks  # each group's tokens per block (group_blocks)
        computed = max(hit * self.block_size, computed_tokens)
        firsts = [g.first_block(computed, num_tokens, B, mode) for g, B in zip(self.groups, sizes, strict=True)]
        keys = self._keys(block_keys)
        weights = self.weights  # units a group's block costs (weighted tables: weighted.py; all 1 otherwise)
        if keys is None and num_tokens >= 0:  # no hit in any group: each takes its blocks from its first held
            return hit, firsts, sum((ceil_div(num_tokens, B) - min(first, ceil_div(num_tokens, B))) * w
                                    for first, B, w in zip(firsts, sizes, weights, strict=True)), tables
        need, hit_tokens = 0, hit * self.block_size
        for g, (pool, first) in enumerate(zip(self.pools, firsts, strict=True)):
            table, group_hit, s, own = tables[g], hit_tokens // sizes[g], self.scales[g], 0
            if table is not None:  # an anchored group: fresh blocks past the hit, cached hits revived
                held = table[self._hold_from(g, hit_tokens, first, num_tokens):]  # (align: a jump's resumed page)
                own += ceil_div(num_tokens, sizes[g]) - max(group_hit, first)
                need += (own + int(np.count_nonzero(self.store.state[held] == FREE_CACHED))) * weights[g]
                continue
            group_keys = self._group_keys(g, keys)
            own += pool.allocate_need(num_tokens * s, group_keys, (g, extra_key), group_hit, first)
            if group_hit and first:  # skipped hits are pinned while the groups allocate (see allocate)
                skipped = pool.hit_blocks(num_tokens * s, group_keys, (g, extra_key))[: min(first, group_hit)]
                own += int(np.count_nonzero(self.store.state[skipped] == FREE_CACHED))
            need += own * weights[g]
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
        store, pins, hit_tokens, sizes, scales = self.store, [], hit * self.block_size, self.group_blocks, self.scales
        holds = [self._hold_from(g, hit_tokens, first, num_tokens) for g, first in enumerate(firsts)]
        if hit:
            for g, pool in enumerate(self.pools):
                table = tables[g]
                held = pool.hit_blocks(num_tokens * scales[g], self._group_keys(g, keys), (g, extra_key))[
                    : hit_tokens // sizes[g]] if table is None else table[holds[g]:]
                if len(held):
                    state = store.state.take(held)
                    store.share(held, state, int(np.count_nonzero(state == FREE_CACHED)))
                    pins.append((g, held))
        for g, (pool, first) in enumerate(zip(self.pools, firsts, strict=True)):
            got = pool.allocate(seq_id, num_tokens * scales[g], self._group_keys(g, keys), (g, extra_key),
                                max_hit_blocks=hit_tokens // sizes[g], first_block=first, hits=tables[g])
            assert got == hit_tokens * scales[g], f"group {g}: hit {got} slots, the pool's plan said {hit} blocks"
            self._changed()
        for g, held in pins:  # the pin: the new tables hold the hits they keep; the others go back to the cache
            if holds[g] < firsts[g]:  # align: the hit page a first step that jumps resumes from, held until the next
                self._resume(seq_id, g, holds[g], int(held[0]))  # step (HybridLayout._resume)
                self.pools[g].logical_blocks += 1
                held = held[1:]
            store.ref[held] -= 1
            unheld = held[store.ref[held] == 0]
            if len(unheld):
                store.drop(unheld[::-1], defer=self.pools[0]._in_step)
        if self.coarse is not None:
            self.coarse.start(seq_id, keys, self.pools[0])
        if keys is not None:
            self._register_anchored(seq_id, hit_tokens, num_tokens)
        return hit_tokens

    def _register_anchored(self, seq_id: Hashable, old: int, new: int) -> None:
        """Index the blocks of anchored groups that a step from `old` to `new` committed tokens completed (see
        group_hits): a window's or chunk's full blocks; a state page where the step ends (align)."""
        sizes = self.group_blocks  # each group's tokens per block (all the pool's block size unless mixed)
        if self.anchor is None or new // sizes[self.anchor] <= old // sizes[self.anchor]:
            return
        A = sizes[self.anchor]
        anchor_table = self.pools[self.anchor].block_table(seq_id)
        parts: list[tuple[int, np.ndarray, np.ndarray]] = []  # (group, its blocks, their positions)
        for g, (group, pool) in enumerate(zip(self.groups, self.pools, strict=True)):
            seq, B = pool.seqs[seq_id], sizes[g]
            if not self.anchored[g] or seq.num_hashed < 0:  # a state over rejected drafts: never
                continue
            # a window's or chunk's blocks whose anchor (the full block holding their last token) the step completed
            first, end = (new // B - 1, new // B) if group.kind == "state" and self.state_mode == "align" else (
                old // A * A // B, new // A * A // B)  # mode all: a state saved at every boundary the step passed
            positions = np.arange(max(first, seq.num_skipped), end)
            parts.append((g, seq.table[positions], positions))
        if not parts:
            return
        positions = np.concatenate([p for _, _, p in parts])
        at, subs = (positions, None) if not self.mixed else (np.concatenate(x) for x in zip(
            *(anchor_positions(p, sizes[g], A) for g, _, p in parts), strict=True))
        anchors = anchor_table[at]
        groups = np.repeat([g for g, _, _ in parts], [len(p) for _, _, p in parts])
        register_anchored(self.store, groups, np.concatenate([b for _, b, _ in parts]), anchors, positions, subs)
        self._changed()

