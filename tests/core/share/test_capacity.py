"""The capacity curve and the tiers (core/share/capacity.py, tiers.py) against hand-worked traces and an
independent replay: a plain dict interning prefix chains and OrderedDict LRUs, run once per capacity."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lru_reference import HAND, lru_hit_blocks

from kvcalc.core.errors import ParameterError
from kvcalc.core.inputs.traces import Trace, read_trace
from kvcalc.core.share.capacity import capacity_curve, parse_capacities, saved_state_hit_blocks
from kvcalc.core.share.replay import replay
from kvcalc.core.share.stack_distance import stack_distances
from kvcalc.core.share.tiers import simulate_tiers

TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"


def make_trace(requests: list[tuple[int, list[int]]], arrival_s: list[float] | None = None) -> Trace:
    """(prompt tokens, hash ids) per request; outputs of 1 token."""
    ids = [h for _, hs in requests for h in hs]
    offsets = np.cumsum([0] + [len(hs) for _, hs in requests])
    arrival = np.zeros(len(requests)) if arrival_s is None else np.array(arrival_s, dtype=np.float64)
    return Trace("mooncake", "test", arrival, np.array([p for p, _ in requests], np.int64),
                 np.ones(len(requests), np.int64), np.array(ids, np.int64), offsets.astype(np.int64))


# ---- the independent replay ------------------------------------------------------------------------------
def chain_keys(trace: Trace, block_size: int) -> list[tuple[list[int], int]]:
    """Per request in arrival order: its full blocks' chain keys (a dict interns (parent, id, sub-block)) and
    the most blocks a hit may cover, (p - 1) // B."""
    order = np.argsort(trace.arrival_s, kind="stable")
    per_id = 512 // block_size
    intern: dict[tuple[int, int, int], int] = {}
    out = []
    for r in order.tolist():
        p, ids = int(trace.prompt_tokens[r]), trace.request_hash_ids(r).tolist()
        keys, parent = [], -1
        for j in range(p // block_size):
            parent = intern.setdefault((parent, ids[j // per_id], j % per_id), len(intern))
            keys.append(parent)
        out.append((keys, max(p - 1, 0) // block_size))
    return out


def exclusive_tiers(requests: list[tuple[list[int], int]], caps: tuple[int, int, int]):
    """Three OrderedDicts: evictions demote to the next tier (most recent there), the last drops; a hit in
    any tier is promoted. Hits per tier, writes per tier (blocks newly in a tier), blocks dropped."""
    tiers: list[OrderedDict[int, None]] = [OrderedDict(), OrderedDict(), OrderedDict()]
    hits, writes, dropped = [0, 0, 0], [0, 0, 0], 0
    for keys, eligible in requests:
        before = [set(t) for t in tiers]
        h = 0
        while h < eligible and any(keys[h] in t for t in tiers):
            hits[next(i for i, t in enumerate(tiers) if keys[h] in t)] += 1
            h += 1
        for k in keys:
            for t in tiers:
                t.pop(k, None)
        for k in reversed(keys):
            tiers[0][k] = None
        for i in range(3):
            demoted = []
            while len(tiers[i]) > caps[i]:
                demoted.append(tiers[i].popitem(last=False)[0])
            if i < 2:
                for k in demoted:
                    tiers[i + 1][k] = None
            else:
                dropped += len(set(demoted) & set().union(*before))
        for i in range(3):
            writes[i] += len(set(tiers[i]) - before[i])
    return hits, writes, dropped


def inclusive_tiers(requests: list[tuple[list[int], int]], caps: tuple[int, int, int]):
    """Each present tier its own LRU over every access (write-through); a hit counts in the fastest tier."""
    tiers: list[OrderedDict[int, None]] = [OrderedDict(), OrderedDict(), OrderedDict()]
    hits, writes = [0, 0, 0], [0, 0, 0]
    for keys, eligible in requests:
        before = [set(t) for t in tiers]
        h = 0
        while h < eligible and any(keys[h] in t for t in tiers):
            hits[next(i for i, t in enumerate(tiers) if keys[h] in t)] += 1
            h += 1
        for i, t in enumerate(tiers):
            if not caps[i]:
                continue
            for k in reversed(keys):
                t[k] = None
                t.move_to_end(k)
            while len(t) > caps[i]:
                t.popitem(last=False)
            writes[i] += sum(k not in before[i] for k in keys)
    return hits, writes


# ---- a trace worked by hand ------------------------------------------------------------------------------
# Block 512 = one hash id per block. Stack after each request (top first):
#   r0 1536 tok [1,2,3]: 3 full blocks, eligible 2, nothing cached       -> [1,2,3]
#   r1 1537 tok [1,2,3,4]: 3 full (the 4th id covers 1 token), eligible 3; depths 1,2,3 -> [1,2,3]
#   r2 1024 tok [5,6]: new                                               -> [5,6,1,2,3]
#   r3 2048 tok [1,2,7,8]: eligible 3; 1 at depth 3, 2 at depth 4, 7 new -> [1,2,7,8,5,6,3]
# Hits: r1 = min(3, C) blocks; r3 = 0 (C < 3), 1 (C = 3), 2 (C >= 4).
HAND_HITS = {0: 0, 1: 1, 2: 2, 3: 3 + 1, 4: 3 + 2, 5: 5, 100: 5}


def test_hand_worked_curve() -> None:
    d = stack_distances(make_trace(HAND), 512)
    for capacity, blocks in HAND_HITS.items():
        assert d.total_hit_blocks(capacity) == blocks, capacity
    assert d.total_hit_blocks(None) == 5
    curve = capacity_curve(d, [1, 3, 4])
    assert [p.hit_tokens for p in curve.points] == [512, 4 * 512, 5 * 512]
    assert curve.ceiling.hit_tokens == 2560 and curve.prompt_tokens == 1536 + 1537 + 1024 + 2048
    # 50 %: ceil(2.5) = 3 blocks first reached at C = 3; 90 % and 99 %: 5 blocks at C = 4
    assert curve.reach == {0.5: 3, 0.9: 4, 0.99: 4}
    assert [lru_hit_blocks(chain_keys(make_trace(HAND), 512), c) for c in HAND_HITS] == list(HAND_HITS.values())


def test_hand_worked_tiers() -> None:
    # GPU 1, host 2, disk 0 blocks (exclusive). r0: GPU {1}, host {2,3} (3 writes). r1: GPU hit 1, host hits 2,3;
    # nothing moves. r2: GPU {5}, host {6,1}, 2 and 3 dropped (2 writes). r3: 1 is a host hit (depth 3), 2 is
    # gone; GPU {1}, host {2,7}, 5 and 6 dropped (2 writes). Host: 3 hits, 3 reads, 2+0+2+2 = 6 writes.
    d = stack_distances(make_trace(HAND), 512)
    result = simulate_tiers(d, (1, 2, 0), None)
    gpu, host, disk = result.tiers
    assert (gpu.hit_blocks, host.hit_blocks, disk.hit_blocks) == (1, 3, 0)
    assert (host.read_blocks, host.write_blocks, gpu.write_blocks, disk.write_blocks) == (3, 6, 3, 0)
    assert result.dropped_blocks == 4
    assert exclusive_tiers(chain_keys(make_trace(HAND), 512), (1, 2, 0)) == ([1, 3, 0], [3, 6, 0], 4)


def test_sub_blocks_of_one_id_and_a_partial_last_id() -> None:
    # Block 256: two sub-blocks per id. r0 600 tokens [1,2]: blocks (1,0) (1,1) (2,0). r1 700 tokens [1,9]:
    # (1,0) (1,1) hit, (9,0) new; eligible floor(699/256) = 2. r2 520 [1,2]: (1,0) (1,1) (2,0), eligible 2:
    # hits 2 blocks; (2,0) was last held by r0 (the partial id 2 covered 88 + 256 tokens there).
    trace = make_trace([(600, [1, 2]), (700, [1, 9]), (520, [1, 2])])
    d = stack_distances(trace, 256)
    keys = chain_keys(trace, 256)
    for capacity in (0, 1, 2, 3, 4, 5, 6, None):
        assert d.total_hit_blocks(capacity) == lru_hit_blocks(keys, capacity)
    assert d.total_hit_blocks(None) == 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.lists(st.integers(0, 4), min_size=6, max_size=6)),
                min_size=1, max_size=25),
       st.sampled_from([64, 128, 512]),
       st.lists(st.integers(0, 60), min_size=3, max_size=3))
def test_random_traces_match_the_independent_replay(raw, block_size: int, caps: list[int]) -> None:
    """Small alphabets make long shared prefixes, partial last ids and repeats; every capacity agrees."""
    requests = [(p, ids[: -(-p // 512)]) for p, ids in raw]
    trace = make_trace(requests, arrival_s=[float(i % 4) for i in range(len(requests))])  # ties keep file order
    d = stack_distances(trace, block_size)
    keys = chain_keys(trace, block_size)
    for capacity in (*range(0, 12), 30, 100, None):
        assert d.total_hit_blocks(capacity) == lru_hit_blocks(keys, capacity), capacity
    tiers = simulate_tiers(d, tuple(caps), None)
    expected = exclusive_tiers(keys, tuple(caps))
    assert ([t.hit_blocks for t in tiers.tiers], [t.write_blocks for t in tiers.tiers], tiers.dropped_blocks) \
        == expected
    assert [t.read_blocks for t in tiers.tiers] == [0, *expected[0][1:]]
    inclusive = simulate_tiers(d, tuple(caps), None, mode="inclusive")
    assert ([t.hit_blocks for t in inclusive.tiers], [t.write_blocks for t in inclusive.tiers]) == \
        inclusive_tiers(keys, tuple(caps))
    # inclusive: the hierarchy holds what its largest tier holds, an LRU of that size on its own
    largest = max(caps)
    assert inclusive.dropped_blocks == exclusive_tiers(keys, (largest, 0, 0))[2]
    target = d.total_hit_blocks(None)
    for share in (0.5, 0.9, 1.0):
        need = -(-target * round(share * 100) // 100)
        c = d.capacity_for(need)
        assert d.total_hit_blocks(c) >= need and (c == 0 or d.total_hit_blocks(c - 1) < need)


def test_states_saved_only_where_prompts_end_by_hand() -> None:
    # HAND at block 512: r0 saves a state after its 3rd block ([1,2,3]); r1 (eligible 3) resumes there: 3 hits;
    # r2 saves after [5,6]; r3 [1,2,7,8] shares [1,2] but no state was saved after 1 or [1,2]: 0 (was 2)
    assert saved_state_hit_blocks(make_trace(HAND), 512) == 3


def saved_state_reference(requests: list[tuple[list[int], int]]) -> int:
    """A set of chain keys after which a state was saved (a request's last full block); the hit is the
    deepest saved boundary among its first `eligible` blocks."""
    saved: set[int] = set()
    hits = 0
    for keys, eligible in requests:
        hits += max((j + 1 for j in range(eligible) if keys[j] in saved), default=0)
        if keys:
            saved.add(keys[-1])
    return hits


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.lists(st.integers(0, 3), min_size=6, max_size=6)),
                min_size=1, max_size=25),
       st.sampled_from([64, 256, 512]))
def test_states_saved_only_where_prompts_end(raw, block_size: int) -> None:
    trace = make_trace([(p, ids[: -(-p // 512)]) for p, ids in raw])
    assert saved_state_hit_blocks(trace, block_size) == saved_state_reference(chain_keys(trace, block_size))
    assert saved_state_hit_blocks(trace, block_size) <= stack_distances(trace, block_size).total_hit_blocks(None)


def test_ceiling_equals_the_pool_replay() -> None:
    trace = make_trace([(p, ids[: -(-p // 512)]) for p, ids in
                        [(1500, [1, 2, 3]), (1800, [1, 2, 4, 5]), (700, [1, 6]), (2000, [1, 2, 4, 7])]])
    for block_size in (16, 64, 512):
        assert stack_distances(trace, block_size).total_hit_blocks(None) * block_size == \
            replay(trace, block_size, None, True).hit_tokens


def test_a_trace_without_ids_hits_nothing() -> None:
    trace = Trace("azure", "t", np.arange(3.0), np.array([100, 200, 50]), np.array([1, 1, 1]), None, None)
    d = stack_distances(trace, 16)
    assert d.total_hit_blocks(None) == 0 and capacity_curve(d, [10]).reach == {0.5: None, 0.9: None, 0.99: None}
    # its blocks still pass through the tiers, each request's its own: 6, 12 and 3 blocks
    keys = [(list(range(0, 6)), 6), (list(range(6, 18)), 12), (list(range(18, 21)), 3)]
    for caps in ((4, 8, 2), (20, 0, 0), (0, 0, 5)):
        result = simulate_tiers(d, caps, None)
        assert ([t.hit_blocks for t in result.tiers], [t.write_blocks for t in result.tiers],
                result.dropped_blocks) == exclusive_tiers(keys, caps)


# ---- capacities as typed ---------------------------------------------------------------------------------
def test_parse_capacities() -> None:
    assert [(v.amount, v.unit) for v in parse_capacities("3M, 500k,2e6,1GiB,80GB")] == [
        (3_000_000, "tokens"), (500_000, "tokens"), (2_000_000, "tokens"), (2**30, "bytes"), (80 * 10**9, "bytes")]
    assert [v.amount for v in parse_capacities("1M:64M:4")] == [1_000_000, 4_000_000, 16_000_000, 64_000_000]
    assert len(parse_capacities("1M:64M")) == 10
    assert parse_capacities("3M")[0].blocks(16, None) == 187_500
    assert parse_capacities("1GiB")[0].blocks(16, 2 * 2**20) == 512


@pytest.mark.parametrize("text", ["", "3M,", "3X", "1.5", "-5", "1M:1GiB", "64M:1M", "1M:2M:1", "1M:2M:x"])
def test_bad_capacities_name_the_parameter(text: str) -> None:
    with pytest.raises(ParameterError) as e:
        parse_capacities(text)
    assert e.value.param == "capacity"


def test_bytes_without_a_model_are_refused() -> None:
    with pytest.raises(ParameterError, match="give a model"):
        parse_capacities("1GiB")[0].blocks(16, None)


# ---- the real Mooncake traces ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["conversation", "synthetic"])
def test_mooncake_traces_match_the_independent_replay(name: str) -> None:
    path = TRACES / f"mooncake_{name}.jsonl"
    if not path.is_file():
        pytest.skip(f"the Mooncake {name} trace is not at {path}")
    trace = read_trace("mooncake", path)
    # whole trace at block 512 (one key per hash id); the first 1,500 requests at block 64
    for block_size, part in ((512, trace), (64, trace.head(1500))):
        d = stack_distances(part, block_size)
        keys = chain_keys(part, block_size)
        for capacity in (1_000, 10_000, 100_000, None):
            assert d.total_hit_blocks(capacity) == lru_hit_blocks(keys, capacity), (block_size, capacity)
    head = trace.head(300)  # the reference copies every tier's set per request
    d, keys = stack_distances(head, 128), chain_keys(head, 128)
    for caps in ((300, 1_000, 4_000), (0, 2_000, 0)):
        result = simulate_tiers(d, caps, None)
        assert ([t.hit_blocks for t in result.tiers], [t.write_blocks for t in result.tiers],
                result.dropped_blocks) == exclusive_tiers(keys, caps)
