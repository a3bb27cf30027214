"""The prefix cache's side of the block pool: content keys, their chain hashes, the verified look-up of a
prompt's cached prefix, and the registration of full blocks (a mixin of `BlockPool`, over the per-block
arrays of block_store).

    keys        one int64 per full block (object keys are interned to exact ids; one kind per pool)
    hashes      chained from the extra key's root (prefix_cache), with home slots in the hash index
    look-up     the index's `find` of every key (the misses' free slots are kept for registration), then
                verification of the candidates up to the first miss: the same key, chained after the
                block just matched at the same version (or the root); a hit never covers the block of
                the last prompt token (see BlockPool.allocate)
    register    the fresh full blocks with keys go into the index, at most one block per hash: a block
                whose chain is already cached in another block stays unindexed

A replay hashes many prompts at once (`hash_prompts`); their look-ups then run 32 prompts at a time and
are checked per prompt against the index as it is (see `_find`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .hash_index import EMPTY
from .prefix_cache import HashedKeys, HashedPrompts, chain_hashes, chain_hashes_batch, root_hash

if TYPE_CHECKING:
    from .block_pool import BlockPool
    from .store import BlockKeys

_ROOT = np.array([-1], dtype=np.intp)
_LOOKAHEAD_PROMPTS = 32  # prompts of a hashed batch looked up at once (see _find)
_NO_IDS = np.empty(0, dtype=np.intp)
_NO_IDS.flags.writeable = False
_NO_HASHES = np.empty(0, dtype=np.uint64)
_NO_HASHES.flags.writeable = False
# `_probe` without keys: nothing to look up, nothing to memoise
_NO_PROBE = (_NO_IDS, _NO_HASHES, _NO_IDS, _NO_IDS, _NO_IDS, _NO_IDS, 0)


class PrefixLookup:
    """Content keys, hashing, look-up and registration of `BlockPool` (see the module docstring)."""

    # ---- content keys and their hashes ----------------------------------------------------------
    def hash_prompts(
        self: BlockPool, block_keys: np.ndarray, offsets: np.ndarray, extra_key: Hashable = None
    ) -> HashedPrompts:
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
        self: BlockPool, block_keys: BlockKeys, extra_key: Hashable
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

    def _continued_homes(self: BlockPool, table: np.ndarray, first: int, hashes: np.ndarray) -> np.ndarray:
        """int64 [k]: home slots of blocks first .. first + k - 1 of a table whose blocks before `first`
        hold their chain hashes; a line's base block may be one of those earlier blocks."""
        positions = first + np.arange(len(hashes))
        base = positions & ~15
        in_batch = base >= first
        earlier = self.block_hash[table[np.minimum(base, first)]]
        base_hashes = np.where(in_batch, hashes[np.maximum(base - first, 0)], earlier)
        return self.index.home_slots(base_hashes, positions)

    def _key_array(self: BlockPool, block_keys: Sequence[Hashable] | np.ndarray) -> np.ndarray:
        if isinstance(block_keys, HashedKeys):
            raise ValueError("keys from hash_prompts are a prompt's: give them to allocate, serve or hit_tokens")
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

    def _extra_id(self: BlockPool, extra_key: Hashable) -> int:
        return self._extras.setdefault(extra_key, len(self._extras))

    # ---- prefix look-up and registration --------------------------------------------------------
    def _find(
        self: BlockPool, hashes: np.ndarray, homes: np.ndarray, block_keys: BlockKeys
    ) -> tuple[np.ndarray, np.ndarray]:
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
            expected = np.where(present >= 0, present, EMPTY)  # what each slot holds while still valid
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

    def _verified_hits(self: BlockPool, cand: np.ndarray, keys: np.ndarray, extra_id: int) -> int:
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

    def _present_after_evictions(self: BlockPool, present: np.ndarray) -> np.ndarray:
        """A look-up's present block ids [k] (or -1), made right again after evictions since it ran: an
        evicted block's hash is absent now, and its slot (a tombstone on the hash's probe run) is a valid
        place to insert the hash again — no second look-up. Nothing else changes on a deletion."""
        gone = (present >= 0) & (self.block_slot.take(np.maximum(present, 0)) < 0)
        return np.where(gone, -1, present)

    def _register(
        self: BlockPool,
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
        inserted = self.index.insert_absent(hashes, blocks, homes, present, slots)
        if inserted is not None:  # an equal chain is cached in another block: keep that one
            blocks, keys = blocks[inserted], keys[inserted]
            parent_ids, parent_vers = parent_ids[inserted], parent_vers[inserted]
        self.key[blocks] = keys
        self.parent_id[blocks] = parent_ids
        self.parent_ver[blocks] = parent_vers
        return inserted

    def _probe(self: BlockPool, num_tokens: int, block_keys: BlockKeys, extra_key: Hashable) -> tuple:
        """(hit block ids intp [h], then the prompt's chain hashes, keys and home slots [k], the index's
        `find` of them (present block ids, slots) [k], and the extra-key id); memoised."""
        if num_tokens < 0:
            raise ValueError(f"a prompt cannot have a negative number of tokens ({num_tokens})")
        if block_keys is None or not self.enable_prefix_caching:
            return _NO_PROBE
        memo = self._memo
        if memo is not None and memo[0] == self._epoch and memo[1] is block_keys and memo[2:4] == (
            num_tokens,
            extra_key,
        ):
            return memo[4]
        keys, hashes, homes, extra_id = self._prompt_hashes(block_keys, extra_key)
        if len(keys) > num_tokens // self.block_size:
            raise ValueError(
                f"{len(keys)} block keys for a {num_tokens}-token prompt, which has only "
                f"{num_tokens // self.block_size} full blocks of {self.block_size}"
            )
        max_hit = min(len(keys), max(num_tokens - 1, 0) // self.block_size)
        present, slots = self._find(hashes, homes, block_keys)  # all: allocate inserts misses without a 2nd look
        cand = present[:max_hit]
        if max_hit and cand[-1] < 0:  # verify only up to the first block not in the index: no hit after it
            cand = cand[: int(np.argmin(cand >= 0))]
        num_hit = self._verified_hits(cand, keys, extra_id) if len(cand) else 0
        result = (cand[:num_hit], hashes, keys, homes, present, slots, extra_id)
        self._memo = (self._epoch, block_keys, num_tokens, extra_key, result)
        return result
