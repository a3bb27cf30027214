"""Batches of keys for the HashIndex tests (test_block_pool.py, test_hash_index_rounds.py): small keys spread over the
whole table, a batch's blocks and hashes, and what a batch insert must do against a dict of what the index holds.
(On pytest's path through `pythonpath = ["tests"]`.)"""

from __future__ import annotations

import numpy as np


def spread(k: int) -> int:
    return k * 0x9E3779B97F4A7C15 % 2**64  # small keys spread over the whole table (Fibonacci hashing)


def batch(first_block: int, ks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The blocks first_block, first_block + 1, … of a batch of keys `ks`, and their hashes."""
    return np.arange(first_block, first_block + len(ks)), np.array([spread(k) for k in ks], dtype=np.uint64)


def check_batch_insert(ref: dict[int, int], ks: list[int], blocks: np.ndarray, inserted: list[bool]) -> None:
    """A batch insert of keys `ks` as `blocks` (`inserted`: which went in) against `ref`, key -> its block (updated):
    a key absent before has exactly one of its equal copies in the batch go in, a present one none."""
    triples = list(zip(ks, blocks.tolist(), inserted, strict=True))
    for k in set(ks):
        winners = [b for kk, b, ok in triples if kk == k and ok]
        assert len(winners) == (k not in ref)
        if winners:
            ref[k] = winners[0]
