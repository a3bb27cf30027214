"""Prefix-cache replay of the real Mooncake conversation trace (run with `python -m pytest -m perf tests/perf -s`).

Times the replay the CLI runs (`kvcalc share --trace mooncake ... --block 16`, without and with a capacity
of 20,480 blocks = 40 GiB of Llama-3-8B fp16 KV at 2 MiB a block), and the fast path (batch hashing, one
fused `serve` per request) against the general one (allocate, append, release, each prompt hashed on its
own) on the same requests in the same run. Numbers are printed; the assertions are about results only.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvcalc.core.inputs.traces import read_trace
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
