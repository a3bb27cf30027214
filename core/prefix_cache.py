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

import numpy as np

_P = 0x9E3779B97F4A7C15  # odd, so invertible modulo 2^64
_P_INV = pow(_P, -1, 2**64)
_EMPTY = -1
_TOMBSTONE = -2
_STRAGGLERS = 8  # probe steps go batch-wide until this few keys are left; those finish one at a time


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: int64/uint64 [n] -> well-mixed uint64 [n]."""
    z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


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
    with np.errstate(over="ignore"):
        scaled = np.cumsum(mix64(keys) * neg[:n], dtype=np.uint64)
        return pos[:n] * (np.uint64(parent_hash) * np.uint64(_P) + scaled)


def chain_hashes_reference(parent_hash: int, keys: list[int]) -> list[int]:
    """The same recurrence one block at a time with Python ints (for tests)."""
    out, h = [], parent_hash
    for key in keys:
        h = (h * _P + int(mix64(np.array([key], dtype=np.int64))[0])) % 2**64
        out.append(h)
    return out


class HashIndex:
    """Open-addressing (linear probing) map uint64 hash -> block id, vectorised over many hashes.

    At most one block per hash: a block whose hash is already taken stays unhashed (see BlockPool).
    Deletions leave tombstones; the table is rebuilt when live entries + tombstones pass 3/4 of it.
    Capacity is a power of two >= 2 x the most entries it can hold (the pool's block count).
    """

    def __init__(self, max_entries: int) -> None:
        bits = max(4, int(2 * max_entries - 1).bit_length())
        self._shift = np.uint64(64 - bits)
        self._mask = (1 << bits) - 1
        self.keys = np.zeros(1 << bits, dtype=np.uint64)
        self.vals = np.full(1 << bits, _EMPTY, dtype=np.int32)
        self.num_live = 0
        self._num_tombstones = 0

    def _slots(self, hashes: np.ndarray) -> np.ndarray:
        return (hashes >> self._shift).astype(np.int64)

    def find(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(block ids or -1, slot or -1) for each hash in uint64 [n]."""
        n = len(hashes)
        found = np.full(n, -1, dtype=np.int64)
        slots_out = np.full(n, -1, dtype=np.int64)
        active = np.arange(n)
        slots = self._slots(hashes)
        while len(active) > _STRAGGLERS:
            vals = self.vals[slots]
            hit = (vals >= 0) & (self.keys[slots] == hashes[active])
            found[active[hit]] = vals[hit]
            slots_out[active[hit]] = slots[hit]
            going = ~hit & (vals != _EMPTY)
            active, slots = active[going], (slots[going] + 1) & self._mask
        # NOTE: a few keys sit at the end of long probe runs; one numpy round per probe step would cost
        # the whole batch the longest run, so the stragglers finish one at a time.
        keys, vals = self.keys, self.vals
        for i, slot in zip(active.tolist(), slots.tolist(), strict=True):
            h = hashes[i]
            while (v := int(vals[slot])) != _EMPTY:
                if v >= 0 and keys[slot] == h:
                    found[i], slots_out[i] = v, slot
                    break
                slot = (slot + 1) & self._mask
        return found, slots_out

    def insert(self, hashes: np.ndarray, block_ids: np.ndarray, present: np.ndarray | None = None) -> np.ndarray:
        """Insert the pairs whose hash is absent (first of equal hashes wins); returns bool [n] inserted.

        `present` (int64 [n], from `find` on the unchanged index) saves looking the hashes up again.
        """
        if present is None:
            present, _ = self.find(hashes)
        _, first = np.unique(hashes, return_index=True)
        todo = np.zeros(len(hashes), dtype=bool)
        todo[first] = True
        todo &= present < 0
        inserted = todo.copy()
        active = np.flatnonzero(todo)
        slots = self._slots(hashes[active])
        while len(active) > _STRAGGLERS:
            vals = self.vals[slots]
            free = vals < 0
            # of several new keys aiming at one free slot in this round, the last write wins: mark, read back
            marks = -3 - np.arange(len(active), dtype=np.int32)
            self.vals[slots[free]] = marks[free]
            win = free & (self.vals[slots] == marks)
            self._num_tombstones -= int(np.sum(vals[win] == _TOMBSTONE))
            self.keys[slots[win]] = hashes[active[win]]
            self.vals[slots[win]] = block_ids[active[win]]
            lose = ~win  # taken before or in this round: probe on
            slots, active = (slots[lose] + 1) & self._mask, active[lose]
        for i, slot in zip(active.tolist(), slots.tolist(), strict=True):
            while (v := int(self.vals[slot])) >= 0:
                slot = (slot + 1) & self._mask
            self._num_tombstones -= v == _TOMBSTONE
            self.keys[slot], self.vals[slot] = hashes[i], block_ids[i]
        self.num_live += int(inserted.sum())
        if self.num_live + self._num_tombstones > 0.75 * len(self.vals):
            self._rebuild()
        return inserted

    def delete_slots(self, slots: np.ndarray) -> None:
        self.vals[slots] = _TOMBSTONE
        self.num_live -= len(slots)
        self._num_tombstones += len(slots)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        live = self.vals >= 0
        return self.keys[live], self.vals[live].astype(np.int64)

    def _rebuild(self) -> None:
        keys, vals = self.items()
        self.keys[:] = 0
        self.vals[:] = _EMPTY
        self.num_live = self._num_tombstones = 0
        self.insert(keys, vals)
