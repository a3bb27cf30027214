"""The replay without eviction computed per hash id (core/share/id_replay.py) against the block pool itself: every
field of the result equal, on random traces with prefix-chained ids and without (ids from a small alphabet that
follow different ids in different requests, where only the trie of whole id sequences says what is equal), at
block sizes from 1 to 2,048, in arrival order with ties, with and without a capacity. The real traces at every
block size: tests/core/pool/test_prefix_replay.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.inputs.traces import Trace, first_unchained_id
from kvcalc.core.share import id_replay
from kvcalc.core.share.id_replay import trie_nodes
from kvcalc.core.share.replay import replay
from kvcalc.core.share.trace_blocks import check_trace


def make_trace(requests: list[tuple[float, int, int, list[int]]]) -> Trace:
    ids = [h for *_, hs in requests for h in hs]
    offsets = np.cumsum([0] + [len(hs) for *_, hs in requests]).astype(np.int64)
    return Trace("mooncake", "test", np.array([a for a, *_ in requests], np.float64),
                 np.array([p for _, p, _, _ in requests], np.int64), np.array([o for _, _, o, _ in requests], np.int64),
                 np.array(ids, np.int64), offsets)


def chained_ids(shapes: list[tuple[int, int]], need: list[int]) -> list[list[int]]:
    """Requests that continue an earlier request's ids (shape (earlier, keep)) with fresh ids: prefix-chained."""
    out: list[list[int]] = []
    fresh = 100
    for k, ((earlier, keep), n) in enumerate(zip(shapes, need, strict=True)):
        base = out[earlier % k][:keep] if k else []
        ids = base[:n] + list(range(fresh, fresh + max(0, n - len(base))))
        fresh += n
        out.append(ids)
    return out


requests_strategy = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 5000), st.integers(0, 3000), st.lists(st.integers(0, 3), max_size=10),
              st.tuples(st.integers(0, 50), st.integers(0, 10))),
    min_size=1, max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(requests_strategy, st.sampled_from([1, 8, 16, 64, 128, 512, 1024, 2048]), st.booleans(),
       st.sampled_from([None, 0, 1, 10**9]), st.sampled_from([1, 7, 1 << 14]), st.sampled_from([1, 10**12]))
def test_the_id_level_replay_equals_the_pool(raw: list, block_size: int, chained: bool, capacity: int | None,
                                             chunk_pairs: int, scale: int) -> None:
    """`chunk_pairs`: (request, position) pairs id_replay takes at a time, from one (every request its own chunk,
    what a node covered carried over from chunk to chunk) to the default; `scale` 10^12 spreads the ids over a
    range far larger than their number."""
    need = [-(-p // 512) for _, p, _, _, _ in raw]
    if chained or block_size > 512:  # a block of several ids needs chained ids (check_trace refuses others)
        ids = chained_ids([shape for *_, shape in raw], need)
    else:  # a small alphabet, padded with fresh ids: mostly not prefix-chained
        ids = [(small + [1000 + 10 * k + j for j in range(n)])[:n] for k, ((*_, small, _), n) in
               enumerate(zip(raw, need, strict=True))]
    ids = [[h * scale for h in hs] for hs in ids]
    trace = make_trace([(float(a), p, o, hs) for (a, p, o, _, _), hs in zip(raw, ids, strict=True)])
    unlimited = check_trace(trace, block_size, None).pool_blocks
    cap = None if capacity is None else unlimited + capacity  # capacity == unlimited: the pool; above: by ids
    for caching in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(id_replay, "_CHUNK_PAIRS", chunk_pairs)
            by_ids = replay(trace, block_size, cap, caching)
        assert by_ids == replay(trace, block_size, cap, caching, by_ids=False)
        assert by_ids == replay(trace, block_size, cap, caching, fast=False)
    assert by_ids.evictions == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-3, 3), max_size=7), max_size=15), st.sampled_from([1, 10**12]))
def test_trie_nodes_label_equal_id_sequences_alike(sequences: list[list[int]], scale: int) -> None:
    """`scale` 10^12 spreads the ids over a range far larger than their number: labels by rank, not by value."""
    sequences = [[h * scale for h in seq] for seq in sequences]
    hash_ids = np.array([h for seq in sequences for h in seq], dtype=np.int64)
    offsets = np.cumsum([0] + [len(seq) for seq in sequences]).astype(np.int64)
    labels_array, count = trie_nodes(hash_ids, offsets)
    labels = labels_array.tolist()
    paths = [tuple(seq[: d + 1]) for seq in sequences for d in range(len(seq))]
    assert len(labels) == len(paths)
    # equal labels exactly where the whole sequences up to the position are equal
    first_label: dict[tuple[int, ...], int] = {}
    for label, path in zip(labels, paths, strict=True):
        assert first_label.setdefault(path, label) == label
    assert len(set(labels)) == len(first_label)
    assert all(0 <= label < count for label in labels)
    if first_unchained_id(hash_ids, offsets) is None and labels and scale == 1:  # chained: the id less the least
        assert labels == (hash_ids - hash_ids.min()).tolist()


def test_a_hand_worked_trace_without_chained_ids() -> None:
    """Block 256 (2 blocks per id). a: ids [5, 6], 1,024 tokens: 4 full blocks, none cached: 0 hits; caches
    (5: 2 blocks) (5,6: 2). b: ids [6, 6], 1,000 tokens: 3 full blocks; node (6) is new (6 followed nothing in a):
    0 hits; caches (6: 2) (6,6: 1). c: ids [5, 6], 1,100 tokens: 4 full blocks, at most 1,099 // 256 = 4 hit;
    (5) and (5,6) are wholly cached: 4 hits = 1,024 tokens. d: ids [6, 6], 1,280 tokens: 5 full blocks, the 5th
    past the ids (1,280 > 1,024) -- refused; with 900 tokens: 3 full blocks, at most 899 // 256 = 3, (6) has 2,
    (6,6) 1 cached: 3 hits = 768 tokens. Cached at the end: 4 + 3 = 7 blocks."""
    trace = make_trace([(0, 1024, 1, [5, 6]), (1, 1000, 1, [6, 6]), (2, 1100, 1, [5, 6]), (3, 900, 1, [6, 6])])
    assert first_unchained_id(trace.hash_ids, trace.hash_offsets) is not None
    result = replay(trace, 256, None, True)
    assert (result.hit_tokens, result.hit_blocks, result.peak_cached_blocks) == (1024 + 768, 7, 7)
    assert result == replay(trace, 256, None, True, by_ids=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(-3, 5), max_size=6), min_size=1, max_size=10), st.sampled_from([1, 10**12]))
def test_chaining_against_dicts(sequences: list[list[int]], scale: int) -> None:
    """first_unchained_id takes a table by id when the ids span a small range, else a sort (`scale` 10^12 spreads
    them): against a dict of each id's predecessors."""
    ids = np.array([h * scale for seq in sequences for h in seq], dtype=np.int64)
    offsets = np.cumsum([0] + [len(seq) for seq in sequences]).astype(np.int64)
    predecessors: dict[int, set[int | None]] = {}
    for seq in sequences:
        for i, h in enumerate(seq):
            predecessors.setdefault(h, set()).add(seq[i - 1] if i else None)
    chained = all(len(p) == 1 for p in predecessors.values())
    assert (first_unchained_id(ids, offsets) is None) == chained
