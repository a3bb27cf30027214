"""Runs of k decode steps on a hybrid pool with prefix caching, planned from counts and then applied only where
something happens, leaving the pool exactly as k steps of the per-sequence loop (hybrid_ordered) leave it.

A decode step of the batch `seq_ids` (every sequence one token, no keyed block completed) is, in the loop's order:

    need ≤ free blocks                   the step fits before anything is freed (else stepping goes request by
                                         request, as vLLM, and may preempt: the run stops before it)
    skip_ordered(pool, seq_ids)          each (sequence, group) pair frees the blocks its rule lets go, tail first
    append_ordered(pool, seq_ids, 1s)    a pair whose last block is full takes one, handed out in pair order

With n sequences of G tables and B-token blocks a step touches only the pairs where a block boundary is crossed:
sequence i (t_i tokens) opens a block in step j iff (t_i + j) % B == 0, and a group's table frees in step j the
positions from its first kept block before to its first kept block after (hybrid_private.first_blocks, capped at
the blocks held). `plan` counts, from the pool as it is, what every step frees (a block whose last reference goes:
an indexed one a cache entry, a block opened in the run or unindexed hash-less, each at the free queue's tail),
hands out (the queue's head: its entries at the start, then what the run freed; a cache entry popped is evicted)
and holds — every figure the step's accounting reads — and where the run must stop;
hybrid_apply.apply then makes those steps' changes in a few array operations (the whole run, or stretches of B
steps) and checks the pool against the plan's last step.

Only for a pool the loop's one-pass form applies to (`ordered`), without state groups (their pages move with every
token), forks (a partially filled block in two tables), pending frees (a step under way) or a listener on the free
queue's hand-outs (host tiers hear evictions with the clock of their step).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..blocks import BLOCK_TABLE_ENTRY_BYTES
from .group_hits import anchored_present
from .hybrid_ordered import _rules, ordered
from .hybrid_private import first_blocks

if TYPE_CHECKING:
    from .free_queue import FreeBlockQueue
    from .hybrid import HybridPool
    from .store import BlockKeys


class DecodeRun(NamedTuple):
    """A planned run (every array one entry per step, after the step)."""

    block_size: int
    seq_ids: list[Hashable]  # the sequences, in the plan's order (any: counts do not depend on it)
    tokens: list[int]  # tokens each sequence held before the run
    used: np.ndarray  # int64 [k]: blocks in use
    cached: np.ndarray  # int64 [k]: cached free blocks (the LRU)
    useful: np.ndarray  # int64 [k]: tokens written in the used blocks
    logical: np.ndarray  # int64 [k]: table entries over every group
    held: np.ndarray  # int64 [k, G]: distinct blocks each group's tables hold
    order_bound: bool = False  # it stopped where one step's hand-outs take part of a step's frees, hashed and not

    @property
    def k(self) -> int:
        return len(self.used)

    def memory(self, k: int, capacity_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(memory parts [k, 6], block-table bytes [k], blocks per group [k, G]) after each of the first k steps, as
        the sim's policy reads them from the pool's usage (GroupedPagedPolicy.parts, group_blocks)."""
        B = self.block_size
        used, cached, useful = self.used[:k] * B, self.cached[:k] * B, self.useful[:k]
        parts = np.zeros((k, 6), dtype=np.int64)
        parts[:, 0] = useful
        parts[:, 1] = used - useful
        parts[:, 4] = cached
        parts[:, 5] = capacity_slots - used - cached
        return parts, self.logical[:k] * BLOCK_TABLE_ENTRY_BYTES, self.held[:k]


def runs_apply(pool: HybridPool) -> bool:
    """The pool's decode steps can be planned and applied here (see the module docstring)."""
    store = pool.store
    return (store.enable_prefix_caching and ordered(pool) and not store.counters["forks"]
            and not store.num_pending_blocks and not pool.pools[0]._in_step
            and all(g.kind != "state" for g in pool.groups) and "pop" not in vars(store.queue))


class Waiting(NamedTuple):
    """A request waits, refused an admission now: what keeps it refused (`plan`)."""

    evictable: int  # the oldest cached blocks hand-outs may evict with its look-up unchanged (`evictable`)
    need_floor: int  # its need can fall no lower while blocks are only evicted (`need_floor`)


def plan(pool: HybridPool, seq_ids: Sequence[Hashable], k: int, held: Sequence[int], waiting: Waiting | None = None
         ) -> DecodeRun:
    """The first steps of k decode steps of `seq_ids` (every sequence the pool holds, ≥ 1 token each) that stepping
    takes as plain decode steps: up to the first whose growth does not fit; with a request `waiting`, also up to the
    first after which its refusal may end: it stands while fewer blocks are free than its need's floor, or while no
    eviction has reached a block its look-up found (so its look-up and need are unchanged) and no more blocks are
    free than now. `held`: each group's distinct blocks now (hybrid_ordered.held_blocks). Planned a window of steps
    at a time (B steps, or 2 when a request waits; then 8x longer each), so that a run stopped early costs little."""
    B, store, G = pool.block_size, pool.store, len(pool.pools)
    tokens = [t.num_tokens for t in pool.pools[0]._tables(seq_ids)]
    t0 = np.array(tokens, dtype=np.int64)[:, None]
    heads, left = _Heads(store.queue), store.ref.copy()  # left: references not yet dropped by the run
    plain, cached = store.queue.num_plain, store.queue.num_cached
    free_now, done, span = plain + cached, 0, 2 if waiting else B  # waiting: runs often stop at once
    order_bound = False
    rows: list[tuple[int, int, int, int]] = []  # per step: cached after it, blocks opened, freed, entries freed
    freed_groups: list[np.ndarray] = []
    while done < k:
        steps = np.arange(max(done - 1, 0), min(done + span, k), dtype=np.int64)
        opened, freed_plain, freed_cached, freed, entries = _window(pool, seq_ids, t0 + steps, t0[:, 0], done > 0,
                                                                    left)
        for j in range(len(opened)):
            need = opened[j]
            if need > plain + cached:  # not covered before the step frees: stepping goes request by request
                k = done
                break
            heads.free(freed_plain[j], freed_cached[j])
            evicted = heads.pop(need)
            if evicted is None:  # the hand-outs end inside one step's frees, hashed and not: their order decides
                k, order_bound = done, True
                break
            plain += freed_plain[j] - (need - evicted)
            cached += freed_cached[j] - evicted
            if waiting and plain + cached >= waiting.need_floor and (
                    heads.popped > waiting.evictable or plain + cached > free_now):
                k = done
                break
            rows.append((cached, need, freed_plain[j] + freed_cached[j], entries[j]))
            freed_groups.append(freed[j])
            done += 1
        span *= 8
    table = np.array(rows, dtype=np.int64).reshape(-1, 4)
    grown, gone = np.cumsum(table[:, 1]), np.cumsum(table[:, 2])
    return DecodeRun(
        B, list(seq_ids), tokens, store.num_used + grown - gone, table[:, 0],
        store.useful_tokens + len(seq_ids) * G * np.arange(1, done + 1, dtype=np.int64) - B * gone,
        sum(p.logical_blocks for p in pool.pools) + grown - np.cumsum(table[:, 3]),
        np.asarray(held, dtype=np.int64) + (grown // G)[:, None] - np.cumsum(
            np.array(freed_groups, dtype=np.int64).reshape(-1, G), axis=0), order_bound)


def looked_up(pool: HybridPool, num_tokens: int, keys: BlockKeys) -> np.ndarray:
    """Every cached block an admission's look-up of a prompt of `num_tokens` with `keys` finds now, in any group (a
    shorter prompt's look-up finds a subset): each chain group's hit chain, and each anchored group's blocks under
    the chain hit's positions — only those its hit reads (a window's, a chunk's) when every anchored group serves the
    whole chain hit (HybridHits._hits_at_top then reads no other; neither does the look-up of the prompt's first
    chunk, whose hit is the same). While none of them is evicted (and no block is indexed: no prompt block completes
    in a decode step), that look-up and the need of its allocation from the hit blocks' states are the same."""
    found = [p.hit_blocks(num_tokens, pool._group_keys(g, keys), (g, None))
             for g, p in enumerate(pool.pools) if not pool.anchored[g]]
    anchor = pool.anchor
    anchored = [g for g in range(len(pool.groups)) if pool.anchored[g]]
    if anchored and anchor is not None:
        hit = min(len(f) for f in found)
        plan = pool._hit_plan(num_tokens, keys, None)  # kept from the admission's look-up while the pool is unchanged
        if plan[0] == hit:  # every anchored group served the chain hit: it read only its own blocks for it
            return np.concatenate([np.asarray(f, dtype=np.int64).ravel() for f in found] + [
                t[t >= 0].astype(np.int64) for t in plan[2] if t is not None])
        probe = pool.pools[anchor]._probe(num_tokens, keys, (anchor, None))
        rows = anchored_present(pool.store, anchored, probe.hits[:hit], probe.hashes[:hit])
        found.append(rows[rows >= 0])
    return np.concatenate([np.asarray(f, dtype=np.int64).ravel() for f in found])


def need_floor(pool: HybridPool, need: int, cut: bool, budget: int) -> int:
    """The fewest free blocks an admission refused now (needing `need`; its first chunk `cut` short of the prompt's
    end by a step's `budget` of tokens, or not) can need while blocks are only evicted: its hit h only shrinks, and
    blocks only go from used to cached. Each group takes ceil(total / B) − h blocks past the hit (its first kept
    block is at most h) plus its cached hit blocks: while the chunk ends at the prompt's end that is non-decreasing
    as h falls (one block more, at most one cached hit less), so at least `need`; once the budget cuts the chunk,
    total = h·B + budget, so at least ceil(budget / B) a group."""
    bound = len(pool.pools) * -(-budget // pool.block_size)
    return bound if cut else min(need, bound)


def evictable(pool: HybridPool, num_tokens: int, keys: BlockKeys) -> int:
    """How many hand-outs may pop the free queue's head while an admission of a prompt of `num_tokens` with `keys`,
    refused now, stays refused by its look-up: those before the first block its look-up found (`looked_up`), or
    the whole queue (what the run frees comes after it)."""
    free = pool.store.queue.live()
    found = np.zeros(len(pool.store.ref), dtype=bool)
    found[looked_up(pool, num_tokens, keys)] = True
    first = np.flatnonzero(found[free])
    return int(first[0]) if len(first) else len(free)


class _Heads:
    """The free queue as a planned run sees it (free_queue: one queue, hand-outs pop its head): the entries it holds
    at the start, read as far as the hand-outs reach, then each step's frees appended as counts (hash-less, cached),
    their order inside a step not known here."""

    def __init__(self, queue: FreeBlockQueue) -> None:
        self.queue, self.start, self.popped, self.end = queue, len(queue), 0, len(queue)
        self.cum = queue.evictions_within(0)  # cum[i]: cache entries among the first i entries at the start
        self.steps: list[tuple[int, int, int]] = []  # (first position, hash-less, cached) of each step's frees

    def free(self, plain: int, cached: int) -> None:
        if plain + cached:
            self.steps.append((self.end, plain, cached))
            self.end += plain + cached

    def pop(self, n: int) -> int | None:
        """The cache entries the next n hand-outs evict; None when that depends on the order of one step's frees."""
        a, b = self.popped, self.popped + n
        evicted = 0
        if a < self.start:
            top = min(b, self.start)
            if len(self.cum) <= top:
                self.cum = self.queue.evictions_within(min(self.start, max(2 * top, 64)))
            evicted += int(self.cum[top] - self.cum[a])
        while self.steps and self.steps[0][0] + self.steps[0][1] + self.steps[0][2] <= a:
            self.steps.pop(0)  # popped before
        for first, plain, cached in self.steps:
            lo, hi = max(a, first), min(b, first + plain + cached)
            if lo >= hi:
                break
            if hi - lo == plain + cached or not plain:
                evicted += cached if plain else hi - lo
            elif cached:
                return None
        self.popped = b
        return evicted


def _window(pool: HybridPool, seq_ids: Sequence[Hashable], computed: np.ndarray, tokens: np.ndarray, lead: bool,
            left: np.ndarray) -> tuple[list[int], list[int], list[int], np.ndarray, list[int]]:
    """For the steps of `computed` [n, w] (the tokens before each step; `lead`: its first column is the step before
    the window, only read for where its frees ended), per step: the blocks opened (a sequence at a multiple of B
    tokens takes one in every table), the blocks freed to the free queue hash-less and cached, those per group [w, G],
    and the table entries freed. A table's entry freed is a block held before the run (`tokens`), freed at its last
    reference (`left`: the references the run has not dropped yet, updated), or one opened in the run (one table,
    never indexed: hash-less)."""
    B, mode, G = pool.block_size, pool.state_mode, len(pool.pools)
    opened = ((computed[:, 1:] if lead else computed) % B == 0).sum(axis=0) * G
    w = len(opened)
    held = (-(-tokens // B)).tolist()  # blocks each table holds before the run
    ends: dict[tuple[str, int | None], np.ndarray] = {}
    runs: dict[tuple, tuple[np.ndarray, list[int], list[int]] | None] = {}  # alike tables freeing alike: once
    steps, groups, blocks = [], [], []  # each table entry freed: its step, group, block (-1: opened in the run)
    for g, _, alike in _rules(pool):
        tables = [pool.pools[g].seqs[s] for s in seq_ids]
        skipped = [t.num_skipped for t in tables]
        key = (alike, *skipped)
        if key not in runs:
            end = ends.get(alike)
            if end is None:
                end = ends[alike] = np.minimum(first_blocks(pool.groups[g], computed, B, mode), -(-computed // B))
            runs[key] = _freeing(end, np.array(skipped, dtype=np.int64)[:, None], lead)
        run = runs[key]
        if run is not None:
            steps.append(run[0])
            groups.append(np.full(len(run[0]), g, dtype=np.int64))
            blocks += _entries(tables, run[1], run[2], held)
    return (opened.tolist(), *_freed(pool.store, left, steps, groups, blocks, w, G))


def _freeing(end: np.ndarray, skipped: np.ndarray, lead: bool) -> tuple[np.ndarray, list[int], list[int]] | None:
    """(the step of each entry a window frees, table by table in order; each table's first and last position
    freed + 1) of tables at `skipped` [n, 1] whose rule keeps from `end` [n, w(+1 with `lead`)] on; None: none."""
    after = np.maximum(end, skipped)
    before = after[:, :-1] if lead else np.concatenate([skipped, after[:, :-1]], axis=1)
    count = (after[:, 1:] if lead else after) - before
    if not count.any():
        return None
    flat = count.ravel()
    cell = np.repeat(np.arange(flat.size, dtype=np.int64), flat)  # [i, j] flattened: a table's entries in order
    return cell % count.shape[1], before[:, 0].tolist(), after[:, -1].tolist()


def _entries(tables: list, first: list[int], last: list[int], held: list[int]) -> list[np.ndarray]:
    """The blocks at positions first[i]..last[i]-1 of each table in turn (its entries a window frees, step after
    step: one range), -1 past the blocks it `held` before the run."""
    parts = []
    for table, a, b, h in zip(tables, first, last, held, strict=True):
        if b > a:
            parts.append(table.table[a : min(b, h)])
            if b > h:
                parts.append(np.full(b - max(a, h), -1, dtype=np.int64))
    return parts


def _freed(store, left: np.ndarray, steps: list[np.ndarray], groups: list[np.ndarray], blocks: list[np.ndarray],
           w: int, G: int) -> tuple[list[int], list[int], np.ndarray, list[int]]:
    """(per step of w: blocks freed hash-less, cached, per group [w, G], table entries freed) from every entry freed
    (its step, group and block; -1: opened in the run, one table, never indexed). A block held before the run goes
    at its last reference (`left`, updated): in the last step that drops it, if the run drops every one left."""
    if not steps:
        return [0] * w, [0] * w, np.zeros((w, G), dtype=np.int64), [0] * w
    step, group, block = (np.concatenate(x) for x in (steps, groups, blocks))
    new = block < 0
    held, inverse, drops = np.unique(block[~new], return_inverse=True, return_counts=True)
    last = np.zeros(len(held), dtype=np.int64)
    np.maximum.at(last, inverse, step[~new])
    owner = np.empty(len(held), dtype=np.int64)
    owner[inverse] = group[~new]  # a block is in one group's tables only
    assert (left[held] >= drops).all(), "a block dropped more often than it is held"
    gone = left[held] == drops
    left[held] -= drops.astype(left.dtype)
    cached = store.block_slot[held] >= 0
    freed = np.zeros((w, G), dtype=np.int64)
    np.add.at(freed, (last[gone], owner[gone]), 1)
    np.add.at(freed, (step[new], group[new]), 1)
    plain = np.bincount(last[gone & ~cached], minlength=w) + np.bincount(step[new], minlength=w)
    return plain.tolist(), np.bincount(last[gone & cached], minlength=w).tolist(), freed, np.bincount(
        step, minlength=w).tolist()
