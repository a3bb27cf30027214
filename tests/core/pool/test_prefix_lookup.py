"""The prefix look-up (core/pool/prefix_lookup): a hit is a chain of cached blocks from the root, and a
hole in the chain ends it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvcalc.core.pool import prefix_lookup
from kvcalc.core.pool.block_pool import BlockPool


def test_hole_in_the_chain_stops_the_hit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20: a look-up that finds [miss, hit] accepted block id -1 (a miss read as an id: the last physical
    block) as the first hit, and handed out a table holding -1. Issue 20's ten pool calls made the hole by evicting
    block 0's hash while a duplicate's child stayed cached; duplicates now keep their content's entry (vLLM caches
    them too), so the hole comes from a hash that depends on a block's own key only: (k5, k1)'s second block sits
    under k1's hash, where the prompt (k0, k1) looks for its second block after missing its first."""
    monkeypatch.setattr(prefix_lookup, "chain_hashes", lambda parent, keys: np.asarray(keys, dtype=np.uint64) * 7919)
    pool = BlockPool(4, 4)  # 4 blocks of 4 tokens
    k0, k1, k5 = 100, 101, 105
    pool.allocate("A", 8, np.array([k5, k1]))  # blocks 0, 1 indexed under k5's and k1's hashes
    pool.release("A")
    # a 9-token prompt: 2 full blocks may hit (the block of the last token never does); k0 misses, so
    # nothing may: the hit is 0 tokens even though a block sits under k1's hash
    assert pool.hit_tokens(9, np.array([k0, k1])) == 0
    assert pool.allocate("C", 9, np.array([k0, k1])) == 0
    table = pool.block_table("C")
    assert table.min() >= 0 and len(set(table.tolist())) == 3
    pool.check_invariants()


ISSUE_20_OPS = [("alloc", 0, 12, []), ("alloc", 1, 4, [0]), ("release", 0, 1, []), ("alloc", 2, 4, [0]),
                ("append", 2, 4, [1]), ("release", 1, 1, []), ("alloc", 3, 8, []), ("release", 2, 1, []),
                ("release", 3, 1, []), ("alloc", 0, 9, [0, 1])]


@settings(max_examples=200, deadline=None)
@example(4, ISSUE_20_OPS)
@given(st.integers(3, 6), st.lists(st.tuples(st.sampled_from(["alloc", "append", "release"]), st.integers(0, 3),
                                             st.integers(1, 13), st.lists(st.integers(0, 1), max_size=4)),
                                   max_size=40))
def test_every_hit_block_holds_the_prompts_content(num_blocks: int, ops: list[tuple[str, int, int, list[int]]]) -> None:
    """Random allocate / append / release in a pool of 3-6 blocks of 4 tokens, keys 0 or 1 (so
    chains share prefixes, blocks are evicted and holes appear). An independent record of what each physical
    block was last written with (the chain of keys from the root, or None) must agree with every hit: the
    hit blocks hold exactly the prompt's chain, no table holds a negative id, the invariants hold."""
    B = 4
    pool = BlockPool(num_blocks, B)
    content: dict[int, tuple[int, ...] | None] = {}  # physical block -> the chain written in it
    live: dict[int, tuple[int, list[int]]] = {}  # seq -> (tokens, its keys so far)
    for op, seq, tokens, raw in ops:
        if op == "alloc" and seq not in live:
            keys = raw[: tokens // B]
            if not pool.can_allocate(tokens, np.array(keys, dtype=np.int64)):
                continue
            hits = pool.allocate(seq, tokens, np.array(keys, dtype=np.int64)) // B
            table = pool.block_table(seq).tolist()
            assert min(table) >= 0 and len(set(table)) == len(table)
            for i, block in enumerate(table):
                chain = tuple(keys[: i + 1]) if i < len(keys) else None
                if i < hits:
                    assert content.get(block) == chain, (i, block, content.get(block), chain)
                else:
                    content[block] = chain
            live[seq] = (tokens, list(keys))
        elif op == "append" and seq in live:
            old, keys = live[seq]
            new_total = old + tokens
            completed = [k for k in raw][: new_total // B - old // B]
            if len(keys) < old // B or len(completed) < new_total // B - old // B:
                completed = []  # keys only when every completed block (and every earlier one) has one
            if not pool.can_append(seq, tokens):
                continue
            pool.append(seq, tokens, np.array(completed, dtype=np.int64) if completed else None)
            table = pool.block_table(seq).tolist()
            keys = keys + completed if completed else keys
            for i in range(old // B, len(table)):  # the partial block written on, and the new ones
                content[table[i]] = tuple(keys[: i + 1]) if i < len(keys) else None
            live[seq] = (new_total, keys)
        elif op == "release" and seq in live:
            pool.release(seq)
            del live[seq]
        pool.check_invariants()
