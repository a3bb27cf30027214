"""sim's lower tiers per KV cache group (core/sim/tiers.py, tiers_groups.py, tiers_lru.py), by hand on the tier
cache alone: a group's block written on its own (`_write`: one store each, the host's own LRU evicting, in bytes),
what a hit needs of each group, what a load reads.

vLLM's offloading connector (distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py, its HMA version)
keys a CPU block by (block hash, group) and looks a hit of h blocks up per group: full attention every block
after the GPU hit (_maximal_prefix_lookup), a sliding window of W the last cdiv(W, B) blocks
(_sliding_window_lookup), a Mamba group one block, the state at h − 1; it loads each group's non-null blocks only
(update_state_after_alloc), which are single_type_kv_cache_manager's blocks from get_num_skipped_tokens(h·B) // B
on. A chunked group (Llama-4's ChunkedLocalAttentionSpec) has no rule there; kvcalc needs the current chunk's
blocks, the GPU prefix cache's rule. An entry is `position key · C + class` (C classes: the tier's byte groups).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.share.cache_bytes import GroupBytes
from kvcalc.core.share.load_or_recompute import prefill_s
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.tiers import DISK, HOST, TierCache
from kvcalc.core.sim.tiers_groups import find, read_counts, valid_loads
from kvcalc.core.sim.tiers_store import _demote as demote_to_disk

LINK = 25e9  # the host link's default, bytes/s
KEY0 = 1000  # position i's key: KEY0 + i


def _cache(tmp_path, state_pages: bool = False, **o) -> TierCache:
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [1]}) + "\n")
    sim = build(SimOptions(gpu="H200", trace=("mooncake", str(path)), **o)).sim
    assert sim.tiers is not None
    return TierCache(sim.tiers, sim.steptime, sim.block_size, [_keys(1024)], 1100, state_pages=state_pages)


WRITER = 1  # a request id that stores the test's entries (its touches cover none of request 0's prompt keys)


def _write(cache: TierCache, group: str, positions) -> None:
    """`group`'s blocks of these positions are written to the top tier, one store each, in this order (each the
    most recent once written: the writer's touch covers none of them)."""
    c = [g.label for g in cache.classes].index(group)
    C, host = len(cache.classes), cache.host
    if WRITER not in host.lo:
        host.register(WRITER, [], (1 << 40,) * C)
    for p in positions:
        size, held = host.bytes, len(host)
        evicted = host.store([int(KEY0 + p) * C + c], [int(p)], WRITER)
        assert evicted is not None
        host.end_step()
        cache.totals.write_blocks[cache.top] += len(host) - held + len(evicted)
        cache.totals.write_bytes[cache.top] += host.bytes - size + host.weigh(evicted)
        demote_to_disk(cache, evicted)


def _keys(n: int) -> np.ndarray:
    return KEY0 + np.arange(n, dtype=np.int64)


@pytest.fixture
def gemma(tmp_path) -> TierCache:
    # Gemma-3-27B, vLLM's layout at block 16: a position is the full table's 10 pages of 131,072 B (1,310,720 B) and
    # the sliding tables' 60 (52 layers + 8 padding slots: 7,864,320 B), 9,175,040 B in all. 4 GiB of host:
    # 4,294,967,296 // 9,175,040 = 468 positions = 4,293,918,720 B (= 546 sliding blocks, 3,276 full ones)
    cache = _cache(tmp_path, model="gemma-3-27b", block_size=16, host_cache="4GiB", max_model_len=8192)
    assert [(g.label, g.bytes_per_block) for g in cache.classes] == [("full", 1_310_720), ("sliding_1024", 7_864_320)]
    assert cache.capacity_bytes == (468 * 9_175_040, 0) == (4_293_918_720, 0)
    return cache


def test_a_write_moves_one_groups_block(gemma):
    # full 0..127 and sliding 64..127 evicted: 128 + 64 = 192 entries, 128 x 1,310,720 + 64 x 7,864,320 =
    # 167,772,160 + 503,316,480 = 671,088,640 B (all groups' bytes of 128 positions would be 1,174,405,120 B)
    _write(gemma, "full", range(128))
    _write(gemma, "sliding_1024", range(64, 128))
    assert gemma.totals.write_blocks == [192, 0] and gemma.totals.write_bytes == [671_088_640, 0]
    assert gemma.lru[HOST].bytes == 671_088_640 and len(gemma.lru[HOST]) == 192


def test_the_host_is_filled_in_bytes(gemma):
    # 546 sliding blocks fill the 4,293,918,720 B exactly; one full block (1,310,720 B) more drops the oldest
    # entry, a sliding one (ceil(1,310,720 / 7,864,320) = 1 pop), which frees room for 6 full blocks in all: five
    # more drop nothing, the seventh drops the next sliding block
    _write(gemma, "sliding_1024", range(546))
    assert gemma.lru[HOST].bytes == 4_293_918_720 and gemma.totals.dropped_blocks == 0
    _write(gemma, "full", [0])
    assert gemma.totals.dropped_blocks == 1 and KEY0 * 2 + 1 not in gemma.lru[HOST].stamp
    _write(gemma, "full", range(1, 6))
    assert gemma.totals.dropped_blocks == 1 and gemma.lru[HOST].bytes == 4_293_918_720
    _write(gemma, "full", [6])
    assert gemma.totals.dropped_blocks == 2 and (KEY0 + 1) * 2 + 1 not in gemma.lru[HOST].stamp
    assert gemma.lru[HOST].bytes == 4_293_918_720 - 7_864_320 + 1_310_720


def test_gemma3_a_hit_needs_the_window_of_the_sliding_group_only(gemma):
    # A prompt of 2,049 tokens: eligible (2,049 − 1) // 16 = 128 blocks, no GPU hit. The host holds the full blocks
    # 0..127 and the sliding blocks 64..127 only (0..63 not written). A hit of k blocks needs the
    # sliding blocks k − cdiv(1,024, 16) = k − 64 .. k − 1: only k = 128 finds them (64..127); k = 1..127 needs
    # one of 0..63. Every-group-at-every-position (the rule before) loads nothing.
    _write(gemma, "full", range(128))
    _write(gemma, "sliding_1024", range(64, 128))
    plan = gemma.plan(0, 0, 2049, 0.0)
    assert plan.load_blocks == 128 and plan.skipped == 0 and set(plan.tier_of) == {HOST}
    # it reads full 128 x 1,310,720 = 167,772,160 B and the window's (2,048 − 1,023) // 16 = 64.. 127: 64 x
    # 7,864,320 = 503,316,480 B: 671,088,640 B over 25 GB/s = 26.84 ms, less than prefilling the 2,048 tokens
    wait = 671_088_640 / LINK
    assert plan.ready_s == pytest.approx(wait, rel=1e-12)
    assert wait + prefill_s(gemma.steptime, 2048, 1) < prefill_s(gemma.steptime, 0, 2049)
    gemma.commit(0, plan, 0.0)
    assert gemma.totals.read_group_bytes[HOST] == {"full": 167_772_160, "sliding_1024": 503_316_480}
    # inclusive: the read entries stay in the host, pinned until the load lands (the full group's 128, the window's 64)
    assert gemma.totals.read_blocks == [128, 0] and len(gemma.lru[HOST]) == 192 and len(gemma.host.pinned) == 192


def test_gemma3_a_hole_in_the_window_cuts_the_hit(gemma):
    # sliding 64..127 but 100: a hit of k needs k − 64..k − 1 free of 100, and (k < 64) the sliding 0..k − 1:
    # none valid from 1 to 100, nor 101..128 (each window k − 64..k − 1 covers 100 for k <= 164): nothing loads
    _write(gemma, "full", range(128))
    _write(gemma, "sliding_1024", [*range(64, 100), *range(101, 128)])
    plan = gemma.plan(0, 0, 2049, 0.0)
    assert plan.load_blocks == 0 and plan.skipped == 128


def test_a_load_the_pool_cannot_take_is_cut_to_one_it_can(gemma):
    # Every group's block of 0..127 in the host: every k is valid and the rule loads 119 (past it, reading 1,310,720
    # B more a block costs more than the prefill it saves: the step time is flat there). Suppose the pool can take
    # the admission of at most 100 loaded blocks (kvcalc allocates loaded tokens as a prefill chunk: on an idle
    # pool, a load it cannot take would wait forever): the plan is cut to 100, 28 more recomputed; it reads full
    # 100 x 1,310,720 = 131,072,000 B and the window (1,600 − 1,023) // 16 = 36..99: 64 x 7,864,320 = 503,316,480 B
    _write(gemma, "full", range(128))
    _write(gemma, "sliding_1024", range(128))
    plan = gemma.plan(0, 0, 2049, 0.0)
    assert (plan.load_blocks, plan.skipped) == (119, 9)
    cut = gemma.shrink(plan, lambda k: k <= 100, 0.0)
    assert (cut.load_blocks, cut.skipped) == (100, 28)
    assert cut.ready_s == pytest.approx((131_072_000 + 503_316_480) / LINK, rel=1e-12)
    # with the sliding blocks 0..63 gone only k = 128 is valid: nothing below it fits but k = 0
    hole = _cache_like(gemma)
    _write(hole, "full", range(128))
    _write(hole, "sliding_1024", range(64, 128))
    cut = hole.shrink(hole.plan(0, 0, 2049, 0.0), lambda k: k <= 100, 0.0)
    assert (cut.load_blocks, cut.skipped, cut.ready_s) == (0, 128, 0.0)


@pytest.fixture
def scout(tmp_path) -> TierCache:
    # Llama-4-Scout tp 2, block 16: 2,048 B a token a layer per GPU, a block 32,768 B a layer: 36 chunked layers
    # (C = 8,192) 1,179,648 B, 12 full layers 393,216 B
    cache = _cache(tmp_path, model="llama-4-scout", tp=2, block_size=16, host_cache="40GiB", max_model_len=16384)
    assert [(g.label, g.bytes_per_block) for g in cache.classes] == [("chunked_8192", 1_179_648), ("full", 393_216)]
    return cache


def test_scout_a_hit_ending_on_a_chunk_boundary_needs_no_chunked_block(scout):
    # 8,193 tokens: eligible 512 blocks = 8,192 tokens. The host holds the full blocks 0..511 and no chunked one.
    # A hit of k needs the chunked blocks (16k // 8,192 · 8,192) // 16 = 512 · (k // 512) .. k − 1: for k < 512
    # blocks 0..k − 1 (absent), for k = 512 none: the hit ends on the chunk's end, the next token starts a chunk.
    _write(scout, "full", range(512))
    plan = scout.plan(0, 0, 8193, 0.0)
    assert plan.load_blocks == 512 and plan.skipped == 0
    scout.commit(0, plan, 0.0)
    # reads 512 x 393,216 = 201,326,592 B of the full layers, nothing of the chunked ones
    assert scout.totals.read_group_bytes[HOST] == {"full": 201_326_592, "chunked_8192": 0}
    assert plan.ready_s == pytest.approx(201_326_592 / LINK, rel=1e-12)


def test_scout_a_hit_inside_a_chunk_needs_that_chunks_blocks(scout):
    # 10,241 tokens: eligible 640. Full 0..639 and chunked 512..639 in the host (the first chunk's chunked blocks
    # gone): k = 512..640 are valid (chunked 512..k − 1), k < 512 not. The rule loads all 640 (the prefill of the
    # rest is longest at k = 512): full 640 x 393,216 = 251,658,240 B, chunked 128 x 1,179,648 = 150,994,944 B
    _write(scout, "full", range(640))
    _write(scout, "chunked_8192", range(512, 640))
    plan = scout.plan(0, 0, 10241, 0.0)
    assert plan.load_blocks == 640
    scout.commit(0, plan, 0.0)
    assert scout.totals.read_group_bytes[HOST] == {"full": 251_658_240, "chunked_8192": 150_994_944}
    # with the chunked block 600 missing, k = 601..640 are out: the largest left is 600
    scout2 = _cache_like(scout)
    _write(scout2, "full", range(640))
    _write(scout2, "chunked_8192", [*range(512, 600), *range(601, 640)])
    assert scout2.plan(0, 0, 10241, 0.0).load_blocks <= 600


def _cache_like(cache: TierCache) -> TierCache:
    return TierCache(cache.tiers, cache.steptime, cache.block_size, [_keys(1024)], 1100)


@pytest.fixture
def nemotron(tmp_path) -> TierCache:
    # Nemotron-H-56B on an H200, mamba_cache_mode align: block 4,128; per block the full table's 10 x 16,908,288 =
    # 169,082,880 B and a state page of 6 tables x 10 slots x 16,908,288 = 1,014,497,280 B (vLLM's layout)
    cache = _cache(tmp_path, state_pages=True, model="nemotron-h-56b", mamba_cache_mode="align", host_cache="100GiB",
                   max_model_len=16384)
    assert cache.block_size == 4128
    assert [(g.label, g.bytes_per_block) for g in cache.classes] == [
        ("full", 169_082_880), ("state_mamba2", 1_014_497_280)]
    return cache


@pytest.mark.parametrize(("states", "loaded", "skipped"), [([1], 2, 1), ([1, 2], 3, 0), ([0], 1, 2), ([], 0, 3)])
def test_nemotron_a_load_ends_where_a_state_is(nemotron, states, loaded, skipped):
    # 13,000 tokens: eligible (13,000 − 1) // 4,128 = 3 blocks; the host holds the full blocks 0..2 and the states
    # at `states`. A hit of k needs the one state at k − 1 (a Mamba group's window is one block): the longest valid
    # load ends at the last state (each beats prefilling its 4,128 tokens: 169,082,880 + 1,014,497,280 B = 47.3 ms)
    _write(nemotron, "full", range(3))
    _write(nemotron, "state_mamba2", states)
    plan = nemotron.plan(0, 0, 13000, 0.0)
    assert (plan.load_blocks, plan.skipped) == (loaded, skipped)
    nemotron.commit(0, plan, 0.0)
    # reads k full blocks and ONE state page: k x 169,082,880 + 1,014,497,280
    read = {"full": loaded * 169_082_880, "state_mamba2": 1_014_497_280} if loaded else {}
    assert nemotron.totals.read_group_bytes[HOST] == read
    assert nemotron.totals.read_state_pages == [1 if loaded else 0, 0]
    assert nemotron.totals.read_blocks == [loaded, 0]


def test_nemotron_a_state_on_disk_makes_the_position_a_disk_hit(tmp_path):
    # host 0 B, disk 100 GiB: everything is written to the disk; a load of 2 reads the disk only
    cache = _cache(tmp_path, state_pages=True, model="nemotron-h-56b", mamba_cache_mode="align", host_cache="0",
                   disk_cache="100GiB", max_model_len=16384)
    _write(cache, "full", range(3))
    _write(cache, "state_mamba2", [1])
    plan = cache.plan(0, 0, 13000, 0.0)
    assert plan.load_blocks == 2 and plan.tier_of == (DISK, DISK)


# ---- against vLLM's connector look-up, re-written from its source (an independent model) ---------------------------

def _vllm_lookup(present: list[list[bool]], kinds: list[str], windows: list[int], g: int, n: int, B: int) -> int:
    """OffloadingConnectorScheduler._lookup (HMA) in blocks after g GPU hits of n eligible: full groups a maximal
    prefix, then sliding/Mamba groups (largest window first) the end of their last run of cdiv(W, B) (Mamba: 1)
    consecutive hits, or a run from g shorter than that; each group may lower the hit, and the sliding groups are
    looked up again until it holds."""
    def suffix(seg: list[bool], w: int) -> int:
        run = 0
        for i in range(len(seg) - 1, -1, -1):
            run = run + 1 if seg[i] else 0
            if run == w:
                return i + w
        return run

    size = [None if k == "full" else 1 if k == "state" else -(-windows[c] // B) for c, k in enumerate(kinds)]
    slides = sorted((c for c, k in enumerate(kinds) if k != "full"), key=lambda c: -size[c])
    everyone = [c for c, k in enumerate(kinds) if k == "full"] + slides
    top, hit, todo = n, 0, everyone
    while todo:
        looked, groups, todo = False, todo, []
        for c in groups:
            if top - g < 1:
                return 0
            seg = present[c][g:top]
            w = size[c]
            hits = next((i for i, p in enumerate(seg) if not p), len(seg)) if w is None else suffix(seg, w)
            if hits == 0:
                return 0
            top = min(top, g + hits)
            if top - g < hit and looked and not todo:
                todo = slides
            looked |= w is not None
            hit = top - g
    return hit


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_the_longest_valid_load_is_vllms_hit(data):
    B = data.draw(st.sampled_from([1, 4, 16]), label="B")
    kinds = data.draw(st.lists(st.sampled_from(["full", "sliding", "state"]), min_size=1, max_size=4), label="kinds")
    windows = [data.draw(st.integers(1, 80)) if k == "sliding" else 0 for k in kinds]
    n = data.draw(st.integers(0, 30), label="n")
    g = data.draw(st.integers(0, n), label="g")
    present = [[data.draw(st.booleans()) if i >= g else True for i in range(n)] for _ in kinds]
    classes = tuple(GroupBytes(f"{k}_{c}", 1, 100 + c, k, windows[c] if k == "sliding" else None)
                    for c, k in enumerate(kinds))
    C = len(classes)
    host = {(KEY0 + i) * C + c: 0 for c in range(C) for i in range(g, n) if present[c][i]}
    found = find((host, {}), list(range(KEY0 + g, KEY0 + n)), classes)
    valid = valid_loads(found, classes, g, B)
    assert int(np.flatnonzero(valid).max()) == _vllm_lookup(present, kinds, windows, g, n, B)
    # what each valid load reads: a group's blocks from vLLM's get_num_skipped_tokens((g + k)·B) // B on
    ks = np.flatnonzero(valid)
    reads = read_counts(found, classes, g, B, ks)
    for c, (k_, gb) in enumerate(zip(kinds, classes, strict=True)):
        for j, k in enumerate(ks.tolist()):
            h = g + k
            skipped = {"full": 0, "state": max(h - 1, 0), "sliding": max(0, h * B - (gb.window or 0) + 1) // B}[k_]
            assert reads[c, HOST, j] == max(0, h - max(skipped, g))


def test_zero_tiers_on_a_hybrid_are_the_plain_run(tmp_path):
    # gpt-oss-20b on 585 ids (tests/qa/test_round8_tiers_hybrid.py works the trace by hand): r3's sliding window
    # is evicted while r0's full blocks 0..61 are still cached, so the pool's hit is cut short. With host and disk
    # of size 0 those cached blocks count nowhere (no lower tier holds vLLM's copy): the run is the plain one
    rows = [(0, 4096, list(range(8))), (2000, 4096, list(range(100, 108))), (4000, 4096, list(range(8)))]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": p, "output_length": 2, "hash_ids": ids})
                            + "\n" for t, p, ids in rows))
    o = SimOptions(model="gpt-oss-20b", gpu_memory="2360MiB", bandwidth="4.8e12", flops="989e12",
                   weights_bytes="1GiB", workspace_bytes="1", memory_utilization=1.0, max_model_len=4098,
                   trace=("mooncake", str(path)), host_cache="0", disk_cache="0")
    sim = build(o).sim
    plain = run_policy(build(o).workload, "paged", replace(sim, tiers=None))
    tiered = run_policy(build(o).workload, "paged", sim)
    for name in ("first_token_s", "finish_s", "generated", "preemptions", "status"):
        assert np.array_equal(getattr(plain, name), getattr(tiered, name), equal_nan=True), name
    assert plain.end_s == tiered.end_s and tiered.tiers.read_blocks == [0, 0]
    # nothing is stored without a tier
    assert tiered.tiers.gpu_hit_blocks.tolist() == [0, 0, 0] and tiered.tiers.write_blocks == [0, 0]
