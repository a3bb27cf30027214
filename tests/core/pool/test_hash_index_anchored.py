"""The anchored map (core/pool/anchored_map.py) against every anchored block in the hash index itself.

Two hybrid pools take the same random allocations, appends and releases: one registers its sliding, chunked and
align/all-state blocks in the anchored map (the default), the reference indexes each under its derived hash
(`map_anchored = False`: group_hits' index path, as for mixed block sizes). Pools this small evict all the time, so
anchors are evicted before and after their anchored blocks, stale entries are dropped or refused, and blocks move
from the map into the index. After every operation both must be the same pool, block for block: the hits of
every prompt (each group's own too), every block's state, references, version and whether it is hashed, the free
queue's order, the counters, every table; and both pass check_invariants.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.anchored_map import AnchoredMap
from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid import HybridPool

B = 4
GROUPS = {
    "sliding": (PoolGroup("full"), PoolGroup("sliding", 6), PoolGroup("sliding", 9)),
    "mixed kinds": (PoolGroup("full"), PoolGroup("sliding", 6), PoolGroup("chunked", 8), PoolGroup("state")),
}
PROMPTS = [[0, 1, 0, 1, 2, 0], [0, 1, 0, 2, 2], [0, 1, 1], [2, 0, 1, 0, 1, 0, 1], [0, 1, 0, 1, 2, 1]]


def _keys(prompt: int, blocks: int) -> list[tuple[int, int]]:
    return [(prompt, k) for k in PROMPTS[prompt][:blocks]] + [(prompt, 9)] * max(blocks - len(PROMPTS[prompt]), 0)


def _same(a: HybridPool, b: HybridPool, live: dict[int, tuple[int, int]]) -> None:
    sa, sb = a.store, b.store
    for name in ("state", "ref", "version", "fill"):
        assert np.array_equal(getattr(sa, name), getattr(sb, name)), f"block {name}s differ"
    assert np.array_equal(sa.block_slot >= 0, sb.block_slot >= 0), "hashed blocks differ"
    assert a.pools[0].free_queue_order() == b.pools[0].free_queue_order(), "free queues differ"
    assert sa.counters == sb.counters
    for seq in live:
        for pa, pb in zip(a.pools, b.pools, strict=True):
            assert np.array_equal(pa.block_table(seq), pb.block_table(seq)), "tables differ"
    for prompt in range(len(PROMPTS)):
        for tokens in (4 * B, 6 * B + 1, 8 * B):
            keys = _keys(prompt, tokens // B)
            assert a.group_hit_tokens(tokens, keys) == b.group_hit_tokens(tokens, keys)
            assert a.hit_tokens(tokens, keys) == b.hit_tokens(tokens, keys)


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(sorted(GROUPS)), st.sampled_from(["align", "all"]), st.integers(14, 40),
       st.lists(st.tuples(st.sampled_from(["alloc", "append", "release"]), st.integers(0, 5), st.integers(1, 14),
                          st.integers(0, len(PROMPTS) - 1)), max_size=50))
def test_the_anchored_map_is_the_index(kinds: str, mode: str, num_blocks: int,
                                       ops: list[tuple[str, int, int, int]]) -> None:
    pools = [HybridPool(num_blocks, B, GROUPS[kinds], state_mode=mode) for _ in range(2)]
    pools[1].store.index.map_anchored = False
    live: dict[int, tuple[int, int]] = {}  # seq -> (prompt, tokens)
    for op, seq, tokens, prompt in ops:
        if op == "alloc" and seq not in live:
            keys = _keys(prompt, tokens // B)
            if not pools[0].can_allocate(tokens, keys):
                assert not pools[1].can_allocate(tokens, keys)
                continue
            assert len({p.allocate(seq, tokens, keys) for p in pools}) == 1
            live[seq] = (prompt, tokens)
        elif op == "append" and seq in live:
            prompt, old = live[seq]
            if not pools[0].can_append(seq, tokens):
                assert not pools[1].can_append(seq, tokens)
                continue
            keys = _keys(prompt, (old + tokens) // B)[old // B:]
            for p in pools:
                p.append(seq, tokens, keys)
            live[seq] = (prompt, old + tokens)
        elif op == "release" and seq in live:
            for p in pools:
                p.release(seq)
            del live[seq]
        for p in pools:
            p.check_invariants()
        _same(*pools, live)


def test_rows_orphaned_when_their_anchor_goes_come_back_with_their_content_as_in_the_index() -> None:
    """A 6-block prompt (25 tokens, B 4: 6 full blocks) is allocated and released; a filler allocation evicts the
    oldest free blocks — its full group's blocks (anchors) before the sliding groups' last windows — and the prompt
    comes again: its full blocks are recomputed under the same chain hashes (new content classes), and the sliding
    blocks still cached under the old ones are found again (the map: ghost rows revived; the index: their content,
    the anchor's key after its parent content, compared), as vLLM finds a window's block by its own hash. The pools
    of 21-28 blocks cover it; each must equal the reference pool block for block."""
    groups = GROUPS["sliding"]
    prompt = [("p", i) for i in range(6)]
    revived = 0
    for num_blocks, filler in [(21, 1), (22, 1), (24, 2), (25, 2), (27, 3), (28, 3)]:
        pools = [HybridPool(num_blocks, B, groups, state_mode="align") for _ in range(2)]
        pools[1].store.index.map_anchored = False
        ghosts = 0
        for p in pools:
            p.allocate(1, 25, prompt)
            p.release(1)
            p.allocate(2, B * filler)
            anchored = p.store.index.anchored
            assert isinstance(anchored, AnchoredMap)
            ghosts = len(anchored.ghosts) if p is pools[0] else ghosts
            p.allocate(3, 25, prompt)
            p.check_invariants()
        anchored = pools[0].store.index.anchored
        assert isinstance(anchored, AnchoredMap)
        revived += ghosts - len(anchored.ghosts)
        _same(*pools, {2: (0, B * filler), 3: (0, 25)})
    assert revived >= 6
