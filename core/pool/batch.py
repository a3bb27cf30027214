"""Many sequences in one pool call: the store side of `BlockPool.append_many`, `fork_many` and `release_many`.

Each makes exactly the changes of the one-sequence operation applied to the sequences in the given order —
the same block ids handed out in the same order, the same copies, the same free-queue order (tests compare
whole pools) — with numpy over all of them instead of a dozen numpy calls per sequence. A beam search
step (thousands of beams forked, dropped and each given one token) is three calls, not thousands.

    append_many   the sequences that cross a block boundary take fresh blocks; a partially filled last
                  block held by r tables, w of which are in the batch, is copied by the first min(w, r - 1)
                  of them in batch order (the last holder, once the others have copied, writes in place)
    fork_many     each child's table is a copy of its parent's; ref += 1 per child for every block
    release_many  a block drops when the last of its holders in the batch releases it and nobody else
                  holds it: in the order the releases one by one would drop it (each table tail first)
"""

from __future__ import annotations

import numpy as np

from ..blocks import ceil_div
from .append import SeqTable
from .store import BlockStore, PoolExhaustedError


def _one(store: BlockStore) -> np.generic:
    """1 in the dtype of the reference counts. NOTE: `np.add.at(ref, ids, 1)` with a Python int takes a
    casting path about 40x slower than with a scalar of the array's own dtype."""
    return store.ref.dtype.type(1)


def _ranks(values: np.ndarray) -> np.ndarray:
    """int64 [n]: how many earlier entries hold the same value (0 for the first occurrence)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    rank = np.arange(len(values)) - np.repeat(starts, np.diff(np.r_[starts, len(values)]))
    out = np.empty(len(values), dtype=np.int64)
    out[order] = rank
    return out


def append_many(store: BlockStore, seqs: list[SeqTable], num_tokens: int) -> tuple[list[tuple[int, int]], int]:
    """`num_tokens` (>= 1) more tokens for each of `seqs` (distinct), in order; returns (the copy-on-write
    copies [(src, dst)] in that order, the blocks the tables grew by). Raises PoolExhaustedError, changing
    nothing, when they do not fit."""
    B, count = store.block_size, len(seqs)
    old = np.fromiter((s.num_tokens for s in seqs), np.int64, count)
    new_blocks = ceil_div(old + num_tokens, B) - np.fromiter((s.num_blocks for s in seqs), np.int64, count)
    partial = np.flatnonzero(old % B)
    last = np.full(count, -1, dtype=np.int64)
    last[partial] = [seqs[i].table[seqs[i].num_blocks - 1] for i in partial.tolist()]
    copy = np.zeros(count, dtype=bool)
    refs = store.ref[last[partial]]
    shared = np.flatnonzero(refs > 1)
    if len(shared):
        writers = partial[shared]
        copy[writers[_ranks(last[writers]) < refs[shared] - 1]] = True
    taken = copy + new_blocks  # blocks each append takes: its copy first, then its fresh blocks
    need = int(taken.sum())
    if need > len(store.queue):
        raise PoolExhaustedError(f"appending {num_tokens} tokens to {count} sequences needs {need} blocks, "
                                 f"{len(store.queue)} free")
    blocks = store.hand_out(need)[0]
    store.ref[blocks] = 1
    store.num_used += need
    first = np.cumsum(taken) - taken  # where each sequence's blocks start in `blocks`
    copiers = np.flatnonzero(copy)
    src, dst = last[copiers], blocks[first[copiers]]
    # copies read their source before the in-place writes below: a shared block's in-place writer is the
    # last of its holders in the batch
    copied_tokens = store.fill[src]
    store.fill[dst] = copied_tokens
    np.subtract.at(store.ref, src, _one(store))
    store.counters["cow_copies"] += len(copiers)
    written = last.copy()
    written[copiers] = dst
    store.fill[written[partial]] += np.minimum(B - old[partial] % B, num_tokens)
    fresh = np.ones(need, dtype=bool)
    fresh[first[copiers]] = False
    fresh_blocks = blocks[fresh]
    store.fill[fresh_blocks] = B
    growing = np.flatnonzero(new_blocks)
    ends = np.cumsum(new_blocks[growing]) - 1  # each growing sequence's last fresh block in `fresh_blocks`
    store.fill[fresh_blocks[ends]] = (old[growing] + num_tokens - 1) % B + 1
    store.useful_tokens += num_tokens * count + int(copied_tokens.sum())
    copies = list(zip(src.tolist(), dst.tolist(), strict=True))
    block_list, starts, grow = blocks.tolist(), first.tolist(), new_blocks.tolist()
    for i in np.flatnonzero(taken).tolist():
        seq, at = seqs[i], starts[i]
        if copy[i]:
            seq.table[seq.num_blocks - 1] = block_list[at]
            at += 1
        k = grow[i]
        if k:
            seq.extend(block_list[at : at + k])
    for seq in seqs:
        seq.num_tokens += num_tokens
    return copies, int(new_blocks.sum())


def fork_many(store: BlockStore, parents: list[SeqTable]) -> list[SeqTable]:
    """A child table for each parent (a parent may come several times): shares every block of it."""
    children = [
        SeqTable(p.table.copy(), p.num_blocks, p.num_tokens, p.extra_id, p.num_hashed, p.last_hash,
                 num_skipped=p.num_skipped)
        for p in parents
    ]
    if children:
        np.add.at(store.ref, np.concatenate([c.blocks for c in children]), _one(store))
    return children


def release_many(store: BlockStore, seqs: list[SeqTable], *, defer: bool) -> None:
    """Drop each of `seqs` (distinct, already taken out of the pool's live sequences), in order: blocks
    nobody holds any more go to the free side (or, `defer`, wait until the step ends)."""
    if not seqs:
        return
    held = np.concatenate([s.blocks[::-1] for s in seqs])  # the order releases drop blocks in
    np.subtract.at(store.ref, held, _one(store))
    assert store.ref[held].min(initial=0) >= 0, "a reference count went below zero"
    gone = np.flatnonzero(store.ref[held] == 0)
    dropped = held[gone]
    if len(np.unique(dropped)) < len(dropped):  # held by several of these: dropped at its last holder's release
        _, last_in_reversed = np.unique(dropped[::-1], return_index=True)
        dropped = held[np.sort(gone[::-1][last_in_reversed])]
    store.drop(dropped, defer=defer)
