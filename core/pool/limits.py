"""The block pool's size limits and the bytes of its store, without the store (core/pool/store.py): what a command
checks before it builds a pool — a trace replay that computes its hits per hash id builds none — importing only
numpy and the hash index's geometry."""

from __future__ import annotations

from .hash_index import HashIndex

MAX_BLOCKS = MAX_BLOCK_TOKENS = 2**31 - 1  # block ids and per-block fills are int32


def store_memory_bytes(num_blocks: int) -> int:
    """Bytes a BlockStore of `num_blocks` allocates (with prefix caching), to refuse a pool that cannot fit before
    creating it: the per-block arrays (see store), the free queue's and the hash index's int32 slots."""
    arrays = 1 + 4 + 4 + 4 + 4 + 8 + 4 + 8 + 4 + 4  # state, ref, version, fill, block_slot .. parent_ver
    queue = 4 + 2 * 4 + 4  # plain stack, LRU (room for two entries a block), stamp
    return num_blocks * (arrays + queue) + 4 * HashIndex.num_slots(num_blocks)
