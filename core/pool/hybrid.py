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
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .accounting import PoolStats, PoolUsage, ReleaseReason
from .block_pool import BlockPool
from .free_queue import FREE_CACHED
from .group_hits import Canonical, anchored_present, hit_table, register_anchored, valid_hits
from .groups import DEFAULT_STATE_MODE, FULL, PoolGroup, check_state_mode
from .invariants import check_pool_invariants
from .prefix_lookup import PrefixIndex
from .speculative import DEFAULT_ROLLBACK_POLICY, check_speculative
from .store import BlockKeys, BlockStore, PoolExhaustedError


@dataclass(frozen=True)
class GroupUsage:
    """One group's part of the pool now: the distinct blocks its tables hold (no block is in two groups),
    its table entries and its logical tokens."""

    group: PoolGroup
    held_blocks: int  # distinct physical blocks its live tables hold
    table_entries: int  # Σ over its live tables of their length, NULL entries included
    logical_tokens: int


class HybridPool:
    """`num_blocks` blocks of `block_size` slots shared by `groups`; see the module docstring."""

    def __init__(
        self, num_blocks: int, block_size: int, groups: Sequence[PoolGroup] = (FULL,), *,
        enable_prefix_caching: bool = True, state_mode: str = DEFAULT_STATE_MODE,
        rollback_policy: str = DEFAULT_ROLLBACK_POLICY,
    ) -> None:
        if not groups:
            raise ValueError("a hybrid pool needs at least one layer group")
        self.store = BlockStore(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching)
        self.prefix = PrefixIndex(self.store)
        self.groups = tuple(groups)
        self.state_mode = check_state_mode(state_mode)
        shared = (self.store, self.prefix)
        self.pools = [BlockPool(num_blocks, block_size, rollback_policy=rollback_policy, shared=shared)
                      for _ in self.groups]
        self.num_blocks, self.block_size = self.store.num_blocks, self.store.block_size
        # the groups that keep no whole chain (sliding, chunked, state in mode align) are anchored to the first
        # full group's blocks (see group_hits); without a full group they keep chains, and an align state group
        # then serves no hit. A state group serves a prefix only where a state was saved at exactly that
        # boundary: mode all saves one at every block boundary, align at step ends (group_hits), none none.
        kinds = [g.kind for g in self.groups]
        self.anchor = kinds.index("full") if "full" in kinds else None
        self.anchored = tuple(self.anchor is not None and (k in ("sliding", "chunked") or (
            k == "state" and self.state_mode == "align")) for k in kinds)
        has_state = "state" in kinds
        self._canonical: dict[Hashable, dict[int, Canonical]] = {}  # see group_hits.Canonical
        self._plan_memo: tuple | None = None  # the last _hit_plan, until any group changes (pool 0's epoch)
        self.caches = enable_prefix_caching and not (has_state and (
            self.state_mode == "none" or (self.state_mode == "align" and self.anchor is None)))

    # ---- reading --------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.store.queue)

    @property
    def num_used(self) -> int:
        return self.store.num_used

    def has_seq(self, seq_id: Hashable) -> bool:
        return self.pools[0].has_seq(seq_id)

    @property
    def seq_ids(self) -> list[Hashable]:
        return list(self.pools[0].seqs)

    def num_tokens(self, seq_id: Hashable) -> int:
        return self.pools[0].num_tokens(seq_id)

    def block_tables(self, seq_id: Hashable) -> list[np.ndarray]:
        """One table per group (NULL_BLOCK where a group freed the block)."""
        return [p.block_table(seq_id) for p in self.pools]

    def held_blocks(self, seq_id: Hashable) -> list[int]:
        """Blocks each group's table of the sequence holds now (its NULL entries not counted): what a swap of
        the sequence to the host copies, group by group — the window of a sliding group, the current chunk of a
        chunked one, the state pages of a state group."""
        self.pools[0]._seq(seq_id)  # not live: the error names it
        return [p.seqs[seq_id].num_blocks - p.seqs[seq_id].num_skipped for p in self.pools]

    def swap_bytes(self, seq_id: Hashable, page_bytes: int) -> list[int]:
        """Bytes a swap of the sequence moves each way, per group: `held_blocks` × `page_bytes`, the bytes of one
        block id in one table (KVLayout.page_bytes: every table's block id has that size in both layouts)."""
        return [blocks * page_bytes for blocks in self.held_blocks(seq_id)]

    def group_usage(self) -> list[GroupUsage]:
        out = []
        # NOTE: without prefix-cache hits or forks no block is in two tables, so a group's distinct blocks are
        # the blocks its tables hold (a counter); otherwise they are counted (O(table entries))
        shared = self.store.counters["hit_blocks"] or self.store.counters["forks"]
        for group, pool in zip(self.groups, self.pools, strict=True):
            if not shared:
                distinct = pool.logical_blocks
            else:
                held = [s.blocks for s in pool.seqs.values()]
                distinct = len(np.unique(np.concatenate(held))) if held else 0
            out.append(GroupUsage(group, distinct, sum(s.num_blocks for s in pool.seqs.values()), pool.logical_tokens))
        return out

    def usage(self) -> PoolUsage:
        """The store's usage; logical blocks and tokens summed over groups (max table: the longest of any)."""
        store = self.store
        return PoolUsage(
            num_blocks=self.num_blocks, block_size=self.block_size, used_blocks=store.num_used,
            cached_free_blocks=store.queue.num_cached, free_blocks=len(store.queue),
            pending_free_blocks=store.num_pending_blocks, num_seqs=len(self.pools[0].seqs),
            logical_blocks=sum(p.logical_blocks for p in self.pools),
            logical_tokens=sum(p.logical_tokens for p in self.pools), useful_tokens=store.useful_tokens,
            max_table_blocks=max((s.num_blocks for s in self.pools[0].seqs.values()), default=0),  # all alike
        )

    def stats(self) -> PoolStats:
        """Counters since creation: blocks (hand-outs, copies, evictions) once each; what happens to sequences
        (hits, prompts, forks, releases) once per sequence, not once per group."""
        counters = dict(self.store.counters)
        per_group = len(self.groups)
        for name in ("hit_blocks", "hit_tokens", "prompt_tokens", "forks", *(r.counter for r in ReleaseReason)):
            counters[name] //= per_group
        return PoolStats(**counters)

    # ---- check, then allocate -------------------------------------------------------------------
    def _keys(self, block_keys: BlockKeys) -> BlockKeys:
        return block_keys if self.caches else None

    def _group_keys(self, g: int, keys: BlockKeys) -> BlockKeys:
        """The keys group g's own BlockPool takes: none for an anchored group (the hybrid pool registers it)."""
        return None if self.anchored[g] else keys

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
        probe = self.pools[self.anchor]._probe(num_tokens, keys, (self.anchor, extra_key))
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

    # ---- check, then grow -----------------------------------------------------------------------
    def free_skipped(self, seq_id: Hashable) -> int:
        """Free, in every group, the blocks that the sequence's next tokens will not read (left the window, an
        old chunk, a state page older than the one the next step resumes from); returns how many table
        entries were freed. `append` and `reserve` call it first, so that what they take may reuse them."""
        return self._skip(seq_id)

    def append_need(self, seq_id: Hashable, num_tokens: int) -> int:
        """Free blocks an append takes once `free_skipped` has run (Σ over groups)."""
        return sum(p.append_need(seq_id, num_tokens) for p in self.pools)

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
        keys = self._keys(block_keys)
        copies: list[tuple[int, int]] = []
        B, old = self.block_size, self.pools[0].num_tokens(seq_id)
        for g, (group, pool) in enumerate(zip(self.groups, self.pools, strict=True)):
            grown = pool.append(seq_id, num_tokens, self._group_keys(g, keys))
            copies += grown
            if group.kind == "state" and old and (old - 1) // B != (old + num_tokens - 1) // B:
                # the running state moves into a new page: it starts as a copy of the page it resumes from
                table = pool.seqs[seq_id].table
                move = (int(table[(old - 1) // B]), int(table[(old + num_tokens - 1) // B]))
                if move not in grown:
                    copies.append(move)
            self._changed()
        if keys is not None:
            self._register_anchored(seq_id, old, old + num_tokens)
        return copies

    def append_many(self, seq_ids: Sequence[Hashable], num_tokens: int) -> None:
        """`append(seq, num_tokens)` (no block keys, no copies to report) for each sequence in one call per
        group: a decode step. Only for a pool whose blocks are in one table each (no fork yet, no open
        reservation); check, then change, over all groups together."""
        if self.store.counters["forks"] or any(p.spec.tracked for p in self.pools):
            raise ValueError("append_many takes a pool without forks or speculative slots: append one at a time")
        if num_tokens <= 0 or not seq_ids:
            return
        self.free_skipped_many(seq_ids)
        B = self.block_size
        tables = self.pools[0]._live(seq_ids, "appended to")
        grow = sum(-(-(s.num_tokens + num_tokens) // B) - s.num_blocks for s in tables)
        need = grow * len(self.groups)  # every table of a sequence has the same length
        if need > len(self.store.queue):
            raise PoolExhaustedError(f"appending {num_tokens} tokens to {len(seq_ids)} sequences needs {need} "
                                     f"blocks over {len(self.groups)} groups, {len(self.store.queue)} free")
        for pool in self.pools:
            pool.append_many(seq_ids, num_tokens)
        self._changed()

    def free_skipped_many(self, seq_ids: Sequence[Hashable], one_drop: bool = True) -> None:
        """`free_skipped` of each sequence (none with speculative slots), the rule evaluated once per kind of
        group for all sequences at once; `one_drop` (and every block in one table): one `skip_many` per kind
        instead of BlockPool.skip_blocks per sequence (the same blocks freed in the same order)."""
        B, mode = self.block_size, self.state_mode
        kinds: dict[tuple[str, int | None], list[int]] = {}
        for g, group in enumerate(self.groups):
            if group.kind != "full" and not (group.kind == "state" and mode == "all"):
                kinds.setdefault((group.kind, group.window), []).append(g)
        if not kinds:
            return
        seqs = self.pools[0]._live(seq_ids, "freed")
        tokens = np.fromiter((s.num_tokens for s in seqs), np.int64, len(seqs))
        # NOTE: the one-drop path only without a prefix cache (as in `kvcalc sim` without keys): with one, the
        # per-sequence path keeps the exact order verify's scenarios were written against
        private = one_drop and not (self.store.enable_prefix_caching or self.store.counters["forks"])
        for (kind, window), members in kinds.items():
            if kind == "sliding":
                first = np.maximum(tokens - window + 1, 0) // B  # type: ignore[operator]
            elif kind == "chunked":
                first = tokens // window * window // B  # type: ignore[operator]
            elif mode == "none":
                first = np.maximum(tokens - 1, 0) // B
            else:  # align
                first = np.maximum(tokens // B - 1, 0)
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
        if num_tokens <= 0 or not seq_ids:
            return
        first_tables = self.pools[0]._live(seq_ids, "appended to")  # every group holds the same sequences
        tables = [first_tables, *([p.seqs[i] for i in seq_ids] for p in self.pools[1:])]
        count, groups = len(seq_ids), len(self.pools)
        old = np.fromiter((t.num_tokens for t in tables[0]), np.int64, count)
        grow = -(-(old + num_tokens) // B) - np.fromiter((t.num_blocks for t in tables[0]), np.int64, count)
        per = int(grow.sum())  # every group's tables have the same length
        need = per * groups
        if need > len(store.queue):
            raise PoolExhaustedError(f"appending {num_tokens} tokens to {count} sequences needs {need} blocks over "
                                     f"{groups} groups, {len(store.queue)} free")
        partial = np.flatnonzero(old % B).tolist()
        if partial:
            last = [t[i].table[t[i].num_blocks - 1] for t in tables for i in partial]
            store.fill[last] += np.tile(np.minimum(B - old[partial] % B, num_tokens), groups)
        if need:
            # one hand-out per group, in group order: the block ids of BlockPool.append_many group by group
            if store.enable_prefix_caching:  # evictions: one hand-out per group
                blocks = np.concatenate([store.hand_out(per)[0] for _ in range(groups)])
            else:  # plain blocks only, popped from the top: one pop of G·per is G pops of per, in order
                blocks = store.hand_out(need)[0]
            store.ref[blocks] = 1
            store.num_used += need
            growing = np.flatnonzero(grow)
            fill = np.full(per, B, dtype=store.fill.dtype)
            fill[np.cumsum(grow[growing]) - 1] = (old[growing] + num_tokens - 1) % B + 1
            store.fill[blocks] = np.tile(fill, groups)
            block_list, sizes = blocks.tolist(), grow[growing].tolist()
            at = 0
            for t in tables:
                for i, k in zip(growing.tolist(), sizes, strict=True):
                    seq = t[i]
                    if seq.num_blocks + k > len(seq.table):
                        seq.table = np.concatenate([seq.table, np.empty(2 * (seq.num_blocks + k), dtype=np.int64)])
                    seq.table[seq.num_blocks : seq.num_blocks + k] = block_list[at : at + k]
                    seq.num_blocks += k
                    at += k
        store.useful_tokens += num_tokens * count * groups
        for t, pool in zip(tables, self.pools, strict=True):
            for seq in t:
                seq.num_tokens += num_tokens
            pool.logical_blocks += per
            pool.logical_tokens += num_tokens * count
        self._changed()

    def skip_many(self, groups: Sequence[int], seq_ids: Sequence[Hashable], first_blocks: Sequence[int]) -> int:
        """`BlockPool.skip_blocks(seq, first)` for each sequence, in order, in each of `groups` (group indices,
        in order), in one drop (the blocks skip_blocks would free, in its order). Only for a pool whose blocks
        are in one table each (no fork, no speculative slot, no prefix-cache hit); returns how many were freed."""
        store, B = self.store, self.block_size
        pools = [self.pools[g] for g in groups]
        if store.counters["forks"] or store.counters["hit_blocks"] or any(p.spec.tracked for p in pools):
            raise ValueError("skip_many takes a pool whose blocks are in one table each: skip one at a time")
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
                if first > seq.num_skipped:
                    parts.append(seq.table[seq.num_skipped : first][::-1])  # skip_blocks drops a tail first
                    freed += first - seq.num_skipped
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
        B = self.block_size
        tables = self.pools[0]._live(seq_ids, "appended to")
        return len(self.groups) * sum(-(-(s.num_tokens + num_tokens) // B) - s.num_blocks for s in tables)

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """The child shares every group's blocks; a state page is copied when either branch writes it."""
        for pool in self.pools:
            pool.fork(parent_id, child_id)
        if parent_id in self._canonical:
            self._canonical[child_id] = dict(self._canonical[parent_id])
        self._changed()

    def release(self, seq_id: Hashable, reason: ReleaseReason = ReleaseReason.FINISHED) -> None:
        self.pools[0]._seq(seq_id)  # not live: the error names it before any group changes
        for pool in self.pools:
            pool.release(seq_id, reason)
        self._canonical.pop(seq_id, None)
        self._changed()

    # ---- speculative slots ----------------------------------------------------------------------
    def can_reserve(self, seq_id: Hashable, num_slots: int) -> bool:
        self._skip(seq_id)
        return num_slots <= 0 or self.reserve_need(seq_id, num_slots) <= len(self.store.queue)

    def reserve_need(self, seq_id: Hashable, num_slots: int) -> int:
        return sum(p.reserve_need(seq_id, num_slots) for p in self.pools)

    def reserve(self, seq_id: Hashable, num_slots: int) -> list[tuple[int, int]]:
        """`num_slots` speculative slots in every group (never hashed) until `commit`. A state group keeps its
        page until the commit: a rollback returns to the state it holds."""
        self._skip(seq_id)
        need = self.reserve_need(seq_id, num_slots)
        if need > len(self.store.queue):
            raise PoolExhaustedError(f"{num_slots} slots need {need} blocks, {len(self.store.queue)} free")
        copies = []
        for pool in self.pools:
            copies += pool.reserve(seq_id, num_slots)
            self._changed()
        return copies

    def commit(self, seq_id: Hashable, num_accepted: int, block_keys: BlockKeys = None) -> int:
        """Keep the first `num_accepted` slots in every group; returns the slots rolled back. A state group
        whose pages were written over rejected drafts stops hashing this sequence (vLLM #48375)."""
        res = self.pools[0].reservation(seq_id)
        if res is None:
            raise ValueError(f"sequence {seq_id!r} has no open reservation: a reservation is committed once")
        if not 0 <= num_accepted <= res.num_slots:
            raise ValueError(f"num_accepted {num_accepted} is outside 0..{res.num_slots}, the reserved slots")
        keys = self._keys(block_keys)
        old = self.pools[0].committed_tokens(seq_id)
        rolled_back = 0
        for g, (group, pool) in enumerate(zip(self.groups, self.pools, strict=True)):
            rolled_back = pool.commit(seq_id, num_accepted, self._group_keys(g, keys))
            if group.kind == "state" and rolled_back:
                pool.stop_hashing(seq_id)
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
            logical_tokens=sum(p.logical_tokens for p in self.pools), spare=spare,
        )
        ids = set(self.pools[0].seqs)
        B = self.block_size
        for group, pool in zip(self.groups, self.pools, strict=True):
            assert set(pool.seqs) == ids, f"group {group.name} holds other sequences than group 0"
            check_speculative(pool.spec, pool.seqs)
            for seq_id, seq in pool.seqs.items():
                assert seq.num_tokens == self.pools[0].seqs[seq_id].num_tokens, "groups disagree on a length"
                n, skipped = pool.committed_tokens(seq_id), seq.num_skipped
                # never freed early: the next token (position n) reads every block from `skipped` on
                if group.kind == "sliding":
                    assert skipped * B <= max(0, n - group.window + 1), (  # type: ignore[operator]
                        f"sliding group: sequence {seq_id!r} freed a block inside its window")
                elif group.kind == "chunked":
                    assert skipped * B <= n // group.window * group.window, (  # type: ignore[operator]
                        f"chunked group: sequence {seq_id!r} freed a block of its current chunk")
                elif group.kind == "state":  # the running state's page is held
                    assert n == 0 or skipped <= (n - 1) // B, (
                        f"state group: sequence {seq_id!r} freed the page of its running state")
                else:
                    assert skipped == 0, f"full group: sequence {seq_id!r} freed a block"

    # ---- internals ------------------------------------------------------------------------------
    def _skip(self, seq_id: Hashable) -> int:
        """Free the blocks each group's rule lets go once the sequence's committed tokens are written."""
        B, mode, freed = self.block_size, self.state_mode, 0
        for group, pool in zip(self.groups, self.pools, strict=True):
            if group.kind != "full":
                freed += pool.skip_blocks(
                    seq_id, group.first_block_before_growth(pool.committed_tokens(seq_id), B, mode))
        if freed:
            self._changed()
        return freed

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

    def _changed(self) -> None:
        """Every group's memoised look-up is stale once any group changes the shared store."""
        for pool in self.pools:
            pool._epoch += 1
