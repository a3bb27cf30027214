"""Sums over a run of k engine steps taken at once (fastforward.py, fastforward_groups.py, lean_runs.py): where
arrivals join a run, how far a run through finishes goes, and step-by-step additions in step order, so a run's totals
are bit-identical to stepping one by one."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from .record import RunTotals


def piece_bounds(ends: np.ndarray | list[float], k: int, arrivals: Sequence[float], next_arrival: int) -> list[int]:
    """0 = b_0 < b_1 < … < k: the steps of a k-step run (step j starts at ends[j]) at which arrivals join —
    the first step starting at or after each arrival (an arrival at ends[j] joins before step j); `arrivals`
    sorted (a list: bisection in plain floats, cheaper than numpy's calls for the few arrivals of a run)."""
    starts = ends[:k] if isinstance(ends, list) else ends[:k].tolist()
    last = bisect_right(arrivals, starts[-1], next_arrival)
    return [0, *sorted({bisect_left(starts, a) for a in arrivals[next_arrival:last]}), k]


def sum_few(values: Sequence[float]) -> float:
    """np.add.reduce of fewer than 8 float64 values, in plain floats: numpy sums so few one after another (from −0.0,
    which leaves the first value as it is); tests/core/sim/test_sim_lean.py checks it against numpy."""
    assert len(values) < 8, "numpy sums 8 or more values in 8 running sums (pairwise summation)"
    total = -0.0
    for value in values:
        total += value
    return total


def add_run(totals: RunTotals, d: np.ndarray, ends: np.ndarray, memory: tuple[np.ndarray, np.ndarray, np.ndarray],
            running: np.ndarray | int, waiting: np.ndarray | int) -> None:
    """A run's step-by-step integrals, timeline rows, inter-token gaps and busy time, as stepping adds them: d[j] the
    duration of step j (ending at ends[j + 1]), `memory` the policy's run_memory (parts, table bytes and blocks
    per group, each per step), `running` / `waiting` the requests each step (a count or one per step)."""
    parts, table, groups = memory
    if totals.group_block_s is None:
        totals.group_block_s = np.zeros(groups.shape[1])
    # every integral a column of one table (cumsum adds each column in step order): the parts, table bytes,
    # running, in system, busy time, then the blocks of each group
    sums = np.empty((len(d) + 1, 10 + groups.shape[1]))
    sums[0] = (*totals.memory_slot_s, totals.block_table_byte_s, totals.running_s, totals.in_system_s, totals.busy_s,
               *totals.group_block_s)
    sums[1:, :6] = d[:, None] * parts
    sums[1:, 6] = d * table
    sums[1:, 7] = d * running  # a count or one per step: the same products (an int is one array element)
    sums[1:, 8] = d * (running + waiting)
    sums[1:, 9] = d
    sums[1:, 10:] = d[:, None] * groups
    total = sums.cumsum(axis=0)[-1]
    totals.memory_slot_s[...] = total[:6]
    totals.block_table_byte_s, totals.running_s, totals.in_system_s, totals.busy_s = total[6:10].tolist()
    totals.group_block_s[...] = total[10:]
    if totals.timeline is not None:
        running, waiting = np.broadcast_to(running, d.shape), np.broadcast_to(waiting, d.shape)
        for j, (row, blocks) in enumerate(zip(parts.tolist(), groups.tolist(), strict=True)):
            start = float(ends[j])
            totals.timeline.append((start, start + float(d[j]), int(running[j]), int(waiting[j]), *row, *blocks))
    totals.add_itl(np.repeat(ends[1:] - ends[:-1], running), 1)  # step by step: one gap per running request
    totals.steps += len(d)
    totals.segments += 1


# Windowed layers' excess (steptime's module docstring): what a window W (sliding) or a chunk C (chunked) cuts from
# the positions a query attends and reads, summed in closed form over a chunk's queries or over k decode steps.

SMALL = 32  # at most this many chunks: the excess in plain integers (the same sums), cheaper than numpy's calls


def sliding_chunk_excess(start: np.ndarray, count: np.ndarray, w: int) -> tuple[int, int]:
    """(Σ_{q=s+1}^{s+m} max(q − W, 0), max(s + 1 − W, 0)) summed over the chunks (s = start, m = count)."""
    if len(start) <= SMALL:
        positions = reads = 0
        for s, m in zip(start.tolist(), count.tolist(), strict=True):
            first, last = max(s + 1, w + 1) - w, s + m - w
            positions += (first + last) * max(last - first + 1, 0) // 2
            reads += max(s + 1 - w, 0)
        return positions, reads
    first = np.maximum(start + 1, w + 1) - w  # first query beyond the window, minus W
    last = start + count - w
    n = np.maximum(last - first + 1, 0)
    positions = int(((first + last) * n // 2).sum())  # Σ u for u = first .. last (n terms; 0 when n = 0)
    return positions, int(np.maximum(start + 1 - w, 0).sum())


def chunked_chunk_excess(start: np.ndarray, count: np.ndarray, c: int) -> tuple[int, int]:
    """(Σ_{q=s+1}^{s+m} C·floor((q − 1)/C), C·floor(s/C)) summed over the chunks: query q attends (q − 1) mod C + 1
    positions, its own chunk. With F(n) = Σ_{u<n} floor(u/C) = C·a(a − 1)/2 + a·b (n = a·C + b), the first term is
    C·(F(s + m) − F(s))."""
    def f(n: np.ndarray) -> np.ndarray:
        a, b = np.divmod(n, c)
        return c * a * (a - 1) // 2 + a * b

    if len(start) <= SMALL:
        positions = reads = 0
        for s, m in zip(start.tolist(), count.tolist(), strict=True):
            (a0, b0), (a1, b1) = divmod(s, c), divmod(s + m, c)
            positions += (c * a1 * (a1 - 1) // 2 + a1 * b1) - (c * a0 * (a0 - 1) // 2 + a0 * b0)
            reads += s // c
        return c * positions, c * reads
    return c * int((f(start + count) - f(start)).sum()), c * int((start // c).sum())


def sliding_decode_excess(contexts: np.ndarray, k: int, hi: np.ndarray, w: int) -> np.ndarray:
    """Σ_i max(contexts[i] + j − W, 0) over i with j < hi[i], for j = 0 .. k−1 [k] float64. Difference arrays:
    request i adds the line (contexts[i] − W) + j for j in [max(W − contexts[i], 0), hi[i])."""
    lo = np.maximum(w - contexts, 0)
    keep = lo < hi
    lo, hi, offset = lo[keep], hi[keep], (contexts - w)[keep].astype(np.float64)
    const = np.bincount(lo, offset, k + 1) - np.bincount(hi, offset, k + 1)
    slope = np.bincount(lo, minlength=k + 1) - np.bincount(hi, minlength=k + 1)
    return (np.cumsum(const) + np.cumsum(slope) * np.arange(k + 1))[:k]


def chunked_decode_excess(contexts: np.ndarray, k: int, hi: np.ndarray, c: int) -> np.ndarray:
    """Σ_i C·floor((contexts[i] + j − 1)/C) over i with j < hi[i], for j = 0 .. k−1 [k] float64 (exact integers).
    Request i starts at C·floor((c_i − 1)/C) and steps up by C at j = C − (c_i − 1) mod C, then every C steps,
    until it leaves at hi[i]: a difference array of those steps, summed."""
    keep = hi > 0
    contexts, hi = contexts[keep], hi[keep]
    base = c * ((contexts - 1) // c)
    first = c - (contexts - 1) % c  # 1 .. C
    rises = np.maximum(hi - first + c - 1, 0) // c  # steps j = first + t·C < hi
    at = np.repeat(first, rises) + c * (np.arange(int(rises.sum())) - np.repeat(np.cumsum(rises) - rises, rises))
    diff = np.bincount(at, minlength=k + 1) * float(c) - np.bincount(hi, base + c * rises, k + 1)
    diff[0] += float(base.sum())
    return np.cumsum(diff)[:k]


def shrinking_run(st: Any, tokens0: np.ndarray, remaining: np.ndarray, k: int, now_s: float,  # st: StepTimeModel
                  steps: np.ndarray, excess: np.ndarray | float) -> tuple[np.ndarray, ...]:
    """A k-step run in which requests leave as they finish (fastforward._segment_through_finishes, lean_runs): (the
    requests by tokens to go, stable; their tokens to go in that order; alive and context sum per step; step times;
    step ends from `now_s`). `steps`: 0, 1, …, k − 1 (int64)."""
    order = np.argsort(remaining, kind="stable")
    by_remaining = remaining[order]
    context_done = np.zeros(len(tokens0) + 1, np.int64)
    np.cumsum(tokens0[order] + 1, out=context_done[1:])
    gone = np.searchsorted(by_remaining, steps, side="right")  # requests finished before step j
    alive = len(tokens0) - gone
    context = context_done[-1] - context_done[gone] + steps * alive  # Σ over alive of (t_i + 1 + j)
    alive_f, context_f = alive.astype(np.float64), context.astype(np.float64)
    d = np.asarray(st.step_s(alive_f, context_f, context_f + alive_f, 0.0, excess, excess))  # ints < 2^53: exact
    ends = np.empty(k + 1)
    ends[0] = now_s
    ends[1:] = d
    np.cumsum(ends, out=ends)
    return order, by_remaining, alive, context, d, ends


class FinishesRun(NamedTuple):
    """A run through finishes as far as it goes (`run_through_finishes`): k steps, d[j] the time of step j (ending at
    ends[j + 1]), alive[j] the requests in it, the policy's integrals (parts, table bytes), and the requests that
    finish in it (indices into the batch, in finishing order)."""

    k: int
    d: np.ndarray
    ends: np.ndarray
    alive: np.ndarray
    parts: np.ndarray
    table_bytes: float
    finished: np.ndarray


def run_through_finishes(st: Any, policy: Any, rids: Any, tokens0: np.ndarray, remaining: np.ndarray, longest: int,
                         now_s: float, until: float, floor_s: float,
                         steps_upto: Callable[[int], np.ndarray]) -> FinishesRun | None:
    """FastForward._segment_through_finishes and the lean loop's (lean_runs) up to their own updates: decode steps of
    the batch holding `tokens0` with `remaining` tokens to go (`longest` the most), nobody waiting, requests leaving
    as they finish, until the next arrival `until` (inf: none) or the memory the policy (st: StepTimeModel, policy:
    a MemoryPolicy's finish_segment, given `rids`) finds short. `floor_s`: the shortest decode step (one request, no
    context); `steps_upto(k)`: 0, 1, … (int64, at least k of them). None (nothing done): under two steps."""
    k = longest
    if until < np.inf:  # no decode step is shorter than the weights' read + overhead
        if until <= now_s + floor_s:  # <= the end of step 0 (rounding is monotone): under two steps
            return None
        k = min(k, int((until - now_s) / floor_s) + 2)
    excess = st.decode_excess(tokens0 + 1, k, remaining) if st.sliding_share else 0.0
    order, by_remaining, alive, context, d, ends = shrinking_run(st, tokens0, remaining, k, now_s, steps_upto(k)[:k],
                                                                 excess)
    if until < np.inf:
        k = min(k, int(np.searchsorted(ends[:k], until, side="left")))
    k, parts, table_bytes = policy.finish_segment(rids, tokens0, remaining, d[:k], context[:k])
    if k < 2:
        return None
    finished = order[: int(np.searchsorted(by_remaining, k, side="right"))]  # in finishing order
    return FinishesRun(k, d[:k], ends[: k + 1], alive[:k], parts, table_bytes, finished)


def add_through_finishes(totals: RunTotals, parts: np.ndarray, table_bytes: float, d: np.ndarray, ends: np.ndarray,
                         alive: np.ndarray, n: int, now_s: float) -> None:
    """The totals of a run through finishes from `now_s` (nobody waits; k = len(d) steps, `alive` per step, `n` at its
    start), summed as stepping sums them; the requests' times are the caller's."""
    totals.memory_slot_s += parts
    totals.block_table_byte_s += table_bytes
    running_s = float(d @ alive)  # nobody waits: the same integral twice
    totals.running_s += running_s
    totals.in_system_s += running_s
    if totals.timeline is not None:
        totals.timeline.append((now_s, float(ends[-1]), n, 0, *(parts / float(d.sum())).tolist()))
    totals.add_itl(np.repeat(ends[1:] - ends[:-1], alive), 1)
    totals.busy_s += float(ends[-1] - ends[0])
    totals.steps += len(d)
    totals.segments += 1
