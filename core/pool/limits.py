"""The block pool's size limits and the bytes of its store, without the store (core/pool/store.py): what a command
checks before it builds a pool — a trace replay that computes its hits per hash id builds none — without numpy,
the hash index's geometry (its slot count) included."""

from __future__ import annotations

MAX_BLOCKS = MAX_BLOCK_TOKENS = 2**31 - 1  # block ids and per-block fills are int32
_ROOMY_SLOTS = 1 << 18  # 1 MiB of int32 slots


def index_slots(max_entries: int) -> int:
    """Slots of a hash index for `max_entries` (HashIndex.num_slots; see hash_index.py), a power of two."""
    slots = max(32, 2 * max_entries, min(8 * max_entries, _ROOMY_SLOTS))
    return 1 << int(slots - 1).bit_length()


def store_memory_bytes(num_blocks: int) -> int:
    """Bytes a BlockStore of `num_blocks` allocates (with prefix caching), to refuse a pool that cannot fit before
    creating it: the per-block arrays (see store), the free queue's and the hash index's int32 slots."""
    arrays = 1 + 4 + 4 + 4 + 4 + 8 + 4 + 8  # state, ref, version, fill, block_slot, block_hash, block_home, key
    arrays += 8 + 8 + 4 + 4  # klass, parent_klass, the index's duplicate lists (dup_lists)
    queue = 2 * 4 + 4  # the free queue (room for two entries a block), stamp
    return num_blocks * (arrays + queue) + 4 * index_slots(num_blocks)
