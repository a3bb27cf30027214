"""What sim's host stores of a request's step (core/sim/tiers_store.store_blocks), as vLLM's offloading connector's
_get_reqs_to_store does (each KV cache group's blocks from next_stored_block_idx to the step's full blocks, null
blocks left out), worked by hand on a plain model, a sliding-window hybrid and a Mamba hybrid under align; and the
look-up of a request preempted by recompute, which finds its own output block in the host."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.record import COMPLETED
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.tiers import HOST, TierCache
from kvcalc.core.sim.tiers_host import OUTPUT_KEYS
from kvcalc.core.sim.tiers_store import store_blocks

KEY0 = 1000  # position i's key: KEY0 + i


def _cache(tmp_path, state_pages: bool = False, **o) -> TierCache:
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [1]}) + "\n")
    sim = build(SimOptions(gpu="H200", trace=("mooncake", str(path)), **o)).sim
    assert sim.tiers is not None
    keys = [KEY0 + np.arange(128, dtype=np.int64)]  # request 0's prompt: 128 keyed blocks
    cache = TierCache(sim.tiers, sim.steptime, sim.block_size, keys, 200, state_pages=state_pages)
    cache.host.register(0, keys[0].tolist(), (0,) * len(cache.classes))  # its look-up (a first hit of 0)
    return cache


def _held(cache: TierCache) -> dict[str, list[int]]:
    """The positions the host holds, per group label."""
    C = len(cache.classes)
    out: dict[str, list[int]] = {g.label: [] for g in cache.classes}
    for e in cache.host.stamp:
        k, c = divmod(e, C)
        out[cache.classes[c].label].append(k - KEY0 if k < OUTPUT_KEYS else k - OUTPUT_KEYS)
    return {label: sorted(p) for label, p in out.items()}


def test_plain_model_stores_prompt_and_output_blocks(tmp_path):
    # Llama-3.1-8B, block 16: a prefill of 2,049 tokens fills blocks 0..127 (2,048 tokens): 128 entries of
    # 16 x 131,072 = 2,097,152 B. The decode step that computes token 2,064 fills block 128, which holds sampled
    # tokens: key OUTPUT_KEYS + request 0 x P + 128 (P = 200 positions), written too
    cache = _cache(tmp_path, model="llama-3.1-8b", block_size=16, host_cache="1GiB")
    store_blocks(cache, 0, 0, 2049)
    assert cache.stored[0] == 128 and _held(cache) == {"full": list(range(128))}
    assert cache.totals.write_blocks == [128, 0] and cache.totals.write_bytes == [128 * 2_097_152, 0]
    store_blocks(cache, 0, 2049, 2063)  # decode steps short of the boundary: nothing
    assert cache.stored[0] == 128 and cache.totals.write_blocks == [128, 0]
    store_blocks(cache, 0, 2063, 2064)
    assert OUTPUT_KEYS + 0 * 200 + 128 in cache.host.stamp and cache.totals.write_blocks == [129, 0]


def test_gemma3_sliding_group_stores_what_the_step_computed_and_the_window_of_its_hit(tmp_path):
    # Gemma-3-27B, block 16, full and sliding_1024 groups (1,310,720 and 7,864,320 B a block, vLLM's layout).
    cache = _cache(tmp_path, model="gemma-3-27b", block_size=16, host_cache="4GiB", max_model_len=8192)
    # No hit, a prefill of 2,049 tokens: every block computed holds KV in both groups (the window frees blocks
    # only after the step): 128 + 128 entries, 128 x 9,175,040 = 1,174,405,120 B
    store_blocks(cache, 0, 0, 2049)
    assert _held(cache) == {"full": list(range(128)), "sliding_1024": list(range(128))}
    assert cache.totals.write_bytes == [1_174_405_120, 0]


def test_gemma3_a_gpu_hit_is_offered_from_its_first_block_without_its_null_ones(tmp_path):
    # A request with a GPU hit of 100 blocks (1,600 tokens) computes to 2,049. Its next_stored_block_idx is 0 (no
    # load): the hit's blocks are offered too, as vLLM's connector does, but a sliding group's blocks before the
    # window are null: get_num_skipped_tokens(1,600) = 1,600 − 1,024 + 1 = 577 -> block 577 // 16 = 36. Stored:
    # full 0..127 (128) and sliding 36..127 (92): 220 entries, 128 x 1,310,720 + 92 x 7,864,320 = 891,289,600 B
    cache = _cache(tmp_path, model="gemma-3-27b", block_size=16, host_cache="4GiB", max_model_len=8192)
    store_blocks(cache, 0, 1600, 2049)
    assert _held(cache) == {"full": list(range(128)), "sliding_1024": list(range(36, 128))}
    assert cache.totals.write_blocks == [220, 0] and cache.totals.write_bytes == [891_289_600, 0]
    # held entries are not written again: the same step once more writes nothing
    cache.stored[0] = 0
    store_blocks(cache, 0, 1600, 2049)
    assert cache.totals.write_blocks == [220, 0]


def test_nemotron_align_stores_a_state_only_where_a_step_ends_on_a_boundary(tmp_path):
    # Nemotron-H-56B under mamba_cache_mode align: block 4,128; per block the full table's 169,082,880 B and a
    # state page of 1,014,497,280 B. A prefill chunk [0, 6,000) fills block 0 of the full group; the state saved at
    # 6,000 is inside block 1, not stored (vLLM's state block of a step ending mid-block is not full). The next
    # step [6,000, 8,256) ends on block 1's boundary: full block 1 and the state at 8,256 (block 1) are stored.
    cache = _cache(tmp_path, state_pages=True, model="nemotron-h-56b", mamba_cache_mode="align",
                   host_cache="100GiB", max_model_len=16384)
    assert cache.block_size == 4128
    store_blocks(cache, 0, 0, 6000)
    assert _held(cache) == {"full": [0], "state_mamba2": []}
    store_blocks(cache, 0, 6000, 8256)
    assert _held(cache) == {"full": [0, 1], "state_mamba2": [1]}
    assert cache.totals.write_bytes == [2 * 169_082_880 + 1_014_497_280, 0]
    # one step over both blocks from 0 to 8,256 stores full 0, 1 and the state at its end only (block 1)
    other = _cache(tmp_path, state_pages=True, model="nemotron-h-56b", mamba_cache_mode="align",
                   host_cache="100GiB", max_model_len=16384)
    store_blocks(other, 0, 0, 8256)
    assert _held(other) == {"full": [0, 1], "state_mamba2": [1]}


def test_a_recomputed_request_looks_its_own_output_blocks_up(tmp_path):
    # Llama-3.1-8B, block 16, request 0's prompt of 2,049 tokens (128 keyed blocks) and 15 sampled tokens: the
    # step that computes token 2,064 stored block 128 (sampled tokens, its own key). Preempted by recompute, it comes
    # back with 2,049 + 16 = 2,065 tokens: vLLM's connector looks up (2,065 − 1) // 16 = 129 blocks, its output block
    # included; with no GPU hit the host holds all 129. The load-or-recompute rule then loads 120 and recomputes 9:
    # a weight-bound step computes the last 145 tokens as fast as 1 (the first k of the least cost), over any link
    cache = _cache(tmp_path, model="llama-3.1-8b", block_size=16, host_cache="1GiB", host_bw="10TB/s")
    store_blocks(cache, 0, 0, 2049)
    store_blocks(cache, 0, 2049, 2064)
    plan = cache.plan(0, 0, 2065, 0.0)
    assert plan.load_blocks + plan.skipped == 129 and plan.tier_of == (HOST,) * plan.load_blocks
    assert plan.load_blocks == 120
    cache.commit(0, plan, 0.0)
    assert cache.stored[0] == 120 and len(cache.host.pinned) == 120  # read entries pinned until the load lands
    cache.landed(0, plan)
    assert not cache.host.pinned


def _write_through_trace(tmp_path, n=40, seed=3):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        shared = int(rng.integers(0, 4))  # a prefix of up to 3 ids shared by everyone
        ids = [*range(1, shared + 1), *(1000 * (i + 1) + j for j in range(int(rng.integers(1, 4))))]
        prompt = 512 * (len(ids) - 1) + int(rng.integers(1, 512))
        rows.append((0.05 * i, prompt, int(rng.integers(1, 700)), ids))
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": int(t * 1000), "input_length": p, "output_length": o,
                                        "hash_ids": ids}) + "\n" for t, p, o, ids in rows))
    return path


@pytest.mark.parametrize(("model", "capacity"), [("llama-3.1-8b", 12), ("gemma-3-12b", 36)])
@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_host_that_never_evicts_holds_every_block_computed(tmp_path, fast_forward, model, capacity):
    # block 512 (layout ideal), a small pool (preemptions by recompute, prefix hits, loads) and a host larger than
    # everything: after the run it holds exactly every full block each request computed — its prompt's keyed blocks
    # and its blocks of sampled tokens up to its last computed token (prompt + output − 1), in every group: on
    # Gemma-3 a sliding block a request did not store (before its hit's window) was stored by the request that
    # computed it — whatever steps, runs of decode steps, loads and re-admissions did it
    o = SimOptions(trace=("mooncake", str(_write_through_trace(tmp_path))), model=model, block_size=512,
                   layout="ideal", host_cache="1M")
    setup = build(o)
    sim = replace(setup.sim, capacity_blocks=capacity,
                  scheduler=replace(setup.sim.scheduler, fast_forward=fast_forward))
    from kvcalc.core.sim import tiers_run

    caches = []
    real = tiers_run.TierCache

    def keep(*a, **kw):
        caches.append(real(*a, **kw))
        return caches[-1]

    tiers_run.TierCache = keep
    try:
        record = run_policy(setup.workload, "paged", sim)
    finally:
        tiers_run.TierCache = real
    cache = caches[0]
    assert record.preemptions.sum() > 0 and record.tiers.host_hit_blocks.sum() > 0  # the run exercises both
    assert (record.status == COMPLETED).sum() >= len(setup.workload) - 2  # (a request longer than the pool is not)
    want = set()
    w, C = setup.workload, len(cache.classes)
    for rid in np.flatnonzero(record.status == COMPLETED).tolist():
        computed = int(w.prompt_tokens[rid] + w.output_tokens[rid] - 1)
        want |= {k * C + c for k in cache.keys_to(rid, computed // 512)[: computed // 512] for c in range(C)}
    assert set(cache.host.stamp) == want and record.tiers.dropped_blocks == 0
