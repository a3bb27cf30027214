"""How many decode steps the free blocks of a paged pool cover for a batch, and the plan of its block boundaries
(PagedPolicy.decode_steps_available, the lean loop's runs)."""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

import numpy as np

SMALL_BATCH = 64  # at most this many requests: batch arithmetic in plain ints (numpy's per-call cost dominates)


def decode_steps_plan(tokens: np.ndarray | list[int], block_size: int, spare: int) -> tuple[int, list | np.ndarray]:
    """(the most decode steps `spare` free blocks cover for requests holding `tokens` [n ≥ 1], the plan).

    Request i, holding t_i tokens, needs a new block in step j iff (t_i + j) % B == 0, so the blocks
    needed by the first s steps repeat with period B: need(s) = (s // B)·n + cum[s % B], where cum
    is the running count of requests by their first boundary step (the plan: cum, a list of ints or an array).
    """
    n, B = len(tokens), block_size
    periods, rest = divmod(spare, n)
    if n <= SMALL_BATCH and B <= SMALL_BATCH:  # the same counts in plain ints
        first = list(accumulate(boundary_counts(tokens.tolist() if isinstance(tokens, np.ndarray) else tokens, B),
                                initial=0))
        return periods * B + bisect_right(first, rest) - 1, first
    cum = np.zeros(B + 1, dtype=np.float64)
    np.cumsum(np.bincount((-np.asarray(tokens, np.int64)) % B, minlength=B), out=cum[1:])
    return periods * B + int(np.searchsorted(cum, rest, side="right")) - 1, cum


def boundary_counts(tokens: list[int], block_size: int) -> list[int]:
    """counts[r]: the requests (holding `tokens`) whose next block boundary is crossed in decode step r of every B:
    (t + r) % B == 0, r = (−t) mod B (decode_steps_plan's plan is their running sum)."""
    counts = [0] * block_size
    for t in tokens:
        counts[-t % block_size] += 1
    return counts


def steps_covered(counts: list[int], spare: int) -> int:
    """decode_steps_plan's steps from boundary_counts: the most decode steps `spare` free blocks cover."""
    B = len(counts)
    periods, rest = divmod(spare, sum(counts))
    return periods * B + bisect_right(list(accumulate(counts, initial=0)), rest) - 1
