"""skip_ordered of many sequences (hybrid_ordered._skip_many: every rule's first kept block for all sequences at
once, then only the tables that free anything, in the loop's order) is the per-sequence loop: the one-pass step's
hypothesis test (test_hybrid_ordered) run with every step of its window and chunk layouts taken that way, and a
step of many sequences whose windows free shared and cached blocks at different points."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcalc.core.pool import hybrid_ordered
from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid import HybridPool
from kvcalc.core.pool.hybrid_ordered import label, skip_ordered

from . import test_hybrid_ordered as one_pass
from .test_hybrid_ordered import B, family_keys, state


@pytest.mark.parametrize("name", ["sliding+chunked", "narrow window"])
def test_every_step_through_skip_many_is_the_loop(monkeypatch, name):
    calls = []
    real = hybrid_ordered._skip_many
    monkeypatch.setattr(hybrid_ordered, "MANY", 0)
    monkeypatch.setattr(hybrid_ordered, "_skip_many", lambda *a: calls.append(1) or real(*a))
    one_pass.test_a_step_in_one_pass_is_the_per_sequence_loop(name=name, mode="none")
    assert calls  # the array path was taken


def test_many_sequences_free_in_the_loops_order():
    """Twelve sequences of three families (hits share blocks; each family's first prompt released, its blocks
    cached) at different lengths: one skip_ordered of all of them (> MANY) against free_skipped one by one."""
    groups = (PoolGroup("full"), PoolGroup("sliding", 6), PoolGroup("sliding", 6), PoolGroup("chunked", 8))
    pool = HybridPool(400, B, groups)
    for seq in range(12):
        n = 8 + seq % 3 * 4  # 8, 12 or 16 tokens of the family's prompt
        pool.allocate(seq, n, family_keys(seq % 3)[: n // B])
        label(pool, seq)
    pool.release(0)
    ids = list(range(1, 12))
    for s, add in zip(ids, [1, 5, 9, 2, 6, 10, 3, 7, 11, 4, 8], strict=True):
        pool.append_fitting(s, add, None)
    loop = copy.deepcopy(pool)
    assert len(ids) > hybrid_ordered.MANY
    freed = skip_ordered(pool, ids)
    for s in ids:
        loop.free_skipped(s)
    assert state(pool) == state(loop)
    assert freed > len(ids)  # most tables freed something, some several blocks


@given(blocks=st.lists(st.integers(0, 199), min_size=1, max_size=150), reuse=st.booleans())
def test_distinct_is_the_set(blocks, reuse):
    """hybrid_ordered._distinct (a set for up to 64 ids, a mark per place beyond) says what a set says, also with
    its scratch array left as an earlier call wrote it."""
    store = HybridPool(200, B, (PoolGroup("full"),)).store
    if reuse:
        hybrid_ordered._distinct(store, np.arange(150, dtype=np.int64)[::-1])
    held = np.array(blocks, dtype=np.int64)
    assert hybrid_ordered._distinct(store, held) == (len(set(blocks)) == len(blocks))
