"""The hybrid model's paged memory for verify: one pool group per layer kind (`hybrid_pool_groups`), the
policy whose plans carry block tables and which keeps a preempted request's tables (`HybridExactPolicy`), and
`HybridStore`, the one physical store every group's block ids index (see hybrid_executor.py's docstring for the
groups, the content tags and the step that uses them)."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import torch

from ...core.pool.block_pool import ReleaseReason
from ...core.pool.groups import PoolGroup
from ...core.sim.paged_groups import GroupedPagedPolicy
from .hybrid_model import HybridWeights

GROUP_OF_KIND = {"full": "full", "sliding": "sliding", "recurrent": "state"}
STATE_MODE = "all"  # a saved state at every block boundary: the mode in which a hybrid's prefix cache can hit
_UNWRITTEN = -1


def hybrid_pool_groups(weights: HybridWeights) -> tuple[PoolGroup, ...]:
    """One pool group per layer kind present, full first (the scheduler's plans carry group 0's table)."""
    cfg = weights.config
    groups = [PoolGroup("full", label="full")]
    if cfg.layers_of("sliding"):
        groups.append(PoolGroup("sliding", cfg.window, label=f"sliding {cfg.window}"))
    if cfg.layers_of("recurrent"):
        groups.append(PoolGroup("state", label="state"))
    return tuple(groups)


class HybridExactPolicy(GroupedPagedPolicy):
    """GroupedPagedPolicy whose plans carry block tables (group 0's, the full group), and which keeps every
    group's tables of a request it preempts, for the executor's swap-out. Counts `window_frees`: sliding
    table entries freed as the window moved on."""

    exact_block_tables = True

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        assert self.groups[0].kind == "full", "group 0 must be full attention"
        self.preempted_tables: dict[int, list[np.ndarray]] = {}
        self.window_frees = 0
        for group, bp in zip(self.groups, self.pool.pools, strict=True):
            if group.kind == "sliding":
                self._count_frees(bp)

    def _count_frees(self, bp) -> None:
        skip = bp.skip_blocks

        def counted(seq_id: Hashable, first_block: int) -> int:
            freed = skip(seq_id, first_block)
            self.window_frees += freed
            return freed

        bp.skip_blocks = counted

    def block_table(self, rid: int) -> np.ndarray:
        return self.pool.pools[0].block_table(rid)

    # ---- speculative decoding (core/sim/spec_run.py's SpeculativeScheduler calls these) ----------------------
    def reserve(self, rid: int, num_slots: int) -> bool:
        """`num_slots` past the committed tokens in every group (the last token, K drafts, lookahead)."""
        if not self.pool.can_reserve(rid, num_slots):
            return False
        self.copies += self.pool.reserve(rid, num_slots)
        return True

    def commit(self, rid: int, num_accepted: int) -> int:
        """Keep the first `num_accepted` reserved slots in every group; the rest roll back."""
        return self.pool.commit(rid, num_accepted)

    def speculative_parts(self, tokens: np.ndarray, head_rid: int | None, steps) -> tuple[np.ndarray, int, int]:
        """The pool's memory parts while reservations are open (verify reads no memory figures: 0 slots apart)."""
        parts, table_bytes = self.parts(tokens, head_rid)
        return parts, table_bytes, 0

    def release(self, rid: int, reason: ReleaseReason | str) -> None:
        if ReleaseReason(reason) == ReleaseReason.PREEMPTED:
            self.preempted_tables[rid] = [t.copy() for t in self.pool.block_tables(rid)]
        super().release(rid, reason)


class HybridStore:
    """K/V [num_blocks, B, Hkv, D] per attention layer, a state [num_blocks, S] per recurrent layer, and the
    content tags (see the module docstring). Blocks start as finite garbage: a read nobody wrote shows."""

    def __init__(self, weights: HybridWeights, num_blocks: int, block_size: int) -> None:
        cfg, base = weights.config, weights.config.base
        gen = torch.Generator().manual_seed(1234)
        kw = {"dtype": weights.body.torch_dtype, "device": weights.device}

        def garbage(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * 30).to(**kw)

        kv = (num_blocks, block_size, base.num_kv_heads, base.head_dim)
        self.k = {i: garbage(*kv) for i, kind in enumerate(cfg.kinds) if kind != "recurrent"}
        self.v = {i: garbage(*kv) for i in self.k}
        self.state = {i: garbage(num_blocks, cfg.state_size) for i in cfg.layers_of("recurrent")}
        self.slot_tag = np.full((num_blocks, block_size), _UNWRITTEN, np.int64)  # prefix id of each K/V slot
        self.state_tag = np.full(num_blocks, _UNWRITTEN, np.int64)  # prefix id a state page was computed from
        self.state_pos = np.full(num_blocks, _UNWRITTEN, np.int64)  # the position of its last token

    def _arrays(self) -> list:
        return [*self.k.values(), *self.v.values(), *self.state.values(), self.slot_tag, self.state_tag,
                self.state_pos]

    def copy(self, src: int, dst: int) -> None:
        for a in self._arrays():
            a[dst] = a[src]

    def save(self, block_ids: np.ndarray) -> list:
        idx = torch.as_tensor(block_ids, dtype=torch.int64)
        return [a[idx].clone() if isinstance(a, torch.Tensor) else a[block_ids].copy() for a in self._arrays()]

    def load(self, block_ids: np.ndarray, saved: list, rows: np.ndarray) -> None:
        idx, ridx = torch.as_tensor(block_ids, dtype=torch.int64), torch.as_tensor(rows, dtype=torch.int64)
        for a, s in zip(self._arrays(), saved, strict=True):
            if isinstance(a, torch.Tensor):
                a[idx] = s[ridx]
            else:
                a[block_ids] = s[rows]
