"""Sharing scenarios vs closed forms; trace replay vs hand-computed hits and an independent reference."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.inputs.traces import Trace, mooncake_block_keys, read_trace
from kvcalc.core.share import replay as share_trace_module
from kvcalc.core.share import trace_blocks as trace_blocks_module
from kvcalc.core.share.forks import ScenarioSpec, closed_form_physical_blocks, run_scenario
from kvcalc.core.share.replay import replay, share_trace, uncached_replay
from kvcalc.core.share.trace_blocks import check_trace, in_arrival_order, unlimited_capacity

MOONCAKE = Path(__file__).resolve().parents[4] / "shared" / "traces" / "mooncake_conversation.jsonl"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---- scenario mode ------------------------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(st.integers(1, 120), st.integers(1, 5), st.integers(1, 40), st.integers(1, 16))
def test_parallel_matches_the_closed_form(prefix: int, branches: int, gen: int, block: int) -> None:
    result = run_scenario(ScenarioSpec(prefix, branches, gen, block), check=True)
    full, rest = divmod(prefix, block)
    written = gen - 1  # the last generated token is sampled, never written
    own = ceil_div(rest + written, block) if written else 0
    assert result.physical_blocks == (full + branches * own if written else ceil_div(prefix, block))
    assert result.physical_blocks == closed_form_physical_blocks(prefix, branches, gen, block)
    assert result.logical_blocks == branches * ceil_div(prefix + written, block)
    # every branch but the last to write copies the shared partial block; none when P mod B = 0 or none writes
    assert result.cow_copies == (branches - 1 if rest and written else 0)
    assert result.peak_blocks == result.physical_blocks  # parallel sampling only ever grows
    assert result.saved_blocks == result.logical_blocks - result.physical_blocks


def test_parallel_worked_examples() -> None:
    # P = 1000, B = 16: 62 full blocks + 8 tokens; G = 200 writes 199: each branch ceil(207/16) = 13 own blocks,
    # 4 tables of ceil(1,199 / 16) = 75
    r = run_scenario(ScenarioSpec(1000, 4, 200, 16))
    assert (r.physical_blocks, r.logical_blocks, r.cow_copies) == (62 + 4 * 13, 4 * 75, 3)
    assert r.saved_fraction == pytest.approx(186 / 300)
    # P mod B = 0: P = 64, B = 16 -> 4 shared blocks; G = 20 writes 19 -> ceil(19/16) = 2 own blocks each, no copy
    r = run_scenario(ScenarioSpec(64, 3, 20, 16))
    assert (r.physical_blocks, r.logical_blocks, r.cow_copies) == (4 + 3 * 2, 3 * 6, 0)
    # G = 0: nobody writes, everything stays shared: ceil(70/16) = 5 blocks, 3 tables of 5
    r = run_scenario(ScenarioSpec(70, 3, 0, 16))
    assert (r.physical_blocks, r.logical_blocks, r.cow_copies) == (5, 15, 0)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(1, 5), st.integers(1, 25), st.integers(1, 8), st.integers(0, 10**6))
def test_beam_keeps_k_beams_and_its_invariants(prefix: int, k: int, gen: int, block: int, seed: int) -> None:
    spec = ScenarioSpec(prefix, k, gen, block, mode="beam", seed=seed)
    result = run_scenario(spec, check=True)
    assert result == run_scenario(spec)  # seeded: reproducible
    # K beams of P + G − 1 positions at the end (the last token is sampled, never written)
    assert result.logical_blocks == k * ceil_div(prefix + gen - 1, block)
    assert ceil_div(prefix + gen - 1, block) <= result.physical_blocks <= result.logical_blocks
    assert result.physical_blocks <= result.peak_blocks
    assert result.forks - (k - 1) == result.dropped_branches  # every dropped beam is replaced by a fork


def test_beam_with_one_beam_is_parallel_with_one_branch() -> None:
    assert run_scenario(ScenarioSpec(37, 1, 50, 8, mode="beam")).physical_blocks == ceil_div(37 + 49, 8)


def test_bad_scenarios() -> None:
    with pytest.raises(ValueError, match="branches"):
        ScenarioSpec(10, 0, 5, 16)
    with pytest.raises(ValueError, match="mode"):
        ScenarioSpec(10, 2, 5, 16, mode="greedy")
    with pytest.raises(ValueError, match="gen"):
        ScenarioSpec(10, 2, -1, 16)


# ---- trace mode ---------------------------------------------------------------------------------------
def make_trace(requests: list[tuple[int, int, list[int]]]) -> Trace:
    ids = [h for _, _, hs in requests for h in hs]
    offsets = np.cumsum([0] + [len(hs) for _, _, hs in requests])
    return Trace(
        "mooncake", "test", np.zeros(len(requests)), np.array([p for p, _, _ in requests], np.int64),
        np.array([o for _, o, _ in requests], np.int64), np.array(ids, np.int64), offsets.astype(np.int64),
    )


def _trie_path(trie: dict, ids: list[int], prompt_tokens: int, block_size: int) -> list[int]:
    """Trie nodes of a prompt's full blocks, keyed (parent node, (hash_id, sub-block)); new nodes added."""
    per_id = 512 // block_size
    node, nodes = -1, []
    for j in range(prompt_tokens // block_size):
        node = trie.setdefault((node, (ids[j // per_id], j % per_id)), len(trie))
        nodes.append(node)
    return nodes


def reference_hit_tokens(trace: Trace, block_size: int) -> int:
    """Unlimited cache as a trie of block keys (hash_id, sub-block) in plain dicts: no pool, no hashing."""
    trie: dict[tuple[int, tuple[int, int]], int] = {}  # (parent node, key) -> node
    cached: set[int] = set()
    hits = 0
    for i in range(len(trace)):
        p = int(trace.prompt_tokens[i])
        nodes = _trie_path(trie, trace.request_hash_ids(i).tolist(), p, block_size)
        n = 0
        while n < min(len(nodes), (p - 1) // block_size) and nodes[n] in cached:
            n += 1
        hits += n * block_size
        cached.update(nodes)
    return hits


def reference_lru_replay(trace: Trace, block_size: int, capacity: int, peak: list[int] | None = None
                         ) -> tuple[int, int]:
    """(hit tokens, evictions) of a bounded pool modelled directly on vLLM v1's one free queue: an OrderedDict of
    entries, head first — `capacity` never-used blocks at start, then freed blocks in free order, a block that holds
    a cache entry as its key chain (a trie node), any other as a fresh token. A request revives its cached prefix
    (its entries leave the queue), pops its prompt's other blocks off the head (a node popped is an eviction), keys
    its full blocks (unless an equal chain is still cached), pops its output's; on release its table goes back to
    the tail reversed: output, fresh prompt blocks, hits. No pool, no hashing. `peak`: [the most cache entries
    free at a request's end] is appended to it."""
    trie: dict[tuple[int, tuple[int, int]], int] = {}
    queue: OrderedDict[object, None] = OrderedDict.fromkeys(("never used", j) for j in range(capacity))
    hits = evictions = most = cached = 0  # cached: the cache entries in the queue
    for i in range(len(trace)):
        p, o = int(trace.prompt_tokens[i]), max(int(trace.output_tokens[i]) - 1, 0)  # the last token writes no KV
        nodes = _trie_path(trie, trace.request_hash_ids(i).tolist(), p, block_size)
        n = 0
        while n < min(len(nodes), (p - 1) // block_size) and nodes[n] in queue:
            n += 1
        for node in nodes[:n]:
            del queue[node]
        hits += n * block_size
        evicted_now = evictions

        def take(count: int) -> None:
            nonlocal evictions
            for _ in range(count):
                entry, _ = queue.popitem(last=False)
                evictions += not isinstance(entry, tuple)  # a cache entry (a node) was evicted

        take(ceil_div(p, block_size) - n)
        fresh = [node if node not in queue else ("keyless", i, j) for j, node in enumerate(nodes[n:], start=n)]
        fresh += [("keyless", i, j) for j in range(len(nodes), ceil_div(p, block_size))]
        take(ceil_div(p + o, block_size) - ceil_div(p, block_size))
        output = [("output", i, j) for j in range(ceil_div(p + o, block_size) - ceil_div(p, block_size))]
        for entry in [*output[::-1], *fresh[::-1], *nodes[:n][::-1]]:
            queue[entry] = None
        evicted_now = evictions - evicted_now
        cached += sum(not isinstance(entry, tuple) for entry in fresh) - evicted_now  # hits left and came back
        most = max(most, cached)
    if peak is not None:
        peak.append(most)
    return hits, evictions


def test_hand_computed_trace() -> None:
    trace = make_trace([(1000, 10, [0, 1]), (1100, 10, [0, 1, 2]), (600, 10, [0, 3])])
    result = replay(trace, 16, None, prefix_caching=True)
    # 1: 1000 tokens -> 62 full blocks cached (ids 0: blocks 0-31, id 1: blocks 32-61), no hit
    # 2: same ids 0, 1: blocks 0-61 hit (block 62 = tokens 992-1007 was never full) -> 62 · 16 = 992
    # 3: id 0 again: blocks 0-31 hit -> 512; block 32 has id 3: miss
    assert (result.hit_tokens, result.hit_blocks) == (992 + 512, 62 + 32)
    assert result.token_hit_rate == pytest.approx(1504 / 2700)
    # largest request: ceil((1100 + 10 − 1) / 16) = 70 blocks
    assert result.peak_used_blocks == 70 and result.evictions == 0
    # request 2 caches 62 + 6 more full blocks (1100 // 16 = 68), request 3: 37 - 32 = 5 more: 73
    assert result.peak_cached_blocks == 73
    assert replay(trace, 16, None, prefix_caching=False).hit_tokens == 0



def test_requests_replay_in_arrival_order() -> None:
    # file order: t = 5 s (2,048 tokens, ids 7..10), then t = 0 (1,024 tokens, ids 7, 8). In arrival order
    # the short one comes first and caches 64 full blocks (ids 7, 8); the long one then hits all of them:
    # 1,024 hit tokens. In file order the short one would hit 63 blocks of the long one's (its last block
    # holds its last token, never a hit): 1,008.
    trace = make_trace([(2048, 1, [7, 8, 9, 10]), (1024, 1, [7, 8])])
    trace = Trace(trace.kind, trace.path, np.array([5.0, 0.0]), trace.prompt_tokens, trace.output_tokens,
                  trace.hash_ids, trace.hash_offsets)
    assert replay(trace, 16, None, True).hit_tokens == 1024
    assert replay(trace, 16, None, True, fast=False).hit_tokens == 1024
    assert replay(make_trace([(2048, 1, [7, 8, 9, 10]), (1024, 1, [7, 8])]), 16, None, True).hit_tokens == 1008


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 5), max_size=4)), min_size=1, max_size=12))
def test_arrival_order_sorts_stably_and_keeps_each_requests_ids(raw: list[tuple[int, list[int]]]) -> None:
    trace = make_trace([(len(ids) * 512, i, ids) for i, (_, ids) in enumerate(raw)])
    trace = Trace(trace.kind, trace.path, np.array([t for t, _ in raw], dtype=np.float64), trace.prompt_tokens,
                  trace.output_tokens, trace.hash_ids, trace.hash_offsets)
    ordered = in_arrival_order(trace)
    expected = sorted(range(len(raw)), key=lambda i: raw[i][0])  # sorted() is stable
    assert ordered.output_tokens.tolist() == expected  # output i marks request i of the file
    assert [ordered.request_hash_ids(j).tolist() for j in range(len(raw))] == [raw[i][1] for i in expected]
    assert ordered.arrival_s.tolist() == sorted(t for t, _ in raw)


def test_replay_progress_counts_every_request() -> None:
    trace = make_trace([(1000, 10, [0, 1]), (1100, 10, [0, 1, 2]), (600, 10, [0, 3])])
    for fast in (True, False):
        done: list[int] = []
        replay(trace, 16, None, True, fast=fast, progress=done.append)
        assert sum(done) == 3

def test_last_token_is_never_a_hit() -> None:
    trace = make_trace([(512, 1, [7]), (512, 1, [7])])
    # 512 tokens = 32 full blocks of 16, but the 512th token is recomputed: 31 blocks hit
    assert replay(trace, 16, None, True).hit_tokens == 31 * 16


def test_an_output_eviction_comes_after_the_prompt_is_cached() -> None:
    # B = 16, capacity 37 (a request writes its prompt and all its output but the last token); hand-outs pop the
    # free queue's head (vLLM's order). 1: ids [0, 1000], 537 + 41 tokens = 577 written = 37 blocks (the 37 never
    # used), 33 full ones cached; freed tail first: its 3 output blocks, its partial block 33, then 32..0. 2: 528
    # fresh tokens = 33 blocks: the 4 hash-less, then 29 evictions of 1's blocks 32..4. 3: id 0, 48 + 1 tokens:
    # blocks 0, 1 hit, block 2 is fresh (evicting 1's block 3) while 1's equal block 2 is still cached, so it stays
    # keyless; the output's block then evicts 1's block 2. 4: 1 + 16 tokens, 2 blocks off the head: 2's blocks 32
    # and 31, evicted (the 2 keyless ones were freed after them). 29 + 2 + 2 = 33 in all
    trace = make_trace([(537, 41, [0, 1000]), (528, 0, [1010, 1011]), (48, 2, [0]), (1, 17, [1030])])
    assert (replay(trace, 16, 37, True).hit_tokens, replay(trace, 16, 37, True).evictions) == (32, 33)
    peak: list[int] = []
    assert reference_lru_replay(trace, 16, 37, peak) == (32, 33)
    assert replay(trace, 16, 37, True).peak_cached_blocks == peak[0]


def test_lru_eviction_with_a_small_capacity() -> None:
    trace = make_trace([(64, 0, [1]), (64, 0, [2]), (64, 0, [1])])
    # B = 16: each request 4 blocks (3 hittable: not the last token's). Capacity 8: request 2 fits beside
    # request 1's 4 cached blocks; request 3 revives 3 of them (48 tokens) and needs 1 fresh block: the
    # LRU head is request 1's last block (freed tail first) -> 1 eviction. Capacity 4: request 2 evicts
    # all of request 1's blocks (4 evictions), then request 3 evicts request 2's (4 more), no hit
    assert (replay(trace, 16, 8, True).hit_tokens, replay(trace, 16, 8, True).evictions) == (48, 1)
    assert (replay(trace, 16, 4, True).hit_tokens, replay(trace, 16, 4, True).evictions) == (0, 8)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 2000), st.integers(0, 40), st.lists(st.integers(0, 6), max_size=4)),
             min_size=1, max_size=12),
    st.sampled_from([1, 4, 16, 64, 512]),
)
def test_replay_matches_a_set_based_reference(raw: list, block_size: int) -> None:
    # hash_ids: one per 512 tokens; make id lists the right length by padding with fresh ids
    requests = []
    for k, (p, o, ids) in enumerate(raw):
        need = ceil_div(p, 512)
        requests.append((p, o, (ids + [1000 + 10 * k + j for j in range(need)])[:need]))
    trace = make_trace(requests)
    result = replay(trace, block_size, None, True)
    assert result.hit_tokens == reference_hit_tokens(trace, block_size)
    assert result.evictions == 0 and result.pool_blocks == unlimited_capacity(trace, block_size)
    # the contrast without prefix caching, closed form vs the pool, unlimited and at the smallest capacity
    largest = max(-(-(p + max(o - 1, 0)) // block_size) for p, o, _ in requests)  # the last token writes no KV
    for capacity in (None, largest, 10**12):
        assert uncached_replay(trace, block_size, capacity) == replay(trace, block_size, capacity, False)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 1500), st.integers(0, 40), st.lists(st.integers(0, 4), max_size=3)),
             min_size=1, max_size=15),
    st.sampled_from([16, 64, 128]),
    st.integers(0, 40),
)
def test_bounded_replay_matches_an_lru_reference(raw: list, block_size: int, extra_capacity: int) -> None:
    requests = []
    for k, (p, o, ids) in enumerate(raw):
        need = ceil_div(p, 512)
        requests.append((p, o, (ids + [1000 + 10 * k + j for j in range(need)])[:need]))
    trace = make_trace(requests)
    capacity = max(ceil_div(p + max(o - 1, 0), block_size) for p, o, _ in requests) + extra_capacity
    result = replay(trace, block_size, capacity, True)
    assert (result.hit_tokens, result.evictions) == reference_lru_replay(trace, block_size, capacity)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 1500), st.integers(0, 40), st.lists(st.integers(0, 4), max_size=3)),
             min_size=1, max_size=40),
    st.sampled_from([8, 16, 64]),
    st.one_of(st.none(), st.integers(0, 30)),
    st.sampled_from([3, 50, 1 << 17]),
)
def test_fast_replay_equals_the_general_replay(raw: list, block_size: int, extra_capacity: int | None,
                                               batch_blocks: int) -> None:
    """The replay's fast path (keys hashed a batch at a time, one fused `serve` per request) against the
    general one (each prompt hashed on its own; allocate, append, release): every number equal, with and
    without evictions, with key batches from a few blocks (many batches, requests split across none) up."""
    requests = []
    for k, (p, o, ids) in enumerate(raw):
        need = ceil_div(p, 512)
        requests.append((p, o, (ids + [1000 + 10 * k + j for j in range(need)])[:need]))
    trace = make_trace(requests)
    capacity = None
    if extra_capacity is not None:
        capacity = max(ceil_div(p + max(o - 1, 0), block_size) for p, o, _ in requests) + extra_capacity
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(share_trace_module, "_BATCH_BLOCKS", batch_blocks)
        fast = replay(trace, block_size, capacity, True)
    assert fast == replay(trace, block_size, capacity, True, fast=False)
    if capacity is None:
        assert fast.hit_tokens == reference_hit_tokens(trace, block_size)
    else:
        assert (fast.hit_tokens, fast.evictions) == reference_lru_replay(trace, block_size, capacity)


def test_a_huge_capacity_is_the_unlimited_replay() -> None:
    trace = make_trace([(1000, 10, [0, 1]), (1100, 10, [0, 1, 2]), (600, 10, [0, 3])])
    huge = replay(trace, 16, 10**12, True)
    unlimited = replay(trace, 16, None, True)
    assert huge.capacity_blocks == 10**12 and huge.pool_blocks == unlimited.pool_blocks
    assert (huge.hit_tokens, huge.evictions) == (unlimited.hit_tokens, 0)


def test_trace_errors() -> None:
    trace = make_trace([(1000, 1, [0])])  # 1000 tokens need 2 hash ids
    with pytest.raises(ValueError, match="need 2 hash_ids"):
        replay(trace, 16, None, True)
    with pytest.raises(ValueError, match="does not divide 512"):
        share_trace(make_trace([(10, 1, [0])]), 24)
    with pytest.raises(ValueError, match="smaller than request 1"):
        share_trace(make_trace([(100, 1, [0])]), 16, capacity_blocks=6)  # needs ceil(101/16) = 7
    assert mooncake_block_keys(np.array([5, 9]), 600, 256).tolist() == [5 * 2 + 0, 5 * 2 + 1]


def test_a_checked_trace_is_checked_once_and_only_for_its_own_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = make_trace([(100, 2, [0]), (100, 2, [0]), (600, 2, [0, 1])])
    checked = check_trace(trace, 16, None)
    # every request's blocks (no eviction in vLLM's free-queue order: trace_blocks.unlimited_capacity), P + O − 1
    # positions each: ceil(101/16) = 7 twice and ceil(601/16) = 38; the largest 38
    assert (checked.pool_blocks, checked.largest_blocks) == (7 + 7 + 38, 38)
    expected = share_trace(trace, 16)
    calls = []
    real = trace_blocks_module.check_requests
    monkeypatch.setattr(trace_blocks_module, "check_requests", lambda *a: calls.append(a[1:]) or real(*a))
    monkeypatch.setattr(share_trace_module, "check_requests", lambda *a: calls.append(a[1:]) or real(*a))
    assert share_trace(trace, 16, checked=checked) == expected and calls == []
    # a check for other arguments (block size, capacity, another trace) is not used: the trace is checked again
    assert share_trace(trace, 16, 40, checked=checked).cached.capacity_blocks == 40 and calls == [(16, 40)]
    assert share_trace(trace, 32, checked=checked).cached.block_size == 32 and calls[1:] == [(32, None)]
    other = make_trace([(100, 2, [0])])
    assert share_trace(other, 16, checked=checked).cached.requests == 1 and calls[2:] == [(16, None)]


def test_the_unlimited_pool_outlasts_every_hand_out() -> None:
    # vLLM's free queue hands out the never-used blocks first and then the oldest freed, cached or not, so only a
    # pool that outlasts every hand-out never evicts. A: 1,024 tokens, ids [1, 2], 1 out: 64 blocks, all keyed;
    # B: 600 tokens, ids [3, 4], 2 out: ceil(601/16) = 38 blocks; C: A again, 64 blocks. C hits (1,024 - 1) // 16
    # = 63 blocks while they are cached
    trace = make_trace([(1024, 1, [1, 2]), (600, 2, [3, 4]), (1024, 1, [1, 2])])
    assert unlimited_capacity(trace, 16) == 64 + 38 + 64
    unlimited = replay(trace, 16, None, True)
    assert (unlimited.hit_tokens, unlimited.evictions, unlimited.pool_blocks) == (63 * 16, 0, 166)
    assert (replay(trace, 16, 166, True, by_ids=False).hit_tokens, unlimited.evictions) == (63 * 16, 0)
    # 90 blocks: A takes 0..63 and frees them tail first (63 first); B takes the 26 never-used 64..89 and then
    # the 12 oldest freed, 63..52, evicting them; C's chain finds blocks 0..51: 52 hits, and it takes 64 - 52 = 12
    # more off the head, B's table freed tail first: its last block (8 prompt tokens + 1 written, hash-less), then
    # 11 of its 37 keyed blocks, evicted: 12 + 11 evictions
    small = replay(trace, 16, 90, True, by_ids=False)
    assert (small.hit_tokens, small.evictions) == (52 * 16, 12 + 11)


def test_azure_trace_has_no_hits(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,5\n"
                    "2023-11-16 18:15:47.0,100,5\n")
    result = share_trace(read_trace("azure", path), 16)
    assert not result.has_prefix_ids and result.cached.hit_tokens == 0
    assert result.cached.peak_used_blocks == ceil_div(105, 16)


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"real trace {MOONCAKE} not present")
def test_real_mooncake_head_matches_the_reference() -> None:
    trace = read_trace("mooncake", MOONCAKE).head(150)
    assert replay(trace, 16, None, True).hit_tokens == reference_hit_tokens(trace, 16)
    bounded = replay(trace, 16, 20_000, True)
    assert (bounded.hit_tokens, bounded.evictions) == reference_lru_replay(trace, 16, 20_000)
    assert bounded == replay(trace, 16, 20_000, True, fast=False)


def test_mooncake_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
             {"timestamp": 5, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert share_trace(read_trace("mooncake", path), 16).cached.hit_tokens == 992
