"""Registering a sequence's full blocks that no append keyed: the blocks holding sampled (output) tokens.

vLLM v1 hashes every full block it computes, output tokens included (KVCacheManager.allocate_slots caches the
full blocks of min(num_computed + num_new, num_tokens) tokens), so a request preempted by recompute finds its
own blocks again at re-admission if nobody evicted them since. A simulator does not know what was sampled: the
caller names those blocks with keys of its own (a key no other request uses: nobody else can hit them), and
registers them here — when the sequence is released, which is when it matters: until then only the sequence
itself holds them, and nobody can hit a block whose hash only its holder's chain reaches.

    register_full(pool, seq, first, keys)          a plain BlockPool: the full committed blocks from `first`
    register_full_groups(pool, seq, first, keys)   a HybridPool: every group's, as an append of those tokens
                                                   with these keys registers them (anchored groups included)

`first` is the block (of the pool's block size) the keys start at; nothing is registered where the sequence's
chain of hashed blocks does not reach it (a gap in its keys; a state computed over rejected drafts).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from .append import register_completed

if TYPE_CHECKING:
    from .block_pool import BlockPool
    from .hybrid import HybridPool

Keys = Sequence[Hashable] | np.ndarray  # one key a block, as the caller gives them (never a HashedKeys)


def register_full(pool: BlockPool, seq_id: Hashable, first: int, keys: Keys | None) -> int:
    """Index the sequence's full committed blocks first, first + 1, … under `keys` (one a block, chained after
    block first - 1; extra keys past its full blocks are ignored). Returns how many were indexed."""
    seq = pool.seqs[seq_id]
    if keys is None or not pool.store.enable_prefix_caching or seq.num_hashed != first:
        return 0
    count = min(pool.committed_tokens(seq_id) // pool.block_size - first, len(keys))
    if count <= 0:
        return 0
    pool._epoch += 1  # a look-up kept since (can_allocate -> allocate) may find more now
    register_completed(pool.prefix, seq, pool.prefix.key_array(keys[:count]))
    return count


def register_full_groups(pool: HybridPool, seq_id: Hashable, first: int, keys: Keys) -> None:
    """register_full over every group of a hybrid pool, keys per block of its block size (the hash block): a
    group's own keys (coarser blocks: CoarseKeys) where its BlockPool indexes them, then the anchored groups'
    blocks beside the full group's (a window's, a chunk's, a state page where the last step ended)."""
    if pool._keys(keys) is None:  # the pool caches nothing (state groups in mode none)
        return
    B = pool.block_size
    tokens = pool.pools[0].committed_tokens(seq_id) // pool.scales[0]
    count = min(tokens // B - first, len(keys))
    if count <= 0:
        return
    keys = keys[:count]
    coarse = pool.coarse
    if coarse is not None:
        coarse.note(seq_id, first * B, keys, B, pool.pools[0])
    for g, group_pool in enumerate(pool.pools):
        group_keys = cast("Keys | None", pool._group_keys(g, keys, seq_id))  # (coarse: a list or an int64 array)
        if group_keys is not None:
            own = coarse is not None and coarse.per_block[g] > 1  # its keys start at its first unhashed block
            register_full(group_pool, seq_id, group_pool.seqs[seq_id].num_hashed if own else first, group_keys)
    pool._changed()
    pool._register_anchored(seq_id, first * B, (first + count) * B)
