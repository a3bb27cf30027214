"""The lean loop's runs of decode steps (lean.py): FastForward._segment and paged_run.account_pieces on plain lists.

A run of k steps of the fixed batch has its step times in plain floats (StepTimeModel.decode_run_s; from numpy for
long runs), its step ends a running sum in step order, and each piece (split where arrivals join the queue) the
policy's integrals from the sums PagedRun.piece takes (Σd, Σd·s and Σd·need(s): numpy's own reductions and dot
products), the rest in plain floats — the same bits as the fast path, with a handful of numpy calls.
"""

from __future__ import annotations

from itertools import accumulate, cycle, islice, pairwise
from operator import sub
from typing import TYPE_CHECKING

import numpy as np

from .paged_run import piece_parts
from .record import CANCELLED, COMPLETED
from .step_sums import add_through_finishes, piece_bounds, run_through_finishes

if TYPE_CHECKING:
    from .paged import PagedPolicy
    from .record import RunTotals
    from .scheduler import Scheduler
    from .steptime import StepTimeModel

_sum = np.add.reduce  # what ndarray.sum calls, without its Python wrapper: the same sums
LIST_STEPS = 32  # runs of at most this many decode steps get their step times in plain floats, longer ones from numpy


def _steps(k: int) -> np.ndarray:
    """0, 1, …, k − 1 (int64)."""
    return np.arange(k, dtype=np.int64)


class LeanBatch:
    """The running batch of the lean loop (lean.LeanLoop sets these) and its runs of decode steps."""

    s: Scheduler
    st: StepTimeModel
    policy: PagedPolicy
    totals: RunTotals
    B: int
    capacity: int
    owed: int  # Σ ceil(tok / B): the blocks the running requests hold
    tok: list[int]  # tokens held by each running request (the scheduler's running order)
    rem: list[int]  # tokens each still has to generate
    last_s: float  # when every running request but `unsampled` got its last token
    unsampled: list[int]
    mem: list[float]  # RunTotals.memory_slot_s, summed here between write-backs
    itl: list[float]  # inter-token latencies since the last write-back,
    itl_weight: list[int]  # and how many requests saw each
    steps_float: np.ndarray  # 0, 1, 2, … as floats (more than any run's steps)
    floor_s: float  # the shortest decode step (one request, no context): StepTimeModel.step_s(1.0, 0.0, 0.0)
    stop_at: list[int]
    output: list[int]

    def decode_run(self, k: int, counts: list[int]) -> bool:
        """FastForward._segment's run of up to k decode steps of the lean loop's batch through arrivals, from the
        loop's lists: accounted piece by piece, then the batch's tokens, tokens to go, owed blocks and inter-token gaps
        moved on (leaving is the caller's). `counts`: decode_plan.boundary_counts of the batch.
        False (nothing done): the first piece is one step (the general step takes it)."""
        s, tok = self.s, self.tok
        n = len(tok)
        context0 = sum(tok) + n  # Σ (c_i + 1): step j attends context0 + n·j positions
        if s.next_arrival < s.num_requests and s.arrival_list[s.next_arrival] <= s.now_s + self.st.decode_run_s(
                n, context0, 1)[0]:
            return False  # an arrival by the end of step 0 (ends[1]): piece_bounds' first piece would be one step
        if k >= len(self.steps_float):
            self.steps_float = np.arange(2 * k + 2, dtype=np.float64)
        if k <= LIST_STEPS:
            d = self.st.decode_run_s(n, context0, k)
            d_array = np.array(d)
        else:  # numpy's calls cost less than a long loop: the same values (StepTimeModel.decode_run_s)
            d_array = np.asarray(self.st.decode_steps_s(n, context0 + n * self.steps_float[:k], 0.0))
            d = d_array.tolist()
        ends = list(accumulate(d, initial=s.now_s))  # ends[j + 1] = end of step j, summed in the order of now += d
        pieces = [0, k]
        if s.next_arrival < s.num_requests and s.arrival_list[s.next_arrival] <= ends[k - 1]:
            pieces = piece_bounds(ends, k, s.arrival_list, s.next_arrival)
            if pieces[1] < 2:
                return False
        # need(m), the blocks the first m steps take, for m = 1 .. k: step j takes those of the requests whose
        # boundary step is j mod B, a running sum
        need = list(accumulate(islice(cycle(counts), k)))
        done = self._account_pieces(d, d_array, ends, pieces, need)
        self.itl += map(sub, ends[1 : done + 1], ends[:done])  # as step by step: now − last token
        self.itl_weight += [n] * done
        self.owed += need[done - 1]
        self.tok = [t + done for t in tok]
        self.rem = [r - done for r in self.rem]
        self.last_s = s.now_s
        self.unsampled = []
        return True

    def _account_pieces(self, d: list[float], d_array: np.ndarray, ends: list[float], pieces: list[int],
                        need: list[int]) -> int:
        """paged_run.account_pieces on the lean loop's integers (the table holds the owed blocks, the pool hands
        out none, nothing is cached): each piece's sums as PagedRun.piece takes them — Σd pairwise as np.add.reduce
        (np.add.reduce), Σd·s and Σd·need(s) numpy's dot products — accounted in the same order. The first
        m steps take need[m − 1] blocks. Returns the steps done."""
        s, totals, mem, B, n = self.s, self.totals, self.mem, self.B, len(self.tok)
        tokens, capacity, timeline, steps = sum(self.tok), self.capacity, totals.timeline, self.steps_float
        need_array = np.array(need, dtype=np.float64)  # exact integers, as the plan's floats
        done = 0
        for i, j in pairwise(pieces):
            if j - i < 2:
                break  # a run of one step: the general step takes it, as without merging
            if i:
                s.now_s = ends[i]
                s.ingest()  # the arrivals up to now join the queue behind its blocked head
            before = need[i - 1] if i else 0
            piece, owed = d_array[i:j], self.owed + before
            # the dot products as PagedRun.piece takes them (ndarray.dot is np.dot)
            parts, table_bytes = piece_parts((B, n, capacity, owed, owed, tokens + n * i, 0), float(_sum(piece)),
                                             float(piece.dot(steps[1 : j - i + 1])),
                                             float(piece.dot(need_array[i:j] - before if i else need_array[:j])), 0.0)
            mem[0] += parts[0]
            mem[1] += parts[1]  # parts 2 and 3 are 0.0: adding them changes nothing
            mem[4] += parts[4]
            mem[5] += parts[5]
            totals.block_table_byte_s += table_bytes
            # Σ parts (the parts tile the pool: = capacity · Σ d) as np.add.reduce sums 6 values: step_sums.sum_few
            span = (((((parts[0] + parts[1]) + parts[2]) + parts[3]) + parts[4]) + parts[5]) / capacity
            totals.running_s += span * n
            waiting = len(s.waiting)
            totals.in_system_s += span * (n + waiting)
            if timeline is not None:
                timeline.append((s.now_s, ends[j], n, waiting, *[p / span for p in parts]))
            totals.busy_s += span
            totals.steps += j - i
            totals.segments += 1
            done = j
        s.now_s = ends[done]
        return done

    def through_finishes(self) -> bool:
        """FastForward._segment_through_finishes on the loop's lists (nobody waits: requests leave as they finish, up
        to the next arrival or the memory limit): the same run (step_sums.run_through_finishes) and sums
        (step_sums.add_through_finishes) on arrays of the lists. False (nothing done): under two steps."""
        s, tok = self.s, self.tok
        until = s.arrival_list[s.next_arrival] if s.next_arrival < s.num_requests else np.inf
        if until <= s.now_s + self.floor_s:  # run_through_finishes' first test, before any numpy work: under two steps
            return False
        tokens0, remaining = np.array(tok, dtype=np.int64), np.array(self.rem, dtype=np.int64)
        # the policy (PagedPolicy) reads no request ids: the tokens stand in for them
        found = run_through_finishes(self.st, self.policy, tokens0, tokens0, remaining, max(self.rem), s.now_s, until,
                                     self.floor_s, _steps)
        if found is None:
            return False
        k, d, ends, alive, parts, table_bytes, finished = found
        totals = self.totals
        if self.itl:  # the gaps so far first: the same chunks of samples as the write-back gave
            totals.add_itl_each(self.itl, self.itl_weight)
            self.itl, self.itl_weight = [], []
        totals.memory_slot_s[:] = self.mem
        add_through_finishes(totals, parts, table_bytes, d, ends, alive, len(tok), s.now_s)
        self.mem = totals.memory_slot_s.tolist()
        self._leave_in_order(finished.tolist(), k, ends.tolist(), tokens0 + np.minimum(remaining, k), remaining - k)
        self.last_s = s.now_s = float(ends[-1])
        self.unsampled = []
        s.steady = True
        return True

    def _leave_in_order(self, finished: list[int], k: int, ends: list[float], grown: np.ndarray,
                        rest: np.ndarray) -> None:
        """The run of `k` steps ending at `ends` moves every request on: it holds `grown` tokens and has `rest` to go
        (below 0: it left); `finished` (indices into the batch, in finishing order) leave each at the end of its last
        step (Scheduler.close), the others stay."""
        s, running, stop_at, output = self.s, self.s.running, self.stop_at, self.output
        before, tok = self.rem, grown.tolist()
        for i in finished:
            rid, held = running[i], tok[i]
            s.now_s = s.finish_s[rid] = s.last_token_s[rid] = ends[before[i]]  # its last step's end
            s.status[rid] = CANCELLED if stop_at[rid] < output[rid] else COMPLETED
            s.computed[rid] = held
            s.generated[rid] = stop_at[rid]
            s.prefix.ended(rid, held)
        if finished:
            keep = rest > 0
            s.running = [running[i] for i in np.flatnonzero(keep).tolist()]
            grown, rest = grown[keep], rest[keep]
        self.tok, self.rem = grown.tolist(), rest.tolist()
        self.owed = int(_sum((grown + (self.B - 1)) // self.B))  # Σ ceil(tok / B): every request grew
