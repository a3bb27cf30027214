"""Block-pool benchmarks (run with `python -m pytest -m perf tests/perf -s`): block operations per second,
and the whole Mooncake conversation trace through `kvcalc share --trace`. Numbers are printed; the only
assertions are about results and memory, never about time (CPU figures are noisy on shared machines)."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvcalc.core.pool.block_pool import BlockPool

pytestmark = pytest.mark.perf
MOONCAKE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_conversation.jsonl"


def best_of(runs: int, fn) -> float:
    """Fastest wall time of `runs` calls (the least disturbed by other processes)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@pytest.mark.parametrize("blocks_per_seq", [1, 8, 64, 512])
def test_allocate_free_block_ops_per_second(blocks_per_seq: int) -> None:
    pool = BlockPool(4096, 16)
    rounds = max(20_000 // blocks_per_seq, 200)

    def run() -> None:
        for i in range(rounds):
            pool.allocate(i, 16 * blocks_per_seq)
            pool.release(i)

    seconds = best_of(3, run)
    block_ops = 2 * rounds * blocks_per_seq  # each block handed out once and freed once
    pool.check_invariants()
    print(f"\nallocate+free, {blocks_per_seq:4d} blocks/seq: {block_ops / seconds:12,.0f} block ops/s, "
          f"{2 * rounds / seconds:10,.0f} calls/s")


def test_fork_and_copy_on_write_per_second() -> None:
    pool = BlockPool(4096, 16)
    pool.allocate("parent", 16 * 32 + 5)  # a partially filled last block: every child's first write copies it
    rounds = 5_000

    def run() -> None:
        for i in range(rounds):
            pool.fork("parent", i)
            pool.append(i, 1)  # copy-on-write of the shared last block
            pool.release(i)

    seconds = best_of(3, run)
    assert pool.stats().cow_copies == 3 * rounds
    pool.check_invariants()
    print(f"\nfork + copy-on-write append + release: {rounds / seconds:10,.0f} forks/s "
          f"({3 * rounds / seconds:,.0f} pool calls/s)")


def test_decode_appends_per_second() -> None:
    """The simulator's pattern: many live sequences, one append per block boundary (n = 16 tokens)."""
    pool = BlockPool(65_536, 16)
    for i in range(256):
        pool.allocate(i, 100)
    rounds = 40

    def run() -> None:
        for _ in range(rounds):
            for i in range(256):
                pool.append(i, 16)

    seconds = best_of(1, run)
    pool.check_invariants()
    print(f"\nappend 16 tokens to one of 256 sequences: {rounds * 256 / seconds:10,.0f} appends/s")


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"the Mooncake trace is not at {MOONCAKE}")
def test_mooncake_conversation_trace_through_share() -> None:
    command = [sys.executable, "-m", "kvcalc", "share", "--trace", "mooncake", str(MOONCAKE), "--block", "16", "--json"]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert proc.returncode == 0, proc.stderr
    import json

    doc = json.loads(proc.stdout)
    assert doc["requests"] == 12_031 and doc["evictions"] == 0
    assert peak_mib < 1024
    print(f"\nmooncake conversation, B = 16: {wall_s:.1f} s wall (read + replay with and without caching), "
          f"peak RSS {peak_mib:.0f} MiB; {doc['prompt_tokens']:,} prompt tokens, hit rate "
          f"{doc['token_hit_rate']:.2%}, {doc['pool_blocks']:,} pool blocks")
