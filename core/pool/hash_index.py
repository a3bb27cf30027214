"""The prefix cache's hash -> block index: open addressing, vectorised over a prompt's blocks.

The table stores only block ids (int32); a slot's hash is read from the pool's per-block hash array
`hash_of` (uint64 [num_blocks]) and its home slot from `home_of`, both filled by the pool before it
inserts. 4 bytes a slot instead of 12: the whole-trace Mooncake replay holds millions of blocks. The index
also keeps `slot_of` (int32 [num_blocks], -1 when not indexed): where each indexed block's entry lives,
so that deleting an evicted block's entry costs no look-up.

Locality: block i of a chain has its home slot in the 16-slot line (one 64-byte cache line) that the hash
of block i - i mod 16 picks, at offset (i + that hash) mod 16. A prompt's hundreds of look-ups then touch
one cache line per 16 blocks instead of one per block: random memory accesses, not arithmetic, are what a
look-up costs (about 0.1 µs each without huge pages).

Probe sequence: home, then the key's *own* slot (the low bits of its own hash), then steps of +17 from
there (odd, so a run visits every slot; the next line, as near as a new line can be, so a run leaves a
line filled by one chain in one step). Only the first probe is shared by the blocks of a line: a prefix
shared by every request (a system prompt, Mooncake's first hash id) puts the blocks after it of every
request on one line, and a run that stayed on it — as a run from the home line did before — grows with
every request (56,274 keys on one line at block 64 of the Mooncake conversation trace: quadratic). From
the second probe on, runs of different keys are independent, as in any open-addressing table at load
<= 3/4. The map is from (hash, home): two equal hashes at different chain positions — a 64-bit collision
— may both be entries; a hit is verified by the pool.

Several blocks may hold one content (vLLM caches duplicates too): the entry holds the earliest, the others follow
it in a list (dup_lists) and record the entry's slot as theirs; the entry passes to the next when its block leaves.
Deletions leave tombstones, which lengthen probe runs like live entries; the table is rebuilt when
tombstones pass 1/4 of it, or live entries + tombstones 3/4. Capacity is a power of two >= 2 x the most
entries it can hold (the pool's block count), and >= 8 x up to _ROOMY_SLOTS: a small pool (a bounded
replay, where every request evicts) gets a sparse table for little memory — short runs, rare rebuilds.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .dup_lists import DupLists
from .limits import index_slots

EMPTY = -1  # a slot never used since the last rebuild: a probe run ends here
_TOMBSTONE = -2  # a deleted entry: probe runs go on past it
_MINUS_ONES = np.full(8192, -1, dtype=np.intp)
_LINE = 16  # int32 slots per 64-byte cache line: a chain's consecutive blocks share one
_STEP = _LINE + 1  # odd, so a probe run visits every slot; the next line, as near as a new line can be
_STRAGGLERS = 16  # probe steps go batch-wide until this few keys are left; those finish one at a time
LAZY = np.iinfo(np.int32).max  # slot_of of a hashed block registered outside the index (anchored_map)
_NO_IDS = np.empty(0, dtype=np.intp)


class AnchoredBlocks(Protocol):
    """What the index asks of the map of anchored blocks registered outside it (anchored_map.AnchoredMap)."""

    num_lazy: int
    dups: DupLists
    ghosts: dict

    def revive(self, heads: np.ndarray) -> None: ...

    def left(self, ids: np.ndarray, passed: list[tuple[int, int]]) -> None: ...

    def lazy_left(self, ids: np.ndarray) -> None: ...

    def check(self) -> None: ...


class HashIndex:
    """Open-addressing map uint64 hash -> block id; see the module docstring."""

    def __init__(self, max_entries: int, hash_of: np.ndarray, home_of: np.ndarray, slot_of: np.ndarray) -> None:
        bits = int(self.num_slots(max_entries) - 1).bit_length()
        self._shift = np.uint64(64 - bits)
        self._mask = (1 << bits) - 1
        self.hash_of = hash_of
        self.home_of = home_of
        self.slot_of = slot_of
        self.vals = np.full(1 << bits, EMPTY, dtype=np.int32)
        self.num_live = 0
        self.num_tombstones = 0
        self.generation = 0  # bumped whenever an entry is deleted or moved (a saved look-up may be stale then)
        # bumped when entries move (a rebuild: a slot saved by a look-up says nothing then); prefix_lookup.probe
        # re-checks kept look-ups until then
        self.epoch = 0
        self.anchored: AnchoredBlocks | None = None  # anchored blocks registered outside the index (anchored_map)
        self.map_anchored = True  # False: every anchored block in the index itself (the reference of the map's tests)
        self.dups = DupLists(len(slot_of))  # the other blocks of an entry's content, behind the one it holds

    @staticmethod
    def num_slots(max_entries: int) -> int:
        """Slots of an index for `max_entries` (see the module docstring), a power of two."""
        return index_slots(max_entries)  # in limits.py: a pool's bytes are checked without numpy

    def home_slots(self, base_hashes: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """int64 [n]: home slot of the block at chain `positions` whose line is picked by `base_hashes`
        (the hashes of the blocks at positions - positions mod 16)."""
        line = (base_hashes >> self._shift).astype(np.int64)
        # the offset turns with the base hash, so that short chains spread over all 16 offset classes
        return (line & ~(_LINE - 1)) | ((positions + line) & (_LINE - 1))

    def own_slots(self, hashes: np.ndarray) -> np.ndarray:
        """int64 [n]: the second probe of each hash in uint64 [n], its own slot (the hash's low bits; the
        home line takes the top bits of the line's base hash)."""
        return (hashes & np.uint64(self._mask)).astype(np.int64)

    def find(self, hashes: np.ndarray, homes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(block ids intp [n] or -1, slots int64 [n]) for each hash in uint64 [n] with home slots int64 [n].

        The slot is where the hash lives, or — for an absent hash — the empty slot that ended its probe
        run: where `insert` may put it (tombstones passed on the way are left for later inserts), handed
        over to save a second probe.
        """
        n = len(hashes)
        table, hash_of = self.vals, self.hash_of
        # NOTE: the first round runs on every key with as few numpy calls as possible: most keys end at
        # their home slot (a hit, or an empty slot), and a prompt's look-up is a few dozen calls in all.
        vals = table.take(homes)
        # negative vals (empty, tombstone) read hash_of from the end: a harmless read, masked out
        hit = hash_of.take(vals) == hashes
        hit &= vals >= 0
        found = np.where(hit, vals, _MINUS_ONES[:n] if n <= len(_MINUS_ONES) else -1).astype(np.intp, copy=False)
        going = vals != EMPTY
        going ^= hit  # a hit is never empty: this is "neither a hit nor empty"
        active = np.flatnonzero(going)
        if not len(active):
            return found, homes
        found_slots = homes.copy()
        mine = hashes[active]
        slots = self.own_slots(mine)  # the second probe: each key's own slot (see the module docstring)
        while len(active) > _STRAGGLERS:
            vals = table.take(slots)
            hit = (hash_of.take(vals) == mine) & (vals >= 0)
            done = hit | (vals == EMPTY)
            found[active[hit]] = vals[hit]
            found_slots[active[done]] = slots[done]
            going = ~done
            active, slots, mine = active[going], (slots[going] + _STEP) & self._mask, mine[going]
        # NOTE: a few keys sit at the end of long probe runs; one numpy round per probe step would cost
        # the whole batch the longest run, so the stragglers finish one at a time.
        for i, slot in zip(active.tolist(), slots.tolist(), strict=True):
            h = hashes[i]
            while (v := int(table[slot])) != EMPTY:
                if v >= 0 and hash_of[v] == h:
                    found[i] = v
                    break
                slot = (slot + _STEP) & self._mask
            found_slots[i] = slot
        return found, found_slots

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
        `find` on the index as it still is (deletions since are fine: a deleted entry's slot is a valid
        place to insert its hash again) — save probing again.
        """
        inserted = self.insert_absent(hashes, block_ids, homes, present, free_slots)
        return np.ones(len(hashes), dtype=bool) if inserted is None else inserted

    def insert_absent(
        self,
        hashes: np.ndarray,
        block_ids: np.ndarray,
        homes: np.ndarray,
        present: np.ndarray | None = None,
        free_slots: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """`insert`, but None instead of the mask when every pair went in (a replay's common case)."""
        if present is None or free_slots is None:
            present, free_slots = self.find(hashes, homes)
        n = len(hashes)
        table = self.vals
        # fast path: each absent hash takes the free slot its lookup saw, unless another key of this
        # batch claims the same slot first (then it goes on along the run, see _insert_lost)
        if n and np.maximum.reduce(present) < 0:  # all of them absent (the ufunc: no Python-level wrapper)
            inserted, cand = None, None
            cand_slots, cand_blocks = free_slots, block_ids
        else:
            inserted = present < 0
            cand = np.flatnonzero(inserted)
            cand_slots, cand_blocks = free_slots[cand], block_ids[cand]
        was = table.take(cand_slots) if self.num_tombstones else None  # without tombstones every slot is empty
        # several keys of this batch may claim one slot: write all, read back, the surviving write wins
        # (block ids are distinct within a batch)
        table[cand_slots] = cand_blocks
        won = table.take(cand_slots) == cand_blocks
        if np.count_nonzero(won) == len(cand_blocks):
            if was is not None:
                self.num_tombstones -= np.count_nonzero(was == _TOMBSTONE)
            self.slot_of[cand_blocks] = cand_slots
        else:
            if was is not None:
                self.num_tombstones -= np.count_nonzero(was[won] == _TOMBSTONE)
            self.slot_of[cand_blocks[won]] = cand_slots[won]
            if inserted is None or cand is None:  # None together: the all-absent fast path
                inserted, cand = np.ones(n, dtype=bool), np.arange(n)
            self._insert_lost(hashes, block_ids, homes, free_slots, cand[~won], inserted)
        self.num_live += n if inserted is None else np.count_nonzero(inserted)
        if 4 * self.num_tombstones > len(self.vals) or self.num_live + self.num_tombstones > 0.75 * len(self.vals):
            self._rebuild()
        return None if inserted is None or inserted.all() else inserted

    def _insert_lost(
        self, hashes: np.ndarray, block_ids: np.ndarray, homes: np.ndarray, free_slots: np.ndarray,
        lost: np.ndarray, inserted: np.ndarray,
    ) -> None:
        """The keys whose free slot another key of the batch took: duplicates drop out, the rest go on.

        Each goes on along its own probe run from the slot it lost (its own slot next if that was its home,
        else +17), past the entries written since, to the next free slot (empty or tombstone): every slot
        between its home and that one is taken, so `find` meets it before its run ends. An equal hash of
        this batch placed before it is met on the way (it followed the same run), and drops it.
        """
        table, hash_of, mask = self.vals, self.hash_of, self._mask
        mine, slots = hashes[lost], free_slots[lost].astype(np.int64)
        at_home, owns = slots == homes[lost], self.own_slots(mine)
        # NOTE: batch-wide rounds (a rebuild loses thousands of keys): each key reads its slot; an equal hash
        # there drops it, another entry moves it on, a free slot is claimed — by the first key of the batch that
        # claims it (np.unique's first index), the others read the winner there next round
        while len(lost) > _STRAGGLERS:
            vals = table.take(slots)
            taken = vals >= 0
            equal = taken & (hash_of.take(vals) == mine)
            inserted[lost[equal]] = False
            moving = taken & ~equal
            slots[moving] = np.where(at_home[moving], owns[moving], (slots[moving] + _STEP) & mask)
            at_home[moving] = False
            claims = np.flatnonzero(~taken)
            done = equal
            if len(claims):
                won = claims[np.unique(slots[claims], return_index=True)[1]]
                self.num_tombstones -= np.count_nonzero(vals[won] == _TOMBSTONE)
                table[slots[won]] = block_ids[lost[won]]
                self.slot_of[block_ids[lost[won]]] = slots[won]
                done[won] = True
            going = ~done
            lost, mine, slots, at_home, owns = lost[going], mine[going], slots[going], at_home[going], owns[going]
        for i, h, slot, home, own in zip(lost.tolist(), mine.tolist(), slots.tolist(), at_home.tolist(),
                                         owns.tolist(), strict=True):
            while (v := int(table[slot])) >= 0:
                if hash_of[v] == h:  # an equal hash of this batch took a slot of this run
                    inserted[i] = False
                    break
                slot, home = (own if home else (slot + _STEP) & mask), False
            else:
                self.num_tombstones -= v == _TOMBSTONE
                table[slot] = block_ids[i]
                self.slot_of[block_ids[i]] = slot

    def join(self, heads: np.ndarray, blocks: np.ndarray) -> None:
        """Unindexed `blocks` holding the content of the indexed heads[i] (the caller checked) join its entry, behind
        the blocks there (dup_lists): found once those before them leave."""
        self.slot_of[blocks] = self.slot_of.take(heads)
        self.dups.append(heads, blocks)

    def delete(self, block_ids: np.ndarray) -> None:
        """Drop these hashed blocks (evicted; no look-up): an entry's block passes the entry to the next block of its
        content (dup_lists), or leaves a tombstone when it was the last; a member just leaves its list; one in the
        anchored map leaves it, and the blocks registered there under an entry's block follow the entry
        (anchored_map)."""
        slots = self.slot_of.take(block_ids)
        self.slot_of[block_ids] = -1
        anchored = self.anchored
        if anchored is not None and anchored.num_lazy:
            real = slots != LAZY
            if np.count_nonzero(real) < len(block_ids):
                anchored.lazy_left(block_ids[~real])
                block_ids, slots = block_ids[real], slots[real]
        passed: list[tuple[int, int]] = []  # (an entry's block that left, the block its entry passed to, or -1)
        if self.dups.num_members and np.count_nonzero(listed := self.dups.listed(block_ids)):
            for b, slot in zip(block_ids[listed].tolist(), slots[listed].tolist(), strict=True):
                head = int(self.vals[slot])
                now = self.dups.remove(b, head)
                if b == head:  # (a block whose members left earlier in this batch ends its entry here)
                    self.vals[slot] = _TOMBSTONE if now < 0 else now
                    self.generation += 1
                    passed.append((b, now))
                    if now < 0:
                        self.num_live -= 1
                        self.num_tombstones += 1
            block_ids, slots = block_ids[~listed], slots[~listed]
        self.vals[slots] = _TOMBSTONE
        self.generation += 1
        self.num_live -= len(block_ids)
        self.num_tombstones += len(block_ids)
        if anchored is not None:
            anchored.left(block_ids, passed)

    def drop_entries(self, heads: np.ndarray, *, orphan: bool = False) -> np.ndarray:
        """Remove the entries of these indexed blocks with every block of their content (a stale entry that no
        look-up can verify any more, in the way of a new one under its hash): intp [k], the blocks removed —
        unhashed, or (`orphan`) still hashed as anchored blocks no look-up reaches (anchored_map, which must exist)."""
        heads = np.unique(heads)
        out = np.array([b for head in heads.tolist() for b in self.dups.take_out(head)], dtype=np.intp)
        slots = self.slot_of.take(heads)
        self.vals[slots] = _TOMBSTONE
        self.generation += 1
        self.num_live -= len(slots)
        self.num_tombstones += len(slots)
        anchored = self.anchored
        if orphan:
            assert anchored is not None
            self.slot_of[out] = LAZY
            anchored.num_lazy += len(out)
        else:
            self.slot_of[out] = -1
        if anchored is not None:
            anchored.left(out, [])
        return out

    def head_of(self, blocks: np.ndarray) -> np.ndarray:
        """intp [n]: the block each entry of these indexed blocks holds (itself, or the earlier copy of its
        content); -1 for a block not indexed."""
        slots = self.slot_of.take(blocks)
        real = (slots >= 0) & (slots != LAZY)
        return np.where(real, self.vals.take(np.where(real, slots, 0)), -1).astype(np.intp, copy=False)

    @property
    def num_lazy(self) -> int:
        """Hashed blocks registered outside the index, in the anchored map (anchored_map)."""
        return 0 if self.anchored is None else self.anchored.num_lazy

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(hashes uint64 [live], block ids int64 [live]): the entries' blocks (not their duplicates)."""
        vals = self.vals[self.vals >= 0].astype(np.int64)
        return self.hash_of[vals], vals

    def check(self) -> None:
        """Assert that every entry's slot is recorded in slot_of, and nothing else is."""
        slots = np.flatnonzero(self.vals >= 0)
        vals = self.vals[slots]
        assert np.array_equal(self.slot_of[vals], slots), "a hash entry's slot is not the one recorded for it"
        self.dups.check(vals.astype(np.intp))
        members, heads = self.dups.grouped(vals.astype(np.intp))
        assert np.array_equal(self.slot_of[members], self.slot_of[heads]), "a duplicate records another slot"
        assert np.array_equal(self.hash_of[members], self.hash_of[heads]), "a duplicate of another hash"
        indexed = np.count_nonzero((self.slot_of >= 0) & (self.slot_of != LAZY))
        assert indexed == len(slots) + len(members), "a block records a slot but has no entry"
        if self.anchored is not None:
            self.anchored.check()

    def _rebuild(self) -> None:
        keys, vals = self.items()
        members, heads = self.dups.grouped(vals.astype(np.intp)) if self.dups.num_members else (_NO_IDS, _NO_IDS)
        self.vals[:] = EMPTY
        self.slot_of[vals] = -1
        self.generation += 1
        self.epoch += 1
        self.num_live = self.num_tombstones = 0
        self.insert(keys, vals, self.home_of[vals].astype(np.int64))
        self.slot_of[members] = self.slot_of.take(heads)
