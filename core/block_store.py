"""The physical side of the block pool: per-block state, handing blocks out and taking them back, and the
prefix cache (content keys, verified look-up, registration of full blocks) — what vLLM v1 calls its block
pool. `BlockPool` (block_pool) adds sequences and their block tables on top.

Per-block arrays, all indexed by block id:

    state       int8    USED / FREE_PLAIN / FREE_CACHED / PENDING (see free_queue)
    ref         int32   live block tables holding the block
    version     int64   raised each time the block is handed out for new content
    fill        int32   tokens written in it
    block_slot  int32   slot of its hash-index entry, -1 when not indexed (`hashed` = block_slot >= 0)
    block_hash  uint64  its chain hash        } meaningful while indexed; the index reads them
    block_home  int32   that hash's home slot }
    key         int64   its content key                     } what a hit is verified against: the same key,
    parent_id   int32   the block it was chained after      } chained after the block just matched (with
    parent_ver  int64   that block's version then           } the same version), or after the root

A full block is registered (indexed) when the sequence that wrote it gives its content key; at most one
block per hash, so a block whose chain is already cached elsewhere stays unindexed (and goes back to the
plain free stack when freed). Evicting a cached block drops its entry through `block_slot`, no look-up.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from kvcalc.core.free_queue import FreeBlockQueue
from kvcalc.core.hash_index import HashIndex
from kvcalc.core.pool_accounting import PoolStats
from kvcalc.core.prefix_cache import HashedKeys, HashedPrompts, chain_hashes, chain_hashes_batch, root_hash

BlockKeys = Sequence[Hashable] | np.ndarray | HashedKeys | None

_NO_BLOCKS = np.empty(0, dtype=np.intp)
_NO_BLOCKS.flags.writeable = False
_ROOT = np.array([-1], dtype=np.intp)
_LOOKAHEAD_PROMPTS = 32  # prompts of a hashed batch looked up at once (see _find)
_EMPTY_SLOT = -1  # HashIndex's empty slot


class PoolExhaustedError(RuntimeError):
    """An allocation that does not fit; ask `can_allocate` / `can_append` first. Nothing was changed."""


class BlockStore:
    """`num_blocks` physical blocks of `block_size` token slots; see the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a pool needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.enable_prefix_caching = enable_prefix_caching
        n = self.num_blocks
        self.state = np.zeros(n, dtype=np.int8)
        self.ref = np.zeros(n, dtype=np.int32)
        self.version = np.zeros(n, dtype=np.int64)  # int64: a long simulation hands blocks out many times
        self.fill = np.zeros(n, dtype=np.int32)
        self.block_slot = np.full(n, -1, dtype=np.int32)
        self.block_hash = np.zeros(max(n, 2), dtype=np.uint64)  # >= 2: the index reads [-1], [-2] harmlessly
        self.block_home = np.zeros(max(n, 2), dtype=np.int32)
        # zeros, not -1: like the hash, these are read only for indexed blocks, which wrote them
        self.key = np.zeros(n, dtype=np.int64)
        self.parent_id = np.zeros(n, dtype=np.int32)
        self.parent_ver = np.zeros(n, dtype=np.int64)
        self.queue = FreeBlockQueue(n, self.state)
        self.index = HashIndex(n if enable_prefix_caching else 1, self.block_hash, self.block_home, self.block_slot)
        self._key_kind: str | None = None
        self._interned: dict[Hashable, int] = {}
        self._extras: dict[Hashable, int] = {None: 0}
        self._lookahead: tuple | None = None  # see _find
        # running totals so that usage() is O(live sequences)
        self.num_used = 0
        self.useful_tokens = 0
        self._stats = {k: 0 for k in PoolStats.counter_names()}

    # ---- sizes ----------------------------------------------------------------------------------
    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: plain free + cached free (evictable)."""
        return len(self.queue)

    @property
    def num_cached_free_blocks(self) -> int:
        return self.queue.num_cached

    @property
    def hashed(self) -> np.ndarray:
        """bool [num_blocks] (a fresh array): the block holds a prefix-cache entry."""
        return self.block_slot >= 0

    # ---- content keys and their hashes ----------------------------------------------------------
    def hash_prompts(self, block_keys: np.ndarray, offsets: np.ndarray, extra_key: Hashable = None) -> HashedPrompts:
        """Chain hashes and home slots of many prompts' block keys at once (vectorised over all of them).

        block_keys int64 [K]: the prompts' keys end to end; offsets int64 [N+1]: prompt i's keys are
        block_keys[offsets[i]:offsets[i+1]]. `.prompt(i)` is what `allocate` takes as its block_keys.
        """
        if not isinstance(block_keys, np.ndarray):
            raise ValueError("hash_prompts takes block keys as one int64 array (object keys: pass them per prompt)")
        keys = self._key_array(block_keys)
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.diff(offsets)
        if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(keys) or np.any(lengths < 0):
            raise ValueError(f"offsets must rise from 0 to {len(keys)} (the number of keys), one more than prompts")
        hashes = chain_hashes_batch(root_hash(self._extra_id(extra_key)), keys, offsets)
        position = np.arange(len(keys), dtype=np.int64) - np.repeat(offsets[:-1], lengths)
        line_base = np.arange(len(keys), dtype=np.int64) - (position & 15)  # see HashIndex: one line per 16
        homes = self.index.home_slots(hashes[line_base], position)
        return HashedPrompts(keys, hashes, homes, offsets, extra_key, self.index)

    def _prompt_hashes(
        self, block_keys: BlockKeys, extra_key: Hashable
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(keys int64 [k], chain hashes uint64 [k], home slots int64 [k], extra-key id) of a prompt."""
        extra_id = self._extra_id(extra_key)
        if isinstance(block_keys, HashedKeys):
            batch = block_keys.batch
            if batch.index is not self.index:
                raise ValueError("these hashed keys were computed by another pool: use this pool's hash_prompts")
            if batch.extra_key != extra_key:
                raise ValueError(f"keys hashed for extra key {batch.extra_key!r}, allocated with {extra_key!r}")
            return block_keys.keys, block_keys.hashes, block_keys.homes, extra_id
        keys = self._key_array(block_keys)
        hashes = chain_hashes(root_hash(extra_id), keys)
        positions = np.arange(len(keys))
        return keys, hashes, self.index.home_slots(hashes[positions & ~15], positions), extra_id

    def _continued_homes(self, table: np.ndarray, first: int, hashes: np.ndarray) -> np.ndarray:
        """int64 [k]: home slots of blocks first .. first + k - 1 of a table whose blocks before `first`
        hold their chain hashes; a line's base block may be one of those earlier blocks."""
        positions = first + np.arange(len(hashes))
        base = positions & ~15
        in_batch = base >= first
        earlier = self.block_hash[table[np.minimum(base, first)]]
        base_hashes = np.where(in_batch, hashes[np.maximum(base - first, 0)], earlier)
        return self.index.home_slots(base_hashes, positions)

    def _key_array(self, block_keys: Sequence[Hashable] | np.ndarray) -> np.ndarray:
        is_int = isinstance(block_keys, np.ndarray)
        kind = "int" if is_int else "object"
        if self._key_kind is None:
            self._key_kind = kind
        elif self._key_kind != kind:
            raise ValueError(f"this pool takes {self._key_kind} block keys; do not mix int64 arrays and objects")
        if is_int:
            if block_keys.dtype.kind not in "iu":
                raise ValueError(f"block keys as an array must be integers, got dtype {block_keys.dtype}")
            return block_keys.astype(np.int64, copy=False)
        interned = self._interned
        return np.fromiter((interned.setdefault(k, len(interned)) for k in block_keys), np.int64, len(block_keys))

    def _extra_id(self, extra_key: Hashable) -> int:
        return self._extras.setdefault(extra_key, len(self._extras))

    # ---- prefix look-up and registration --------------------------------------------------------
    def _find(self, hashes: np.ndarray, homes: np.ndarray, block_keys: BlockKeys) -> tuple[np.ndarray, np.ndarray]:
        """The index's `find` of a prompt's hashes: (present block ids intp [k] or -1, slots int64 [k]).

        For a prompt of a hashed batch, the look-up runs for the next _LOOKAHEAD_PROMPTS prompts at once (a
        few numpy calls over thousands of keys instead of a few dozen per prompt) and each prompt's part is
        checked against the index as it is now. Without deletions (no tombstone, no eviction, no rebuild)
        an entry found stays where it is, and a hash absent up to an empty slot stays absent while that
        slot is empty: the only inserts since went into empty slots, and an insert of the hash itself
        would have taken that slot, the first free one on its probe run. Keys whose slot changed are
        looked up again.
        """
        index = self.index
        if not isinstance(block_keys, HashedKeys) or index.num_tombstones:
            return index.find(hashes, homes)
        batch, number = block_keys.batch, block_keys.number
        ahead = self._lookahead
        if ahead is None or ahead[0] is not batch or not ahead[1] <= number < ahead[2] or ahead[3] != index.generation:
            stop = min(number + _LOOKAHEAD_PROMPTS, len(batch))
            a, b = int(batch.offsets[number]), int(batch.offsets[stop])
            present, slots = index.find(batch.hashes[a:b], batch.homes[a:b])
            expected = np.where(present >= 0, present, _EMPTY_SLOT)  # what each slot holds while still valid
            ahead = self._lookahead = (batch, number, stop, index.generation, a, present, slots, expected)
        a = block_keys.start - ahead[4]
        b = a + len(hashes)
        present, slots = ahead[5][a:b], ahead[6][a:b]
        stale = index.vals.take(slots) != ahead[7][a:b]
        if stale.any():
            redo = np.flatnonzero(stale)
            present, slots = present.copy(), slots.copy()
            present[redo], slots[redo] = index.find(hashes[redo], homes[redo])
        return present, slots

    def _verified_hits(self, cand: np.ndarray, keys: np.ndarray, extra_id: int) -> int:
        """How many leading candidates (block ids intp [m], all indexed) hold the prompt's content: the
        same key, chained after the candidate before (the same block at the same version) or the root."""
        m = len(cand)
        ok = self.key.take(cand) == keys[:m]
        parent_ids, parent_vers = self.parent_id.take(cand), self.parent_ver.take(cand)
        ok[0] &= (parent_ids[0] == -1) & (parent_vers[0] == extra_id)
        if m > 1:
            prev = cand[:-1]
            ok[1:] &= parent_ids[1:] == prev
            ok[1:] &= parent_vers[1:] == self.version.take(prev)
        return int(np.argmin(ok)) if np.count_nonzero(ok) < m else m

    def _register(
        self,
        table: np.ndarray,
        first: int,
        extra_id: int,
        hashes: np.ndarray,
        keys: np.ndarray,
        homes: np.ndarray,
        present: np.ndarray | None = None,
        slots: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """Index the full blocks table[first : first + len(keys)] (just written, ref 1) under their hashes;
        returns which were indexed (bool [k]), or None when all of them were.

        `present, slots`: the index's `find` of these hashes, when the caller has it (saves a probe).
        """
        count = len(keys)
        blocks = table[first : first + count]
        if first:
            parent_ids = table[first - 1 : first + count - 1]
            parent_vers = self.version.take(parent_ids)
        else:
            parent_ids = np.concatenate((_ROOT, table[: count - 1]))
            parent_vers = self.version.take(parent_ids)  # [0] reads the last block, replaced:
            parent_vers[0] = extra_id
        self.block_hash[blocks] = hashes
        self.block_home[blocks] = homes
        inserted = self.index.insert(hashes, blocks, homes, present, slots)
        partial = np.count_nonzero(inserted) < count
        if partial:  # an equal chain is cached in another block: keep that one
            blocks, keys = blocks[inserted], keys[inserted]
            parent_ids, parent_vers = parent_ids[inserted], parent_vers[inserted]
        self.key[blocks] = keys
        self.parent_id[blocks] = parent_ids
        self.parent_ver[blocks] = parent_vers
        return inserted if partial else None

    # ---- handing out and taking back ------------------------------------------------------------
    def _hand_out(self, n: int) -> tuple[np.ndarray, int]:
        """Pop n free blocks for new content (version + 1, state USED; evicted cache entries dropped):
        (block ids intp [n], evictions among them). Reference counts are the caller's."""
        if n == 0:
            return _NO_BLOCKS, 0
        plain, evicted = self.queue.pop(n)
        if len(evicted):
            self.index.delete(evicted)
            self._stats["evictions"] += len(evicted)
            blocks = np.concatenate([plain, evicted])
        else:
            blocks = plain
        versions = self.version.take(blocks)
        versions += 1
        self.version[blocks] = versions
        self._stats["allocated_blocks"] += n
        return blocks, len(evicted)

    def _take(self, n: int) -> np.ndarray:
        """Hand out n free blocks for new content to one table: ref 1, version + 1."""
        blocks = self._hand_out(n)[0]
        self.ref[blocks] = 1
        self.num_used += n
        return blocks

    def _take_one(self) -> int:
        """`_take(1)`; a content-free block in scalar steps. NOTE: the array path costs a dozen numpy
        calls, too many for decode, which needs one block per block boundary of every sequence."""
        if not self.queue.num_plain:
            return int(self._take(1)[0])
        block = self.queue.pop_plain_one()
        self.version[block] += 1
        self.ref[block] = 1
        self.num_used += 1
        self._stats["allocated_blocks"] += 1
        return block

    def _free(self, blocks: np.ndarray) -> None:
        """Blocks with ref 0 go to the free side: indexed ones to the LRU cache (in this order), the rest to
        the plain stack with their content dropped."""
        if not self.enable_prefix_caching:  # then nothing is ever indexed
            self.fill[blocks] = 0
            self.queue.push_plain(blocks)
            return
        keep = self.block_slot.take(blocks) >= 0
        num_keep = np.count_nonzero(keep)
        if num_keep == len(blocks):
            self.queue.push_cached(blocks)
            return
        plain = blocks[~keep] if num_keep else blocks
        self.fill[plain] = 0
        self.queue.push_plain(plain)
        if num_keep:
            self.queue.push_cached(blocks[keep])
