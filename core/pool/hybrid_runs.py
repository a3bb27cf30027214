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
`apply` then makes those steps' changes with the loop's own functions on the sequences that have any, each brought
to its token count first (a sequence's last block fills in between: nothing else reads it), and the others at the
end. `apply` checks the pool against the plan's last step.

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
from .hybrid_ordered import _append_run, _rules, ordered, skip_ordered
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
    frees: list[list[int]]  # per step: the sequences (indices into seq_ids) whose tables free blocks
    opens: list[list[int]]  # per step: the sequences that open a block in every table
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
    queue, heads = store.queue, _Heads(store.queue)
    refs: dict[int, int] = {}
    plain, cached = queue.num_plain, queue.num_cached
    free_now, done, span = plain + cached, 0, 2 if waiting else B  # waiting: runs often stop at once
    order_bound = False
    rows: list[tuple[int, int, int, int]] = []  # per step: cached after it, blocks opened, freed, entries freed
    freed_groups: list[np.ndarray] = []
    frees: list[list[int]] = []
    opens: list[list[int]] = []
    while done < k:
        steps = np.arange(max(done - 1, 0), min(done + span, k), dtype=np.int64)
        opening, drops, entries, seqs = _window(pool, seq_ids, t0 + steps, tokens, done > 0)
        freed_plain, freed_cached, freed = _freed(store, refs, drops, G)
        for j in range(len(drops)):
            need = len(opening[j]) * G
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
            rows.append((cached, need, freed_plain[j] + freed_cached[j], int(entries[j])))
            freed_groups.append(freed[j])
            frees.append(seqs[j])
            opens.append(opening[j])
            done += 1
        span *= 8
    table = np.array(rows, dtype=np.int64).reshape(-1, 4)
    grown, gone = np.cumsum(table[:, 1]), np.cumsum(table[:, 2])
    return DecodeRun(
        B, list(seq_ids), tokens, store.num_used + grown - gone, table[:, 0],
        store.useful_tokens + len(seq_ids) * G * np.arange(1, done + 1, dtype=np.int64) - B * gone,
        sum(p.logical_blocks for p in pool.pools) + grown - np.cumsum(table[:, 3]),
        np.asarray(held, dtype=np.int64) + (grown // G)[:, None] - np.cumsum(
            np.array(freed_groups, dtype=np.int64).reshape(-1, G), axis=0), frees, opens, order_bound)


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


def _freed(store, refs: dict[int, int], drops: list[list[tuple[int, int]]], G: int
           ) -> tuple[list[int], list[int], np.ndarray]:
    """(per step: blocks freed to the plain stack, to the LRU cache, and per group) from the step's drops, `refs`
    the references left of the blocks held before the run that earlier steps dropped (updated)."""
    k = len(drops)
    freed_plain, freed_cached, freed = [0] * k, [0] * k, np.zeros((k, G), dtype=np.int64)
    slot, ref = store.block_slot, store.ref
    for j, step in enumerate(drops):
        for g, block in step:
            if block >= 0:  # a block held before the run: freed at its last reference
                left = refs[block] = refs.get(block, int(ref[block])) - 1
                if left:
                    continue
                if slot[block] >= 0:
                    freed_cached[j] += 1
                    freed[j, g] += 1
                    continue
            freed_plain[j] += 1  # opened in the run (one table, never indexed) or unindexed
            freed[j, g] += 1
    return freed_plain, freed_cached, freed


def _window(pool: HybridPool, seq_ids: Sequence[Hashable], computed: np.ndarray, tokens: list[int], lead: bool
            ) -> tuple[list[list[int]], list[list[tuple[int, int]]], np.ndarray, list[list[int]]]:
    """For the steps of `computed` [n, w] (the tokens before each step; `lead`: its first column is the step before
    the window, only read for where its frees ended): per step the sequences opening a block, the (group, block)
    pairs its frees drop — block -1: one opened in the run —, the table entries freed and the sequences freeing."""
    B, mode, pools = pool.block_size, pool.state_mode, pool.pools
    cols = slice(1, None) if lead else slice(None)
    opening = [np.flatnonzero(c).tolist() for c in (computed[:, cols] % B == 0).T]
    w = len(opening)
    drops: list[list[tuple[int, int]]] = [[] for _ in range(w)]
    seqs: list[set[int]] = [set() for _ in range(w)]
    entries = np.zeros(w, dtype=np.int64)
    held = (computed + B - 1) // B  # blocks each table holds before the step's growth
    ends: dict[tuple[str, int | None], np.ndarray] = {}
    for g, _, _ in _rules(pool):
        group = pool.groups[g]
        end = ends.get((group.kind, group.window))
        if end is None:
            end = ends[group.kind, group.window] = np.minimum(first_blocks(group, computed, B, mode), held)
        tables = [pools[g].seqs[s] for s in seq_ids]
        skipped = np.array([t.num_skipped for t in tables], dtype=np.int64)[:, None]
        after = np.maximum(end, skipped)
        before = after[:, :-1] if lead else np.concatenate([skipped, after[:, :-1]], axis=1)
        after = after[:, cols]
        for i, j in zip(*(a.tolist() for a in np.nonzero(after > before)), strict=True):
            first, last, table, held_before = int(before[i, j]), int(after[i, j]), tables[i].table, -(-tokens[i] // B)
            entries[j] += last - first
            seqs[j].add(i)
            drops[j] += [(g, int(table[p]) if p < held_before else -1) for p in range(first, last)]
    return opening, drops, entries, [sorted(s) for s in seqs]


def apply(pool: HybridPool, order: Sequence[Hashable], run: DecodeRun) -> None:
    """The run's steps on the pool, the sequences of each step in the batch's `order` (see the module docstring),
    then the pool checked against the plan."""
    seq_ids, at = run.seq_ids, list(run.tokens)
    position = {s: i for i, s in enumerate(order)}
    assert len(position) == len(seq_ids) and all(s in position for s in seq_ids), "a run of another batch"
    rank = [position[s] for s in seq_ids]
    tables = [[p.seqs[s] for p in pool.pools] for s in seq_ids]
    for j, (frees, opens) in enumerate(zip(run.frees, run.opens, strict=True)):
        if not (frees or opens):
            continue
        frees, opens = sorted(frees, key=rank.__getitem__), sorted(opens, key=rank.__getitem__)
        moving = sorted(set(frees).union(opens))
        _catch_up(pool, [tables[i] for i in moving], [at[i] for i in moving], [run.tokens[i] + j for i in moving])
        for i in moving:
            at[i] = run.tokens[i] + j
        if frees:
            skip_ordered(pool, [seq_ids[i] for i in frees])
        if opens:
            _append_run(pool, [seq_ids[i] for i in opens], 1)
            for i in opens:
                at[i] += 1
    _catch_up(pool, tables, at, [t + run.k for t in run.tokens])
    pool._changed()
    _check(pool, run)


def _catch_up(pool: HybridPool, tables: list[list], now: list[int], target: list[int]) -> None:
    """Sequences' tables from `now` to `target` tokens, none crossing a block boundary: each table's last block
    fills (a block of one table: no fork) — as the loop's appends of one token each fill it."""
    lasts: list[int] = []
    adds: list[int] = []
    G, total = len(pool.pools), 0
    for seq_tables, a, b in zip(tables, now, target, strict=True):
        if b == a:
            continue
        for t in seq_tables:
            lasts.append(int(t.table[t.num_blocks - 1]))
            t.num_tokens = b
        adds += [b - a] * G
        total += b - a
    if not lasts:
        return
    store = pool.store
    store.fill[np.array(lasts, dtype=np.int64)] += np.array(adds, dtype=store.fill.dtype)
    store.useful_tokens += total * G
    for p in pool.pools:
        p.logical_tokens += total


def _check(pool: HybridPool, run: DecodeRun) -> None:
    store = pool.store
    got = (store.num_used, store.queue.num_cached, store.useful_tokens, sum(p.logical_blocks for p in pool.pools))
    want = (int(run.used[-1]), int(run.cached[-1]), int(run.useful[-1]), int(run.logical[-1]))
    assert got == want, f"a prefix-cached decode run of {run.k} steps: the pool holds {got}, the plan said {want}"
