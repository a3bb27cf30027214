"""The prefix cache end to end against an independent replay: the block pool's hit tokens and cached
blocks on a whole Mooncake-style trace equal a plain-Python replay over hash ids (id_replay.py, no kvcalc
code), at blocks 16, 64, 512, 1,024 and 4,096, through `share`'s replay in the pool (batch hashing and fused `serve`;
a block of 512·m tokens keyed by the id of its last 512-token block) and per hash id (what `share` runs when
nothing can be evicted, every field equal), and at 1,024 and 4,096 also the pool
driven directly with each block keyed by the tuple of its ids.

A constructed trace always runs; the real Mooncake traces run when ../shared/traces holds them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from kvcalc.core.inputs.traces import Trace, read_trace
from kvcalc.core.pool.block_pool import BlockPool
from kvcalc.core.share.replay import replay
from kvcalc.core.share.trace_blocks import in_arrival_order

_spec = importlib.util.spec_from_file_location("id_replay", Path(__file__).with_name("id_replay.py"))
id_replay_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(id_replay_module)
id_replay = id_replay_module.id_replay
ID_TOKENS = id_replay_module.ID_TOKENS

TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"
BLOCKS = [16, 64, 512, 1024, 4096]


def requests_of(trace: Trace) -> list[tuple[int, list[int]]]:
    return [(int(trace.prompt_tokens[i]), trace.request_hash_ids(i).tolist()) for i in range(len(trace))]


def pool_replay(trace: Trace, block_size: int) -> tuple[int, int, int]:
    """(hit tokens, hit blocks, cached blocks at the end) of `share`'s replay, unlimited capacity, through the
    block pool (B = 512·m keyed by the last id of each block); every field equal to what `kvcalc share --trace
    mooncake` computes per hash id when nothing can be evicted (core/share/id_replay.py)."""
    r = replay(trace, block_size, None, True, by_ids=False)
    assert replay(trace, block_size, None, True) == r
    return r.hit_tokens, r.hit_blocks, r.peak_cached_blocks


def tuple_key_replay(trace: Trace, block_size: int) -> tuple[int, int, int]:
    """The pool driven directly, each full block of B = 512·m tokens keyed by the tuple of its m ids (object
    keys, chained by the pool): exact whether or not the ids are prefix-chained."""
    per_block = block_size // ID_TOKENS
    requests = requests_of(trace)
    outputs = trace.output_tokens.tolist()
    pool = BlockPool(sum(-(-(n + o) // block_size) for (n, _), o in zip(requests, outputs, strict=True)), block_size)
    cached = 0
    for (prompt, ids), output in zip(requests, outputs, strict=True):
        keys = [tuple(ids[j * per_block : (j + 1) * per_block]) for j in range(prompt // block_size)]
        pool.serve(prompt, keys, output)
        cached = max(cached, pool.usage().cached_free_blocks)
    stats = pool.stats()
    return stats.hit_tokens, stats.hit_blocks, cached


def constructed_trace(seed: int, requests: int = 300) -> Trace:
    """Conversations over a shared system prompt (id 0 first in every request, as in Mooncake), with
    sessions that grow turn by turn, branch, and end mid-id (partial last ids, prompts of every length)."""
    rng = np.random.default_rng(seed)
    sessions: list[list[int]] = []
    next_id = 1
    prompts, ids = [], []
    for _ in range(requests):
        if sessions and rng.random() < 0.6:  # a later turn of a session: its ids, then new ones
            base = sessions[int(rng.integers(len(sessions)))]
            base = base[: int(rng.integers(1, len(base) + 1))] if rng.random() < 0.2 else base  # a branch
        else:
            base = [0]
        grow = int(rng.integers(0, 12))
        chain = base + list(range(next_id, next_id + grow))
        next_id += grow
        sessions.append(chain)
        tokens = (len(chain) - 1) * ID_TOKENS + int(rng.integers(1, ID_TOKENS + 1))  # the last id partly used
        prompts.append(tokens)
        ids.append(chain)
    offsets = np.zeros(requests + 1, dtype=np.int64)
    np.cumsum([len(c) for c in ids], out=offsets[1:])
    return Trace("mooncake", f"constructed-{seed}", np.arange(requests, dtype=np.float64), np.array(prompts),
                 rng.integers(1, 600, size=requests), np.concatenate([np.array(c) for c in ids]), offsets)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("block_size", BLOCKS)
def test_constructed_trace_matches_the_id_replay(seed: int, block_size: int) -> None:
    trace = constructed_trace(seed)
    expected = id_replay(requests_of(trace), block_size)
    assert expected[0] > 0  # the trace shares prefixes at every block size
    assert pool_replay(trace, block_size) == expected
    if block_size > ID_TOKENS:
        assert tuple_key_replay(trace, block_size) == expected


def test_id_replay_by_hand() -> None:
    """The reference itself on three requests at block 256 (two blocks per id):
    a: ids [0, 1], 1,000 tokens: 3 full blocks, nothing cached yet: 0 hits; caches (0, s0) (0, s1) (1, s0).
    b: ids [0, 1], 1,024 tokens: 4 full blocks, at most (1,024 - 1) // 256 = 3 hit: (0,s0) (0,s1) (1,s0)
       are cached: 3 hits = 768 tokens; caches (1, s1): 4 blocks cached.
    c: ids [0, 2], 700 tokens: 2 full blocks, at most 699 // 256 = 2 hit: both (id 0): 512 tokens."""
    assert id_replay([(1000, [0, 1]), (1024, [0, 1]), (700, [0, 2])], 256) == (768 + 512, 5, 4 + 0)
    # block 1,024 (two ids a block): a caches [0, 1] and [3, 4]; b (2,100 tokens: 2 full blocks, at most
    # 2,099 // 1,024 = 2 hit) hits both: 2,048 tokens; c's one full block is [0, 2], not [0, 1]: no hit,
    # and it is cached: 3 blocks
    assert id_replay([(2048, [0, 1, 3, 4]), (2100, [0, 1, 3, 4, 5]), (1500, [0, 2, 6])], 1024) == (2048, 2, 3)


@pytest.mark.parametrize("name", ["mooncake_conversation.jsonl", "mooncake_synthetic.jsonl"])
@pytest.mark.parametrize("block_size", BLOCKS)
def test_mooncake_trace_matches_the_id_replay(name: str, block_size: int) -> None:
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"the Mooncake trace is not at {path} (see ../shared/traces/README.md)")
    trace = in_arrival_order(read_trace("mooncake", path))
    expected = id_replay(requests_of(trace), block_size)
    assert pool_replay(trace, block_size) == expected
    if block_size > ID_TOKENS:
        assert tuple_key_replay(trace, block_size) == expected
