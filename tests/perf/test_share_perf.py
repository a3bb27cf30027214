"""Prefix-cache replay of the real Mooncake conversation trace, and the beam-search scenario (run with
`python -m pytest -m perf tests/perf -s`).

Times the replay the CLI runs (`kvcalc share --trace mooncake ... --block 16`, without and with a capacity
of 20,480 blocks = 40 GiB of Llama-3-8B fp16 KV at 2 MiB a block), and the fast path (batch hashing, one
fused `serve` per request) against the general one (allocate, append, release, each prompt hashed on its
own) on the same requests in the same run. Numbers are printed; the assertions are about results only.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from kvcalc.core.inputs.traces import read_trace
from kvcalc.core.pool.block_pool import BlockPool, ReleaseReason
from kvcalc.core.share.forks import ScenarioSpec, run_scenario
from kvcalc.core.share.replay import replay

pytestmark = pytest.mark.perf
MOONCAKE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_conversation.jsonl"
BOUNDED_BLOCKS = 20_480  # 40 GiB / (2 · 32 layers · 8 KV heads · 128 dims · 2 bytes · 16 tokens = 2 MiB)


def timed(fn):
    start = time.perf_counter()
    cpu = time.process_time()
    result = fn()
    return result, time.perf_counter() - start, time.process_time() - cpu


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"the Mooncake trace is not at {MOONCAKE}")
def test_mooncake_replay_unbounded_and_bounded() -> None:
    trace, read_s, _ = timed(lambda: read_trace("mooncake", MOONCAKE))
    unbounded, wall_s, cpu_s = timed(lambda: replay(trace, 16, None, True))
    # the numbers `kvcalc share` printed before the fast path existed (and an independent dict replay)
    assert (unbounded.requests, unbounded.prompt_tokens, unbounded.hit_tokens) == (12_031, 144_793_823, 54_097_440)
    assert (unbounded.hit_blocks, unbounded.peak_used_blocks) == (3_381_090, 7_908)
    assert (unbounded.peak_cached_blocks, unbounded.evictions) == (5_662_916, 0)
    bounded, bounded_wall_s, bounded_cpu_s = timed(lambda: replay(trace, 16, BOUNDED_BLOCKS, True))
    assert (bounded.hit_tokens, bounded.hit_blocks, bounded.evictions) == (6_287_520, 392_970, 8_630_596)
    assert (bounded.peak_used_blocks, bounded.peak_cached_blocks) == (7_908, 20_479)
    blocks = unbounded.prompt_tokens // 16
    print(f"\nmooncake conversation, B = 16: read {read_s:.2f} s; replay {wall_s:.2f} s wall ({cpu_s:.2f} s CPU, "
          f"{blocks / wall_s / 1e6:.2f} M prompt blocks/s, {unbounded.pool_blocks:,} pool blocks); "
          f"bounded to {BOUNDED_BLOCKS:,} blocks: {bounded_wall_s:.2f} s wall ({bounded_cpu_s:.2f} s CPU, "
          f"{bounded.evictions:,} evictions)")


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"the Mooncake trace is not at {MOONCAKE}")
@pytest.mark.parametrize("capacity", [None, BOUNDED_BLOCKS])
def test_fast_replay_against_the_general_path(capacity: int | None) -> None:
    trace = read_trace("mooncake", MOONCAKE).head(3_000)
    fast, fast_s, _ = timed(lambda: replay(trace, 16, capacity, True))
    general, general_s, _ = timed(lambda: replay(trace, 16, capacity, True, fast=False))
    assert fast == general
    print(f"\nfirst 3,000 requests, capacity {capacity or 'unlimited'}: fast path {fast_s:.2f} s, general path "
          f"{general_s:.2f} s ({general_s / fast_s:.1f}x)")


def beam_one_call_per_sequence(spec: ScenarioSpec) -> tuple[int, int, int]:
    """The beam scenario with one pool call per beam and operation (how run_scenario drove the pool before
    the batch calls): (physical blocks, copies, forks)."""
    K = spec.branches
    pool = BlockPool(spec.pool_blocks, spec.block_size)
    pool.allocate(0, spec.prefix_tokens)
    for child in range(1, K):
        pool.fork(0, child)
    beams, next_id, rng = list(range(K)), K, np.random.default_rng(spec.seed)
    for step in range(spec.gen_tokens):
        if step > 0:
            picks = np.bincount(rng.integers(0, K, size=K), minlength=K)
            survivors = []
            for beam, count in zip(beams, picks.tolist(), strict=True):
                if count == 0:
                    pool.release(beam, ReleaseReason.CANCELLED)
                    continue
                survivors.append(beam)
                for _ in range(count - 1):
                    pool.fork(beam, next_id)
                    survivors.append(next_id)
                    next_id += 1
            beams = survivors
        for beam in beams:
            pool.append(beam, 1)
    stats = pool.stats()
    return pool.usage().used_blocks, stats.cow_copies, stats.forks


def test_beam_search_scenario() -> None:
    """`kvcalc share --mode beam --branches 5000 --gen 500`, and the same steps one pool call per beam."""
    spec = ScenarioSpec(1000, 5000, 500, 16, mode="beam", seed=0)
    result, wall_s, cpu_s = timed(lambda: run_scenario(spec))
    # the numbers the one-call-per-beam driver gave (checked once against it on the whole run, ~29 s)
    assert (result.physical_blocks, result.cow_copies, result.peak_blocks) == (7_745, 865_994, 10_609)
    assert (result.forks, result.dropped_branches, result.logical_blocks) == (923_005, 918_006, 470_000)
    short = ScenarioSpec(1000, 5000, 40, 16, mode="beam", seed=0)
    batched, batched_s, _ = timed(lambda: run_scenario(short))
    single, single_s, _ = timed(lambda: beam_one_call_per_sequence(short))
    assert single == (batched.physical_blocks, batched.cow_copies, batched.forks)
    appends = spec.branches * spec.gen_tokens
    print(f"\nbeam, 5,000 beams x 500 tokens: {wall_s:.2f} s wall ({cpu_s:.2f} s CPU, {appends / wall_s:,.0f} "
          f"appends/s, {result.forks:,} forks); 40 steps: batch calls {batched_s:.2f} s, one call per beam "
          f"{single_s:.2f} s ({single_s / batched_s:.1f}x)")
