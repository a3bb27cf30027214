"""Weighted block tables: a layer group whose block takes k units of the pool is one table of blocks that
cost k units each, not k identical tables of one unit (the ideal layout, core/model/kv_groups.py).

The ideal layout pools each layer type on its own page: a block is B tokens (or one state) of the type's real
layers, and memory is counted in units of the gcd of the types' block bytes. Granite-4.0-H-Small at B 16: an
attention block is 262,144 B, a Mamba-2 state 77,322,240 B, their gcd 2,048 B, so a block costs 128 and a
state 37,755 units; 40 GiB is 20,971,520 units. A table per unit (pool_groups without weights) is 37,883 tables
per sequence; here it is two.

What the store counts, and why it never holds a unit id (units number in millions):

    units       num_units = pool bytes // unit bytes; a block of group g costs weight[g] of them
    block ids   group g owns the id range [start_g, start_g + num_units // weight[g]): as many as could ever
                be alive at once, so the per-block arrays (ref, fill, hash, ...) stay those of a plain pool of
                the lightest group's blocks (Granite at 40 GiB: 163,840 + 555 ids). An id's weight is a
                function of the id (`weight[id]`), so freeing, evicting and checking need no group.
    free units  plain_units (held by no block) + cached_units (held by free blocks that are still prefix-cache
                entries, evictable): len(queue) is their sum, so "need <= len(queue)" is a check in units
    plain ids   one stack per group (its id range, lowest id handed out first): the ids not held by any
                used, pending or cached block. More ids than units allow are free (ids are over-provisioned
                per group), so an id is not space: a hand-out of n blocks of group g takes n ids off g's stack
                and n · weight[g] plain units
    LRU         the free cached blocks of every group, one queue (free_queue's lazily deleted array): a hand-out
                short of plain units evicts the oldest cached blocks, whatever their group, until plain_units >=
                n · weight[g]; an eviction frees all its block's units (a cached state is never evicted in part),
                its id back to its group's stack. Plain units go first: kvcalc's own rule, not vLLM's one free
                queue (free_queue), as the ideal layout is no engine's and units freed hash-less are all alike

A hand-out never takes more units than are plain: plain_units >= 0 always (check). There are always n ids on g's
stack when plain_units >= n · w: the blocks of g alive hold at most (num_units − plain_units) units, so at most
floor((num_units − plain_units) / w) ids, and floor(U / w) − floor((U − p) / w) >= floor(p / w).

`store.num_used` counts units (the hybrid pool's num_blocks is num_units, its free blocks free units), and
each group's BlockPool hands out through a `GroupStore`, a view of the one store that knows its group; every
other operation (share, drop, free, the prefix index) reads an id's weight. A caller that knows a group never
holds more than some number of blocks (share's scenario: its pool_blocks) may cap the id ranges there
(`max_group_blocks`); a hand-out past a range is an AssertionError, never a silent overlap. A state group's prefill
chunk jumps over the pages it would not keep (`state_jump`, below). With every weight 1 none of this is built: the
pool keeps its plain BlockStore (hybrid_layout), the same code and output as before. Used where an ideal layout
has more than MAX_POOL_GROUPS unit tables (pool_groups(weighted=True): share, its trace replay, sim); usage()
counts tokens in the units' slots; align pages as vLLM's MambaManager. Not yet: swaps (bytes per group), refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .free_queue import FREE_CACHED, FREE_PLAIN, USED, FreeBlockQueue
from .state_pages import roll_need
from .store import VERSION_INT32_MAX, BlockStore


class WeightedQueue(FreeBlockQueue):
    """A weighted store's free side (module docstring): per-group id stacks, units, FreeBlockQueue's cached LRU."""
    _eager = True  # evict reads the stamps

    def __init__(self, starts: Sequence[int], sizes: Sequence[int], weight: np.ndarray, num_units: int,
                 state: np.ndarray) -> None:
        super().__init__(len(weight), state)
        self._head = self._tail = self._num_free = 0  # the base's one queue holds only the cached blocks here
        self.starts, self.sizes, self.weight, self.num_units = list(starts), list(sizes), weight, num_units
        # group g's stack in _plain[lo : lo + top], top last
        self._plain = np.concatenate([np.arange(lo + n - 1, lo - 1, -1, dtype=np.int32) for lo, n in zip(
            starts, sizes, strict=True)]) if len(sizes) else np.empty(0, dtype=np.int32)
        self.tops = list(sizes)
        self._starts = np.asarray(starts, dtype=np.int64)
        self.plain_units, self.cached_units = int(num_units), 0

    def __len__(self) -> int:
        return self.plain_units + self.cached_units

    num_plain = property(lambda self: sum(self.tops))

    def group_of(self, block_ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._starts, block_ids, side="right") - 1

    # ---- adding -------------------------------------------------------------------------------
    def push_plain(self, block_ids: np.ndarray) -> None:
        groups = self.group_of(block_ids)
        for g in np.unique(groups).tolist():
            ids = block_ids[groups == g]
            at = self.starts[g] + self.tops[g]
            self._plain[at : at + len(ids)] = ids
            self.tops[g] += len(ids)
        self.plain_units += int(self.weight[block_ids].sum())
        self._state[block_ids] = FREE_PLAIN

    def push_cached(self, block_ids: np.ndarray) -> None:
        super().push_cached(block_ids)
        self.cached_units += int(self.weight[block_ids].sum())

    def push(self, block_ids: np.ndarray, cached: np.ndarray, num_cached: int) -> None:
        self.push_plain(block_ids[~cached])  # plain ids to their stacks, cache entries to the LRU, in order
        self.push_cached(block_ids[cached])

    # ---- removing -------------------------------------------------------------------------------
    def revive(self, block_ids: np.ndarray) -> None:
        super().revive(block_ids)
        self.cached_units -= int(self.weight[block_ids].sum())

    def pop(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        raise TypeError("a weighted queue hands out a group's blocks: pop_group")

    def pop_plain_one(self) -> int:
        raise TypeError("a weighted queue hands out a group's blocks: pop_group")

    def evict(self, units: int) -> np.ndarray:
        """Take the oldest cached blocks off the LRU until they hold at least `units` units (the caller checked
        that the cache holds them); returns their ids, still FREE_CACHED and hashed: the store drops them."""
        parts: list[np.ndarray] = []
        while units > 0:
            assert self._head < self._tail, f"evict: {units} units short and the cache is empty"
            pos = np.arange(self._head, min(self._head + 256, self._tail))
            ids = self._lru[pos].astype(np.intp)
            live = pos[(self._state[ids] == FREE_CACHED) & (self.stamp[ids] == pos)]
            cum = np.cumsum(self.weight[self._lru[live]])
            if len(cum) and cum[-1] >= units:
                live = live[: int(np.searchsorted(cum, units)) + 1]  # the first prefix holding `units`
                self._head = int(live[-1]) + 1
            else:
                self._head = int(pos[-1]) + 1
            taken = self._lru[live].astype(np.intp)
            units -= int(self.weight[taken].sum())
            parts.append(taken)
        evicted = np.concatenate(parts) if parts else np.empty(0, dtype=np.intp)
        self.stamp[evicted] = -1
        self.num_cached -= len(evicted)
        self.cached_units -= int(self.weight[evicted].sum())
        return evicted

    def pop_group(self, g: int, n: int) -> np.ndarray:
        """n ids off group g's stack, taking n · weight units of the plain ones (the caller made them plain)."""
        units = n * int(self.weight[self.starts[g]])
        assert units <= self.plain_units and n <= self.tops[g], f"group {g}: {n} blocks do not fit"
        top = self.starts[g] + self.tops[g]
        blocks = self._plain[top - n : top][::-1].astype(np.intp)
        self.tops[g] -= n
        self.plain_units -= units
        self._state[blocks] = USED
        return blocks

    # ---- inspection -----------------------------------------------------------------------------
    def order(self) -> list[int]:
        """Plain ids group by group (each in hand-out order), then the LRU head to tail."""
        plain = [i for lo, top in zip(self.starts, self.tops, strict=True)
                 for i in self._plain[lo : lo + top][::-1].tolist()]
        return plain + self.live().tolist()

    def check(self) -> None:
        """The queue's own invariants, in ids and in units."""
        state, weight = self._state, self.weight
        for g, (lo, top, size) in enumerate(zip(self.starts, self.tops, self.sizes, strict=True)):
            ids = self._plain[lo : lo + top]
            assert 0 <= top <= size, f"group {g}: plain stack of {top} ids in a range of {size}"
            assert np.all((ids >= lo) & (ids < lo + size)), f"group {g}: a plain id of another group"
            assert np.all(state[ids] == FREE_PLAIN), f"group {g}: a block on the plain stack is not FREE_PLAIN"
            assert len(np.unique(ids)) == len(ids), f"group {g}: a block is twice on the plain stack"
        assert int(np.count_nonzero(state == FREE_PLAIN)) == sum(self.tops), "FREE_PLAIN blocks missing from a stack"
        live = self.live()
        cached = np.flatnonzero(state == FREE_CACHED)
        assert len(live) == self.num_cached == len(cached), "LRU entries, cached counter and FREE_CACHED differ"
        assert np.array_equal(np.sort(live), cached), "LRU entries and FREE_CACHED blocks differ"
        assert self.cached_units == int(weight[cached].sum()), "cached units disagree with the cached blocks"
        held = int(weight[state != FREE_PLAIN].sum())
        assert self.plain_units == self.num_units - held, (
            f"plain units {self.plain_units}, but blocks hold {held} of the {self.num_units} units")
        assert self.plain_units >= 0, "more units handed out than the pool has"


class WeightedStore(BlockStore):
    """A BlockStore of `num_units` units shared by groups whose blocks cost `weights` units (module docstring)."""

    def __init__(self, num_units: int, block_size: int, weights: Sequence[int], *,
                 enable_prefix_caching: bool = True, max_group_blocks: int | None = None) -> None:
        if num_units < max(weights):
            raise ValueError(f"a weighted pool of {num_units} units holds no block of {max(weights)} units")
        # ids of group g: as many blocks as could be alive at once (or a bound the caller gives, e.g. a scenario's)
        sizes = [min(num_units // w, num_units if max_group_blocks is None else max_group_blocks) for w in weights]
        super().__init__(sum(sizes), block_size, enable_prefix_caching=enable_prefix_caching)
        self.num_units = int(num_units)
        self.weights = tuple(int(w) for w in weights)
        self.weight = np.repeat(np.asarray(self.weights, dtype=np.int64), sizes)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
        self.queue: WeightedQueue = WeightedQueue(starts, sizes, self.weight, self.num_units, self.state)

    def group_stores(self) -> list[GroupStore]:
        """One view per group: what each group's BlockPool hands out through."""
        return [GroupStore(self, g) for g in range(len(self.weights))]

    @property
    def num_pending_blocks(self) -> int:  # units, as num_used and len(queue)
        return self.num_units - self.num_used - len(self.queue)

    def hand_out(self, n: int) -> tuple[np.ndarray, int]:
        raise TypeError("a weighted store hands out a group's blocks: hand_out_group (through its GroupStore)")

    def hand_out_group(self, g: int, n: int) -> tuple[np.ndarray, int]:
        """n blocks of group g for new content (version + 1, USED), evicting the oldest cached blocks of any
        group while the plain units fall short: (block ids, evictions)."""
        if self.counters["allocated_blocks"] + n > VERSION_INT32_MAX:
            self.widen_versions()
        queue = self.queue
        short = n * self.weights[g] - queue.plain_units
        evicted = queue.evict(short) if short > 0 else np.empty(0, dtype=np.intp)
        if len(evicted):
            self.index.delete(evicted)
            self.counters["evictions"] += len(evicted)
            self.fill[evicted] = 0
            queue.push_plain(evicted)
        blocks = queue.pop_group(g, n)
        self.version[blocks] += 1
        self.counters["allocated_blocks"] += n
        return blocks, len(evicted)

    def share(self, blocks: np.ndarray, state: np.ndarray, num_cached: int) -> None:
        revived = blocks if num_cached == len(blocks) else blocks[state != USED]
        self.num_used += int(self.weight[revived].sum()) - len(revived)  # BlockStore.share counts them once
        super().share(blocks, state, num_cached)

    def drop(self, blocks: np.ndarray, num_tokens: int | None = None, *, defer: bool = False) -> None:
        self.num_used -= int(self.weight[blocks].sum()) - len(blocks)  # BlockStore.drop counts them once
        super().drop(blocks, num_tokens, defer=defer)


class GroupStore(WeightedStore):
    """Group g's view of a WeightedStore: the same arrays, queue, index and counters (every attribute is the
    store's), but its hand-outs are group g's blocks, each `weight` units."""

    def __init__(self, store: WeightedStore, g: int) -> None:  # a view: no BlockStore.__init__, no arrays of its own
        self.__dict__["_store"], self.__dict__["_group"] = store, g

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_store"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["_store"], name, value)  # num_used, useful_tokens, widened versions: the store's

    def hand_out(self, n: int) -> tuple[np.ndarray, int]:
        return self._store.hand_out_group(self._group, n)

    def take(self, n: int, num_tokens: int) -> np.ndarray:
        store = self._store
        blocks = store.hand_out_group(self._group, n)[0]
        store.ref[blocks] = 1
        store.num_used += n * store.weights[self._group]
        if n:
            store.fill[blocks] = store.block_size
            store.fill[blocks[-1]] = num_tokens - (n - 1) * store.block_size
        store.useful_tokens += num_tokens
        return blocks

    def take_one(self, num_tokens: int) -> int:
        return int(self.take(1, num_tokens)[0])

    def group_stores(self) -> list[GroupStore]:
        return self._store.group_stores()


# ---- a state group's chunk on weighted tables ---------------------------------------------------------------
# A state group holds a page per block boundary (groups.py) and frees the older ones at the sequence's next step;
# an append of T tokens takes every page up to the last, ceil(T / B) of them. Of those a step keeps only the ones
# groups.first_block names after it (none: the last; align: the saved one and the last). On unit tables a page is
# one id; on a weighted table it is a whole state (Granite at B 16: 37,755 units, so a prefill chunk of 8,192 tokens
# would take 512 states), so here a state group jumps: the pages in between are never taken (NULL entries, as
# skipped ones); the page it resumes from stays held past the table until the sequence's next step (HybridLayout.
# _resume: vLLM's last_state_block_idx), older pages go now. The move (resume page, last page) is reported as a copy.
# Mode none never gets here: its one page moves along the table in place (state_pages.roll_page), taken first.


def _state_jump_plan(hybrid: Any, g: int, seq_id: Any, num_tokens: int) -> tuple[int, int] | None:
    """(first slot the step keeps, slots after the step) when group g (a state group of a weighted pool) jumps;
    None when a plain append takes no page it would not keep (or the sequence has speculative slots)."""
    pool, group = hybrid.pools[g], hybrid.groups[g]
    seq = pool._seq(seq_id)
    if group.kind != "state" or hybrid.state_mode == "all" or not seq.num_tokens or pool.spec.tracks(seq_id):
        return None
    B, new = pool.block_size, seq.num_tokens + num_tokens
    keep = group.first_block(seq.num_tokens, new, B, hybrid.state_mode)  # the step's rule (groups.py); past the
    return (keep, -(-new // B)) if keep > seq.num_skipped else None  # page it resumes from: a jump


def weighted_append_need(hybrid: Any, seq_id: Any, num_tokens: int) -> int:
    """Units an append takes on a weighted pool (after free_skipped): each group's blocks times its weight, a state
    group's only the pages it keeps when it jumps (align), and under mode none its one page moving in place: a copy
    (w units) only when a fork shares it (state_pages.roll_need)."""
    need = 0
    for g, (pool, w) in enumerate(zip(hybrid.pools, hybrid.weights, strict=True)):
        if (seq := hybrid._rolls(g, seq_id, num_tokens)) is not None:
            need += w * roll_need(pool.store, seq)
            continue
        plan = _state_jump_plan(hybrid, g, seq_id, num_tokens) if num_tokens > 0 else None
        need += w * (pool.append_need(seq_id, num_tokens) if plan is None else plan[1] - plan[0])
    return need


def state_jump(hybrid: Any, g: int, seq_id: Any, num_tokens: int) -> tuple[int, int] | None:
    """Append `num_tokens` to state group g by a jump (see above); returns the move (the page it resumes from,
    the last page) or None where a plain append is right (the caller appends then)."""
    plan = _state_jump_plan(hybrid, g, seq_id, num_tokens)
    if plan is None:
        return None
    keep, total = plan
    pool = hybrid.pools[g]
    seq, store = pool._seq(seq_id), pool.store
    at = seq.num_blocks - 1  # the page the step resumes from (free_skipped let the step before's go), held unless
    resume, held = int(seq.table[at]), keep == total - 1  # the step ends past a boundary mid-block (groups.py)
    gone = seq.table[seq.num_skipped : at + (not held)].copy()
    if len(seq.table) < total:
        seq.table = np.concatenate([seq.table, np.empty(2 * total, dtype=np.int64)])
    new = seq.num_tokens + num_tokens
    seq.table[keep:total] = store.take(total - keep, new - keep * pool.block_size)
    store.ref[gone] -= 1
    store.drop(gone[store.ref[gone] == 0][::-1], defer=pool._in_step)
    if held:  # the step resumes from it: held until the sequence's next step
        hybrid._resume(seq_id, g, at, resume)
    pool.logical_blocks += total - keep - len(gone)
    pool.logical_tokens += num_tokens
    seq.num_skipped, seq.num_blocks, seq.num_tokens = keep, total, new
    pool._epoch += 1
    return resume, int(seq.table[total - 1])


def weighted_usage(store: BlockStore) -> tuple[int, int]:
    """(useful slots, cached units) of a weighted store, in the units' slots: a unit has block_size slots, so a
    block of weight w holding f tokens fills f · w of them (as store slots count under mixed block sizes)."""
    assert isinstance(store, WeightedStore)
    used = store.state == USED
    return int(np.dot(store.fill[used], store.weight[used])), store.queue.cached_units


def cached_units(store: BlockStore) -> int:
    """Units the free cached blocks hold (a plain store: its cached blocks)."""
    queue = store.queue
    return queue.cached_units if isinstance(queue, WeightedQueue) else queue.num_cached


def group_stores(num_blocks: int, block_size: int, weights: Sequence[int], enable_prefix_caching: bool,
                 max_group_blocks: int | None = None) -> tuple[BlockStore, list[BlockStore]]:
    """(the pool's store, the store each group's BlockPool uses): with every weight 1 one plain BlockStore of
    `num_blocks` blocks for all; otherwise a WeightedStore of `num_blocks` units and a view per group
    (`max_group_blocks`: the most blocks a group ever holds, when the caller knows a bound below its units)."""
    if all(w == 1 for w in weights):
        store = BlockStore(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching)
        return store, [store] * len(weights)
    weighted = WeightedStore(num_blocks, block_size, weights, enable_prefix_caching=enable_prefix_caching,
                             max_group_blocks=max_group_blocks)
    return weighted, list(weighted.group_stores())
