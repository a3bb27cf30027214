"""The prefix look-up (core/pool/prefix_lookup): a hit is a chain of cached blocks from the root, and a
hole in the chain ends it."""

from __future__ import annotations

import numpy as np

from kvcalc.core.pool.block_pool import BlockPool


def test_hole_in_the_chain_stops_the_hit() -> None:
    """Issue 20's ten pool calls: block 0's hash (k0) is evicted while block 1's (k1, chained after k0) is
    still cached. The look-up finds [miss, hit]; before the fix it accepted block id -1 (a miss read as an
    id: the last physical block) as the first hit, and handed out a table holding -1."""
    pool = BlockPool(4, 4)  # 4 blocks of 4 tokens
    k0, k1 = 100, 101
    pool.allocate("x", 12)  # blocks 0, 1, 2, no keys
    pool.allocate("A", 4, np.array([k0]))  # block 3, indexed under k0
    pool.release("x")  # 0, 1, 2 back on the plain stack
    pool.allocate("B", 4, np.array([k0]))  # k0 is A's: B's block stays unindexed
    pool.append("B", 4, np.array([k1]))  # B's second block indexed under (k0, k1)
    pool.release("A")  # block 3 cached free
    pool.allocate("y", 8)  # the last plain block, then evicts block 3: k0 is gone
    pool.release("B")
    pool.release("y")
    # a 9-token prompt: 2 full blocks may hit (the block of the last token never does); k0 misses, so
    # nothing may: the hit is 0 tokens even though k1's block is cached
    assert pool.hit_tokens(9, np.array([k0, k1])) == 0
    assert pool.allocate("C", 9, np.array([k0, k1])) == 0
    table = pool.block_table("C")
    assert table.min() >= 0 and len(set(table.tolist())) == 3
    pool.check_invariants()
