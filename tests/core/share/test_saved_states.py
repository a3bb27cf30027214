"""Align-mode hits per capacity (core/share/saved_states.py) against an independent replay: a dict of saved
states over an OrderedDict LRU of blocks, a state leaving with its block."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from kvcalc.core.inputs.traces import Trace, read_trace
from kvcalc.core.share.capacity import saved_state_hit_blocks
from kvcalc.core.share.saved_states import saved_state_hit_curve
from kvcalc.core.share.stack_distance import stack_distances

ROOT = Path(__file__).resolve().parents[3]


def _trace(rows) -> Trace:
    ids = [np.array(i, np.int64) for _, i in rows]
    offsets = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int64)
    return Trace("mooncake", "test", np.arange(len(rows), dtype=np.float64), np.array([p for p, _ in rows]),
                 np.ones(len(rows), np.int64), np.concatenate(ids), offsets)


def _replay(rows, block: int, capacity: int | None) -> int:
    """Requests one at a time: the longest cached prefix, cut back to the last block with a saved state; then
    the request's blocks on top (block 0 most recent), the LRU's oldest evicted with their states, and a state
    saved after its last full block. Blocks are keyed by their whole prefix (ids, then the index in the id)."""
    per_id, ids_per_block = max(512 // block, 1), max(block // 512, 1)
    lru: OrderedDict[tuple, None] = OrderedDict()
    states: set[tuple] = set()
    total = 0
    for p, ids in rows:
        m, eligible = p // block, max(p - 1, 0) // block
        keys = [(tuple(ids[: (j // per_id + 1) * ids_per_block]), j % per_id) for j in range(m)]
        best = 0
        for j in range(min(m, eligible)):
            if keys[j] not in lru:
                break
            if keys[j] in states:
                best = j + 1
        total += best
        for key in reversed(keys):
            lru[key] = None
            lru.move_to_end(key)
        while capacity is not None and len(lru) > capacity:
            states.discard(lru.popitem(last=False)[0])
        if m:
            states.add(keys[m - 1])
    return total


# B = 512: r0 [1, 2] (2 blocks, saves after block 2); r1 [1, 2, 3] (3 blocks, eligible 3): resumes after 2 if
# block 2 (depth 2 before r1) survives, saves after 3; r2 [1, 2, 3]: after 3 if block 3 survives (depth 3, its
# deepest since the save), else after 2 (deepest 2). Totals: C = 1: 0; C = 2: 2 + 2; C = 3: 2 + 3; unbounded 5.
HAND = [(1025, [1, 2]), (1537, [1, 2, 3]), (1537, [1, 2, 3])]


def test_hand_worked():
    trace = _trace(HAND)
    d = stack_distances(trace, 512)
    assert saved_state_hit_curve(trace, d, [1, 2, 3, None]) == [0, 4, 5, 5]
    assert [_replay(HAND, 512, c) for c in (1, 2, 3, None)] == [0, 4, 5, 5]
    assert saved_state_hit_blocks(trace, 512) == 5


@pytest.mark.parametrize("block", [16, 128, 512, 1024])
@pytest.mark.parametrize("seed", range(6))
def test_random_traces_against_the_replay(block, seed):
    rng = np.random.default_rng(seed)
    roots = [[int(x) for x in rng.integers(1, 10_000, 3)] for _ in range(3)]
    rows, fresh = [], 20_000
    for _ in range(40):  # conversations: a root's prefix, grown by new ids, with repeats
        base = list(roots[rng.integers(3)])[: int(rng.integers(1, 4))]
        extra = int(rng.integers(0, 4))
        ids = base + list(range(fresh, fresh + extra))
        fresh += extra
        if rows and rng.random() < 0.4:  # a later turn of an earlier prompt
            ids = [*rows[int(rng.integers(len(rows)))][1], fresh]
            fresh += 1
        p = int(rng.integers(512 * (len(ids) - 1) + 1, 512 * len(ids) + 1))
        rows.append((p, ids))
        roots.append(ids)
    trace = _trace(rows)
    d = stack_distances(trace, block)
    caps = [0, 1, 2, 3, 5, 8, 13, 21, 34, None]
    assert saved_state_hit_curve(trace, d, caps) == [_replay(rows, block, c) for c in caps]
    assert saved_state_hit_curve(trace, d, [None])[0] == saved_state_hit_blocks(trace, block)


def test_mooncake_conversation_head():
    path = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
    if not path.exists():
        pytest.skip("../shared/traces/mooncake_conversation.jsonl is absent")
    trace = read_trace("mooncake", path).head(400)
    rows = [(int(p), trace.request_hash_ids(i).tolist()) for i, p in enumerate(trace.prompt_tokens.tolist())]
    d = stack_distances(trace, 512)
    caps = [50, 200, 1_000, 5_000, None]
    assert saved_state_hit_curve(trace, d, caps) == [_replay(rows, 512, c) for c in caps]
