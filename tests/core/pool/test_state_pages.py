"""A state group under mamba_cache_mode none holds one page a sequence through every operation (core/pool/
state_pages.py): growth by a token or a chunk, a fork's copy-on-write, speculative slots, a swap's re-allocation;
and a state page's slots are all useful (usage). Figures by hand, then a random walk against the invariants."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.free_queue import USED
from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid import HybridPool
from kvcalc.core.pool.store import PoolExhaustedError

B = 4
GROUPS = (PoolGroup("full"), PoolGroup("state"))


def test_a_prefill_chunk_takes_no_state_page() -> None:
    pool = HybridPool(20, B, GROUPS, state_mode="none")
    pool.allocate(0, 7)  # full ceil(7 / 4) = 2, state the page of token 6: 3 blocks
    assert pool.num_used == 3 and pool.append_need(0, 33) == 8  # full ceil(40 / 4) − 2 = 8 more; the state 0
    assert pool.append(0, 33) == []  # the page moves from block 1 to block 9 in place: no copy
    assert pool.num_used == 10 + 1 and pool.held_blocks(0) == [10, 1]
    # usage: 40 tokens in 10 full blocks (no tail), the state page a whole state of 4 slots
    usage = pool.usage()
    assert (usage.useful_tokens, usage.tail_fragmentation_slots) == (40 + 4, 0)
    pool.check_invariants()


def test_a_forked_state_page_is_copied_once_per_writing_branch() -> None:
    pool = HybridPool(30, B, GROUPS, state_mode="none")
    pool.allocate(0, 8)  # 2 full blocks, the state page of token 7 (block 1), full
    pool.fork(0, 1)
    pool.fork(0, 2)
    assert pool.num_used == 3  # all shared
    # branch 1 grows into block 2: a new full block, and its own copy of the shared state page
    page = int(pool.block_tables(0)[1][1])
    copies = pool.append(1, 1)
    assert len(copies) == 1 and copies[0][0] == page and pool.num_used == 5
    assert pool.append(2, 1)[0][0] == page and pool.num_used == 7  # branch 2 too
    assert pool.append(0, 1) == [] and pool.num_used == 8  # the parent, the last holder, writes it in place
    assert pool.held_blocks(0) == pool.held_blocks(1) == pool.held_blocks(2) == [3, 1]
    assert pool.stats().cow_copies == 2
    # usage: full blocks 0, 1 shared (8 tokens) + 3 own blocks of 1 token; 3 whole state pages
    usage = pool.usage()
    assert (usage.used_blocks, usage.useful_tokens, usage.tail_fragmentation_slots) == (8, 8 + 3 + 12, 3 * 3)
    pool.check_invariants()


def test_swap_in_takes_one_page() -> None:
    pool = HybridPool(30, B, GROUPS, state_mode="none")
    pool.allocate(0, 13, computed_tokens=12)  # a swapped-out sequence back at 13 tokens: 4 full + the page of 12
    assert pool.held_blocks(0) == [4, 1] and pool.num_used == 5


@given(ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9), st.integers(1, 9)), max_size=40),
       policy=st.sampled_from(["keep", "free"]), caching=st.booleans())
@settings(max_examples=150, deadline=None)
def test_one_state_page_outside_a_reservation(ops, policy, caching) -> None:
    groups = (PoolGroup("full"), PoolGroup("state"), PoolGroup("sliding", 6), PoolGroup("state"))
    pool = HybridPool(40, B, groups, state_mode="none", enable_prefix_caching=caching, rollback_policy=policy)
    live: list[int] = []
    for n, (op, pick, size) in enumerate(ops):
        seq = live[pick % len(live)] if live else None
        open_slots = None if seq is None else pool.pools[0].reservation(seq)
        try:
            if seq is None or op == 0:
                pool.allocate(n, size)
                live.append(n)
            elif op == 1 and open_slots is None:
                pool.append(seq, size)
            elif op == 2 and open_slots is None:
                pool.fork(seq, n)
                live.append(n)
            elif op == 3:
                pool.release(seq)
                live.remove(seq)
            elif op == 4 and open_slots is None:
                pool.reserve(seq, size)
            elif op == 5 and open_slots is not None:
                pool.commit(seq, min(size - 1, open_slots.num_slots))
        except PoolExhaustedError:
            pass
        pool.check_invariants()
        for s in live:
            if pool.pools[0].reservation(s) is None:
                held = pool.held_blocks(s)
                assert held[1] == held[3] == 1, (s, held)
        # a state page is all useful: the tail is the unused slots of the other blocks in use (full, sliding, and
        # speculative ones kept past a table), counted block by block
        state = {int(b) for g, p in zip(groups, pool.pools, strict=True) if g.kind == "state"
                 for t in [*(q.blocks for q in p.seqs.values()), *p.spec.kept.values()] for b in t}
        used = np.flatnonzero(pool.store.state == USED).tolist()
        assert pool.usage().tail_fragmentation_slots == sum(B - int(pool.store.fill[b]) for b in used if b not in state)
