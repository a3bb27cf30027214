"""Mooncake traces at blocks of 512·m tokens (m > 1: 1,024, 2,048, 4,096): a full block covers m whole hash
ids and is keyed by the id of its last 512-token block, exact because the ids are prefix-chained (checked).

References here are independent of that key: chains of the *tuple* of a block's m ids, interned per parent
(exact whatever the ids' chaining), an OrderedDict LRU, and answers worked by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lru_reference import lru_hit_blocks

from kvcalc.core.errors import ParameterError
from kvcalc.core.inputs.traces import (
    Trace,
    coarse_hash_ids,
    first_unchained_id,
    mooncake_block_keys,
    read_trace,
)
from kvcalc.core.pool.block_pool import BlockPool
from kvcalc.core.share.capacity import saved_state_hit_blocks
from kvcalc.core.share.replay import replay
from kvcalc.core.share.stack_distance import stack_distances
from kvcalc.core.share.trace_blocks import in_arrival_order, trace_block_keys
from kvcalc.core.sim.paged import mooncake_prompt_keys

TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"


def make_trace(requests: list[tuple[int, list[int]]]) -> Trace:
    """(prompt tokens, hash ids) per request, in arrival order; outputs of 1 token."""
    ids = [h for _, hs in requests for h in hs]
    offsets = np.cumsum([0] + [len(hs) for _, hs in requests]).astype(np.int64)
    return Trace("mooncake", "test", np.arange(len(requests), dtype=np.float64),
                 np.array([p for p, _ in requests], np.int64), np.ones(len(requests), np.int64),
                 np.array(ids, np.int64), offsets)


def tuple_chain_keys(trace: Trace, block_size: int) -> list[tuple[list[int], int]]:
    """Per request in arrival order: chain keys of its full blocks, block j interned as (parent, the tuple of
    ids m·j .. m·j + m - 1) — or (parent, id, sub-block) when B divides 512 — and the most blocks a hit may
    cover, (p - 1) // B."""
    m, per_id = max(1, block_size // 512), max(1, 512 // block_size)
    intern: dict[tuple, int] = {}
    out = []
    for r in np.argsort(trace.arrival_s, kind="stable").tolist():
        p, ids = int(trace.prompt_tokens[r]), trace.request_hash_ids(r).tolist()
        keys, parent = [], -1
        for j in range(p // block_size):
            part = tuple(ids[j * m : (j + 1) * m]) if m > 1 else (ids[j // per_id], j % per_id)
            parent = intern.setdefault((parent, part), len(intern))
            keys.append(parent)
        out.append((keys, max(p - 1, 0) // block_size))
    return out


# a: ids [1,2,3,4], b shares 3 of a's 4 ids ([1,2,3,5]), c extends a ([1,2,3,4,7,8], 2,600 tokens)
SHARED_3_OF_4 = [(2048, [1, 2, 3, 4]), (2048, [1, 2, 3, 5]), (2600, [1, 2, 3, 4, 7, 8])]


@pytest.mark.parametrize(("block_size", "hit_tokens", "cached_blocks"), [
    # 512: b hits ids 1,2,3 (at most 2,047 // 512 = 3 blocks): 1,536; c hits 1..4 (at most 2,599 // 512 = 5,
    # id 7 new): 2,048. Cached: a 4, b +1 (id 5), c +1 (id 7, its 5th full block): 6
    (512, 1536 + 2048, 6),
    # 1,024: a's blocks are [1,2] and [3,4] (keys 2, 4); b's [1,2] hits, [3,5] does not (and at most
    # 2,047 // 1,024 = 1 block may hit anyway): 1,024; c's 2 full blocks [1,2] [3,4] both hit (at most
    # 2,599 // 1,024 = 2): 2,048. Cached: a 2, b +1 ([3,5]), c +0: 3
    (1024, 1024 + 2048, 3),
    # 2,048: a's one block [1,2,3,4]; b's [1,2,3,5] differs in its 4th id (and 2,047 // 2,048 = 0 may hit):
    # 0; c's one full block [1,2,3,4] hits (at most 2,599 // 2,048 = 1): 2,048. Cached: a 1, b +1: 2
    (2048, 0 + 2048, 2),
    # 4,096: no prompt fills a block: nothing to hit or cache
    (4096, 0, 0),
])
def test_two_requests_sharing_3_of_4_ids_by_hand(block_size: int, hit_tokens: int, cached_blocks: int) -> None:
    trace = make_trace(SHARED_3_OF_4)
    result = replay(trace, block_size, None, True)
    assert (result.hit_tokens, result.peak_cached_blocks) == (hit_tokens, cached_blocks)
    assert stack_distances(trace, block_size).total_hit_blocks(None) * block_size == hit_tokens
    assert lru_hit_blocks(tuple_chain_keys(trace, block_size), None) * block_size == hit_tokens


def test_block_keys_by_hand() -> None:
    ids = np.array([10, 11, 12, 13, 14])
    # 1,024 = 2 ids a block: 2,600 tokens fill 2 blocks, keyed by ids 11 and 13 (the last id of each)
    assert mooncake_block_keys(ids, 2600, 1024).tolist() == [11, 13]
    # 1,536 = 3 ids: 2,600 tokens fill 1 block, [10,11,12], key 12
    assert mooncake_block_keys(ids, 2600, 1536).tolist() == [12]
    assert mooncake_block_keys(ids, 4095, 4096).tolist() == []
    # 4,096 tokens fill one block of 8 ids; the request has 5: an error naming the need
    with pytest.raises(ValueError, match="4096 prompt tokens need 8 hash_ids"):
        mooncake_block_keys(ids, 4096, 4096)
    # share's vectorised keys and the sim's per-request keys are the same
    trace = make_trace([(2600, [10, 11, 12, 13, 14]), (1024, [10, 11]), (3000, [10, 11, 20, 21, 22, 23])])
    keys, offsets = trace_block_keys(trace, 1024, 0, 3)
    assert keys.tolist() == [11, 13, 11, 11, 21] and offsets.tolist() == [0, 2, 3, 5]
    sim = mooncake_prompt_keys(trace.hash_ids, trace.hash_offsets, trace.prompt_tokens, 1024)
    assert [k.tolist() for k in sim] == [[11, 13], [11], [11, 21]]


def test_coarse_ids_by_hand() -> None:
    # per request the ids at positions m - 1, 2m - 1, ...: floor(len / m) of them
    ids, offsets = coarse_hash_ids(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9]), np.array([0, 5, 5, 9]), 1024)
    assert ids.tolist() == [2, 4, 7, 9] and offsets.tolist() == [0, 2, 2, 4]


def test_unchained_ids_are_found_and_refused_above_512() -> None:
    # id 2 follows id 1 in request 1 and id 3 in request 2: keying [3,2] by its last id would call it [1,2]
    trace = make_trace([(1024, [1, 2]), (1100, [3, 2, 9])])
    assert first_unchained_id(trace.hash_ids, trace.hash_offsets) == (1, 1)
    # an id first in one request and later in another has two predecessors (none, and 5) too
    assert first_unchained_id(np.array([7, 5, 7]), np.array([0, 1, 3])) == (1, 1)
    assert first_unchained_id(np.array([1, 2, 1, 2, 3]), np.array([0, 2, 5])) is None
    for run in (lambda: replay(trace, 1024, None, True), lambda: stack_distances(trace, 1024),
                lambda: saved_state_hit_blocks(trace, 1024),
                lambda: mooncake_prompt_keys(trace.hash_ids, trace.hash_offsets, trace.prompt_tokens, 1024)):
        with pytest.raises(ParameterError, match="not prefix-chained") as e:
            run()
        assert e.value.param == "block_size"
    # a block that divides 512 keys every id of the chain: exact, no check, no hit ([3,2] is not [1,2])
    assert replay(trace, 512, None, True).hit_tokens == 0


@pytest.mark.parametrize("block_size", [24, 768, 1000, 1025])
def test_other_sizes_are_refused(block_size: int) -> None:
    with pytest.raises(ParameterError, match="does not divide 512 and is not a multiple of it") as e:
        replay(make_trace(SHARED_3_OF_4), block_size, None, True)
    assert e.value.param == "block_size" and "1,024, 2,048, 4,096" in str(e.value)


def chained_trace(draws: list[tuple[int, int, int]]) -> Trace:
    """Requests as walks in a trie of ids (one id per (parent, branch)), so the ids are prefix-chained:
    draw (length in ids, branch alphabet, tokens of the last id used)."""
    trie: dict[tuple[int, int], int] = {}
    requests = []
    for length, alphabet, tail in draws:
        node, ids = -1, []
        for k in range(length):
            node = trie.setdefault((node, (k * 7 + alphabet) % (alphabet + 1)), len(trie))
            ids.append(node)
        requests.append(((length - 1) * 512 + tail, ids))
    return make_trace(requests)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(0, 3), st.integers(1, 512)), min_size=1, max_size=25),
       st.sampled_from([1024, 1536, 2048, 4096]))
def test_random_chained_traces_match_the_tuple_keys(draws, block_size: int) -> None:
    """Every capacity of the stack-distance curve and the pool replay agree with the tuple-key LRU."""
    trace = chained_trace(draws)
    keys = tuple_chain_keys(trace, block_size)
    d = stack_distances(trace, block_size)
    for capacity in (*range(0, 8), 20, None):
        assert d.total_hit_blocks(capacity) == lru_hit_blocks(keys, capacity), capacity
    assert replay(trace, block_size, None, True).hit_blocks == lru_hit_blocks(keys, None)


@pytest.mark.parametrize("name", ["conversation", "synthetic"])
@pytest.mark.parametrize("block_size", [1024, 4096])
def test_mooncake_traces_agree_across_share_capacity_and_sim(name: str, block_size: int) -> None:
    """share's replay, share --capacity's stack distances (unbounded and bounded) and the sim's keys on a
    pool, against the tuple-key LRU, on the real traces (skipped when absent)."""
    path = TRACES / f"mooncake_{name}.jsonl"
    if not path.is_file():
        pytest.skip(f"the Mooncake {name} trace is not at {path}")
    trace = in_arrival_order(read_trace("mooncake", path))
    assert first_unchained_id(trace.hash_ids, trace.hash_offsets) is None  # Mooncake's ids are prefix-chained
    keys = tuple_chain_keys(trace, block_size)
    unbounded = lru_hit_blocks(keys, None)
    assert unbounded > 0
    assert replay(trace, block_size, None, True).hit_blocks == unbounded
    d = stack_distances(trace, block_size)
    for capacity in (100, 1_000, None):
        assert d.total_hit_blocks(capacity) == lru_hit_blocks(keys, capacity), capacity
    sim_keys = mooncake_prompt_keys(trace.hash_ids, trace.hash_offsets, trace.prompt_tokens, block_size)
    prompts, outputs = trace.prompt_tokens.tolist(), trace.output_tokens.tolist()
    pool = BlockPool(sum(-(-(p + o) // block_size) for p, o in zip(prompts, outputs, strict=True)), block_size)
    for p, k, o in zip(prompts, sim_keys, outputs, strict=True):
        pool.serve(p, k, o)
    assert pool.stats().hit_blocks == unbounded
