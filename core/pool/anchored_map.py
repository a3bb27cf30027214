"""Anchored blocks registered outside the hash index: a dense map (group, anchor block) -> block (group_hits).

A hybrid pool registers every full block of a sliding, chunked or align-state group, anchored to the full group's
block at the same position (group_hits): ~3,000 a prefill chunk on Gemma-3 (six sliding groups), nearly all of
them evicted again before any look-up reads them (Mooncake, 100 requests: 530k of 558k). Indexing each under its
derived hash costs a probe to insert, a tombstone to evict and a share of the index's rebuilds. Instead a block
registered while its anchor A is indexed goes into `of[g, A]`: it is hashed (block_slot = LAZY, so it is kept in
the free queue as a cache entry, evicted and counted as one like any other), its hash, home, key and parent are
written as for an indexed block, but the index holds no entry for it.

Every look-up of an anchored group goes through its anchor: the full group's verified hit at that position, the
index entry's block of that content. A block the index would verify there — registered under that content — is
`of[g, A]`, so `present` gives what the index's look-up under the derived hash would, with no probe.

A is a content's entry in the index (its head block, dup_lists): a block registered beside a duplicate of A's
content is registered under A, and when A is evicted the map's row of A passes to the next block of the content
(`left`). Several blocks of one group under one anchor are duplicates of one content (vLLM caches them all): the
cell holds the earliest, the others follow it (dup_lists) and take the cell in turn as it is evicted. When the
content's last block is evicted the row becomes a ghost: its blocks stay cached (in the free queue, counted, evicted
as any cache entry), reached by no look-up until the same content is registered anew (a new index entry of the same
chain hash, after the same parent content with the same key: exact), whose row it becomes (`revive`) — as vLLM's
look-up of a window's block by its own hash finds it once the full group's content is cached again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .dup_lists import DupLists
from .hash_index import LAZY  # block_slot of a block registered in the map: hashed, no index slot

if TYPE_CHECKING:
    from .store import BlockStore


class AnchoredMap:
    """The map of a store's anchored blocks registered outside its hash index; see the module docstring."""

    def __init__(self, store: BlockStore, num_groups: int) -> None:
        self.store = store
        n = store.num_blocks
        self.of = np.full((num_groups, n), -1, dtype=np.int32)  # of[g, A]: group g's block under anchor A
        self.group = np.full(n, -1, dtype=np.int8 if num_groups <= 127 else np.int32)  # a LAZY block's group
        self.anchor = np.full(n, -1, dtype=np.int32)  # a cell's block: the anchor of its cell
        self.anchors = np.zeros(n, dtype=bool)  # blocks that may anchor a block of the map
        self.dups = DupLists(n)  # the other blocks of a cell's content, behind the one it holds
        self.num_lazy = 0
        # rows whose anchor's content no block holds any more (ghosts): gid -> (chain hash, the content's parent
        # class and key, {group: the row's block}); a ghost's blocks have anchor -2 - gid (see revive)
        self.ghosts: dict[int, tuple[int, int, int, dict[int, int]]] = {}
        self.ghost_of: dict[int, list[int]] = {}  # chain hash -> its ghosts
        self.ghost_buckets = np.zeros(1 << 16, dtype=bool)  # chain hashes' top 16 bits of every ghost made so far
        self._next_ghost = 0

    def grow(self, num_groups: int) -> None:
        """Room for groups 0..num_groups - 1."""
        if num_groups > len(self.of):
            extra = np.full((num_groups - len(self.of), self.store.num_blocks), -1, dtype=np.int32)
            self.of = np.concatenate((self.of, extra))

    def present(self, groups: np.ndarray, anchors: np.ndarray) -> np.ndarray:
        """intp [len(groups) * len(anchors)] (group-major): `pairs` of every group with every anchor."""
        return self.pairs(np.repeat(groups, len(anchors)), np.tile(anchors, len(groups)))

    def pairs(self, groups: np.ndarray, anchors: np.ndarray) -> np.ndarray:
        """intp [n]: the block of group groups[i] registered under anchor block anchors[i] (an index entry's block),
        or -1."""
        return self.of.ravel().take(groups * self.store.num_blocks + anchors).astype(np.intp, copy=False)

    def add(self, groups: np.ndarray, blocks: np.ndarray, anchors: np.ndarray) -> None:
        """Register `blocks` (of `groups`) under `anchors` (index entries' blocks): a block whose cell holds one
        already follows it as a duplicate."""
        store = self.store
        store.block_slot[blocks] = LAZY
        self.group[blocks] = groups
        self.num_lazy += len(blocks)
        cells = groups * store.num_blocks + anchors
        held = self.of.ravel().take(cells)
        _, first = np.unique(cells, return_index=True)
        new = np.zeros(len(cells), dtype=bool)
        new[first] = True
        new &= held < 0
        if np.count_nonzero(new):
            self.of.ravel()[cells[new]] = blocks[new]
            self.anchor[blocks[new]] = anchors[new]
            self.anchors[anchors[new]] = True
        if not np.all(new):
            joining = ~new
            self.dups.append(self.of.ravel().take(cells[joining]).astype(np.intp), blocks[joining])

    def lazy_left(self, ids: np.ndarray) -> None:
        """`ids` (registered here) were evicted: each leaves its cell's list; a cell's block passes the cell on."""
        self.num_lazy -= len(ids)
        n = self.store.num_blocks
        listed = self.dups.listed(ids) if self.dups.num_members else np.zeros(len(ids), dtype=bool)
        for b in ids[listed].tolist():
            head = self.dups.head_of(b)
            now = self.dups.remove(b, head)
            anchor = int(self.anchor[head])
            cell = int(self.group[head]) * n + anchor
            if b == head and anchor >= 0 and self.of.ravel()[cell] == head:
                self.of.ravel()[cell] = now
            elif b == head and anchor <= -2:
                self._ghost_passes(-2 - anchor, int(self.group[head]), now)
            if b == head and now >= 0:
                self.anchor[now] = anchor
            self.anchor[b] = -1
        alone = ids[~listed]
        anchor = self.anchor.take(alone)
        cells = self.group.take(alone).astype(np.int64) * n + np.maximum(anchor, 0)
        mine = (anchor >= 0) & (self.of.ravel().take(cells) == alone)
        self.of.ravel()[cells[mine]] = -1
        if self.ghosts and np.count_nonzero(ghosts := anchor <= -2):
            for b, a in zip(alone[ghosts].tolist(), anchor[ghosts].tolist(), strict=True):
                self._ghost_passes(-2 - a, int(self.group[b]), -1)
        self.anchor[alone] = -1

    def _ghost_passes(self, gid: int, group: int, now: int) -> None:
        """A ghost's block of `group` left: `now` takes its place (-1: none); a ghost with no block left goes."""
        heads = self.ghosts[gid][3]
        if now >= 0:
            heads[group] = now
            return
        del heads[group]
        if not heads:
            self._drop_ghost(gid)

    def left(self, ids: np.ndarray, passed: list[tuple[int, int]]) -> None:
        """Index entries' blocks left the index: `ids` with their entries, each row a ghost (still cached, found again
        only when its content comes back: `_orphan`); `passed` (block, its successor) in order, each row passing to
        the successor (-1: a ghost too)."""
        held = self.anchors.take(ids)
        if np.count_nonzero(held):
            self._orphan(ids[held])
        for b, successor in passed:
            if not self.anchors[b]:
                continue
            if successor < 0:
                self._orphan(np.array([b], dtype=np.intp))
                continue
            self.anchors[b] = False
            row = self.of[:, b].copy()
            self.of[:, b] = -1
            self.of[:, successor] = row
            self.anchor[row[row >= 0]] = successor
            self.anchors[successor] = True

    def _orphan(self, anchors: np.ndarray) -> None:
        """The last block of these anchors' contents left: each row becomes a ghost, found again when the same content
        is registered anew (`revive`), as vLLM's look-up of a window's block by its own hash finds it then."""
        store = self.store
        self.anchors[anchors] = False
        rows = self.of[:, anchors]
        self.of[:, anchors] = -1
        for i in np.flatnonzero((rows >= 0).any(axis=0)).tolist():
            a = int(anchors[i])
            heads = {int(g): int(rows[g, i]) for g in np.flatnonzero(rows[:, i] >= 0).tolist()}
            gid = self._next_ghost
            self._next_ghost += 1
            chain_hash = int(store.block_hash[a])
            self.ghosts[gid] = (chain_hash, int(store.parent_klass[a]), int(store.key[a]), heads)
            self.ghost_of.setdefault(chain_hash, []).append(gid)
            self.ghost_buckets[chain_hash >> 48] = True
            self.anchor[list(heads.values())] = -2 - gid

    def revive(self, heads: np.ndarray) -> None:
        """`heads` are new index entries (their contents cached anew): the ghosts of the same contents — the same
        chain hash, after the same content (parent class) with the same key: exact — become their rows, found before
        any block registered under them from now on (vLLM: the earliest cached copy first)."""
        store = self.store
        hashes = store.block_hash.take(heads)
        cand = heads[self.ghost_buckets.take((hashes >> np.uint64(48)).astype(np.intp))]
        for h in cand.tolist():
            chain_hash = int(store.block_hash[h])
            for gid in list(self.ghost_of.get(chain_hash, ())):
                _, parent, key, rows = self.ghosts[gid]
                if parent != store.parent_klass[h] or key != store.key[h] or self.anchors[h]:
                    continue
                self._drop_ghost(gid)
                klass = store.klass[h]
                for g, b in rows.items():
                    self.of[g, h] = b
                    self.anchor[b] = h
                    store.parent_klass[[b, *self.dups.members(b)]] = klass
                self.anchors[h] = True
                break

    def _drop_ghost(self, gid: int) -> None:
        """Ghost `gid` is gone: revived as a row, or its last block left."""
        chain_hash = self.ghosts.pop(gid)[0]
        same = self.ghost_of[chain_hash]
        same.remove(gid)
        if not same:
            del self.ghost_of[chain_hash]

    def check(self) -> None:
        """Assert that every cell's block is LAZY, of its group, registered under its anchor (an index entry's
        block, of the content it was registered under), and that the duplicates lists are whole."""
        store = self.store
        lazy = np.flatnonzero(store.block_slot == LAZY)
        assert len(lazy) == self.num_lazy, f"{len(lazy)} blocks in the anchored map, its count says {self.num_lazy}"
        groups, anchors = np.nonzero(self.of >= 0)
        cells = self.of[groups, anchors].astype(np.intp)
        assert np.all(store.block_slot[cells] == LAZY), "a cell of the anchored map holds a block not registered there"
        assert np.array_equal(self.group[cells], groups), "a cell holds a block of another group"
        assert np.array_equal(self.anchor[cells], anchors), "a cell's block records another anchor"
        assert np.all(self.anchors[anchors]), "an anchor of the anchored map is not marked"
        slots = store.block_slot[anchors]
        assert np.all((slots >= 0) & (slots != LAZY)), "an anchor of the anchored map left the index"
        assert np.array_equal(store.index.vals[slots], anchors), "an anchor of the anchored map is not its entry's"
        assert np.array_equal(store.parent_klass[cells], store.klass[anchors]), "a cell's block after other content"
        self.dups.check(cells)
        members, heads = self.dups.grouped(cells)
        assert np.array_equal(store.parent_klass[members], store.parent_klass[heads]), "a duplicate of other content"
        assert np.all(store.block_slot[members] == LAZY), "a duplicate in the anchored map is not registered there"
