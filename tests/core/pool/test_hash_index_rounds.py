"""HashIndex._insert_lost in batch-wide rounds (a rebuild loses thousands of keys to slots another key of its batch
took) against the key-at-a-time placement it replaced: the same keys inserted, the same duplicates dropped, every
hash found where a dict says; only the slots may differ (no caller reads them but through `find`)."""

from __future__ import annotations

import numpy as np
from hash_index_batches import batch, check_batch_insert, spread
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.hash_index import _STEP, _TOMBSTONE, HashIndex


class OneAtATime(HashIndex):
    """The placement before the rounds: each lost key walks its own probe run to the next free slot, in turn."""

    def _insert_lost(self, hashes, block_ids, homes, free_slots, lost, inserted) -> None:
        table, hash_of, mask = self.vals, self.hash_of, self._mask
        for i, own in zip(lost.tolist(), self.own_slots(hashes[lost]).tolist(), strict=True):
            slot, at_home = int(free_slots[i]), int(free_slots[i]) == int(homes[i])
            while (v := int(table[slot])) >= 0:
                if hash_of[v] == hashes[i]:
                    inserted[i] = False
                    break
                slot, at_home = (own if at_home else (slot + _STEP) & mask), False
            else:
                self.num_tombstones -= v == _TOMBSTONE
                table[slot], self.slot_of[block_ids[i]] = block_ids[i], slot


def fresh(kind: type[HashIndex], max_entries: int) -> HashIndex:
    n = 6000
    return kind(max_entries, np.zeros(n, dtype=np.uint64), np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int32))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "del"]), st.lists(st.integers(0, 300), min_size=1, max_size=120)),
                max_size=25), st.integers(0, 3))
def test_rounds_insert_as_one_key_at_a_time(ops: list[tuple[str, list[int]]], lines: int) -> None:
    """Batches of up to 120 keys (so more than _STRAGGLERS = 16 lose their slot: the rounds run, then the last few
    one at a time) on 1-4 crowded home slots, duplicates inside a batch, deletions leaving tombstones and rebuilds
    (300 entries in a table of 1,024: the rebuild at 3/4 and at 1/4 tombstones re-inserts everything, lost keys
    included): both indexes answer alike for every key, each like a dict of what went in."""
    rounds, reference = fresh(HashIndex, 300), fresh(OneAtATime, 300)
    ref: dict[int, int] = {}
    next_block = 0
    for op, ks in ops:
        if op == "put" and len(ref) + len(ks) <= 300:
            blocks, hashes = batch(next_block, ks)
            next_block += len(ks)
            homes = np.array([k % (lines + 1) * 64 for k in ks], dtype=np.int64)  # equal keys: one home
            got = []
            for index in (rounds, reference):
                index.hash_of[blocks], index.home_of[blocks] = hashes, homes
                got.append(index.insert(hashes, blocks, homes).tolist())
            assert got[0] == got[1]  # the same copy of equal keys wins (the first pass's, then the first met)
            check_batch_insert(ref, ks, blocks, got[0])  # absent: one of its equal copies goes in; present: none
        elif op == "del":
            gone = np.array([ref.pop(k) for k in sorted(set(ks) & set(ref))], dtype=np.intp)
            rounds.delete(gone)
            reference.delete(gone)
        keys = np.arange(301)
        hashes = np.array([spread(k) for k in keys.tolist()], dtype=np.uint64)
        for index in (rounds, reference):
            index.check()
            found, _ = index.find(hashes, keys % (lines + 1) * 64)
            assert found.tolist() == [ref.get(k, -1) for k in keys.tolist()]
        assert (rounds.num_live, rounds.num_tombstones) == (reference.num_live, reference.num_tombstones)


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 249), max_size=250), st.integers(1, 120))
def test_rounds_reuse_tombstones_as_one_key_at_a_time(deleted: set[int], batch: int) -> None:
    """250 keys over the whole table, some deleted (tombstones everywhere), then a batch that all claim one slot:
    the lost keys walk their runs through the tombstones and take them as the key-at-a-time placement does (the
    same tombstone count after, the same answers)."""
    indexes = fresh(HashIndex, 400), fresh(OneAtATime, 400)
    spread_keys = np.arange(250)
    hashes = np.array([spread(k) for k in spread_keys.tolist()], dtype=np.uint64)
    homes = (hashes >> np.uint64(40)).astype(np.int64) & 1023
    crowd = np.arange(1000, 1000 + batch)
    crowd_hashes = np.array([spread(k) for k in crowd.tolist()], dtype=np.uint64)
    gone = np.array(sorted(deleted), dtype=np.intp)
    for index in indexes:
        index.hash_of[spread_keys], index.home_of[spread_keys] = hashes, homes
        index.insert(hashes, spread_keys, homes)
        index.delete(gone)
        index.hash_of[crowd], index.home_of[crowd] = crowd_hashes, 5
        assert index.insert(crowd_hashes, crowd, np.full(batch, 5)).all()
        index.check()
    rounds, reference = indexes
    assert (rounds.num_live, rounds.num_tombstones) == (reference.num_live, reference.num_tombstones)
    every = np.concatenate([hashes, crowd_hashes])
    every_homes = np.concatenate([homes, np.full(batch, 5)])
    expected = [-1 if k in deleted else k for k in range(250)] + crowd.tolist()
    for index in indexes:
        assert index.find(every, every_homes)[0].tolist() == expected
