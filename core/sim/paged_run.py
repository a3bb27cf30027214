"""A fast-forwarded run of decode steps on the paged policy (paged.py), accounted in pieces: the batch is fixed,
so what the pool holds in every step of the run follows from the batch at its start, and the pool is told of
the run's growth once, at its end (fastforward._segment splits a run where arrivals join the queue, and each
piece is accounted as a run of its own would be — these are the figures of PagedPolicy.segment_integrals).

Request i, holding t_i tokens, takes a new block in step j iff (t_i + j) % B == 0, so the blocks taken by the
first m steps are need(m) = (m // B)·n + cum[m % B] (decode_steps_available's plan). A piece starting at step
i sees every request i tokens longer: its plan is need(i + m) − need(i), its block tables Σ ceil(t/B) +
need(i) entries, its tokens Σ t + n·i, and the pool has i's blocks more owed to it. Only integers change between
pieces, so a piece costs its four float sums over its steps (as segment_integrals sums them) and nothing else.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np

from ..blocks import BLOCK_TABLE_ENTRY_BYTES

_sum = np.add.reduce  # what ndarray.sum calls, without its Python wrapper: the same sums

if TYPE_CHECKING:
    from .paged import PagedPolicy
    from .record import RunTotals
    from .scheduler import Scheduler


class PagedRun:
    """The run's integers, taken once at its start (`k` steps at most); `piece` gives each piece's integrals."""

    __slots__ = ("block_size", "cached", "capacity", "evicted", "n", "need", "owed", "plain", "table", "tokens", "used")

    def __init__(self, policy: PagedPolicy, tokens: list[int], plan: np.ndarray, k: int, steps: np.ndarray,
                 held: tuple[int, int, int, int, int] | None = None) -> None:
        """`held`: (blocks in the requests' tables, used, plain free, cached free, owed blocks) when the caller keeps
        them (lean.LeanLoop); by default counted from `tokens` and read from the policy."""
        B, n = policy.block_size, len(tokens)
        self.block_size, self.n, self.capacity = B, n, policy.capacity_slots
        m = steps[: k + 1]
        self.need = (m // B) * n + plan[m % B]  # need(m), m = 0 .. k: floats (plan's), exact integers
        self.tokens = sum(tokens)
        if held is None:
            held = (sum([-(-t // B) for t in tokens]), *policy.pool_state(), policy.owed_blocks)
        self.table, used, self.plain, self.cached, self.owed = held
        self.used = used + self.owed
        # E(m) for m up to the run's last hand-out: cache entries among the free queue's first m blocks
        self.evicted = policy._free.evictions_within(self.owed + int(self.need[k])) if self.cached else None

    def piece(self, d: np.ndarray, i: int, steps: np.ndarray) -> tuple[np.ndarray, float]:
        """(Σ_j d_j · parts_j [6], Σ_j d_j · block-table bytes_j) of the len(d) steps from step i of the run: the
        arithmetic of PagedPolicy.segment_integrals, operation for operation, on the piece's own integers
        (`steps` = 0, 1, 2, … as floats: the dot products then need no cast, and give the same sums)."""
        B, n, k = self.block_size, self.n, len(d)
        before = int(self.need[i]) if i else 0  # need(0) = 0
        s = steps[1 : k + 1]
        need = self.need[i + 1 : i + k + 1] - before if i else self.need[1 : k + 1]
        table0 = self.table + before
        t0 = self.tokens + n * i
        used0 = self.used + before
        D, DS, DN = float(_sum(d)), float(np.dot(d, s)), float(np.dot(d, need))
        DE = 0.0
        if self.evicted is not None:  # hand-outs pop the free queue's head (vLLM's order), evicting its entries
            DE = float(d @ self.evicted[self.owed + self.need[i + 1 : i + k + 1].astype(np.int64)])
        parts, table_bytes = piece_parts((B, n, self.capacity, used0, table0, t0, self.cached), D, DS, DN, DE)
        return np.array(parts), table_bytes

    def blocks_taken(self, k: int) -> int:
        """need(k): the blocks the first k steps take."""
        return int(self.need[k])


def piece_parts(counts: tuple[int, int, int, int, int, int, int], D: float, DS: float, DN: float,
                DE: float) -> tuple[list[float], float]:
    """(Σ_j d_j · parts_j [6], Σ_j d_j · block-table bytes_j) of a piece of decode steps (s = 1, 2, … steps into it)
    from its sums D = Σd, DS = Σd·s, DN = Σd·need(s), DE = Σd·evicted(s) and `counts` = (B, requests, capacity in
    slots, blocks used and in the tables, tokens, cached free blocks) at its start: PagedPolicy.segment_integrals."""
    B, n, capacity, used0, table0, t0, cached0 = counts
    used = used0 * B * D + B * DN
    useful = ((used0 - table0) * B + t0) * D + n * DS
    cached = cached0 * B * D - B * DE
    return [useful, used - useful, 0.0, 0.0, cached, capacity * D - used - cached], BLOCK_TABLE_ENTRY_BYTES * (
        table0 * D + DN)


def run_pieces(s: Scheduler, totals: RunTotals, policy: PagedPolicy, run: np.ndarray, tokens0: np.ndarray,
               paged: PagedRun, d: np.ndarray, ends: np.ndarray, pieces: list[int], steps: np.ndarray) -> int:
    """The pieces of a run of decode steps of the batch `run` (holding `tokens0`), accounted (account_pieces), then
    the tokens and the pool's growth once, after the last piece (the same values and order as piece by piece);
    returns the steps done."""
    done = account_pieces(s, totals, paged, d, ends, pieces, steps)
    totals.add_itl(ends[1 : done + 1] - ends[:done], paged.n)  # as step by step: now − last token
    grown = tokens0 + done
    s.computed[run] = grown
    s.generated[run] += done
    policy.grow_many(run, grown, paged.blocks_taken(done))
    return done


def account_pieces(s: Scheduler, totals: RunTotals, paged: PagedRun, d: np.ndarray, ends: np.ndarray,
                   pieces: list[int], steps: np.ndarray) -> int:
    """The pieces of a run of decode steps of a fixed batch (step j lasts d[j] and ends at ends[j + 1]; pieces from
    piece_bounds), each accounted as fastforward._piece accounts a run: its integrals, timeline row, busy time and
    steps, the arrivals joining before it; then the clock at the end of the steps done (their inter-token gaps are
    the caller's). Returns the steps done. `steps` = 0, 1, 2, … as floats (PagedRun.piece)."""
    n, capacity, timeline = paged.n, paged.capacity, totals.timeline
    done = 0
    for i, j in itertools.pairwise(pieces):
        if j - i < 2:
            break  # a run of one step: the general step takes it, as without merging
        if i:
            s.now_s = float(ends[i])
            s.ingest()  # the arrivals up to now join the queue behind its blocked head
        parts, table_bytes = paged.piece(d[i:j], i, steps)
        totals.memory_slot_s += parts
        totals.block_table_byte_s += table_bytes
        span = float(_sum(parts)) / capacity  # the parts tile the pool: Σ parts = capacity · Σ d
        totals.running_s += span * n
        waiting = len(s.waiting)
        totals.in_system_s += span * (n + waiting)
        if timeline is not None:
            timeline.append((s.now_s, float(ends[j]), n, waiting, *(parts / span).tolist()))
        totals.busy_s += span
        totals.steps += j - i
        totals.segments += 1
        done = j
    s.now_s = float(ends[done])
    return done
