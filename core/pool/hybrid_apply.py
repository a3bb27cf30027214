"""A planned run of k decode steps (core/pool/hybrid_runs.py) made on the pool in a few array operations, leaving it
exactly as the k steps of the per-sequence loop (hybrid_ordered: skip_ordered, then the appends) leave it.

Why a stretch of steps can be made at once: the pool has one free queue; a step's frees go to its tail and its
hand-outs pop its head (free_queue). Whatever the interleaving, the blocks handed out are then the first ones of
(the queue at the start, followed by every step's frees in step order), so long as each step's pop finds its blocks
there — which the plan checked (each step's growth fits in the blocks free before its frees). So a stretch is:

    fill        every table's last block as the stretch's appends of one token each fill it (a block of one
                table: no fork in a run)
    free        every step's frees in the loop's order — step, the batch's order, group, each table's run tail
                first — dropped in one (a block several tables hold goes at its last entry: _drop_in_order)
    hand out    every step's new blocks in the loop's order (step, the batch's order, group) popped in one

This holds where no block handed out in the stretch is freed in it. A block opened at token pB leaves a window or
a chunk only once its sequence holds (p + 1)B tokens: B steps later at the earliest, so stretches of B steps always
qualify; the whole run is taken as one stretch where nothing it opens is freed in it (the usual case: a window of
more tokens than the run's steps).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .hybrid_ordered import _drop_in_order, _rules
from .hybrid_private import first_blocks

if TYPE_CHECKING:
    from .append import SeqTable
    from .hybrid import HybridPool
    from .hybrid_runs import DecodeRun


class _Frees(NamedTuple):
    """The frees of a stretch of steps, in the loop's order."""

    held: np.ndarray  # int64: the blocks dropped, a table's entry each, in the order the loop drops them
    ends: list[tuple[int, int, int, int]]  # (group, sequence, first kept block after, entries freed) per table


def apply(pool: HybridPool, order: Sequence[Hashable], run: DecodeRun) -> None:
    """The run's steps on the pool, the sequences of each step in the batch's `order` (see the module docstring),
    then the pool checked against the plan."""
    position = {s: i for i, s in enumerate(order)}
    assert len(position) == len(run.seq_ids) and all(s in position for s in run.seq_ids), "a run of another batch"
    rank = np.array([position[s] for s in run.seq_ids], dtype=np.int64)
    tables = [[p.seqs[s] for s in run.seq_ids] for p in pool.pools]  # [group][sequence]
    t0, B = np.array(run.tokens, dtype=np.int64), pool.block_size
    frees = _frees(pool, tables, rank, t0, 0, run.k)
    if frees is not None:
        _stretch(pool, tables, rank, t0, 0, run.k, frees)
    else:  # a block opened in the run is freed in it: stretches of B steps (see the module docstring)
        for lo in range(0, run.k, B):
            hi = min(lo + B, run.k)
            frees = _frees(pool, tables, rank, t0, lo, hi)
            assert frees is not None, "a block freed within B steps of its opening"
            _stretch(pool, tables, rank, t0, lo, hi, frees)
    pool._changed()
    _check(pool, run)


def _frees(pool: HybridPool, tables: list[list[SeqTable]], rank: np.ndarray, t0: np.ndarray, lo: int, hi: int
           ) -> _Frees | None:
    """The frees of steps lo..hi-1 (the tables as step lo finds them, each sequence i at t0[i] + lo tokens) in the
    loop's order; None where one of them is a block opened in the stretch."""
    B, mode = pool.block_size, pool.state_mode
    computed = t0[:, None] + np.arange(lo, hi, dtype=np.int64)  # [n, w]: tokens before each step
    held = -(-(t0 + lo) // B)  # blocks each table holds at the stretch's start
    kept: dict[tuple[str, int | None], np.ndarray] = {}
    runs: dict[tuple, tuple[np.ndarray, ...] | None] = {}  # alike tables freeing alike: worked out once
    parts: list[tuple[np.ndarray, ...]] = []  # (step, rank, group, position) of each entry freed
    blocks: list[np.ndarray] = []
    ends: list[tuple[int, int, int, int]] = []
    for g, _, alike in _rules(pool):
        skipped = [t.num_skipped for t in tables[g]]
        key = (alike, *skipped)
        if key not in runs:
            end = kept.get(alike)
            if end is None:  # skip_ordered's min(first_block_before_growth, blocks) at every step
                end = kept[alike] = np.minimum(first_blocks(pool.groups[g], computed, B, mode), -(-computed // B))
            runs[key] = _freeing(end, np.array(skipped, dtype=np.int64), held)
        run = runs[key]
        if run is None:
            continue
        if not len(run):  # a block the stretch opens
            return None
        step, who, pos, first, last = run
        parts.append((step, rank[who], np.full(len(who), g), pos))
        nz = np.flatnonzero(last > first).tolist()
        blocks += [tables[g][i].table[first[i] : last[i]] for i in nz]
        ends += [(g, i, int(last[i]), int(last[i] - first[i])) for i in nz]
    if not parts:
        return _Frees(np.empty(0, dtype=np.int64), [])
    step, ranks, groups, pos = (np.concatenate(c) for c in zip(*parts, strict=True))
    return _Frees(np.concatenate(blocks)[np.lexsort((-pos, groups, ranks, step))], ends)


def _freeing(end: np.ndarray, skipped: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """(step, sequence and position of each entry freed, sequence by sequence; each table's first and last position
    freed + 1) of tables at `skipped` [n] whose rule keeps from `end` [n, w] on; None: none freed; () where one
    is past the blocks `held`."""
    after = np.maximum(end, skipped[:, None])
    count = after[:, -1] - skipped
    if not count.any():
        return None
    who = np.repeat(np.arange(len(count), dtype=np.int64), count)
    pos = np.arange(len(who), dtype=np.int64) - np.repeat(np.cumsum(count) - count - skipped, count)
    if (pos >= held[who]).any():
        return ()
    span, w = int(after.max()) + 1, after.shape[1]  # each row's steps searched alone: rows offset, a sorted whole
    step = np.searchsorted((after + np.arange(len(count))[:, None] * span).ravel(), pos + who * span, side="right")
    return step - who * w, who, pos, skipped, after[:, -1]


def _stretch(pool: HybridPool, tables: list[list[SeqTable]], rank: np.ndarray, t0: np.ndarray, lo: int, hi: int,
             frees: _Frees) -> None:
    """Steps lo..hi-1 made at once: fills, `frees`, hand-outs (see the module docstring)."""
    store, G, n = pool.store, len(pool.pools), len(t0)
    start, end = t0 + lo, t0 + hi
    _fill_last(pool, tables, start, end)
    for g, i, first, count in frees.ends:
        tables[g][i].num_skipped = first
        pool.pools[g].logical_blocks -= count
    if len(frees.held):
        _drop_in_order(store, frees.held, defer=False)
    _open(pool, tables, rank, start, end)
    for group in tables:
        for seq, tokens in zip(group, end.tolist(), strict=True):
            seq.num_tokens = tokens
    for p in pool.pools:
        p.logical_tokens += n * (hi - lo)
    store.useful_tokens += n * G * (hi - lo)


def _fill_last(pool: HybridPool, tables: list[list[SeqTable]], start: np.ndarray, end: np.ndarray) -> None:
    """Every table whose last block has room at `start` tokens: that block filled as far as `end` tokens go."""
    B, G = pool.block_size, len(pool.pools)
    part = np.flatnonzero(start % B).tolist()
    if part:
        last = [int(group[i].table[(start[i] - 1) // B]) for i in part for group in tables]
        fill = np.minimum(end[part] - (start[part] - 1) // B * B, B)
        pool.store.fill[np.array(last, dtype=np.int64)] = np.repeat(fill, G)


def _open(pool: HybridPool, tables: list[list[SeqTable]], rank: np.ndarray, start: np.ndarray, end: np.ndarray
          ) -> None:
    """The blocks the steps from `start` to `end` tokens open (a sequence at a multiple of B tokens takes one in
    every table), handed out in the loop's order (step, the batch's order, group) and filled to `end`."""
    store, B, G = pool.store, pool.block_size, len(pool.pools)
    first = -(-start // B)  # each sequence's first block position opened (at token first·B)
    count = np.maximum(-(-end // B) - first, 0)
    m = int(count.sum())
    if not m:
        return
    who = np.repeat(np.arange(len(start), dtype=np.int64), count)
    pos = np.arange(m, dtype=np.int64) - np.repeat(np.cumsum(count) - count - first, count)
    blocks = np.empty((m, G), dtype=np.int64)
    blocks[np.lexsort((rank[who], pos * B - start[who]))] = store.hand_out(m * G)[0].reshape(m, G)
    store.ref[blocks] = 1
    store.fill[blocks] = np.minimum(end[who] - pos * B, B)[:, None]
    store.num_used += m * G
    ends = np.cumsum(count)
    for i in np.flatnonzero(count).tolist():
        a, b = int(ends[i] - count[i]), int(ends[i])
        for g, group in enumerate(tables):
            group[i].extend(blocks[a:b, g])
    for p in pool.pools:
        p.logical_blocks += m


def _check(pool: HybridPool, run: DecodeRun) -> None:
    store = pool.store
    got = (store.num_used, store.queue.num_cached, store.useful_tokens, sum(p.logical_blocks for p in pool.pools))
    want = (int(run.used[-1]), int(run.cached[-1]), int(run.useful[-1]), int(run.logical[-1]))
    assert got == want, f"a prefix-cached decode run of {run.k} steps: the pool holds {got}, the plan said {want}"
