"""The duplicate lists of a cache entry (core/pool/dup_lists.py) against a dict of insertion-ordered lists, vLLM's
BlockHashToBlockMap: an entry's blocks in insertion order, the first is the one a look-up finds, an eviction drops
only the evicted block (the next takes the entry)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.dup_lists import DupLists

N = 24


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "add", "evict"]), st.integers(0, 5), st.integers(0, N - 1)),
                max_size=80))
def test_lists_are_insertion_ordered_entries(ops: list[tuple[str, int, int]]) -> None:
    lists = DupLists(N)
    model: dict[int, list[int]] = {}  # entry -> its blocks, earliest first (the head is [0])
    where: dict[int, int] = {}  # block -> its entry
    for op, entry, block in ops:
        if op == "add" and block not in where:
            if entry in model:  # a duplicate: behind the blocks there
                lists.append(np.array([model[entry][0]]), np.array([block]))
                model[entry].append(block)
            else:
                model[entry] = [block]
            where[block] = entry
        elif op == "evict" and block in where:
            entry = where.pop(block)
            head = model[entry][0]
            now = lists.remove(block, head)
            model[entry].remove(block)
            assert now == (model[entry][0] if model[entry] else -1)
            if not model[entry]:
                del model[entry]
        heads = np.array([blocks[0] for blocks in model.values()], dtype=np.intp)
        lists.check(heads)
        for blocks in model.values():
            assert lists.members(blocks[0]) == blocks[1:]
            assert all(lists.head_of(b) == blocks[0] for b in blocks)
        assert lists.num_members == sum(len(b) - 1 for b in model.values())


def test_append_many_to_one_head_keeps_their_order() -> None:
    lists = DupLists(8)
    lists.append(np.array([0, 0, 3, 0]), np.array([5, 1, 4, 7]))
    assert lists.members(0) == [5, 1, 7] and lists.members(3) == [4]
    assert lists.take_out(0) == [0, 5, 1, 7] and lists.num_members == 1
    members, heads = lists.grouped(np.array([3]))
    assert members.tolist() == [4] and heads.tolist() == [3]
