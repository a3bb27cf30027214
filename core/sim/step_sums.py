"""Sums over a run of k engine steps taken at once (fastforward.py, fastforward_groups.py): where arrivals join a
run, and step-by-step additions in step order, so a run's totals are bit-identical to stepping one by one."""

from __future__ import annotations

import numpy as np


def piece_bounds(ends: np.ndarray, k: int, arrival_s: np.ndarray, next_arrival: int) -> list[int]:
    """0 = b_0 < b_1 < … < k: the steps of a k-step run (step j starts at ends[j]) at which arrivals join —
    the first step starting at or after each arrival (an arrival at ends[j] joins before step j)."""
    last = int(np.searchsorted(arrival_s, ends[k - 1], side="right"))
    joins = np.searchsorted(ends[:k], arrival_s[next_arrival:last], side="left")
    return [0, *np.unique(joins).tolist(), k]


def in_order(start: np.ndarray | float, terms: np.ndarray) -> np.ndarray:
    """start + terms[0] + terms[1] + … added one at a time in that order (cumsum accumulates sequentially,
    unlike sum's pairwise tree), as `+=` once per step adds them."""
    out = np.empty((len(terms) + 1, *np.shape(start)))
    out[0] = start
    out[1:] = terms
    return out.cumsum(axis=0)[-1]
