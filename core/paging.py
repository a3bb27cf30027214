"""Equations 2 and 3 over many sequences at once: fixed reservation vs paging.

    A_B(n) = B · ceil(n / B)        positions allocated to a sequence of n tokens in blocks of B
    W_B(n) = A_B(n) − n             tail-block waste (0 <= W_B(n) < B)
    fixed reservation to M:         allocates M, wastes M − n
    U = Σ n_i / Σ A_B(n_i)          position utilisation (not device utilisation)

Inputs are int64 arrays of lengths [N]; totals are exact Python ints. numpy's int64 sum wraps around
silently, so `exact_sum` sums in int64 only in chunks whose sum provably fits, and adds the chunk sums as
Python ints (10^7 lengths of 10^12 tokens stay exact). Every block size costs one vectorised pass.

Block tables hold one int32 block id per logical block. Two conventions: exact (Σ ceil(n/B) entries,
what the sequences use) and dense (N × ceil(M/B) entries, the [num_seqs, max_blocks] tensor engines
allocate up front). KV bytes for a model, which follow from these positions, are in paged_bytes.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .blocks import BLOCK_TABLE_ENTRY_BYTES, MAX_LENGTH, ceil_div
from .errors import ParameterError
from .units import format_int_short

SWEEP_BLOCK_SIZES = tuple(2**k for k in range(9))  # 1, 2, 4, …, 256
_INT64_MAX = np.iinfo(np.int64).max
PASS_CHUNK = 1 << 18  # lengths per step of a chunked pass: 2 MiB of int64, small enough to stay in cache
HISTOGRAM_CHUNK = 1 << 20  # lengths per bincount: large enough that the table's zeroing costs little
HISTOGRAM_MAX_LENGTH = 1 << 22  # the length table of block_counts_by_histogram stays within 32 MiB
BlockSizes = list[int] | tuple[int, ...]


def exact_sum(values: np.ndarray, bound: int | None = None) -> int:
    """Σ values as a Python int, exact for any int64 array (never wraps).

    `bound` >= max |value| may be passed by a caller that knows it, to save two passes over the data.
    """
    if values.size == 0:
        return 0
    if bound is None:
        bound = max(abs(int(values.max())), abs(int(values.min())))
    chunk = _INT64_MAX // max(bound, 1)  # this many elements can never overflow an int64 sum
    if chunk >= values.size:
        return int(values.sum(dtype=np.int64))
    return sum(int(values[i : i + chunk].sum(dtype=np.int64)) for i in range(0, values.size, chunk))


def ceil_div_array(values: np.ndarray, divisor: int, out: np.ndarray | None = None) -> np.ndarray:
    """ceil(values / divisor) elementwise for values in 0..MAX_LENGTH; `out` may be reused as scratch."""
    out = np.add(values, divisor - 1, out=out)
    if divisor & (divisor - 1) == 0:  # a power of two: a shift is several times faster than a division
        return np.right_shift(out, divisor.bit_length() - 1, out=out)
    return np.floor_divide(out, divisor, out=out)


def default_max_len(longest: int) -> int:
    """The smallest power of two >= the longest length (the default fixed reservation M)."""
    return 1 << (longest - 1).bit_length()


def check_lengths(tokens: np.ndarray, max_len: int) -> int:
    """Lengths in 1..max_len (a ValueError names the first offender and the fix); returns the longest."""
    if not 1 <= max_len <= MAX_LENGTH:
        raise ParameterError(
            f"max_len {format_int_short(max_len)} is out of range: give a reservation between 1 and 2^62 tokens",
            "max_len",
        )
    if tokens.size == 0:
        raise ValueError("no lengths: give at least one")
    longest, shortest = int(tokens.max()), int(tokens.min())
    if longest > max_len:
        i = int(np.argmax(tokens > max_len))
        raise ParameterError(
            f"length {int(tokens[i])} (item {i + 1}) is above max_len {max_len}: "
            f"raise max_len to at least {longest} or leave it out (default: next power of two)", "max_len"
        )
    if shortest < 1:
        i = int(np.argmax(tokens < 1))
        raise ValueError(f"length {int(tokens[i])} (item {i + 1}) is not positive: every sequence holds a token")
    return longest


def check_block_sizes(block_sizes: BlockSizes) -> None:
    for block_size in block_sizes:
        if not 1 <= block_size <= MAX_LENGTH:
            raise ParameterError(
                f"block_size {format_int_short(block_size)} is not a valid block size: give a number of tokens from 1 "
                "to 2^62", "block_size"
            )


class _Positions:
    """Waste and utilisation (eq. 3) of a scheme that allocates `allocated_tokens` for `useful_tokens`."""

    useful_tokens: int

    @property
    def allocated_tokens(self) -> int:
        raise NotImplementedError

    @property
    def waste_tokens(self) -> int:
        return self.allocated_tokens - self.useful_tokens

    @property
    def utilization(self) -> Fraction:
        return Fraction(self.useful_tokens, self.allocated_tokens)

    @property
    def waste_fraction(self) -> Fraction:
        """Share of allocated positions that hold no token (1 − U)."""
        return Fraction(self.waste_tokens, self.allocated_tokens)


@dataclass(frozen=True)
class FixedReservation(_Positions):
    """Every sequence reserves `max_len` positions up front (pre-paging engines)."""

    max_len: int
    num_seqs: int
    useful_tokens: int

    @property
    def allocated_tokens(self) -> int:
        return self.num_seqs * self.max_len


@dataclass(frozen=True)
class PagedAllocation(_Positions):
    """Blocks of `block_size` positions, allocated on demand: Σ ceil(n/B) blocks in all."""

    block_size: int
    num_seqs: int
    max_len: int
    useful_tokens: int
    num_blocks: int

    @property
    def allocated_tokens(self) -> int:
        return self.block_size * self.num_blocks

    @property
    def max_blocks_per_seq(self) -> int:
        return ceil_div(self.max_len, self.block_size)

    @property
    def block_table_bytes_exact(self) -> int:
        return self.num_blocks * BLOCK_TABLE_ENTRY_BYTES

    @property
    def block_table_bytes_dense(self) -> int:
        return self.num_seqs * self.max_blocks_per_seq * BLOCK_TABLE_ENTRY_BYTES


def fixed_reservation(tokens: np.ndarray, max_len: int) -> FixedReservation:
    """Fixed reservation of `max_len` for each of the lengths `tokens` int64 [N]."""
    longest = check_lengths(tokens, max_len)
    return FixedReservation(max_len, int(tokens.size), exact_sum(tokens, bound=longest))


def paged_allocations(
    tokens: np.ndarray, block_sizes: BlockSizes, max_len: int, progress: Callable[[int], None] | None = None
) -> list[PagedAllocation]:
    """Equations 2–3 for each block size (see `fixed_and_paged`)."""
    return fixed_and_paged(tokens, block_sizes, max_len, progress)[1]


def fixed_and_paged(
    tokens: np.ndarray, block_sizes: BlockSizes, max_len: int, progress: Callable[[int], None] | None = None
) -> tuple[FixedReservation, list[PagedAllocation]]:
    """Fixed reservation and paging with each block size, from one validation and one paging pass (a
    histogram of the lengths or a chunked pass, whichever is faster; both exact and equal).
    `progress(n)`: n more lengths done (all block sizes)."""
    longest = check_lengths(tokens, max_len)
    check_block_sizes(block_sizes)
    num_seqs, useful = int(tokens.size), exact_sum(tokens, bound=longest)
    if len(block_sizes) >= 2 and longest < min(HISTOGRAM_MAX_LENGTH, tokens.size):
        num_blocks = block_counts_by_histogram(tokens, block_sizes, longest, progress)
    else:
        num_blocks = block_counts_by_passes(tokens, block_sizes, longest, progress)
    paged = [PagedAllocation(b, num_seqs, max_len, useful, n) for b, n in zip(block_sizes, num_blocks, strict=True)]
    return FixedReservation(max_len, num_seqs, useful), paged


def block_counts_by_passes(
    tokens: np.ndarray, block_sizes: BlockSizes, longest: int, progress: Callable[[int], None] | None = None
) -> list[int]:
    """Σ ceil(n/B) for each block size: every block size reads a chunk of lengths while it is in cache
    (about 3 ns a length per block size)."""
    num_blocks = [0] * len(block_sizes)
    scratch = np.empty(min(tokens.size, PASS_CHUNK), dtype=np.int64)
    for start in range(0, tokens.size, PASS_CHUNK):
        chunk = tokens[start : start + PASS_CHUNK]
        out = scratch[: chunk.size]
        for i, b in enumerate(block_sizes):
            # ceil(n/B) <= n, so the longest length bounds every block count too
            num_blocks[i] += exact_sum(ceil_div_array(chunk, b, out=out), longest)
        if progress is not None:
            progress(chunk.size)
    return num_blocks


def block_counts_by_histogram(
    tokens: np.ndarray, block_sizes: BlockSizes, longest: int, progress: Callable[[int], None] | None = None
) -> list[int]:
    """The same sums as Σ_k ceil(k/B) · count(k) over a table of how many sequences have each length k:
    one pass over the lengths (about 5 ns each) for all block sizes, then O(longest) per block size — the
    faster way from two block sizes on when the lengths are short next to their number."""
    counts = np.zeros(longest + 1, dtype=np.int64)
    for start in range(0, tokens.size, HISTOGRAM_CHUNK):
        chunk = tokens[start : start + HISTOGRAM_CHUNK]
        counts += np.bincount(chunk, minlength=longest + 1)
        if progress is not None:
            progress(chunk.size)
    k = np.arange(longest + 1, dtype=np.int64)
    # each product is at most k · count(k), so their sum is at most Σ n: exact_sum keeps it exact anyway
    return [exact_sum(ceil_div_array(k, b) * counts) for b in block_sizes]


@dataclass(frozen=True, eq=False)
class PerSequence:
    """Per-sequence rows, each an int64 [N]: A_B(n) and W_B(n) per block size, and M − n."""

    tokens: np.ndarray
    reservation_waste: np.ndarray
    allocated: dict[int, np.ndarray]
    waste: dict[int, np.ndarray]

    def columns(self) -> dict[str, np.ndarray]:
        """n, reservation_waste, then allocated_bB and waste_bB for each block size: int64 [N] each."""
        columns = {"n": self.tokens, "reservation_waste": self.reservation_waste}
        for b in self.allocated:
            columns[f"allocated_b{b}"] = self.allocated[b]
            columns[f"waste_b{b}"] = self.waste[b]
        return columns

    def rows_by_column(self) -> list[list[int]]:
        """`columns()` as lists of Python ints (one tolist per column, no per-row work)."""
        return [values.tolist() for values in self.columns().values()]

    def rows(self) -> list[tuple[int, ...]]:
        """One tuple of Python ints per sequence, in the order of `columns()`."""
        return list(zip(*self.rows_by_column(), strict=True))

    def records(self) -> list[dict[str, int]]:
        """One dict per sequence, keyed as `columns()` (the --json per_seq entries)."""
        keys = tuple(self.columns())
        return [dict(zip(keys, row, strict=True)) for row in self.rows()]


def per_sequence(tokens: np.ndarray, block_sizes: BlockSizes, max_len: int) -> PerSequence:
    check_lengths(tokens, max_len)
    check_block_sizes(block_sizes)
    allocated = {b: ceil_div_array(tokens, b) * b for b in block_sizes}
    return PerSequence(tokens, max_len - tokens, allocated, {b: a - tokens for b, a in allocated.items()})
