"""Prefix-cache hashing: chained block hashes and a vectorised hash -> block index.

Content model. The pool never sees tokens. The caller gives one *content key* per full block: an integer
(int64) that identifies the block's tokens exactly — Mooncake replay uses `hash_id * (512 // B) + sub`,
a bijection of the pair (hash_id, sub-block index); object keys such as tuples of token ids are interned by
the pool to exact integer ids first. Block i's hash chains the parent's hash with its own key:

    h(-1) = mix(extra_key_id)                      the root: model / adapter id (extra keys)
    h(i)  = h(i-1) · P + mix(key_i)   (mod 2^64)

so equal hashes mean "same extra key and same sequence of block contents from position 0" — up to a
collision. Collisions are harmless because a hit is *verified*: the pool compares the stored content key,
and the stored parent reference (parent block id and version, or the extra key at the root) with the
block just matched before it. A chain of verified equal keys from the root is equal content; a hash is
only a way to find a candidate.

The recurrence is linear, so a whole chain is one vectorised prefix sum (h(i) = P^i · (P·h(-1) +
Σ_{j<=i} P^-j · mix(key_j)), with P odd hence invertible mod 2^64): O(blocks) numpy work per prompt, no
per-token and no per-block Python loop.
"""

from __future__ import annotations

import functools

import numpy as np

_P = 0x9E3779B97F4A7C15  # odd, so invertible modulo 2^64
_P_INV = pow(_P, -1, 2**64)
_EMPTY = -1
_TOMBSTONE = -2
_MINUS_ONES = np.full(4096, -1, dtype=np.int64)
_LINE = 16  # int32 slots per 64-byte cache line: a chain's consecutive blocks share one
_STEP = _LINE + 1  # odd, so a probe run visits every slot; the next line, as near as a new line can be
_STRAGGLERS = 16  # probe steps go batch-wide until this few keys are left; those finish one at a time


_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: int64/uint64 [n] -> well-mixed uint64 [n]. (uint64 array arithmetic wraps
    modulo 2^64 silently, which is what a hash wants.)"""
    z = values.astype(np.uint64)
    z += _GOLDEN
    z ^= z >> _S30
    z *= _MIX1
    z ^= z >> _S27
    z *= _MIX2
    z ^= z >> _S31
    return z


@functools.lru_cache(maxsize=1024)
def root_hash(extra_key_id: int) -> int:
    """h(-1) for a sequence with this (interned) extra key."""
    return int(mix64(np.array([extra_key_id], dtype=np.int64))[0])


class _Powers:
    """P^i and P^-i mod 2^64 for i < n, grown by doubling."""

    def __init__(self) -> None:
        self.pos = np.ones(1, dtype=np.uint64)
        self.neg = np.ones(1, dtype=np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if n > len(self.pos):
            size = max(n, 2 * len(self.pos))
            self.pos = np.cumprod(np.r_[np.uint64(1), np.full(size - 1, _P, dtype=np.uint64)], dtype=np.uint64)
            self.neg = np.cumprod(np.r_[np.uint64(1), np.full(size - 1, _P_INV, dtype=np.uint64)], dtype=np.uint64)
        return self.pos[:n], self.neg[:n]


_POWERS = _Powers()


def chain_hashes(parent_hash: int, keys: np.ndarray) -> np.ndarray:
    """uint64 [n]: h(i) = h(i-1)·P + mix(keys[i]) mod 2^64, with h(-1) = parent_hash."""
    n = len(keys)
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    pos, neg = _POWERS.get(n + 1)
    scaled = mix64(keys)
    scaled *= neg[:n]
    np.add.accumulate(scaled, out=scaled)  # the prefix sum in place (uint64 wraps modulo 2^64)
    scaled += np.uint64(parent_hash * _P % 2**64)  # Python ints: numpy scalars would warn on overflow
    scaled *= pos[:n]
    return scaled


def chain_hashes_reference(parent_hash: int, keys: list[int]) -> list[int]:
    """The same recurrence one block at a time with Python ints (for tests)."""
    out, h = [], parent_hash
    for key in keys:
        h = (h * _P + int(mix64(np.array([key], dtype=np.int64))[0])) % 2**64
        out.append(h)
    return out


class HashIndex:
    """Open-addressing map uint64 hash -> block id, vectorised over many hashes.

    The table stores only block ids (int32); a slot's hash is read from the pool's per-block hash array
    `hash_of` (uint64 [num_blocks]) and its home slot from `home_of`, both filled by the pool before it
    inserts. 4 bytes a slot instead of 12: the whole-trace Mooncake replay holds millions of blocks.

    Locality: block i of a chain has its home slot in the 16-slot line (one 64-byte cache line) that
    the hash of block i - i mod 16 picks, at offset (i + that hash) mod 16; probing steps to the next
    line (+17: odd, so a run visits every slot and never gets stuck in a crowded offset). A prompt's
    hundreds of look-ups then touch one cache line per 16 blocks instead of one per block: random
    memory accesses, not arithmetic, are what a look-up costs (about 0.1 µs each without huge pages).
    The map is from (hash, home): two equal hashes at different chain positions — a 64-bit collision —
    may both be entries; a hit is verified by the pool anyway.

    At most one block per hash: a block whose hash is already taken stays unhashed (see BlockPool).
    Deletions leave tombstones; the table is rebuilt when live entries + tombstones pass 3/4 of it.
    Capacity is a power of two >= 2 x the most entries it can hold (the pool's block count).
    """

    def __init__(self, max_entries: int, hash_of: np.ndarray, home_of: np.ndarray) -> None:
        bits = max(5, int(2 * max_entries - 1).bit_length())
        self._shift = np.uint64(64 - bits)
        self._mask = (1 << bits) - 1
        self.hash_of = hash_of
        self.home_of = home_of
        self.vals = np.full(1 << bits, _EMPTY, dtype=np.int32)
        self.num_live = 0
        self._num_tombstones = 0

    def home_slots(self, base_hashes: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """int64 [n]: home slot of the block at chain `positions` whose line is picked by `base_hashes`
        (the hashes of the blocks at positions - positions mod 16)."""
        line = (base_hashes >> self._shift).astype(np.int64)
        # the offset turns with the base hash, so that short chains spread over all 16 offset classes
        return (line & ~(_LINE - 1)) | ((positions + line) & (_LINE - 1))

    def _holds(self, vals: np.ndarray, hashes: np.ndarray) -> np.ndarray:
        """bool [n]: the slot holds a live entry for this hash."""
        return (self.hash_of[vals] == hashes) & (vals >= 0)  # negative vals read harmlessly from the end

    def find(self, hashes: np.ndarray, homes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(block ids or -1, slot) for each hash in uint64 [n] with home slots int64 [n].

        The slot is where the hash lives, or — for an absent hash — the empty slot that ended its probe
        run: where `insert` may put it (tombstones passed on the way are left for later inserts), handed
        over to save a second probe.
        """
        n = len(hashes)
        found = _MINUS_ONES[:n].copy() if n <= len(_MINUS_ONES) else np.full(n, -1, dtype=np.int64)
        slot_of = found.copy()
        active = np.arange(n)
        slots = homes
        mine = hashes
        table, hash_of = self.vals, self.hash_of
        while len(active) > _STRAGGLERS:
            vals = table[slots]
            # negative vals (empty, tombstone) index hash_of from the end: a harmless read, masked out
            hit = (hash_of.take(vals) == mine) & (vals >= 0)  # take: no int32 -> intp conversion of vals
            done = hit | (vals == _EMPTY)
            found[active[hit]] = vals[hit]
            slot_of[active[done]] = slots[done]
            going = ~done
            active, slots, mine = active[going], (slots[going] + _STEP) & self._mask, mine[going]
        # NOTE: a few keys sit at the end of long probe runs; one numpy round per probe step would cost
        # the whole batch the longest run, so the stragglers finish one at a time.
        for i, slot in zip(active.tolist(), slots.tolist(), strict=True):
            h = hashes[i]
            while (v := int(table[slot])) != _EMPTY:
                if v >= 0 and hash_of[v] == h:
                    found[i] = v
                    break
                slot = (slot + _STEP) & self._mask
            slot_of[i] = slot
        return found, slot_of

    def insert(
        self,
        hashes: np.ndarray,
        block_ids: np.ndarray,
        homes: np.ndarray,
        present: np.ndarray | None = None,
        free_slots: np.ndarray | None = None,
    ) -> np.ndarray:
        """Insert the pairs whose hash is absent (one of equal hashes wins); returns bool [n] inserted.

        `hash_of[block_ids]` must already equal `hashes`. `present, free_slots` — the two arrays of
        `find` on the index as it still is (deletions since are fine) — save probing again.
        """
        if present is None or free_slots is None:
            present, free_slots = self.find(hashes, homes)
        inserted = present < 0
        table = self.vals
        # fast path: each absent hash takes the free slot its lookup saw, unless another key of this
        # batch claims the same slot first (then it probes below, like any other)
        cand = np.flatnonzero(inserted)
        cand_slots = free_slots[cand]
        was = table[cand_slots]
        # several keys of this batch may claim one slot: write all, read back, the surviving write wins
        # (block ids are distinct within a batch)
        table[cand_slots] = block_ids[cand]
        won = table[cand_slots] == block_ids[cand]
        self._num_tombstones -= np.count_nonzero(was[won] == _TOMBSTONE)
        lost = cand[~won]
        # an equal hash of this batch took the slot: a duplicate, not inserted
        dup = self.hash_of[table[free_slots[lost]]] == hashes[lost]
        inserted[lost[dup]] = False
        # the few others probe on one at a time: through the whole run (an equal hash placed by this loop
        # may sit anywhere in it), into its first free slot (tombstone or empty)
        hash_of = self.hash_of
        for i in lost[~dup].tolist():
            h, slot, first_free = hashes[i], int(homes[i]), -1
            while (v := int(table[slot])) != _EMPTY:
                if v >= 0 and hash_of[v] == h:
                    break
                if v == _TOMBSTONE and first_free < 0:
                    first_free = slot
                slot = (slot + _STEP) & self._mask
            if v != _EMPTY:
                inserted[i] = False
                continue
            slot = slot if first_free < 0 else first_free
            self._num_tombstones -= int(table[slot]) == _TOMBSTONE
            table[slot] = block_ids[i]
        self.num_live += np.count_nonzero(inserted)
        if self.num_live + self._num_tombstones > 0.75 * len(self.vals):
            self._rebuild()
        return inserted

    def delete_slots(self, slots: np.ndarray) -> None:
        self.vals[slots] = _TOMBSTONE
        self.num_live -= len(slots)
        self._num_tombstones += len(slots)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(hashes uint64 [live], block ids int64 [live])."""
        vals = self.vals[self.vals >= 0].astype(np.int64)
        return self.hash_of[vals], vals

    def _rebuild(self) -> None:
        keys, vals = self.items()
        self.vals[:] = _EMPTY
        self.num_live = self._num_tombstones = 0
        self.insert(keys, vals, self.home_of[vals].astype(np.int64))
