"""The hybrid pool's layout: one shared store and prefix index, one `BlockPool` per layer group, and which
groups keep whole prefix-cache chains and which are anchored to the first full group's (see group_hits).

`HybridLayout` is the base of `HybridPool` (core/pool/hybrid.py, where the pool's operations are listed): its
construction, and the few steps every operation takes — the keys each group is given, the blocks each group's
rule lets go (`_skip`), and the staleness of every group's memoised look-up (`_changed`). The prefix hits across
groups and allocation are in hybrid_hits, the decode steps of many sequences at once in hybrid_batch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from .block_pool import BlockPool
from .group_blocks import CoarseKeys, group_block_sizes
from .groups import DEFAULT_STATE_MODE, FULL, PoolGroup, check_state_mode
from .prefix_lookup import PrefixIndex
from .speculative import DEFAULT_ROLLBACK_POLICY
from .state_pages import Resumed, resumed_blocks, state_slack
from .store import BlockKeys
from .weighted import group_stores


class HybridLayout:
    """`num_blocks` blocks of `block_size` slots shared by `groups`; see core/pool/hybrid.py."""

    def __init__(
        self, num_blocks: int, block_size: int, groups: Sequence[PoolGroup] = (FULL,), *,
        enable_prefix_caching: bool = True, state_mode: str = DEFAULT_STATE_MODE,
        rollback_policy: str = DEFAULT_ROLLBACK_POLICY, max_group_blocks: int | None = None,
    ) -> None:
        if not groups:
            raise ValueError("a hybrid pool needs at least one layer group")
        self.groups = tuple(groups)
        # each group's tokens per block, and store slots per token: one physical block is one page, which holds
        # `slots` = lcm(tokens per block) slots; a group of B_g tokens per block writes slots / B_g per token
        # (all 1 unless vLLM's unified pages give the groups different tokens per block: group_blocks)
        self.group_blocks, self.scales, slots = group_block_sizes(self.groups, block_size)
        self.mixed = slots != block_size
        # weights: units a group's block costs (weighted tables, the ideal layout's unit: weighted.py); all 1: one
        # plain BlockStore shared by every group, as before; otherwise a WeightedStore and a view of it per group
        self.weights = tuple(g.weight for g in self.groups)
        self.weighted = any(w != 1 for w in self.weights)
        self.store, stores = group_stores(num_blocks, slots, self.weights, enable_prefix_caching, max_group_blocks)
        self.prefix = PrefixIndex(self.store)
        self.coarse = CoarseKeys(self.group_blocks, block_size) if self.mixed else None
        self.state_mode = check_state_mode(state_mode)
        self.pools = [BlockPool(num_blocks, block_size, rollback_policy=rollback_policy, shared=(store, self.prefix))
                      for store in stores]
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)  # weighted: units
        # the groups that keep no whole chain (sliding, chunked, state in mode align or all: a hit reads only the page
        # at its boundary, vLLM's MambaManager.find_longest_cache_hit, the older pages freed) are anchored to the first
        # full group's blocks (see group_hits); without a full group they keep chains, and an align state group
        # then serves no hit. A state group serves a prefix only where a state was saved at exactly that
        # boundary: mode all saves one at every block boundary, align at step ends (group_hits), none none.
        kinds = [g.kind for g in self.groups]
        self.anchor = kinds.index("full") if "full" in kinds else None
        self.anchored = tuple(self.anchor is not None and (k in ("sliding", "chunked") or (
            k == "state" and self.state_mode != "none")) for k in kinds)
        has_state = "state" in kinds
        # mode none: a state group holds one page, moved along its table in place (state_pages.roll_page)
        self.rolled = tuple(k == "state" and self.state_mode == "none" for k in kinds)
        self.rolling = any(self.rolled)
        # align: the page a jump step resumes from, held past the table until the sequence's next step (_resume)
        self._resumed: Resumed = {}  # seq -> {group: (table index, block)} (state_pages)
        self.jumps_hold_resumed = self.state_mode == "align" and has_state  # a step may jump over state pages
        self._plan_memo: tuple | None = None  # (epoch, the last few _hit_plans), until any group changes (pool 0's)
        self.caches = enable_prefix_caching and not (has_state and (
            self.state_mode == "none" or (self.state_mode == "align" and self.anchor is None)))

    def has_seq(self, seq_id: Hashable) -> bool:
        return self.pools[0].has_seq(seq_id)

    def _keys(self, block_keys: BlockKeys) -> BlockKeys:
        return block_keys if self.caches else None

    def _group_keys(self, g: int, keys: BlockKeys, seq_id: Hashable = None) -> BlockKeys:
        """The keys group g's own BlockPool takes: none for an anchored group (the hybrid pool registers it); a
        group of coarser blocks (mixed block sizes) the keys of its own blocks (group_blocks.CoarseKeys)."""
        if self.anchored[g]:
            return None
        return keys if self.coarse is None else self.coarse.group_keys(g, keys, self.pools[g], seq_id)

    def _skip(self, seq_id: Hashable) -> int:
        """Free the blocks each group's rule lets go once the sequence's committed tokens are written."""
        mode, freed, resumed = self.state_mode, 0, self._resumed and seq_id in self._resumed
        for g, (group, pool, B, s) in enumerate(zip(self.groups, self.pools, self.group_blocks, self.scales,
                                                    strict=True)):
            if group.kind != "full":
                freed += pool.skip_blocks(
                    seq_id, group.first_block_before_growth(pool.committed_tokens(seq_id) // s, B, mode))
                if resumed:  # after the group's own frees, as vLLM's MambaManager.remove_skipped_blocks
                    freed += self._let_resumed_go(seq_id, (g,))
        if freed:
            self._changed()
        return freed

    def _hold_from(self, g: int, hit_tokens: int, first: int, num_tokens: int) -> int:
        """The first hit block of group g an allocation of `num_tokens` holds: its rule's `first`, or (align) a
        state group's hit page where the first step jumps past it to a boundary: the state that step resumes from
        (`_resume`). A step that ends mid-block past a boundary holds that boundary's page instead (groups.py)."""
        B = self.group_blocks[g]
        if self.groups[g].kind != "state" or self.state_mode != "align" or not hit_tokens or num_tokens % B:
            return first
        return min(first, hit_tokens // B - 1)

    def _resume(self, seq_id: Hashable, g: int, index: int, block: int) -> None:
        """Hold `block`, group g's page at table `index`, past the table: the state an align step that jumps over
        pages resumes from (vLLM's MambaManager.last_state_block_idx), let go at the sequence's next step
        (`_let_resumed_go`: remove_skipped_blocks frees it then) or its release. The caller counts its reference."""
        held = self._resumed.setdefault(seq_id, {})
        assert g not in held, f"group {g}: sequence {seq_id!r} already holds the page a step resumed from"
        held[g] = (index, block)

    def _let_resumed_go(self, seq_id: Hashable, groups: Sequence[int] | None = None) -> int:
        """Let go the pages `_resume` holds for the sequence (in `groups`, all when None), in group order: each
        one reference less, freed (pending inside a step) where none is left; returns how many."""
        held = self._resumed.get(seq_id)
        if not held:
            return 0
        store, gone = self.store, 0
        for g in sorted(held) if groups is None else [g for g in groups if g in held]:
            block = self._pop_resumed(seq_id, g)
            store.ref[block] -= 1
            if not store.ref[block]:
                store.drop(np.array([block], dtype=np.int64), defer=self.pools[g]._in_step)
            gone += 1
        return gone

    def _pop_resumed(self, seq_id: Hashable, g: int) -> int | None:
        """The page `_resume` holds for the sequence in group g, no longer counted among the group's held blocks
        (the caller drops its reference); None where there is none."""
        held = self._resumed.get(seq_id)
        if not held or g not in held:
            return None
        block = held.pop(g)[1]
        if not held:
            del self._resumed[seq_id]
        self.pools[g].logical_blocks -= 1
        return block

    def state_slack(self) -> int:
        """Slots of the state groups' held pages that no token count fills: a page is a whole state, all of its
        slots useful (state_pages), so usage adds them to the store's written tokens."""
        shared = bool(self.store.counters["hit_blocks"] or self.store.counters["forks"])
        if not (shared or self.weighted or any(p.spec.tracked for p in self.pools)) and (self.rolling or not (
                self.mixed or self.store.enable_prefix_caching)):  # (mode none: one page, wherever it came from)
            return self._private_slack()
        shared = shared or bool(self._resumed)  # (a page a jump resumed from too)
        states = [g for g, group in enumerate(self.groups) if group.kind == "state"]
        past = self._resumed_now() if self._resumed else None
        weights = [[g for g in states if self.groups[g].weight == w] for w in {self.groups[g].weight for g in states}]
        # a block is in one group's tables only: the state groups of one weight summed over their blocks at once
        return sum(state_slack(self.store, [*(s.blocks for g in members for s in self.pools[g].seqs.values()),
                                            *(b for g in members for b in self.pools[g].spec.kept.values()),
                                            *([] if past is None else [past[g] for g in members])],
                               shared, self.groups[members[0]].weight) for members in weights)

    def _private_slack(self) -> int:
        """state_slack where every held block is in one table, written from its first token on (no prefix cache,
        fork, kept page, weighted table or mixed block size): a state table of n tokens holds its blocks from its
        first kept one f to ceil(n / B), all full but the last (a fresh block is; a topped-up one is the last),
        n − B · f tokens in B · (ceil(n / B) − f) slots, so B − fill sums to (−n) mod B, alike in every state group
        and every mode (none's one page too); a page held past the table (align) adds its own B − fill."""
        B, states = self.block_size, sum(g.kind == "state" for g in self.groups)
        slack = states * sum(-s.num_tokens % B for s in self.pools[0].seqs.values()) if states else 0
        for pages in self._resumed.values():
            slack += sum(B - int(self.store.fill[block]) for _, block in pages.values())
        return slack

    def _held_arrays(self) -> list[list[np.ndarray]]:
        """Per group, each live table's held range and the pages held past the tables (state_pages)."""
        return [[*(s.blocks for s in p.seqs.values()), r] for p, r in zip(self.pools, self._resumed_now(), strict=True)]

    def _resumed_now(self) -> list[np.ndarray]:
        """Per group, the pages held past the tables (state_pages.resumed_blocks)."""
        return resumed_blocks(self._resumed, len(self.groups))

    def _fork_resumed(self, parent_id: Hashable, child_id: Hashable) -> None:
        """A fork's child holds the page its parent's jump resumed from too, until its own next step."""
        for g, (at, block) in self._resumed.get(parent_id, {}).items():
            self.store.ref[block] += 1
            self.pools[g].logical_blocks += 1
            self._resume(child_id, g, at, block)

    def _changed(self) -> None:
        """Every group's memoised look-up is stale once any group changes the shared store."""
        for pool in self.pools:
            pool._epoch += 1
