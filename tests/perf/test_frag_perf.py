"""Benchmarks for `kvcalc frag` (run with `python -m pytest -m perf tests/perf -s`).

1. 10 million lengths, --sweep: kvcalc's compute vs a bare numpy expression for the same totals, both
   measured in this run (median of several, interleaved), ratio printed; the goal is within 2x.
2. The whole Azure conversation trace (19,366 requests) through `frag --sweep`: reading plus compute,
   and the whole command in-process; the goal is well under a second of compute.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvcalc.core import paging
from kvcalc.core.frag import analyse
from kvcalc.core.lengths import LengthDistribution, lengths_from_trace

pytestmark = pytest.mark.perf

NUM_LENGTHS = 10_000_000
REPEATS = 7
AZURE_CONV = Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure_llm_2023_conv.csv"


def _median_s(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _kvcalc_totals(tokens: np.ndarray) -> tuple[int, list[int]]:
    """What `frag --sweep` computes (core.frag.analyse): fixed reservation and every block size, exact."""
    result = analyse(tokens, list(paging.SWEEP_BLOCK_SIZES))
    return result.fixed.useful_tokens, [p.num_blocks for p in result.paged]


def _bare_numpy_totals(tokens: np.ndarray) -> tuple[int, list[int]]:
    """The same totals as one would write them in numpy, with no checks (int64 sums, may wrap)."""
    return int(tokens.sum()), [int(((tokens + (b - 1)) // b).sum()) for b in paging.SWEEP_BLOCK_SIZES]


def test_sweep_over_ten_million_lengths_within_2x_of_bare_numpy():
    tokens = LengthDistribution.parse("lognormal:mean=1366,sigma=0.8").sample(NUM_LENGTHS, np.random.default_rng(0))
    assert _kvcalc_totals(tokens) == _bare_numpy_totals(tokens)  # same numbers first
    kvcalc_s, bare_s = [], []
    for _ in range(REPEATS):  # interleaved, so that drifts of a noisy machine hit both alike
        kvcalc_s.append(_median_s(lambda: _kvcalc_totals(tokens), repeats=1))  # one timing each, alternating
        bare_s.append(_median_s(lambda: _bare_numpy_totals(tokens), repeats=1))
    kvcalc_median, bare_median = statistics.median(kvcalc_s), statistics.median(bare_s)
    ratio = kvcalc_median / bare_median
    print(
        f"\nfrag --sweep compute over {NUM_LENGTHS:,} lengths ({len(paging.SWEEP_BLOCK_SIZES)} block sizes): "
        f"kvcalc {kvcalc_median * 1e3:.1f} ms, bare numpy {bare_median * 1e3:.1f} ms, ratio {ratio:.2f} "
        f"(median of {REPEATS})"
    )
    assert ratio < 2.0


def test_sweep_command_over_ten_million_lengths_from_npy(run_cli, tmp_path):
    """The whole command (load .npy, validate, compute, JSON) — reported, for scale."""
    path = tmp_path / "lengths.npy"
    tokens = LengthDistribution.parse("lognormal:mean=1366,sigma=0.8").sample(NUM_LENGTHS, np.random.default_rng(0))
    np.save(path, tokens)
    bare_s = _median_s(lambda: _bare_numpy_totals(tokens), repeats=3)
    command_s = _median_s(lambda: run_cli("frag", "--lengths-file", str(path), "--sweep", "--json"), repeats=3)
    result = run_cli("frag", "--lengths-file", str(path), "--sweep", "--json")
    assert result.exit_code == 0 and result.json()["lengths"]["count"] == NUM_LENGTHS
    print(
        f"\nkvcalc frag --lengths-file ({NUM_LENGTHS:,} lengths, .npy) --sweep --json: {command_s * 1e3:.0f} ms "
        f"in-process, {command_s / bare_s:.2f}x the bare numpy totals ({bare_s * 1e3:.0f} ms)"
    )


@pytest.mark.skipif(
    not AZURE_CONV.is_file(),
    reason=f"{AZURE_CONV} is absent: get AzureLLMInferenceTrace_conv.csv from github.com/Azure/AzurePublicDataset",
)
def test_azure_conversation_trace_sweep_well_under_a_second(run_cli):
    def read_and_compute() -> None:
        lengths = lengths_from_trace("azure", AZURE_CONV)
        _kvcalc_totals(lengths.tokens)

    tokens = lengths_from_trace("azure", AZURE_CONV).tokens
    compute_s = _median_s(lambda: _kvcalc_totals(tokens))
    read_compute_s = _median_s(read_and_compute)
    command_s = _median_s(lambda: run_cli("frag", "--trace", "azure", str(AZURE_CONV), "--sweep"), repeats=5)
    print(
        f"\nAzure conv trace ({tokens.size:,} requests), frag --sweep: compute {compute_s * 1e3:.2f} ms; "
        f"read + compute {read_compute_s * 1e3:.0f} ms; whole command in-process (with tables and chart) "
        f"{command_s * 1e3:.0f} ms (median of {REPEATS}/5)"
    )
    assert tokens.size == 19_366
    assert read_compute_s < 1.0
