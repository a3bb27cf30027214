"""Layer groups with different tokens per block in one hybrid pool: vLLM's unified page sizes.

vLLM v1 gives every KV cache group the same page size (`unify_kv_cache_spec_page_size`): a type whose page
of B tokens is smaller grows its block until the pages match, so its block holds k · B tokens. Gemma-4-31B:
a sliding layer's page of 16 tokens (16 KV heads · 256) equals a full layer's of 32 (4 KV heads · 512 — the
full layers' K = V), so the full group's blocks hold 32 tokens and the sliding groups' 16. One physical
block is still one page, so a block id costs the same in every group; only the tokens it holds differ.

Here one block of the store has `slots` = lcm of the groups' tokens per block; a group of B_g tokens per
block writes slots / B_g slots per token, so each group's `BlockPool` runs on the shared store unchanged,
in slots (its block table counts its own blocks). Prefix-cache keys are given per block of the pool's
`block_size` b (vLLM's hash block, the gcd); a group of k · b tokens per block keys its block by the k keys
together (interned: exact, as any key). A hit is a whole number of every group's blocks: a multiple of
L = lcm(B_g) tokens (vLLM's HybridKVCacheCoordinator aligns hits to the same lcm).

    tokens     0 ........ 15|16 ....... 31|32 ....... 47|48 .. 52       Gemma-4-31B, b 16, L 32
    full      [        7               ][        9               ]     32 tokens a block: slot = token
    sliding   [   3     ] [    4       ][   8      ] [  2   ]           16 tokens a block: 2 slots a token
    a hit of 40 tokens is cut to 32 (L): the full group's block 0, the sliding group's blocks 0 and 1
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

from .groups import PoolGroup
from .prefix_cache import HashedKeys
from .store import BlockKeys


def group_block_sizes(groups: Sequence[PoolGroup], block_size: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(each group's tokens per block, each group's store slots per token, slots per store block)."""
    sizes = tuple(g.tokens_per_block(block_size) for g in groups)
    if any(size % block_size for size in sizes):
        raise ValueError(f"every group's tokens per block must be a multiple of the pool's block size {block_size} "
                         f"(the hash block), got {sorted(set(sizes))}")
    slots = math.lcm(*sizes)
    return sizes, tuple(slots // size for size in sizes), slots


class CoarseKeys:
    """The content keys of the blocks of groups whose block is k > 1 hash blocks: the k keys of a hash block
    each, interned (exact). A sequence's hash-block keys are kept while it lives, so that a coarse block that
    completes in a later append than its first hash blocks still gets all k keys."""

    def __init__(self, group_blocks: Sequence[int], block_size: int) -> None:
        self.per_block = tuple(size // block_size for size in group_blocks)  # k of each group
        self._ids: dict[tuple[int, ...], int] = {}
        self._seq_keys: dict[Hashable, np.ndarray] = {}  # hash-block keys of each live sequence, as exact ints

    def group_keys(self, g: int, keys: BlockKeys, pool, seq_id: Hashable = None) -> BlockKeys:
        """Group g's keys: `keys` as they are where its block is one hash block; otherwise, for a prompt
        (`seq_id` None), one key per k whole hash blocks of it; for a growing sequence, its blocks from the
        first not hashed yet to the last whole one of the hash-block keys known so far (`note`)."""
        k = self.per_block[g]
        if k == 1 or keys is None:
            return keys
        if seq_id is None:
            ints = self.ints(keys, pool)
            return self._coarse(ints[: len(ints) // k * k].reshape(-1, k), keys)
        seq, known = pool.seqs.get(seq_id), self._seq_keys.get(seq_id)
        if seq is None or known is None or seq.num_hashed < 0:
            return None
        rows = known[seq.num_hashed * k : len(known) // k * k].reshape(-1, k)
        return self._coarse(rows, keys)

    @staticmethod
    def ints(keys: BlockKeys, pool) -> np.ndarray:
        """int64 [n]: hash-block keys as the pool's prefix index holds them (object keys interned by it)."""
        if isinstance(keys, HashedKeys):
            return keys.keys
        return pool.prefix.key_array(keys)

    def _coarse(self, rows: np.ndarray, like: BlockKeys) -> BlockKeys:
        """One key per row of k hash-block keys, of the same kind as `like` (int64 array, or objects)."""
        if not isinstance(like, np.ndarray | HashedKeys):
            return [("coarse", *row) for row in rows.tolist()]  # objects: the prefix index interns them
        ids = self._ids
        return np.fromiter((ids.setdefault(tuple(row), len(ids)) for row in rows.tolist()), np.int64, len(rows))

    # ---- a sequence's hash-block keys ------------------------------------------------------------
    def start(self, seq_id: Hashable, keys: BlockKeys, pool) -> None:
        """A sequence allocated with its prompt's hash-block keys (none: nothing to key)."""
        if keys is None:
            self._seq_keys.pop(seq_id, None)
        else:
            self._seq_keys[seq_id] = self.ints(keys, pool).copy()

    def note(self, seq_id: Hashable, old_tokens: int, keys: BlockKeys, block_size: int, pool) -> None:
        """The keys of the hash blocks an append from `old_tokens` completes (they start at hash block
        old_tokens // block_size); a gap in the keys ends what the sequence can hash."""
        known = self._seq_keys.get(seq_id)
        if keys is None or known is None:
            return
        if len(known) != old_tokens // block_size:
            del self._seq_keys[seq_id]
            return
        self._seq_keys[seq_id] = np.concatenate([known, self.ints(keys, pool)])

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        if parent_id in self._seq_keys:
            self._seq_keys[child_id] = self._seq_keys[parent_id].copy()

    def forget(self, seq_id: Hashable) -> None:
        self._seq_keys.pop(seq_id, None)
