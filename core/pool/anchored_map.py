"""Anchored blocks registered outside the hash index: a dense map (group, anchor block) -> block (group_hits).

A hybrid pool registers every full block of a sliding, chunked or align-state group, anchored to the full group's
block at the same position (group_hits): ~3,000 a prefill chunk on Gemma-3 (six sliding groups), nearly all of
them evicted again before any look-up reads them (Mooncake, 100 requests: 530k of 558k). Indexing each under its
derived hash costs a probe to insert, a tombstone to evict and a share of the index's rebuilds. Instead a block
registered while its anchor A is indexed goes into `of[g, A]`: it is hashed (block_slot = LAZY, so it is kept in
the free queue as a cache entry, evicted and counted as one like any other), its hash, home, key and parent are
written as for an indexed block, but the index holds no entry for it.

Every look-up of an anchored group goes through its anchor: the full group's verified hit at that position, an
indexed block at its current version. A block the index would verify there — registered under the anchor at
that version, not handed out since — is `of[g, A]`: a second block under the same (g, A) is refused while the
first is there (one block per hash), and the map's row of A is emptied when A leaves the index (its eviction,
`left`). So `present` gives what the index's look-up under the derived hash would, with no probe.

When A is evicted, the blocks still registered under it are stale (no look-up can verify them again), but a
later registration of the same prefix (a new anchor with A's chain hash) must still find them under their hash:
it drops a free one or is refused by a held one (group_hits.register_anchored). So they move into the index
(at the next registration: `flush`), as they would be had they been indexed all along; `moved` marks their
anchors' chain hashes (a filter of 2^20 buckets by the hash's top bits, never cleared: a bucket set in vain only
costs a probe), and a registration probes the index only for the blocks whose anchor hash falls in a marked
bucket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .hash_index import LAZY  # block_slot of a block registered in the map: hashed, no index slot

if TYPE_CHECKING:
    from .store import BlockStore
_BUCKET_SHIFT = np.uint64(64 - 20)


class AnchoredMap:
    """The map of a store's anchored blocks registered outside its hash index; see the module docstring."""

    def __init__(self, store: BlockStore, num_groups: int) -> None:
        self.store = store
        n = store.num_blocks
        self.of = np.full((num_groups, n), -1, dtype=np.int32)  # of[g, A]: group g's block under anchor A
        self.group = np.full(n, -1, dtype=np.int8 if num_groups <= 127 else np.int32)  # a LAZY block's group
        self.anchors = np.zeros(n, dtype=bool)  # blocks that may anchor a block of the map
        self.moved = np.zeros(1 << 20, dtype=bool)  # chain-hash buckets of the anchors of blocks moved out
        self.num_lazy = 0
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []  # (blocks moved out of the map, their versions): flush

    def grow(self, num_groups: int) -> None:
        """Room for groups 0..num_groups - 1."""
        if num_groups > len(self.of):
            extra = np.full((num_groups - len(self.of), self.store.num_blocks), -1, dtype=np.int32)
            self.of = np.concatenate((self.of, extra))

    def present(self, groups: np.ndarray, anchors: np.ndarray) -> np.ndarray:
        """intp [len(groups) * len(anchors)] (group-major): `pairs` of every group with every anchor."""
        return self.pairs(np.repeat(groups, len(anchors)), np.tile(anchors, len(groups)))

    def pairs(self, groups: np.ndarray, anchors: np.ndarray) -> np.ndarray:
        """intp [n]: the block of group groups[i] registered under anchor block anchors[i] (indexed, at its current
        version: an evicted anchor's row is emptied), or -1."""
        found = self.of.ravel().take(groups * self.store.num_blocks + anchors).astype(np.intp, copy=False)
        if not len(found) or np.maximum.reduce(found) < 0:  # none taken (fresh anchors): the common case
            return found
        cand = np.maximum(found, 0)
        ok = found >= 0
        ok &= self.store.block_slot.take(cand) == LAZY  # not handed out since (an evicted block's slot is -1)
        ok &= self.group.take(cand) == groups
        ok &= self.store.parent_id.take(cand) == anchors
        return np.where(ok, found, -1)

    def suspects(self, anchor_hashes: np.ndarray) -> np.ndarray:
        """Positions (intp) of the anchor hashes a block moved into the index may have been registered under."""
        return np.flatnonzero(self.moved.take((anchor_hashes >> _BUCKET_SHIFT).astype(np.intp)))

    def add(self, groups: np.ndarray, blocks: np.ndarray, anchors: np.ndarray) -> None:
        """Register `blocks` (of `groups`) under `anchors`, none of them taken (`present` -1 there)."""
        self.store.block_slot[blocks] = LAZY
        self.group[blocks] = groups
        self.of.ravel()[groups * self.store.num_blocks + anchors] = blocks
        self.anchors[anchors] = True
        self.num_lazy += len(blocks)

    def left(self, ids: np.ndarray) -> None:
        """`ids` left the index (evicted; versions not yet changed; LAZY ones left the map too): the blocks still
        registered under the anchors among them move into the index (see the module docstring)."""
        held = self.anchors.take(ids)
        if np.count_nonzero(held):
            self._move(ids[held])

    def _move(self, anchors: np.ndarray) -> None:
        store = self.store
        self.anchors[anchors] = False
        rows = self.of[:, anchors]
        self.of[:, anchors] = -1
        groups, at = np.nonzero(rows >= 0)
        blocks = rows[groups, at].astype(np.intp)
        live = store.block_slot.take(blocks) == LAZY
        live &= self.group.take(blocks) == groups
        live &= store.parent_id.take(blocks) == anchors[at]
        if not np.count_nonzero(live):
            return
        blocks, at = blocks[live], at[live]
        self.moved[(store.block_hash.take(anchors[at]) >> _BUCKET_SHIFT).astype(np.intp)] = True
        self.pending.append((blocks, store.version.take(blocks)))

    def flush(self) -> None:
        """Insert the blocks moved out of the map (`left`) that are still registered (LAZY, not handed out since)
        into the index. Not at once: an eviction runs between a look-up and the registration that inserts into the
        empty slots it saw (prefix_lookup), which an insert then could take; here, where register_anchored would
        insert its blocks into the index, as any registration does."""
        store = self.store
        for blocks, versions in self.pending:
            live = store.block_slot.take(blocks) == LAZY
            live &= store.version.take(blocks) == versions
            blocks = blocks[live]
            if not len(blocks):
                continue
            store.block_slot[blocks] = -1
            self.num_lazy -= len(blocks)
            # their hashes are absent: an entry under one would have refused the block when it was registered, and
            # the anchor's hash was indexed by no other block since (one block per hash)
            homes = store.block_home[blocks].astype(np.int64)
            inserted = store.index.insert_absent(store.block_hash[blocks], blocks, homes)
            assert inserted is None, "an anchored block moved into the hash index met an entry under its hash"
        self.pending.clear()

    def check(self) -> None:
        """Assert that every LAZY block is in the map under its group and anchor (an indexed block, at the version
        the block was registered under), or moved out of it and not yet inserted (`flush`)."""
        store = self.store
        lazy = np.flatnonzero(store.block_slot == LAZY)
        assert len(lazy) == self.num_lazy, f"{len(lazy)} blocks in the anchored map, its count says {self.num_lazy}"
        waiting = [b[(store.block_slot[b] == LAZY) & (store.version[b] == v)] for b, v in self.pending]
        mapped = np.setdiff1d(lazy, np.concatenate([np.empty(0, dtype=np.intp), *waiting]))
        groups, anchors = self.group[mapped].astype(np.intp), store.parent_id[mapped]
        assert np.array_equal(self.of[groups, anchors], mapped), "a LAZY block is not in the anchored map"
        assert np.all(self.anchors[anchors]), "an anchor of the anchored map is not marked"
        slots = store.block_slot[anchors]
        assert np.all((slots >= 0) & (slots != LAZY)), "an anchor of the anchored map left the index"
        assert np.array_equal(store.parent_ver[mapped], store.version[anchors]), "a LAZY block's anchor was handed out"
