"""Prefix-cache hashing: chained block hashes, for one prompt or a whole batch of prompts at once.

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
per-token and no per-block Python loop. Many prompts at once are one segmented prefix sum
(`chain_hashes_batch`): a replay hashes a whole trace in a few dozen numpy calls per ~100 k blocks, and the
pool takes the result (`HashedKeys`) instead of hashing each prompt again. The hash -> block index is in
hash_index.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from .hash_index import HashIndex

_P = 0x9E3779B97F4A7C15  # odd, so invertible modulo 2^64
_P_INV = pow(_P, -1, 2**64)


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


def chain_hashes_batch(parent_hash: int, keys: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """uint64 [K]: `chain_hashes(parent_hash, keys[offsets[i]:offsets[i+1]])` for every prompt i, in one pass.

    keys int64 [K] (the prompts' keys end to end), offsets int64 [N+1] with offsets[0] = 0, offsets[N] = K.
    The prefix sum runs over all prompts; each prompt's chain subtracts the sum before its first key.
    """
    total = len(keys)
    if total == 0:
        return np.empty(0, dtype=np.uint64)
    lengths = np.diff(offsets)
    starts = offsets[:-1]
    position = np.arange(total, dtype=np.int64)
    position -= np.repeat(starts, lengths)  # position of each key inside its prompt
    pos, neg = _POWERS.get(int(lengths.max()) + 1)
    scaled = mix64(keys)
    scaled *= neg.take(position)
    np.add.accumulate(scaled, out=scaled)
    before = np.zeros(len(lengths), dtype=np.uint64)  # the running sum before each prompt's first key
    nonempty = lengths > 0
    first = starts[nonempty]
    before[nonempty] = np.where(first > 0, scaled[np.maximum(first - 1, 0)], np.uint64(0))
    before = np.uint64(parent_hash * _P % 2**64) - before  # uint64 wraps: (root · P - sum before) mod 2^64
    scaled += np.repeat(before, lengths)
    scaled *= pos.take(position)
    return scaled


@dataclass(frozen=True, eq=False)
class HashedPrompts:
    """Block keys of N prompts end to end with their chain hashes and hash-index home slots, as
    `BlockPool.hash_prompts` computed them: prompt i is [offsets[i], offsets[i+1]) of keys, hashes, homes.
    `prompt(i)` is what `allocate` takes as block_keys; the pool then looks up without hashing."""

    keys: np.ndarray  # int64 [K]
    hashes: np.ndarray  # uint64 [K], chained from the extra key's root
    homes: np.ndarray  # int64 [K], home slots in `index`
    offsets: np.ndarray  # int64 [N+1]
    extra_key: Hashable
    index: HashIndex  # the index (of the pool that hashed them) whose geometry the home slots are for

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @functools.cached_property
    def _bounds(self) -> list[int]:  # offsets as Python ints: `prompt` runs once a request
        return self.offsets.tolist()

    def prompt(self, i: int) -> HashedKeys:
        a, b = self._bounds[i], self._bounds[i + 1]
        return HashedKeys(self.keys[a:b], self.hashes[a:b], self.homes[a:b], self, i, a)


class HashedKeys(NamedTuple):
    """Prompt `number` of a `HashedPrompts` batch: keys int64 [k], hashes uint64 [k], homes int64 [k]
    (views of the batch's arrays from position `start`). A named tuple: a replay makes one per request."""

    keys: np.ndarray
    hashes: np.ndarray
    homes: np.ndarray
    batch: HashedPrompts
    number: int
    start: int

    def __len__(self) -> int:  # the prompt's blocks with a key, as for any other block keys
        return len(self.keys)

