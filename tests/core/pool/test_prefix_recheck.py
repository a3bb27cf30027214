"""A kept look-up re-checked after the index changed (prefix_lookup.PrefixIndex.probe / _recheck) is the look-up
done afresh: the same verified hits, the same found blocks, the same slots (where a miss would be inserted)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.block_pool import BlockPool

_PROMPTS = [np.array(keys, dtype=np.int64) for keys in ([0, 1, 0, 1], [0, 1, 1], [1, 0, 0, 0], [0, 0], [1])]


def _same(kept, fresh) -> bool:
    return all(np.array_equal(a, b) for a, b in zip(kept, fresh, strict=True))


@settings(max_examples=150, deadline=None)
@given(st.integers(3, 8), st.lists(st.tuples(st.sampled_from(["alloc", "append", "release"]), st.integers(0, 4),
                                             st.integers(1, 17), st.integers(0, 4)), max_size=60))
def test_a_kept_look_up_is_the_fresh_one(num_blocks: int, ops: list[tuple[str, int, int, int]]) -> None:
    """Random allocate / append / release in a pool of 3-8 blocks of 4 tokens, prompts from five short key lists
    sharing prefixes (hits, evictions, a hash-index of 64 slots rebuilt every 16 deletions). After every operation
    each of the five prompts is looked up through the kept look-ups (probe) and afresh (_probe_now): equal."""
    B = 4
    pool = BlockPool(num_blocks, B)
    live: dict[int, int] = {}  # seq -> tokens
    for op, seq, tokens, prompt in ops:
        keys = _PROMPTS[prompt]
        if op == "alloc" and seq not in live:
            keys = keys[: tokens // B]
            if pool.can_allocate(tokens, keys):
                pool.allocate(seq, tokens, keys)
                live[seq] = tokens
        elif op == "append" and seq in live:
            total = live[seq] + tokens
            new_keys = np.arange(total // B - live[seq] // B, dtype=np.int64) % 2  # the blocks it completes
            if pool.append_need(seq, tokens) <= pool.num_free_blocks:
                pool.append(seq, tokens, new_keys)
                live[seq] = total
        elif op == "release" and seq in live:
            pool.release(seq)
            del live[seq]
        for keys in _PROMPTS:
            for tokens in (len(keys) * B, len(keys) * B + 1):
                kept = pool.prefix.probe(tokens, keys, None)
                assert _same(kept, pool.prefix._probe_now(tokens, keys, None))
    pool.check_invariants()
