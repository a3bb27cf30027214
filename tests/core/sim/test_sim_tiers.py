"""Host and disk tiers below sim's GPU pool (core/sim/tiers.py, tiers_run.py): hand-worked traces, load waits
against an independent FIFO model of the links, zero-size tiers against the plain run, a sliding-window hybrid."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kvcalc.core.errors import ParameterError
from kvcalc.core.share.cache_bytes import cached_block_bytes
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.tiers import DISK, HOST

B = 512  # one Mooncake hash id per block: a block vLLM does not take, so the runs are on kvcalc's own pool
IDEAL = "ideal"  # (layout ideal: any block size, no null block; a plain model's pool is otherwise vLLM's)
LLAMA_BLOCK = 512 * 131_072  # Llama-3.1-8B bf16: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 131,072 B/token


def _trace(tmp_path, rows):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": int(t * 1000), "input_length": p, "output_length": o,
                                        "hash_ids": ids}) + "\n" for t, p, o, ids in rows))
    return path


def _setup(tmp_path, rows, capacity_blocks, model="llama-3.1-8b", **tiers):
    o = SimOptions(trace=("mooncake", _trace(tmp_path, rows)), model=model, block_size=B, layout=IDEAL, **tiers)
    setup = build(o)
    return setup, replace(setup.sim, capacity_blocks=capacity_blocks)


# r0 and r1 fill a pool of 4 blocks; r2 repeats r0's prefix. Prompts of 2 x 512 + 1 tokens: 2 keyed blocks and
# a partial one, 3 blocks each; one output token. The pool frees a request's blocks tail first (the LRU's oldest
# is its last full block). The host is written through (vLLM's offloading connector): each request's step stores
# its full blocks; a store touches the request's keys, its first block most recent (tiers_host):
#   r0: stores k1, k2 (host order, oldest first: k2, k1). GPU after: plain {unused, r0's partial}, LRU [k2, k1]
#   r1: stores k3, k4 (order: ..., k4, k3); the GPU evicts k2 for r1's third block: LRU [k1, k4, k3]
#   r2: GPU hit k1 (g = 1); k2 is looked up in the host from position 1 on
HAND = [(0, 1025, 1, [1, 2, 100]), (100, 1025, 1, [3, 4, 101]), (200, 1025, 1, [1, 2, 102])]


def _totals(tmp_path, **tiers):
    setup, sim = _setup(tmp_path, HAND, 4, **tiers)
    return sim, run_policy(setup.workload, "paged", sim).tiers


def test_hand_worked_host_tier(tmp_path):
    # a host of 4 blocks (2,048 tokens) holds k1..k4: r2 finds k2 there; loading it (64 MiB over 25 GB/s = 2.68 ms)
    # beats a 513-token prefill (~40 ms), so it loads k = 1 block, parked 2.68 ms. Its stores start after its load
    # (next_stored_block_idx = 2 = its full blocks): nothing more is written. Host: written 4, read 1, dropped 0.
    sim, t = _totals(tmp_path, host_cache="2048")
    assert (sim.tiers.host_blocks, sim.tiers.disk_blocks) == (4, 0)
    assert sim.tiers.bytes_per_block == LLAMA_BLOCK
    assert t.gpu_hit_blocks.tolist() == [0, 0, 1]
    assert t.host_hit_blocks.tolist() == [0, 0, 1]
    assert t.disk_hit_blocks.tolist() == [0, 0, 0]
    assert t.read_blocks == [1, 0] and t.write_blocks == [4, 0] and t.dropped_blocks == 0
    assert t.wait_s[2] == pytest.approx(LLAMA_BLOCK / 25e9, rel=1e-9)  # 2.68435456 ms: an idle link, 25 GB/s
    assert t.link_busy_s == (LLAMA_BLOCK / 25e9, 0.0)


def test_write_through_evicts_by_the_hosts_own_lru(tmp_path):
    # a host of 2 blocks: r1's stores evict k2 then k1 (the oldest first: r0's touch left k2 older), so r2 finds
    # nothing there although the GPU evicted only k2. r2 stores k1 (its GPU hit, gone from the host: offered again,
    # next_stored_block_idx 0) and k2, evicting k4 then k3. Written 2 + 2 + 2, dropped 4.
    _, t = _totals(tmp_path, host_cache="1024")
    assert t.gpu_hit_blocks.tolist() == [0, 0, 1] and t.host_hit_blocks.sum() == 0
    assert t.read_blocks == [0, 0] and t.write_blocks == [6, 0] and t.dropped_blocks == 4
    # 3 blocks: r1 evicts k2 only (order k1, k4, k3); r2's look-up touches k1 (now k4, k3, k1) and its store of k2
    # (k1 is held: not written again) evicts k4. Written 2 + 2 + 1, dropped 2; r2 still misses k2.
    _, t = _totals(tmp_path, host_cache="1536")
    assert t.host_hit_blocks.sum() == 0 and t.write_blocks == [5, 0] and t.dropped_blocks == 2


def test_hand_worked_disk_tiers(tmp_path):
    # host 2 blocks and disk 2: the host's evictions (k2, k1 by r1's stores) go to the disk; r2 loads k2 from it at
    # 5 GB/s (13.4 ms < ~40 ms). Host written 4, disk 2, nothing dropped.
    _, t = _totals(tmp_path, host_cache="1024", disk_cache="1024")
    assert t.disk_hit_blocks.tolist() == [0, 0, 1] and t.host_hit_blocks.sum() == 0
    assert t.read_blocks == [0, 1] and t.write_blocks == [4, 2] and t.dropped_blocks == 0
    assert t.wait_s[2] == pytest.approx(LLAMA_BLOCK / 5e9, rel=1e-9)
    # a disk alone takes the host's place (written through): as the 2-block host above
    _, t = _totals(tmp_path, disk_cache="1024")
    assert t.disk_hit_blocks.sum() == 0 and t.write_blocks == [0, 6] and t.dropped_blocks == 4


def test_slow_link_recomputes(tmp_path):
    # a 1 MB/s host link: 67 s for the block, far more than its prefill: the rule recomputes it. r2 then stores from
    # position 0 (no load): k1 and k2 are both held, nothing is written. Writes: 4; reads none.
    _, t = _totals(tmp_path, host_cache="2048", host_bw="1MB/s")
    assert t.host_hit_blocks.sum() == 0 and t.recomputed_blocks.tolist() == [0, 0, 1]
    assert t.read_blocks == [0, 0] and t.write_blocks == [4, 0] and t.wait_s.max() == 0


def _fifo_ready(t, bytes_per_block, bandwidths):
    """An independent model of the links: loads in admission order, each tier's link a FIFO server."""
    free = [0.0, 0.0]
    ready = {}
    loaders = np.flatnonzero((t.host_hit_blocks + t.disk_hit_blocks) > 0)
    for rid in sorted(loaders.tolist(), key=lambda r: t.admit_s[r]):  # stable: equal times keep queue order
        end = t.admit_s[rid]
        for tier, n in ((HOST, t.host_hit_blocks[rid]), (DISK, t.disk_hit_blocks[rid])):
            if n:
                free[tier] = max(t.admit_s[rid], free[tier]) + n * bytes_per_block / bandwidths[tier]
                end = max(end, free[tier])
        ready[rid] = end
    return ready


def test_load_waits_queue_on_the_link(tmp_path):
    # four 4-block prefixes A..D, pushed out of a 20-block pool by eight fillers, then all four again at once:
    # their loads share one 5 GB/s host link (13.4 ms a block), so the later ones wait for the earlier ones
    rows, ids = [], iter(range(1, 10_000))
    prefixes = [[next(ids) for _ in range(4)] for _ in range(4)]
    for i, p in enumerate(prefixes):
        rows.append((10 * i, 4 * B + 1, 1, [*p, next(ids)]))
    for i in range(8):
        rows.append((100 + 10 * i, 4 * B + 1, 1, [next(ids) for _ in range(5)]))
    for p in prefixes:
        rows.append((1000, 4 * B + 1, 1, [*p, next(ids)]))
    setup, sim = _setup(tmp_path, rows, 20, host_cache="100k", host_bw="5GB/s")
    record = run_policy(setup.workload, "paged", sim)
    t = record.tiers
    ready = _fifo_ready(t, LLAMA_BLOCK, (5e9, 5e9))
    assert len(ready) >= 3
    for rid, end in ready.items():
        assert t.admit_s[rid] + t.wait_s[rid] == pytest.approx(end, rel=1e-12)
        assert record.first_token_s[rid] > end  # it computes its last token after the load
    queued = [rid for rid in ready if ready[rid] - t.admit_s[rid] > t.host_hit_blocks[rid] * LLAMA_BLOCK / 5e9 + 1e-9]
    assert queued, "no load waited for another: the scenario does not exercise the queue"
    assert t.read_blocks[HOST] == int(t.host_hit_blocks.sum())


def test_zero_tiers_are_the_plain_run(tmp_path):
    rows = [(i * 0.5, 3 * B + 100 * (i % 3) + 1, 20 + i, [1 + (i % 4), 10 + i, 50 + i, 90 + i]) for i in range(24)]
    setup, sim = _setup(tmp_path, rows, 12, host_cache="0", disk_cache="0")
    plain = run_policy(setup.workload, "paged", replace(sim, tiers=None))
    tiered = run_policy(setup.workload, "paged", sim)
    for name in ("first_token_s", "finish_s", "generated", "preemptions", "status"):
        assert np.array_equal(getattr(plain, name), getattr(tiered, name), equal_nan=True), name
    assert plain.end_s == tiered.end_s and plain.steps == tiered.steps
    assert tiered.tiers.read_blocks == [0, 0] and tiered.tiers.write_blocks == [0, 0]


def test_sliding_window_hybrid(tmp_path, CAP=36):
    # Gemma-3-12B: a full-attention group and a 1,024-token sliding group, one pool. A cached block carries both
    # groups' bytes (share's cache_bytes). r2 repeats r0's 4-block prefix after r1 pushed it out of a small pool.
    rows = [(0, 4 * B + 1, 1, [1, 2, 3, 4, 100]), (100, 4 * B + 1, 1, [5, 6, 7, 8, 101]),
            (200, 4 * B + 1, 1, [1, 2, 3, 4, 102])]
    setup, sim = _setup(tmp_path, rows, CAP, model="gemma-3-12b", host_cache="100k")
    assert sim.groups is not None and {g.kind for g in sim.groups} == {"full", "sliding"}
    cbb = cached_block_bytes(setup.spec, "bf16", 16, B)
    assert sim.tiers.bytes_per_block == cbb.bytes_per_block == sum(g.bytes_per_block for g in cbb.groups)
    record = run_policy(setup.workload, "paged", sim)
    t = record.tiers
    assert t.gpu_hit_blocks[2] + t.host_hit_blocks[2] + t.recomputed_blocks[2] == 4  # every repeated block found
    assert t.host_hit_blocks[2] > 0 and t.read_blocks[HOST] == t.host_hit_blocks[2]
    plain = run_policy(setup.workload, "paged", replace(sim, tiers=replace(sim.tiers, host_blocks=0)))
    assert plain.tiers.host_hit_blocks.sum() == 0
    assert record.first_token_s[2] - record.arrival_s[2] < plain.first_token_s[2] - plain.arrival_s[2]


@pytest.mark.parametrize(("extra", "message"), [
    ({"host_bw": "10GB/s"}, "host_bw is a tier's link"),
    ({"host_cache": "1M", "policy": "reserve-max"}, "policy reserve-max"),
    ({"host_cache": "1M", "no_prefix": True}, "need a trace with prefix ids"),
    ({"host_cache": "1M", "timeout_s": "5"}, "timeout"),
    ({"host_cache": "3X"}, "host_cache '3X'"),
    ({"host_cache": "1M", "host_bw": "fast"}, "host_bw 'fast' is not a bandwidth"),
    ({"host_cache": "1M", "disk_bw": "5GB/s"}, "disk_bw is the disk tier's link"),
])
def test_refused_by_name(tmp_path, extra, message):
    extra = dict(extra)
    no_prefix = extra.pop("no_prefix", False)
    o = SimOptions(trace=("mooncake", _trace(tmp_path, HAND)), model="llama-3.1-8b", block_size=B, layout=IDEAL,
                   prefix_caching=not no_prefix, **extra)
    with pytest.raises(ParameterError, match=message):
        build(o)


def test_compare_tiers_against_the_one_at_a_time_replay(tmp_path):
    # HAND again, a 4-block host. Share's replay with a 4-block GPU cache holds ids 1..4 after r1 (the running
    # request's blocks are not cache there), so r2 hits both its blocks in the GPU: (2, 0, 0) at every rung. The
    # sim's pool also holds the partial blocks and r1's own blocks while r1 runs: id 2 was evicted, so r2 hits
    # id 1 on the GPU and loads id 2 from the host with one; with none it recomputes id 2.
    from kvcalc.core.sim.tiers_compare import compare_tiers

    setup, sim = _setup(tmp_path, HAND, 4, host_cache="2048")
    setup = replace(setup, sim=sim)
    record = run_policy(setup.workload, "paged", sim)
    c = compare_tiers(setup, {"paged": record}, {})
    assert [r.label for r in c.rungs] == ["GPU only", "GPU + host"]
    assert c.rungs[-1].record is record and c.prompt_tokens == 3 * 1025 and c.gpu_cache_blocks == 4
    assert [r.replay_hit_blocks for r in c.rungs] == [(2, 0, 0), (2, 0, 0)]
    assert [int(r.totals.gpu_hit_blocks.sum()) for r in c.rungs] == [1, 1]
    assert [int(r.totals.host_hit_blocks.sum()) for r in c.rungs] == [0, 1]


def test_lru_matches_an_ordered_dict():
    # the tiers' LRU (a dict of stamps over an insertion list with lazy deletion, compacted past 65,536 pops,
    # entries weighed by their group: units[key % 3]) against an OrderedDict, over random adds, touches, discards,
    # pops and pops down to a capacity in bytes (the fewest oldest entries)
    from collections import OrderedDict

    from kvcalc.core.sim.tiers_lru import Lru

    units = (5, 7, 11)
    rng = np.random.default_rng(7)
    lru, ref = Lru(units), OrderedDict()
    for _ in range(3000):
        op = rng.integers(5)
        if op == 0:
            new = [k for k in dict.fromkeys(rng.integers(0, 500, 60).tolist()) if k not in ref]
            lru.add(new)
            ref.update(dict.fromkeys(new))
        elif op == 1 and ref:
            key = list(ref)[rng.integers(len(ref))]
            lru.touch(key)
            ref.move_to_end(key)
        elif op == 2:
            gone = rng.integers(0, 500, 20).tolist()
            lru.discard(gone)
            for k in gone:
                ref.pop(k, None)
        elif op == 3 and ref:
            n = int(rng.integers(1, len(ref) + 1))
            assert lru.pop_oldest(n) == [ref.popitem(last=False)[0] for _ in range(n)]
        elif ref:
            cap = int(rng.integers(0, sum(units[k % 3] for k in ref) + 1))
            out = []
            while sum(units[k % 3] for k in ref) > cap:
                out.append(ref.popitem(last=False)[0])
            assert lru.pop_over(cap) == out
        assert len(lru) == len(ref) and set(lru.stamp) == set(ref)
        assert lru.bytes == sum(units[k % 3] for k in ref)

