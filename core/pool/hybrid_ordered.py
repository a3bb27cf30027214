"""A step of many sequences on a hybrid pool with prefix caching, in one pass: the blocks each group's rule lets go
freed, and the appends made, in exactly the order the one-sequence operations take (core/pool/hybrid.py).

With prefix caching the order blocks enter the free queue is the order of the LRU that evicts them, and the order
blocks are handed out decides which cached blocks are evicted: so a step stays the per-sequence loop

    for seq in seq_ids: free_skipped(seq)            each group in group order: skip_blocks (a tail first)
    for seq in seq_ids: append_fitting(seq, add)     each group in group order: BlockPool.append

and these do the same changes, pair (sequence, group) by pair, with numpy over all the pairs at once:

    skip_ordered     every pair's skipped blocks in pair order, each run tail first, concatenated; the reference
                     counts dropped in one subtract; a block held by several of these drops where the loop drops
                     it (its last holder's skip) — one drop of the store, whose free side keeps the order of the
                     blocks given (plain stack and LRU each appended in order), as the loop's drops do in turn
    append_ordered   consecutive sequences that add the same tokens and complete no keyed block (decode, or a
                     prompt's unkeyed tail) with no state page to move: their pairs appended by batch.append_many,
                     which hands out, copies and fills exactly as the appends one at a time in that order; any
                     other sequence (keys to register, a state page that moves) through append_fitting, in turn.

A pool of mixed tokens per block, weighted tables or speculative slots takes the loop itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .batch import append_many
from .hybrid_private import first_blocks

if TYPE_CHECKING:
    from .hybrid import HybridPool


MANY = 4  # skip_ordered of more sequences than this (windows and chunks only) in array operations: _skip_many


def ordered(pool: HybridPool) -> bool:
    """The pool's groups share one block size and one plain store, and no group tracks speculative slots: the
    pairs of a step are alike and these functions apply."""
    return not (pool.mixed or getattr(pool, "weighted", False) or any(p.spec.tracked for p in pool.pools))


def _rules(pool: HybridPool) -> list[tuple[int, Callable[[int, int, str], int], tuple[str, int | None]]]:
    """(group, its PoolGroup.first_block_before_growth, its kind and window: groups alike share the rule's answer) of
    each group that frees anything, in group order (kept on the pool)."""
    rules = pool.__dict__.get("_skip_rules")
    if rules is None:
        rules = pool.__dict__["_skip_rules"] = [
            (g, group.first_block_before_growth, (group.kind, group.window)) for g, group in enumerate(pool.groups)
            if group.kind != "full"]
    return rules


def skip_ordered(pool: HybridPool, seq_ids: Sequence[Hashable]) -> int:
    """`pool.free_skipped(seq)` for each sequence in order (see the module docstring); returns the table entries
    freed. Only for an `ordered` pool."""
    rules = _rules(pool)
    if not rules:
        return 0
    if len(seq_ids) > MANY and not getattr(pool, "_resumed", None) and all(  # array operations
            pool.groups[g].kind in ("sliding", "chunked") for g, _, _ in rules):
        return _drop_parts(pool, _skip_many(pool, seq_ids, rules))
    B, mode, pools, parts, resumed = pool.block_size, pool.state_mode, pool.pools, [], pool._resumed
    tables = [(g, pools[g], pools[g].seqs, alike) for g, _, alike in rules]
    firsts = {alike: first for _, first, alike in rules}  # a rule asked once for its alike groups (Gemma-3: 6)
    for seq_id, first_table in zip(seq_ids, pools[0]._tables(seq_ids), strict=True):
        tokens, blocks = first_table.num_tokens, first_table.num_blocks  # every group's tables alike
        ends = {alike: min(first(tokens, B, mode), blocks) for alike, first in firsts.items()}
        for g, group_pool, seqs, alike in tables:
            seq = seqs[seq_id]
            if (end := ends[alike]) > seq.num_skipped:
                parts.append(seq.table[seq.num_skipped : end][::-1])  # skip_blocks drops a tail first
                group_pool.logical_blocks -= end - seq.num_skipped
                seq.num_skipped = end
            if resumed and (page := pool._pop_resumed(seq_id, g)) is not None:  # an align jump's: HybridLayout._skip
                parts.append(np.array([page], dtype=np.int64))
    if not parts:
        return 0
    held = np.concatenate(parts)
    _drop_in_order(pool.store, held, defer=pools[0]._in_step)
    pool._changed()
    return len(held)


def _skip_many(pool: HybridPool, seq_ids: Sequence[Hashable], rules: list) -> list[np.ndarray]:
    """skip_ordered's frees of many sequences, windows and chunks only: each rule's first kept block for every
    sequence at once (hybrid_private.first_blocks, capped at the blocks held), then only the tables that free
    anything, in the loop's order (sequence, then group), each run tail first."""
    B, mode, pools = pool.block_size, pool.state_mode, pool.pools
    firsts = pools[0]._tables(seq_ids)  # every group's tables alike (one block size)
    tokens = np.array([t.num_tokens for t in firsts], dtype=np.int64)
    blocks = np.array([t.num_blocks for t in firsts], dtype=np.int64)
    ends: dict[tuple[str, int | None], list[int]] = {}
    found: list[tuple[int, int, Any, int]] = []  # (sequence, group, its table, first block kept)
    for g, _, alike in rules:
        end = ends.get(alike)
        if end is None:
            end = ends[alike] = np.minimum(first_blocks(pool.groups[g], tokens, B, mode), blocks).tolist()
        found += [(i, g, t, e) for i, (t, e) in enumerate(zip(pools[g]._tables(seq_ids), end, strict=True))
                  if e > t.num_skipped]
    found.sort(key=lambda f: f[0])  # stable: a sequence's groups stay in group order
    parts = []
    for _, g, seq, first in found:
        parts.append(seq.table[seq.num_skipped : first][::-1])
        pools[g].logical_blocks -= first - seq.num_skipped
        seq.num_skipped = first
    return parts


def _drop_parts(pool: HybridPool, parts: list[np.ndarray]) -> int:
    """The frees `parts` (in drop order) dropped, as skip_ordered ends; returns the table entries freed."""
    if not parts:
        return 0
    held = np.concatenate(parts)
    _drop_in_order(pool.store, held, defer=pool.pools[0]._in_step)
    pool._changed()
    return len(held)


def _drop_in_order(store: Any, held: np.ndarray, *, defer: bool) -> None:
    """One reference less for each entry of `held` (a block may come several times), and the blocks whose count
    reaches 0 dropped where the one-at-a-time decrements would drop them: at their last entry."""
    if len(held) == 1:  # a window's one block (a decode step of one sequence in one group)
        block = int(held[0])
        ref = int(store.ref[block]) - 1
        assert ref >= 0, "a reference count went below zero"
        store.ref[block] = ref
        if not ref:
            store.drop(held, defer=defer)
        return
    if _distinct(store, held):  # the usual case: each block once
        refs = store.ref[held] - 1
        store.ref[held] = refs
        assert refs.min(initial=0) >= 0, "a reference count went below zero"
        store.drop(held[refs == 0], defer=defer)
        return
    np.subtract.at(store.ref, held, store.ref.dtype.type(1))
    assert store.ref[held].min(initial=0) >= 0, "a reference count went below zero"
    gone = np.flatnonzero(store.ref[held] == 0)
    dropped = held[gone]
    _, last_in_reversed = np.unique(dropped[::-1], return_index=True)
    store.drop(held[np.sort(gone[::-1][last_in_reversed])], defer=defer)


def _distinct(store: Any, held: np.ndarray) -> bool:
    """No block comes twice in `held`: a set of a few ids; of many (a prompt's blocks leaving a window), each
    block marked with its place, every place its own mark (a scratch array kept on the store, never reset)."""
    if len(held) <= 64:
        return len(set(held.tolist())) == len(held)
    mark = store.__dict__.get("_distinct_mark")
    if mark is None or len(mark) != len(store.ref):
        mark = store.__dict__["_distinct_mark"] = np.empty(len(store.ref), dtype=np.int64)
    at = np.arange(len(held), dtype=np.int64)
    mark[held] = at  # of a block's places one wins: another place of it then reads a mark not its own
    return bool((mark[held] == at).all())


def need_ordered(pool: HybridPool, seq_ids: Sequence[Hashable], adds: Sequence[int]) -> int:
    """pool.append_need_many(seq_ids, adds) of an `ordered` pool, in plain ints where no fork was made: then no
    partially filled block is in two tables (a hit holds full blocks only), so nothing is copied and the need is
    the first group's new blocks times the groups, less the state groups of mode none (their one page moves in
    place: state_pages.roll_page)."""
    if pool.store.counters["forks"] or pool._jumps(max(adds, default=0)):  # align: a state group's chunk may jump
        return pool.append_need_many(seq_ids, adds)
    B, grow, seqs = pool.block_size, 0, pool.pools[0]._tables(seq_ids)
    for seq, add in zip(seqs, adds, strict=True):
        if add > 0:
            grow += -(-(seq.num_tokens + add) // B) - seq.num_blocks
    return grow * (len(pool.pools) - sum(pool.rolled))


def fitting_run(pool: HybridPool, seq_ids: Sequence[Hashable], targets: Sequence[int], free: int) -> int:
    """How many of `seq_ids`, from the first on, grow to `targets` tokens within `free` blocks before anything is
    freed: need_ordered's plain-int need, summed sequence by sequence (0 where it does not apply: a fork made, or
    an append that may jump over state pages)."""
    if pool.store.counters["forks"]:
        return 0
    B, per, need = pool.block_size, len(pool.pools) - sum(pool.rolled), 0
    for i, (seq, target) in enumerate(zip(pool.pools[0]._tables(seq_ids), targets, strict=True)):
        add = target - seq.num_tokens
        if add < 0 or pool._jumps(add):
            return i
        if add:
            need += (-(-(seq.num_tokens + add) // B) - seq.num_blocks) * per
        if need > free:
            return i
    return len(seq_ids)


def append_ordered(pool: HybridPool, seq_ids: Sequence[Hashable], adds: Sequence[int],
                   keys: Sequence[Any]) -> list[tuple[int, int]]:
    """`pool.append_fitting(seq, add, keys)` for each sequence in order (its checks done: `skip_ordered` ran and
    the need fits); returns the copy-on-write copies in that order. Only for an `ordered` pool."""
    B, copies = pool.block_size, []
    state = any(g.kind == "state" for g in pool.groups)
    run: list[Hashable] = []
    run_add = 0
    for seq_id, add, k in zip(seq_ids, adds, keys, strict=True):
        if not add:
            continue
        if (k is None or not pool.caches) and not (state and _moves(pool, seq_id, add, B)):
            if run and add != run_add:
                copies += _append_run(pool, run, run_add)
                run = []
            run.append(seq_id)
            run_add = add
            continue
        if run:
            copies += _append_run(pool, run, run_add)
            run = []
        copies += pool.append_fitting(seq_id, add, k)
        if k is not None:  # a prompt chunk: blocks a later prompt may hit (held_blocks)
            label(pool, seq_id)
    if run:
        copies += _append_run(pool, run, run_add)
    return copies


def _moves(pool: HybridPool, seq_id: Hashable, add: int, B: int) -> bool:
    """The append moves a state group's running state into a new page (append_fitting reports that copy)."""
    old = pool.pools[0].seqs[seq_id].num_tokens
    return bool(old) and (old - 1) // B != (old + add - 1) // B


def _append_run(pool: HybridPool, seq_ids: list[Hashable], add: int) -> list[tuple[int, int]]:
    """append_fitting(seq, add) without keys for each of `seq_ids`, every (sequence, group) pair in the loop's
    order in one batch.append_many; each group's tables grow alike (one block size)."""
    pools = pool.pools
    copies: list[tuple[int, int]] = []
    if add == 1 and not pool.store.counters["forks"]:  # a decode step, no block copied
        grown = _decode(pool, seq_ids)
    else:
        copies, grown = append_many(pool.store, [p.seqs[s] for s in seq_ids for p in pools], add)
    per_group = grown // len(pools)
    for p in pools:
        p.logical_blocks += per_group
        p.logical_tokens += add * len(seq_ids)
    pool._changed()
    return copies


def _decode(pool: HybridPool, seq_ids: list[Hashable]) -> int:
    """batch.append_many(pairs, 1) of a pool without forks (so no partially filled block is in two tables: nothing
    is copied), in plain ints: a pair's last block filled by one token, or one fresh block of one token, handed out
    in pair order. Returns the blocks handed out."""
    store, B, pools = pool.store, pool.block_size, pool.pools
    tables = [[p.seqs[s] for s in seq_ids] for p in pools]  # [group][sequence]
    room = [t.num_tokens % B > 0 for t in tables[0]]  # every group's tables alike (one block size)
    lasts = [t.table[t.num_blocks - 1] for group in tables for t, r in zip(group, room, strict=True) if r]
    grows = [group[i] for i, r in enumerate(room) if not r for group in tables]  # pair order: sequence, group
    for group in tables:
        for seq in group:
            seq.num_tokens += 1
    if lasts:
        store.fill[np.array(lasts, dtype=np.int64)] += 1  # distinct blocks: each in one table
    if grows:
        blocks = store.hand_out(len(grows))[0]
        store.ref[blocks] = 1
        store.fill[blocks] = 1
        store.num_used += len(grows)
        for seq, block in zip(grows, blocks.tolist(), strict=True):
            n = seq.num_blocks
            if n + 1 > len(seq.table):
                seq.table = np.concatenate([seq.table, np.empty(2 * (n + 1), dtype=np.int64)])
            seq.table[n] = block
            seq.num_blocks = n + 1
    store.useful_tokens += len(seq_ids) * len(pools)
    return len(grows)


def held_blocks(pool: HybridPool) -> list[int]:
    """Distinct blocks each group's live tables hold (`GroupUsage.held_blocks` of pool.group_usage()). A block is in
    one group only and its ref counts the tables holding it (no speculative block is kept in an `ordered` pool), so
    a group holds its table entries (its logical_blocks) less Σ (ref − 1) over its blocks held more than once: only
    those need their group, read from labels (`label`) that are current while the block's version is the one
    labelled (a block changes group only when handed out again: a hit revives a block of its own group's chain).
    A shared block without a current label: every table's blocks counted and labelled (`_count_all`)."""
    store = pool.store
    if not (store.counters["hit_blocks"] or store.counters["forks"]):  # no block in two tables: a counter
        return [p.logical_blocks for p in pool.pools]
    if not ordered(pool) or pool._resumed:  # (a page an align jump resumed from, past the tables: counted there)
        return _count_all(pool) if not pool._resumed else [u.held_blocks for u in pool.group_usage()]
    logical = [p.logical_blocks for p in pool.pools]
    entries = sum(logical)
    if entries == store.num_used:  # Σ ref over used blocks = the entries: none is held twice
        return logical
    if entries * 8 < len(store.ref):  # the blocks held twice, from the entries or from every block's ref
        held = np.concatenate([s.table[s.num_skipped : s.num_blocks] for p in pool.pools for s in p.seqs.values()])
        shared = np.unique(held[store.ref[held] > 1])
    else:
        shared = np.flatnonzero(store.ref > 1)
    owner, owner_ver = _labels(pool)
    if len(shared) and not (np.array_equal(owner_ver[shared], store.version[shared]) and owner[shared].min() >= 0):
        return _count_all(pool)
    extra = np.bincount(owner[shared], weights=store.ref[shared] - 1, minlength=len(pool.pools))
    return [n - int(e) for n, e in zip(logical, extra.tolist(), strict=True)]


def label(pool: HybridPool, seq_id: Hashable) -> None:
    """Label the blocks the sequence's tables hold with their groups (a newly admitted sequence, a prompt chunk
    just appended: the blocks a later prompt may hit), so that `held_blocks` finds them current."""
    owner, owner_ver = _labels(pool)
    for g, p in enumerate(pool.pools):
        seq = p.seqs[seq_id]
        blocks = seq.table[seq.num_skipped : seq.num_blocks]
        owner[blocks] = g
        owner_ver[blocks] = pool.store.version[blocks]


def _labels(pool: HybridPool) -> tuple[np.ndarray, np.ndarray]:
    """(group, version then) of every block labelled so far (-1: never), kept on the pool."""
    labels = pool.__dict__.get("_group_labels")
    if labels is None:
        n = len(pool.store.ref)
        labels = pool.__dict__["_group_labels"] = (np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64))
    return labels


def _count_all(pool: HybridPool) -> list[int]:
    """held_blocks by counting every table entry: each entry marks its block with its position, the winning
    position counts the block once, in its group; every held block is labelled on the way."""
    store = pool.store
    tables = [[s.table[s.num_skipped : s.num_blocks] for s in p.seqs.values()] for p in pool.pools]
    held = [t for group in tables for t in group]
    if not held:
        return [0] * len(pool.pools)
    entries = np.concatenate(held)
    ends = np.cumsum([0, *(sum(map(len, group)) for group in tables)])
    owner, owner_ver = _labels(pool)
    owner[entries] = np.repeat(np.arange(len(pool.pools)), np.diff(ends))
    owner_ver[entries] = store.version[entries]
    mark = pool.__dict__.get("_held_mark")
    if mark is None or len(mark) != len(store.ref):
        mark = pool.__dict__["_held_mark"] = np.empty(len(store.ref), dtype=np.int64)  # no reset: each use writes
    at = np.arange(len(entries))
    mark[entries] = at  # of a block's entries, one position wins (whichever): the block is counted there
    counted = np.concatenate([[0], np.cumsum(mark[entries] == at)])
    return np.diff(counted[ends]).tolist()
