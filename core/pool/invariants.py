"""What the block pool promises, checked from scratch (tests call it after every operation; O(pool +
table entries)):

    free + used + pending = total; pending only inside a step; a free or pending block has ref 0
    ref(b) = the number of live tables holding b, each table holding a block at most once; a table of n
    tokens has ceil(n / B) blocks less the s leading ones it skipped (a sliding, chunked or state group
    freed them; they were full); kept speculative blocks are held past it: ref 1, empty; so is the page an
    align step that jumped resumed from, until the sequence's next step
    every holder of a block agrees on its fill (no block with ref > 1 was written behind the others' back)
    counters (used blocks, useful and logical tokens, logical blocks) equal what they count
    hash-index entries match their blocks; only full blocks are hashed; the LRU holds only hashed blocks
    no live sequence (and no running step): no block in use
    weighted tables (core/pool/weighted.py): the counters count units, Σ weight of the blocks they count; the
    free units plain + cached never exceed the pool's units and never go negative (the queue's own check)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..blocks import ceil_div
from .free_queue import FREE_CACHED, FREE_PLAIN, PENDING, USED
from .store import BlockStore
from .weighted import WeightedStore


def check_pool_invariants(
    store: BlockStore, tables: Sequence[tuple[np.ndarray, int, int]], *, in_step: bool, logical_blocks: int,
    logical_tokens: int, spare: Sequence[np.ndarray] = (), resumed: Sequence[np.ndarray] = (),
) -> None:
    """Raise AssertionError naming the first broken invariant of a pool: its store, the (held blocks, tokens,
    skipped blocks) of every live sequence (of every layer group of a hybrid pool), whether a step is
    running, and its logical-block (blocks held) and logical-token counters.
    `spare`: blocks that sequences hold past their tables (speculative slots kept by a rollback); `resumed`: the
    pages jumps of mode align resumed from, held past the tables until the next step (state_pages)."""
    n, B = store.num_blocks, store.block_size
    state, ref, fill, hashed = store.state, store.ref, store.fill, store.hashed
    counts = np.bincount(state, minlength=4)
    used, plain, cached, pending = (int(counts[s]) for s in (USED, FREE_PLAIN, FREE_CACHED, PENDING))
    assert used + plain + cached + pending == n, "block states do not add up to the pool"
    if isinstance(store, WeightedStore):  # counters in units: a block of weight k counts k (weighted.py)
        weight = store.weight
        used = int(weight[state == USED].sum())
        cached, pending = (int(weight[state == s].sum()) for s in (FREE_CACHED, PENDING))
        plain = store.num_units - used - cached - pending  # a plain id holds no unit (ids are over-provisioned)
        assert plain >= 0, f"blocks hold {used + cached + pending} units, the pool has {store.num_units}"
    assert used == store.num_used, f"{used} USED blocks, counter says {store.num_used}"
    assert plain + cached == len(store.queue), "free-queue length differs from the free blocks"
    assert pending == 0 or in_step, "blocks pending outside a step"
    store.queue.check()
    assert np.all(ref[state != USED] == 0), "a free or pending block has ref > 0"
    # ref(b) = number of live tables holding b; a table holds a block at most once
    held = np.concatenate([t for t, _, _ in tables] + list(spare) + list(resumed)) if tables else (
        np.empty(0, dtype=np.int64))
    for t, num_tokens, skipped in tables:
        assert len(np.unique(t)) == len(t), "a block table holds one block twice"
        assert len(t) == ceil_div(num_tokens, B) - skipped, "a block table's length disagrees with its tokens"
    expected_ref = np.bincount(held, minlength=n)
    bad = np.flatnonzero(expected_ref != ref)
    assert len(bad) == 0, f"block {bad[:1].tolist()} ref {ref[bad[:1]].tolist()} but held by {expected_ref[bad[:1]]}"
    assert np.all(state[held] == USED), "a live table holds a free block"
    # every holder agrees on how full a block is: nobody wrote a shared block behind the others' back
    for t, num_tokens, skipped in tables:
        implied = np.minimum(B, num_tokens - B * np.arange(skipped, skipped + len(t)))
        assert np.array_equal(fill[t], implied), "a block's fill disagrees with a table"
    assert np.all(fill[state == FREE_PLAIN] == 0), "a block on the plain free stack still holds tokens"
    assert all(np.all(fill[s] == 0) for s in spare), "a kept speculative block holds tokens"
    assert store.useful_tokens == int(fill[state == USED].sum()), "useful-token counter is off"
    assert logical_blocks == len(held), "logical-block counter is off"
    assert logical_tokens == sum(num_tokens for _, num_tokens, _ in tables), "logical-token counter is off"
    # hash entries match their blocks; only full blocks are hashed; the LRU holds only hashed blocks
    store.index.check()
    keys, vals = store.index.items()
    assert store.index.num_live == len(vals), "hash-index live count is off"
    assert np.all(hashed[vals]) and np.array_equal(store.block_hash[vals], keys), "a hash entry mismatches"
    assert int(hashed.sum()) == len(vals) + store.index.dups.num_members + store.index.num_lazy, (
        "a hashed block is missing from the hash index")
    assert np.all(fill[hashed] == B), "a hashed block is not full"
    assert np.all(hashed[state == FREE_CACHED]), "an unhashed block sits in the LRU cache"
    if not tables and not in_step:
        assert used == 0 and pending == 0, "no sequence is live but blocks are still used"
