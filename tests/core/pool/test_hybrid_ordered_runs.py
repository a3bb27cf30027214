"""A run of k decode steps planned from counts and applied where blocks change (core/pool/hybrid_runs.py) leaves a
prefix-caching hybrid pool exactly as k steps of the sim's one-pass step do (skip_ordered, the need check,
append_ordered — itself proven equal to the per-sequence loop in test_hybrid_ordered): the same block ids in every
table, reference counts, fills, versions, free-queue order and cache entries; and every step's figures (blocks used,
cached, tokens written, table entries, each group's blocks) are the ones the pool shows after that step of stepping.

Where the plan stops is checked against stepping too: the next step does not fit, or (a request waiting) it would
hand out blocks past the first its look-up found or leave more blocks free than at the start. Hypothesis drives a
pool through random admissions of prompts of a few families (hits on each other's blocks, shared blocks dropped at
their last holder), releases (every freed block at the free queue's tail) and runs, in a pool small enough
that hand-outs evict; planted bugs in the plan and the apply are caught.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool import hybrid_apply, hybrid_runs
from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid import HybridPool
from kvcalc.core.pool.hybrid_ordered import append_ordered, held_blocks, label, need_ordered, skip_ordered

from .test_hybrid_ordered import B, family_keys, state

LAYOUTS = {
    "sliding+chunked": (PoolGroup("full"), PoolGroup("sliding", 6), PoolGroup("sliding", 6), PoolGroup("chunked", 8)),
    "narrow window": (PoolGroup("sliding", 2), PoolGroup("full"), PoolGroup("sliding", 2)),
    "window of blocks": (PoolGroup("full"), PoolGroup("sliding", 8)),
}


def figures(pool: HybridPool) -> tuple:
    """What a step's accounting reads of the pool (GroupedPagedPolicy.parts and group_blocks)."""
    usage = pool.usage()
    return (usage.used_blocks, usage.cached_free_blocks, usage.useful_tokens, usage.logical_blocks,
            tuple(held_blocks(pool)))


def step(pool: HybridPool, ids: list) -> bool:
    """One decode step of `ids` as GroupedPagedPolicy.grow_many takes it in one pass: only where the free blocks
    cover its growth before anything is freed; False (nothing done) where not: the policy then grows request by
    request (vLLM's order: a later request's frees do not pay for an earlier one's growth)."""
    if need_ordered(pool, ids, [1] * len(ids)) > pool.num_free_blocks:
        return False
    skip_ordered(pool, ids)
    append_ordered(pool, ids, [1] * len(ids), [None] * len(ids))
    return True


def check_run(pool: HybridPool, ids: list, k: int, waiting: hybrid_runs.Waiting | None) -> int:
    """Plan k steps on `pool`, step a copy of it, apply the plan: the same pool and the same figures; the plan
    stops where stepping would. Returns the steps taken."""
    stepped = copy.deepcopy(pool)
    order = list(reversed(ids))  # the plan's order is any: the apply takes the batch's
    run = hybrid_runs.plan(pool, order, k, held_blocks(pool), waiting)
    free_now, handed = stepped.num_free_blocks, stepped.store.counters["allocated_blocks"]

    def refused(after: HybridPool) -> bool:  # the waiting request's refusal stands (see hybrid_runs.plan)
        assert waiting is not None
        free = after.num_free_blocks  # evictable: hand-outs off the free queue's head (vLLM's one queue)
        return free < waiting.need_floor or (
            after.store.counters["allocated_blocks"] - handed <= waiting.evictable and free <= free_now)

    for j in range(run.k):
        assert step(stepped, ids)
        assert figures(stepped) == (run.used[j], run.cached[j], run.useful[j], run.logical[j], tuple(run.held[j]))
        assert waiting is None or refused(stepped)
    if run.k < k and not run.order_bound:  # the next step is not a plain decode step of a refused head's run
        probe = copy.deepcopy(stepped)
        assert not step(probe, ids) or (waiting is not None and not refused(probe))
    if run.k:
        hybrid_apply.apply(pool, ids, run)
    assert state(pool) == state(stepped)
    pool.check_invariants()
    return run.k


ops = st.lists(st.tuples(st.sampled_from(["add", "add", "add", "release", "run", "run"]), st.integers(0, 5),
                         st.integers(0, 3), st.integers(1, 40)), min_size=1, max_size=25)


@pytest.mark.parametrize("name", list(LAYOUTS))
@settings(max_examples=60, deadline=None)
@given(steps=ops, waiting=st.booleans())
def test_a_planned_run_is_stepping(name, steps, waiting):
    pool = HybridPool(40, B, LAYOUTS[name])
    for op, seq, family, k in steps:
        if op == "add" and not pool.has_seq(seq):
            n = 4 * (2 + family) + seq % 3  # prompts of the family's keyed blocks, then an unkeyed tail
            keys = family_keys(family)[: n // B]
            if pool.can_allocate(n, keys):
                pool.allocate(seq, n, keys)
                label(pool, seq)
        elif op == "release" and pool.has_seq(seq):
            pool.release(seq)
        elif op == "run" and pool.seq_ids:
            check_run(pool, list(pool.seq_ids), k, hybrid_runs.Waiting(
                min(k // 4, len(pool.store.queue)), k % 7 * 3) if waiting else None)


def scenario() -> HybridPool:
    """A pool in which a run frees shared and cached blocks and evicts: two prompts of family 0 (sharing blocks),
    one of family 1 released (its blocks cached, but the two a family-2 prompt hit)."""
    pool = HybridPool(48, B, LAYOUTS["sliding+chunked"])
    for seq, family, n in ((0, 0, 16), (1, 1, 14), (2, 0, 13), (3, 2, 10)):
        keys = family_keys(family)[: n // B]
        pool.allocate(seq, n, keys)
        label(pool, seq)
    pool.release(1)
    return pool


def test_the_scenario_frees_shared_blocks_and_evicts():
    pool = scenario()
    evictions = pool.store.counters["evictions"]
    assert check_run(pool, [0, 2, 3], 30, None) >= 8
    assert pool.store.counters["evictions"] > evictions


@pytest.mark.parametrize("bug", ["shared block freed at its first holder", "a lagging block not filled",
                                 "cached blocks never evicted", "batch order ignored", "the waiting head forgotten"])
def test_planted_bugs_are_caught(monkeypatch, bug):
    waiting: hybrid_runs.Waiting | None = None
    if bug == "the waiting head forgotten":
        real_plan = hybrid_runs.plan
        monkeypatch.setattr(hybrid_runs, "plan", lambda pool, ids, k, held, waiting: real_plan(pool, ids, k, held))
        waiting = hybrid_runs.Waiting(0, 0)
    elif bug == "shared block freed at its first holder":
        real_freed = hybrid_runs._freed  # every reference the run's first drop (its internal check may say so)
        monkeypatch.setattr(hybrid_runs, "_freed", lambda store, left, *rest: real_freed(
            store, np.minimum(left, 1), *rest))
    elif bug == "a lagging block not filled":
        real_fill = hybrid_apply._fill_last
        monkeypatch.setattr(hybrid_apply, "_fill_last", lambda pool, tables, start, end: real_fill(
            pool, tables, start, np.minimum(end, start + 1)))
    elif bug == "cached blocks never evicted":  # the plan reads no cache entry at the free queue's head
        monkeypatch.setattr(type(scenario().store.queue), "evictions_within", lambda q, m: np.zeros(m + 1, np.int64))
    else:
        real_apply = hybrid_apply.apply
        monkeypatch.setattr(hybrid_apply, "apply", lambda pool, order, run: real_apply(pool, order[::-1], run))
    with pytest.raises(AssertionError):
        check_run(scenario(), [0, 2, 3], 30, waiting)


def test_a_run_while_a_request_waits_stops_where_its_refusal_may_end():
    """Refused now, the head stays refused while fewer blocks are free than its need's floor, or no step frees more
    than the growth takes and no eviction reaches a block its look-up found: the less allowed, the shorter."""
    runs = [check_run(scenario(), [0, 2, 3], 30, hybrid_runs.Waiting(evictable, floor))
            for evictable, floor in ((0, 0), (3, 0), (100, 0), (100, 12))]
    assert runs == sorted(runs) and runs[-1] <= check_run(scenario(), [0, 2, 3], 30, None)


def admission_need(pool: HybridPool, family: int, n: int, budget: int) -> tuple[int, int, int]:
    """(need, first chunk's tokens, its end) of an admission of a family's n-token prompt as the scheduler sizes it:
    the hit of the whole prompt, a first chunk of at most `budget` tokens, the allocation plan of that chunk."""
    keys = family_keys(family)[: n // B]
    start = pool.hit_tokens(n, keys)
    total = start + min(n - start, budget)
    return pool._allocate_plan(total, keys[: total // B], None, 0)[2], total - start, total


@pytest.mark.parametrize("name", list(LAYOUTS))
@settings(max_examples=60, deadline=None)
@given(steps=ops, family=st.integers(0, 3), n=st.integers(8, 16), budget=st.integers(1, 12))
def test_need_floor_bounds_the_need_while_blocks_are_only_evicted(name, steps, family, n, budget):
    """hybrid_runs.need_floor: decode steps of other sequences only evict cached blocks (and free used ones), and
    through any number of them an admission's need stays at or above the floor taken before them."""
    pool = HybridPool(40, B, LAYOUTS[name])
    floor = None
    for op, seq, fam, k in steps:
        if op == "add" and not pool.has_seq(seq) and floor is None:
            m = 4 * (2 + fam) + seq % 3
            if pool.can_allocate(m, family_keys(fam)[: m // B]):
                pool.allocate(seq, m, family_keys(fam)[: m // B])
        elif op == "release" and pool.has_seq(seq) and floor is None:
            pool.release(seq)
        elif op == "run" and pool.seq_ids:
            if floor is None:
                need, chunk, total = admission_need(pool, family, n, budget)
                floor = hybrid_runs.need_floor(pool, need, total < n, chunk if total < n else budget)
            for _ in range(k % 5):
                if not step(pool, list(pool.seq_ids)):
                    break
                assert admission_need(pool, family, n, budget)[0] >= floor


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_need_falls_as_cached_hits_are_evicted_but_not_below_the_floor(name):
    """A released prompt's cached blocks are a later admission's hits, each costing a block (revived from the LRU);
    decode steps of two other sequences evict them oldest first, and with the first chunk cut by a 2-token budget
    the need falls (sliding+chunked: 12 -> 4 blocks, 4 groups x ceil(2 / 4)) — to the floor, never below it."""
    pool = HybridPool(40, B, LAYOUTS[name])
    pool.allocate(9, 16, family_keys(0))
    pool.release(9)
    for seq, family in ((1, 1), (2, 3)):
        pool.allocate(seq, 9, family_keys(family)[:2])
    need, chunk, total = admission_need(pool, 0, 16, 2)
    floor = hybrid_runs.need_floor(pool, need, total < 16, chunk)
    assert (chunk, total, floor) == (2, 14, len(LAYOUTS[name]))
    needs = [need]
    while step(pool, [1, 2]):
        needs.append(admission_need(pool, 0, 16, 2)[0])
    assert min(needs) >= floor
    assert name == "window of blocks" or min(needs) == floor < need  # its wide window keeps every hit to the end


def test_a_floor_that_forgets_the_budget_is_caught(monkeypatch):
    """Planted: the floor taken as the need itself (true only while the chunk ends at the prompt's end)."""
    monkeypatch.setattr(hybrid_runs, "need_floor", lambda pool, need, cut, budget: need)
    with pytest.raises(AssertionError):
        test_the_need_falls_as_cached_hits_are_evicted_but_not_below_the_floor("sliding+chunked")


@pytest.mark.parametrize("name", list(LAYOUTS))
@settings(max_examples=60, deadline=None)
@given(steps=ops, family=st.integers(0, 3), n=st.integers(8, 16), budget=st.integers(1, 12))
def test_evictions_before_the_first_looked_up_block_leave_the_look_up(name, steps, family, n, budget):
    """hybrid_runs.evictable: while decode steps hand out no more than that many blocks off the free queue's head,
    the admission's look-up (its hit plan, whole prompt and first chunk) is the same and its need no lower."""
    pool = HybridPool(40, B, LAYOUTS[name])
    keys = family_keys(family)[: n // B]
    for op, seq, fam, k in steps:
        if op == "add" and not pool.has_seq(seq):
            m = 4 * (2 + fam) + seq % 3
            if pool.can_allocate(m, family_keys(fam)[: m // B]):
                pool.allocate(seq, m, family_keys(fam)[: m // B])
        elif op == "release" and pool.has_seq(seq):
            pool.release(seq)
        elif op == "run" and pool.seq_ids:
            need, _, total = admission_need(pool, family, n, budget)
            plans = [pool._hit_plan(t, keys[: t // B], None)[:2] for t in (n, total)]
            allowed, handed = hybrid_runs.evictable(pool, n, keys), pool.store.counters["allocated_blocks"]
            for _ in range(k % 6):
                if not step(pool, list(pool.seq_ids)) or pool.store.counters["allocated_blocks"] - handed > allowed:
                    break
                assert [pool._hit_plan(t, keys[: t // B], None)[:2] for t in (n, total)] == plans
                assert admission_need(pool, family, n, budget)[0] >= need


@pytest.mark.parametrize(("name", "never_used"), [("sliding+chunked", 40 - 16 - 12 - 4), ("narrow window",
                                                                                    40 - 12 - 9 - 3)])
def test_evictions_up_to_the_first_looked_up_block_and_past_it(name, never_used):
    """The released prompt's blocks are the oldest freed, and its look-up reads all but the first of them: the
    never-used blocks and that one may be handed out, and the hand-out after them changes the hit plan (a looser
    evictable is caught here). Ids: the 16-token prompt 4 blocks a table (4 or 3 tables), released table by table,
    each tail first, so its full table's block 3 (no hit reads it: at most (16 − 1) // 4 = 3 blocks) is the first
    freed; sequence 1 takes 3 blocks a table, sequence 2 (the same keys) hits (9 − 1) // 4 = 2 of them and takes 1."""
    pool = HybridPool(40, B, LAYOUTS[name])
    pool.allocate(9, 16, family_keys(0))
    pool.release(9)
    for seq, family in ((1, 1), (2, 3)):
        pool.allocate(seq, 9, family_keys(family)[:2])
    plan = pool._hit_plan(16, family_keys(0), None)[:2]
    allowed, handed = hybrid_runs.evictable(pool, 16, family_keys(0)), pool.store.counters["allocated_blocks"]
    assert allowed == never_used + 1
    while pool.store.counters["allocated_blocks"] - handed <= allowed:
        assert pool._hit_plan(16, family_keys(0), None)[:2] == plan
        assert step(pool, [1, 2])
    assert pool._hit_plan(16, family_keys(0), None)[:2] != plan


@pytest.mark.parametrize("name", list(LAYOUTS))
@settings(max_examples=60, deadline=None)
@given(steps=ops, family=st.integers(0, 3), n=st.integers(5, 16), chunks=st.lists(st.integers(1, 16), max_size=4))
def test_a_first_chunks_plan_from_the_whole_prompts_is_the_look_up(name, steps, family, n, chunks):
    """HybridHits._prefix_plan: a chunk's hit plan taken from its whole prompt's kept one (as the scheduler asks:
    the whole prompt's hit, then its first chunk) equals the chunk's own look-up, on random pools; so does a chain's
    look-up of the chunk from the whole prompt's kept one (PrefixIndex._prefix_probe)."""
    pool = HybridPool(40, B, LAYOUTS[name])
    prompt = np.array(family_keys(family)[: n // B])  # one array, sliced anew per chunk: views, as the sim's
    for op, seq, fam, k in steps:
        if op == "add" and not pool.has_seq(seq):
            m = 4 * (2 + fam) + seq % 3
            if pool.can_allocate(m, family_keys(fam)[: m // B]):
                pool.allocate(seq, m, family_keys(fam)[: m // B])
        elif op == "release" and pool.has_seq(seq):
            pool.release(seq)
        elif op == "run" and pool.seq_ids:
            for _ in range(k % 4):
                if not step(pool, list(pool.seq_ids)):
                    break
        whole = pool._hit_plan(n, prompt[:], None)
        for total in (min(whole[0] * B + c, n) for c in chunks):
            kept = pool._hit_plan(total, prompt[: total // B], None)
            pool._plan_memo = None
            fresh = pool._hit_plan(total, prompt[: total // B], None)
            assert kept[:2] == fresh[:2]
            assert all((a is None and b is None) or np.array_equal(a, b)
                       for a, b in zip(kept[2], fresh[2], strict=True))
            pool._hit_plan(n, prompt[:], None)  # the whole prompt's kept again
            extra = (pool.anchor, None)  # the full group's chain: a kept look-up's first keys (PrefixIndex.probe)
            for tokens in (total, min(total - total % B, n) or total):  # the chunk, and a whole-block prefix of it
                pool.prefix.probe(n, prompt, extra)
                short, now = pool.prefix.probe(tokens, prompt[: tokens // B], extra), pool.prefix._probe_now(
                    tokens, prompt[: tokens // B], extra)
                assert all(np.array_equal(a, b) for a, b in zip(short, now, strict=True))
