"""The hybrid pool's layout: one shared store and prefix index, one `BlockPool` per layer group, and which
groups keep whole prefix-cache chains and which are anchored to the first full group's (see group_hits).

`HybridLayout` is the base of `HybridPool` (core/pool/hybrid.py, where the pool's operations are listed): its
construction, and the few steps every operation takes — the keys each group is given, the blocks each group's
rule lets go (`_skip`), and the staleness of every group's memoised look-up (`_changed`). The prefix hits across
groups and allocation are in hybrid_hits, the decode steps of many sequences at once in hybrid_batch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from .block_pool import BlockPool
from .group_blocks import CoarseKeys, group_block_sizes
from .group_hits import Canonical
from .groups import DEFAULT_STATE_MODE, FULL, PoolGroup, check_state_mode
from .prefix_lookup import PrefixIndex
from .speculative import DEFAULT_ROLLBACK_POLICY
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
        self._canonical: dict[Hashable, dict[int, Canonical]] = {}  # see group_hits.Canonical
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
        mode, freed = self.state_mode, 0
        for group, pool, B, s in zip(self.groups, self.pools, self.group_blocks, self.scales, strict=True):
            if group.kind != "full":
                freed += pool.skip_blocks(
                    seq_id, group.first_block_before_growth(pool.committed_tokens(seq_id) // s, B, mode))
        if freed:
            self._changed()
        return freed

    def _changed(self) -> None:
        """Every group's memoised look-up is stale once any group changes the shared store."""
        for pool in self.pools:
            pool._epoch += 1
