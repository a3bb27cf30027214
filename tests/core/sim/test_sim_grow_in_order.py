"""A decode step's growth on a hybrid pool in vLLM's order (GroupedPagedPolicy.grow_many): vLLM's scheduler takes
the running requests in order and, per request, frees what its own groups let go (remove_skipped_blocks) and then
allocates (allocate_slots), preempting from the back of the running queue when that does not fit. So a later
request's frees cannot pay for an earlier one's growth.

The reference is the policy grown one request at a time (`grow`: its own frees, then its own need against the free
blocks) with the preemption loop written here; the policy under test takes its batched step (`grow_many`, the
private, ordered and per-pair paths) and, where that refuses, the same loop. On random sliding-window, chunked
and state (mamba_cache_mode all, align, none) layouts, with and without prefix caching, in pools tight enough that
frees decide: the same preemptions, running queue, free blocks, blocks per group and table entries held after every
step."""

from __future__ import annotations

import numpy as np
from hybrid_layouts import hybrid_groups
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.sim import fastforward_groups
from kvcalc.core.sim.paged_groups import GroupedPagedPolicy

N_REQUESTS = 6


def one_by_one(policy: GroupedPagedPolicy, running: list[int], tokens: dict[int, int]) -> list[int]:
    """The scheduler's one-by-one pass (each request grows by one token; a request that does not fit preempts
    from the back, itself last); returns the preempted, in order."""
    preempted, i = [], 0
    while i < len(running):
        rid = running[i]
        victim = None
        while not policy.grow(rid, tokens[rid] + 1):
            victim = running.pop()
            policy.release(victim, "preempted")
            preempted.append(victim)
            if victim == rid:
                break
        if victim == rid:
            break
        i += 1
    return preempted


def state(policy: GroupedPagedPolicy, running: list[int]) -> tuple:
    pool = policy.pool
    # which entries each table holds (not which block ids: the batched step hands out the blocks it freed in
    # another order, as the unchanged fast paths always did; the counts are what a step's fit decides)
    tables = [] if policy._private else [[(t >= 0).tolist() for t in pool.block_tables(r)] for r in running]
    return list(running), pool.num_free_blocks, policy.group_blocks(), tables


@st.composite
def layouts(draw):
    B, groups, mode = draw(hybrid_groups())
    prompts = draw(st.lists(st.integers(1, 6 * B), min_size=2, max_size=N_REQUESTS))
    keyed = draw(st.booleans())
    keys = [[draw(st.integers(0, 2)) for _ in range(n // B)] for n in prompts] if keyed else None
    blocks = draw(st.integers(len(groups) * 3, len(groups) * 12))
    return B, groups, prompts, keys, blocks, draw(st.integers(1, 4 * B)), mode


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_batched_growth_equals_growth_request_by_request(layout) -> None:
    B, groups, prompts, keys, blocks, steps, mode = layout
    keys = None if keys is None else [np.array([hash((k, i)) % 1000 for i, k in enumerate(ks)], dtype=np.int64)
                                      for ks in keys]  # a prefix repeats only from the first key on
    fast, ref = (GroupedPagedPolicy(blocks, B, groups, mode, len(prompts), keys) for _ in range(2))
    runs: list[list[int]] = [[], []]
    tokens: dict[int, int] = {}
    for rid, n in enumerate(prompts):
        hit = fast.hit_tokens(rid, n)
        assert ref.hit_tokens(rid, n) == hit
        if not fast.can_admit(rid, hit, n):
            break
        assert fast.admit(rid, hit, n) and ref.admit(rid, hit, n)
        runs[0].append(rid)
        runs[1].append(rid)
        tokens[rid] = n
    for _ in range(steps):
        running, ref_running = runs
        if not running:
            break
        batched = fast.grow_many(np.array(running), np.array([tokens[r] + 1 for r in running]))
        preempted = [] if batched else one_by_one(fast, running, tokens)
        assert one_by_one(ref, ref_running, tokens) == preempted
        assert state(fast, running) == state(ref, ref_running)
        for rid in running:
            tokens[rid] += 1
        for rid in preempted:
            del tokens[rid]
        runs = [running, ref_running]


def two_requests() -> GroupedPagedPolicy:
    """B = 4, a full table and a sliding one of window 5 (the next token c reads c − 4 .. c: blocks from
    (c − 4) // 4 on), 9 ids. A holds 4 tokens (1 block a table), B 10 (3 a table): 8 used, 1 free. In the next
    decode step A (first in the running queue) writes token 4: a new block in each table, 2 > 1 free; B writes
    token 10 in its last block and frees sliding block 0 ((10 − 4) // 4 = 1). vLLM preempts B for A; crediting
    B's free first would fit both (8 − 1 + 2 = 9)."""
    policy = GroupedPagedPolicy(9, 4, (PoolGroup("full"), PoolGroup("sliding", 5)), "none", 2)
    assert policy.admit(0, 0, 4) and policy.admit(1, 0, 10)
    assert (policy.pool.num_free_blocks, policy.group_blocks()) == (1, [4, 4])
    return policy


def test_a_later_requests_free_does_not_pay_for_an_earlier_growth() -> None:
    policy = two_requests()
    assert not policy.grow_many(np.array([0, 1]), np.array([5, 11]))
    # refused at A, before B's turn: nothing freed (vLLM has not reached B), nothing grown
    assert (policy.pool.num_free_blocks, policy.group_blocks()) == (1, [4, 4])
    running = [0, 1]
    assert one_by_one(policy, running, {0: 4, 1: 10}) == [1] and running == [0]
    assert (policy.pool.num_free_blocks, policy.group_blocks()) == (9 - 4, [2, 2])


def test_a_run_of_decode_steps_stops_before_a_step_only_frees_would_cover() -> None:
    policy = two_requests()
    # after step 0 the pool would hold A 2 + 2 and B 3 + 2 = 9 ≤ 9 blocks, but before it frees 8 + 2 > 9
    k, form = policy.decode_run(np.array([4, 10]), 3, waiting=False)
    assert form is not None and int(form.used[0]) == 9
    assert k == 0

    # and a run through finishes (nobody waits; both have 5 tokens to go): the same first step
    assert fastforward_groups._memory(policy, np.array([4, 10]), np.array([5, 5]), 3)[0] == 0
