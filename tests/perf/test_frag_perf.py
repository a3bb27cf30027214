"""Benchmarks for `kvcalc frag` (run with `python -m pytest -m perf tests/perf -s`).

1. 10 million lengths, --sweep: kvcalc's compute vs a bare numpy expression for the same totals, both
   measured in this run (median of several, interleaved), ratio printed; the goal is within 2x.
2. The whole Azure conversation trace (19,366 requests) through `frag --sweep`: reading plus compute,
   and the whole command in-process; the goal is well under a second of compute.
3. A text lengths file of 10 million lines: kvcalc's reader (numpy on the raw bytes) vs the same lengths
   from .npy and vs reading the lines into Python strings first (what the reader did before), with the
   peak memory each allocates (tracemalloc); the goal is at least 5x faster than the lines reference.
4. --per-seq over 10^6 lengths for --json / --format csv: the per-sequence records and table, and the
   JSON text, timed separately (the JSON encoder is the output sink's).
5. Drawing 10 million lengths in chunks vs one numpy draw of the same lengths: time ratio and peak memory
   per length (the chunked sampler holds the int64 result and a few MB; one draw holds three arrays).
6. The block counts of a --sweep from a histogram of the lengths vs one chunked pass per block size.
"""

from __future__ import annotations

import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvcalc.core import paging
from kvcalc.core.frag import analyse
from kvcalc.core.inputs.lengths import LengthDistribution, lengths_from_trace

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


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    """(seconds, its result) — one run."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def _peak_mib(fn: Callable[[], object]) -> float:
    """Peak MiB allocated while `fn` runs (tracemalloc sees numpy's buffers; it slows Python objects, so
    this is a separate run from the timed one)."""
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return peak


def test_text_lengths_file_of_ten_million_lines(tmp_path):
    from kvcalc.core.inputs.lengths import read_lengths_file

    tokens = LengthDistribution.parse("lognormal:mean=1366,sigma=0.8").sample(NUM_LENGTHS, np.random.default_rng(0))
    text_path, npy_path = tmp_path / "lengths.txt", tmp_path / "lengths.npy"
    np.savetxt(text_path, tokens, fmt="%d")
    np.save(npy_path, tokens)

    def lines_reference() -> np.ndarray:  # the previous reader's core: a Python str per line, then numpy
        lines = [s.strip() for s in text_path.read_text().splitlines()]
        return np.array([s for s in lines if s]).astype(np.int64)

    kvcalc_s, lengths = _timed(lambda: read_lengths_file(text_path))
    npy_s, _ = _timed(lambda: read_lengths_file(npy_path))
    lines_s, reference = _timed(lines_reference)
    assert np.array_equal(lengths.tokens, tokens) and np.array_equal(reference, tokens)  # same numbers first
    kvcalc_mib = _peak_mib(lambda: read_lengths_file(text_path))
    npy_mib = _peak_mib(lambda: read_lengths_file(npy_path))
    print(
        f"\ntext lengths file, {NUM_LENGTHS:,} lines ({text_path.stat().st_size / 2**20:.0f} MiB): "
        f"kvcalc {kvcalc_s:.2f} s, peak {kvcalc_mib:.0f} MiB allocated; the same lengths from .npy {npy_s:.2f} s, "
        f"{npy_mib:.0f} MiB; lines into Python strings first {lines_s:.2f} s ({lines_s / kvcalc_s:.1f}x kvcalc's)"
    )
    assert lines_s / kvcalc_s >= 5


def test_per_seq_json_and_csv_over_a_million_lengths():
    from kvcalc.cli.frag_report import per_seq_table as _per_seq_table
    from kvcalc.cli.output import to_json

    tokens = LengthDistribution.parse("lognormal:mean=1366,sigma=0.8").sample(1_000_000, np.random.default_rng(0))
    result = analyse(tokens, [16, 32], per_sequence=True)
    rows = result.per_sequence
    records_s, records = _timed(rows.records)
    table_s, table = _timed(lambda: _per_seq_table(rows, result.fixed.max_len))
    json_s, _ = _timed(lambda: to_json({"per_seq": records}))
    assert records[0]["n"] == int(tokens[0]) and table.raw.rows[-1][1] == int(tokens[-1])
    print(
        f"\n--per-seq over {tokens.size:,} lengths: records (the JSON's per_seq) {records_s:.2f} s, "
        f"table rows (display and CSV) {table_s:.2f} s, JSON text of the records {json_s:.2f} s"
    )


def test_chunked_sampling_same_lengths_less_memory():
    dist = LengthDistribution.parse("lognormal:mean=1366,sigma=0.8")
    sigma, mu = 0.8, np.log(1366) - 0.8**2 / 2

    def one_draw() -> np.ndarray:  # the sampler before it drew in chunks (no max: no resampling)
        return np.ceil(np.random.default_rng(0).lognormal(mu, sigma, NUM_LENGTHS)).astype(np.int64)

    def chunked() -> np.ndarray:
        return dist.sample(NUM_LENGTHS, np.random.default_rng(0))

    assert np.array_equal(chunked(), one_draw())  # the same lengths first: lognormal draws are sequential
    chunked_s = _median_s(chunked, repeats=3)
    one_s = _median_s(one_draw, repeats=3)
    chunked_per_length, one_per_length = (_peak_mib(fn) * 2**20 / NUM_LENGTHS for fn in (chunked, one_draw))
    print(
        f"\n{NUM_LENGTHS:,} lognormal lengths: chunked {chunked_s:.2f} s, peak {chunked_per_length:.1f} B a length; "
        f"one draw {one_s:.2f} s, peak {one_per_length:.1f} B a length (ratio {chunked_s / one_s:.2f})"
    )
    # the int64 result, plus a chunk's float scratch (a few copies of 2^20 floats: at most 32 MiB in all)
    assert chunked_per_length * NUM_LENGTHS < 8 * NUM_LENGTHS + 32 * 2**20 and chunked_s / one_s < 1.3


def test_sweep_block_counts_histogram_vs_passes():
    tokens = LengthDistribution.parse("lognormal:mean=1366,sigma=0.8").sample(NUM_LENGTHS, np.random.default_rng(0))
    sizes, longest = list(paging.SWEEP_BLOCK_SIZES), int(tokens.max())
    by_histogram = paging.block_counts_by_histogram(tokens, sizes, longest)
    assert by_histogram == paging.block_counts_by_passes(tokens, sizes, longest) == _bare_numpy_totals(tokens)[1]
    histogram_s = _median_s(lambda: paging.block_counts_by_histogram(tokens, sizes, longest), repeats=3)
    passes_s = _median_s(lambda: paging.block_counts_by_passes(tokens, sizes, longest), repeats=3)
    print(
        f"\nblock counts for {len(sizes)} block sizes over {NUM_LENGTHS:,} lengths: histogram {histogram_s * 1e3:.0f} "
        f"ms, one pass per block size {passes_s * 1e3:.0f} ms ({passes_s / histogram_s:.1f}x)"
    )
    assert histogram_s < passes_s
