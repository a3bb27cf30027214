"""Duplicate blocks of one cache entry. vLLM caches every full block it computes (BlockPool.cache_full_blocks), so
one content may be cached in several blocks: its map from block hash holds a dict of blocks per hash, a look-up
takes the earliest inserted one still cached, and an eviction drops only the evicted block. Here an entry (a hash
index slot, or a cell of the anchored map) holds its head block, the earliest inserted; the others follow it in
insertion order:

    nxt[b]   the block after b in its list, -1 at the tail
    prv[b]   the block before b (b a member); for a head, its list's tail (-1 while it has no members)

so a head is the block whose `prv` does not point back at it (`heads_of`). When the head leaves (evicted), the
next block takes its place in the entry: what vLLM's look-up returns once the first copy is gone.
"""

from __future__ import annotations

import numpy as np


class DupLists:
    """The lists of duplicate blocks over `n` block ids; see the module docstring."""

    def __init__(self, n: int) -> None:
        self.nxt = np.full(max(n, 1), -1, dtype=np.int32)
        self.prv = np.full(max(n, 1), -1, dtype=np.int32)
        self.num_members = 0  # blocks in a list behind its head

    def append(self, heads: np.ndarray, blocks: np.ndarray) -> None:
        """Append blocks[i] (in no list) at the tail of heads[i]'s list, in order (a head may come several times)."""
        heads, blocks = heads.astype(np.intp, copy=False), blocks.astype(np.intp, copy=False)
        self.num_members += len(blocks)
        while len(heads):
            _, first = np.unique(heads, return_index=True)
            first.sort()
            h, b = heads[first], blocks[first]
            tails = self.prv.take(h)
            self.nxt[np.where(tails < 0, h, tails)] = b
            self.prv[b] = np.where(tails < 0, h, tails)
            self.prv[h] = b
            rest = np.ones(len(heads), dtype=bool)
            rest[first] = False
            heads, blocks = heads[rest], blocks[rest]

    def listed(self, ids: np.ndarray) -> np.ndarray:
        """bool [n]: which of `ids` are in a list of two or more (a head with members, or a member)."""
        return np.maximum(self.nxt.take(ids), self.prv.take(ids)) >= 0

    def head_of(self, b: int) -> int:
        """The head of b's list (b itself when b is the head or in no list)."""
        while True:
            p = int(self.prv[b])
            if p < 0 or int(self.nxt[p]) != b:
                return b
            b = p

    def remove(self, b: int, head: int) -> int:
        """Take b out of the list whose head is `head`; returns the list's head now: b's successor when b was the
        head (-1 when b was alone), else `head`."""
        nx, pv = int(self.nxt[b]), int(self.prv[b])
        self.nxt[b] = self.prv[b] = -1
        if b == head:
            if nx < 0:
                return -1
            self.prv[nx] = -1 if pv == nx else pv
            self.num_members -= 1
            return nx
        self.nxt[pv] = nx
        if nx >= 0:
            self.prv[nx] = pv
        else:
            self.prv[head] = -1 if pv == head else pv
        self.num_members -= 1
        return head

    def members(self, head: int) -> list[int]:
        """The blocks behind `head` in its list, in order."""
        out, b = [], int(self.nxt[head])
        while b >= 0:
            out.append(b)
            b = int(self.nxt[b])
        return out

    def take_out(self, head: int) -> list[int]:
        """Dissolve `head`'s list: every block of it (head first) leaves, the entry is gone."""
        blocks = [head, *self.members(head)]
        self.nxt[blocks] = -1
        self.prv[blocks] = -1
        self.num_members -= len(blocks) - 1
        return blocks

    def grouped(self, heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(members intp [m], the head of each [m]) of the lists of `heads`, in list order."""
        members: list[int] = []
        owners: list[int] = []
        for head in heads[self.nxt.take(heads) >= 0].tolist():
            found = self.members(head)
            members += found
            owners += [head] * len(found)
        return np.array(members, dtype=np.intp), np.array(owners, dtype=np.intp)

    def check(self, heads: np.ndarray) -> None:
        """Assert that the lists of `heads` are well formed and hold every member there is."""
        seen = 0
        for head in heads[self.nxt.take(heads) >= 0].tolist():
            members = self.members(head)
            assert int(self.prv[head]) == members[-1], "a duplicate list's tail is not its head's prv"
            prev = head
            for m in members:
                assert int(self.prv[m]) == prev, "a duplicate list's back link is broken"
                prev = m
            seen += len(members)
        singles = heads[self.nxt.take(heads) < 0]
        assert np.all(self.prv.take(singles) < 0), "a head without members has a tail"
        assert seen == self.num_members, f"{seen} blocks in duplicate lists, the count says {self.num_members}"
