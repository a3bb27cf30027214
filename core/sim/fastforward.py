"""Fast-forward for the step-time executor: runs of engine steps done at once, with the results of stepping
one by one.

Most steps are decode steps in which nothing changes the batch: no arrival, no finish,
no timeout, no admission possible and enough free blocks for every block boundary crossed. A run of k
such steps is done at once: step j's time is linear in j inside the roofline's max (the KV read grows by
one token per request per step), token times are a cumulative sum of the step times in the same order
as step-by-step additions (so bit-identical), and the memory samples come from the policy in closed form.

Three shapes, each used only where it cannot change the outcome:

    _segment                  decode-only steps up to the first finish, arrival, timeout or memory limit
                              (someone may be waiting: the batch stays fixed);
    _segment_through_finishes nobody waits: requests leave as they finish and the batch shrinks inside
                              the run, up to the next arrival or the memory limit;
    steady_step.steady_step   one general step whose running requests all decode, plus admissions, with
                              less numpy work than a plain step (and no StepPlan).

It needs the step-time model itself (closed forms of its step times), so a model runner never gets it;
without it (`fast_forward=False`) every step goes through a plan; tests compare the two modes.
"""

from __future__ import annotations

import itertools

import numpy as np

from .engine import Engine
from .lean import LeanLoop
from .lean import applies as lean_applies
from .paged import PagedPolicy
from .paged_run import PagedRun, run_pieces
from .steady_step import steady_step
from .step_sums import add_run, add_through_finishes, piece_bounds, run_through_finishes
from .steptime import StepTimeModel

# ndarray.sum reduces with this ufunc and the same arguments, through a Python-level wrapper that costs more than the
# reduction itself on a batch of ~11 requests: the same results, called directly
_sum = np.add.reduce


class FastForward:
    """The engine's fast path (engine.FastPath) over the step-time model; acts on the engine's scheduler."""

    def __init__(self, engine: Engine, steptime: StepTimeModel) -> None:
        self.engine, self.scheduler, self.steptime = engine, engine.scheduler, steptime
        self.policy, self.totals = engine.policy, engine.totals
        self._steps_index = np.arange(1024, dtype=np.int64)
        self._steps_float = self._steps_index.astype(np.float64)  # the same, as floats (exact: < 2^53)
        self._remaining: list[int] = []  # tokens to go of each running request, as _segment_length saw them
        self._floor_s = float(steptime.step_s(1.0, 0.0, 0.0))  # the shortest decode step (one request, no context)
        self._paged = isinstance(engine.policy, PagedPolicy)  # its runs are accounted by paged_run.PagedRun
        self._grouped = not self._paged and _is_grouped(engine.policy)  # runs_decode may change: asked each time

    def whole_loop(self) -> LeanLoop | None:
        """The lean loop (lean.py) where it applies to this run."""
        return LeanLoop(self.engine, self.steptime, self.advance) if lean_applies(self.engine, self.steptime) else None

    def advance(self) -> bool:
        k, plan = self._segment_length()
        if k == -1:
            return self._segment_through_finishes() or steady_step(self.engine, self.steptime)
        return (k >= 2 and self._segment(k, plan)) or steady_step(self.engine, self.steptime)

    # ---- runs of decode steps ----------------------------------------------------------------------------
    def _segment_length(self) -> tuple[int, np.ndarray | None]:
        """(how many decode-only steps can be done at once from now — 0: take a general step, plan;
        -1: a run through finishes)."""
        s = self.scheduler
        run = s.running_ids
        n = len(run)
        if not s.steady or n == 0 or n > s.config.max_batched_tokens:
            return 0, None
        if s.waiting and s.can_admit_head(s.config.max_batched_tokens - n):
            return 0, None
        runs_decode = self._runs_decode()
        if not s.waiting and (self.policy.releases_in_segment or runs_decode):
            return -1, None  # nobody waits: a run through finishes
        self._remaining = (s.stop_at[run] - s.generated[run]).tolist()  # _segment's finishes come from these
        k = min(self._remaining)  # plain min: numpy's reduce costs more on ~13
        if runs_decode:
            return k, None  # a hybrid pool: memory is checked in _segment, once the arrivals have bounded k
        k_memory, plan = self.policy.decode_steps_available(s.computed[run])
        return min(k, k_memory), plan

    def _runs_decode(self) -> bool:
        """A hybrid pool that does runs of decode steps itself (GroupedPagedPolicy.runs_decode, which may change)."""
        return self._grouped and bool(getattr(self.policy, "runs_decode", False))

    def _steps_upto(self, k: int) -> np.ndarray:
        """0, 1, 2, … (at least k of them), kept between runs."""
        if k > len(self._steps_index):
            self._steps_index = np.arange(max(k, 2 * len(self._steps_index)), dtype=np.int64)
            self._steps_float = self._steps_index.astype(np.float64)
        return self._steps_index

    def _excess(self, tokens: np.ndarray, k: int, alive_steps: np.ndarray | None = None) -> np.ndarray | float:
        """Sliding-window excess of k decode steps from requests holding `tokens` (their context in step j is
        tokens + 1 + j); 0.0 without a window."""
        if not self.steptime.sliding_share:
            return 0.0
        return self.steptime.decode_excess(tokens + 1, k, alive_steps)

    def _until(self) -> float:
        """The next arrival (inf when none is left)."""
        s = self.scheduler
        return s.arrival_list[s.next_arrival] if s.next_arrival < s.num_requests else np.inf

    def _segment(self, k: int, plan: np.ndarray | None) -> bool:
        s, st = self.scheduler, self.steptime
        run = s.running_ids
        n = len(run)
        tokens0 = s.computed[run]
        context0 = int(_sum(tokens0)) + n  # Σ (c_i + 1): step j attends context0 + n·j positions
        through = self._through_arrivals()
        until = s.next_deadline if through else min(self._until(), s.next_deadline)
        # steps only lengthen (the KV read grows), so no more than (until − now) / d_0 + 1 start before `until`
        if until < np.inf:
            excess1 = float(np.sum(self._excess(tokens0, 1))) if st.sliding_share else 0.0
            first_s = st.decode_steps_s(n, float(context0), excess1)
            k = min(k, int((until - s.now_s) / first_s) + 2)
        steps = self._steps_upto(k + 1)
        # step j attends context0 + n·j positions, an integer < 2^53: the same float from float steps
        d = np.asarray(st.decode_steps_s(n, context0 + n * self._steps_float[:k], self._excess(tokens0, k)))
        ends = np.empty(k + 1)
        ends[0] = s.now_s
        ends[1:] = d
        ends.cumsum(out=ends)  # ends[j + 1] = end of step j, summed in the order of now += d
        # step j starts at ends[j]; it belongs to this run only if it starts before `until`
        if until < np.inf:
            k = min(k, int(ends[:k].searchsorted(until)))
            if k < 2:
                return False
            d, ends = d[:k], ends[: k + 1]
        if self._runs_decode():
            return self._grouped_segment(k, d, ends)
        pieces = [0, k]
        if through and s.next_arrival < s.num_requests and s.arrival_list[s.next_arrival] <= ends[k - 1]:
            pieces = piece_bounds(ends, k, s.arrival_list, s.next_arrival)
            if pieces[1] < 2:
                return False
        if self._paged:
            assert isinstance(self.policy, PagedPolicy) and plan is not None, "a paged run has a plan"
            paged = PagedRun(self.policy, tokens0.tolist(), plan, k, steps)
            done = run_pieces(s, self.totals, self.policy, run, tokens0, paged, d, ends, pieces, self._steps_float)
            s.last_token_s[run] = s.now_s
            # who reaches its last token: the generated counts went up by `done` (Scheduler.finish's test)
            s.leave([rid for rid, rest in zip(run.tolist(), self._remaining, strict=True) if rest <= done])
            s.steady = True
            return True
        for i, j in itertools.pairwise(pieces):
            if j - i < 2:
                break  # a run of one step: the general step takes it, as without merging
            if i:
                s.ingest()  # the arrivals up to now join the queue behind its blocked head
                plan = self.policy.decode_steps_available(s.computed[run])[1]
            self._piece(run, plan, d[i:j].copy(), ends[i : j + 1], steps)
        s.last_token_s[run] = s.now_s
        s.finish(run)
        s.steady = True
        return True

    def _through_arrivals(self) -> bool:
        """A run may go on past arrivals (then done in pieces, each split where an arrival joins the queue,
        accounted as runs split at arrivals are): when someone waits and cannot be admitted, the newcomers
        queue behind the head (FCFS) and the head stays blocked — decode growth only takes memory, and
        without a prefix cache no hit can appear — with no timeout, no sliding window (whose closed form
        reads the tokens) and one block table per request."""
        s = self.scheduler
        return (bool(s.waiting) and s.config.timeout_s is None and self.policy.releases_in_segment
                and not self.steptime.sliding_share and not self._runs_decode())

    def _piece(self, run: np.ndarray, plan: np.ndarray | None, d: np.ndarray, ends: np.ndarray,
               steps: np.ndarray) -> None:
        """k = len(d) decode steps of the running batch `run` from now, accounted: memory, ITL, tokens."""
        s, totals = self.scheduler, self.totals
        n, k = len(run), len(d)
        tokens0 = s.computed[run]
        parts, table_bytes, new_blocks = self.policy.segment_integrals(tokens0, plan, d, s.head(), steps)
        totals.memory_slot_s += parts
        totals.block_table_byte_s += table_bytes
        span = float(parts.sum()) / self.policy.capacity_slots  # the parts tile the pool: Σ parts = capacity · Σ d
        totals.running_s += span * n
        totals.in_system_s += span * (n + len(s.waiting))
        if totals.timeline is not None:
            totals.timeline.append((s.now_s, float(ends[-1]), n, len(s.waiting), *(parts / span).tolist()))
        totals.add_itl(ends[1:] - ends[:-1], n)  # as step by step: now − last token
        s.computed[run] = tokens0 + k
        s.generated[run] += k
        self.policy.grow_many(run, tokens0 + k, new_blocks)
        s.now_s = float(ends[-1])
        totals.busy_s += span
        totals.steps += k
        totals.segments += 1

    def _grouped_segment(self, k: int, d: np.ndarray, ends: np.ndarray) -> bool:
        """A run of decode steps on a hybrid pool (GroupedPagedPolicy.decode_run): the memory of every step in
        closed form, accounted as stepping accounts it — each integral summed step by step in step order
        (cumsum), so every figure is the one `steady_step.steady_step` gives, bit for bit."""
        from .paged_groups import GroupedPagedPolicy
        s, totals, policy = self.scheduler, self.totals, self.policy
        assert isinstance(policy, GroupedPagedPolicy), "runs_decode is GroupedPagedPolicy's"
        run = s.running_ids
        n, waiting = len(run), len(s.waiting)
        tokens0 = s.computed[run]
        k, memory = policy.decode_run(tokens0, k, waiting > 0)
        if k < 2:
            return False
        assert memory is not None, "decode_run gives no memory only with k = 0"
        d, ends = d[:k], ends[: k + 1]
        add_run(totals, d, ends, policy.run_memory(memory, k), n, waiting)
        s.computed[run] = tokens0 + k
        s.generated[run] += k
        policy.advance_run(run, tokens0, k, memory)
        s.now_s = float(ends[-1])
        s.last_token_s[run] = s.now_s
        s.finish(run)
        s.steady = True
        return True

    def _segment_through_finishes(self) -> bool:
        """Decode steps with nobody waiting: requests leave as they finish and the batch shrinks, so the
        run goes on until the next arrival (or memory runs short). Step j holds the n_j requests with
        more than j tokens to go; its time uses n_j and their context sum S_j, summed in step order."""
        if self._runs_decode():
            from .fastforward_groups import grouped_run_through_finishes
            return grouped_run_through_finishes(self)  # a hybrid pool's
        s = self.scheduler
        run = s.running_ids
        tokens0 = s.computed[run]
        remaining = s.stop_at[run] - s.generated[run]
        found = run_through_finishes(self.steptime, self.policy, run, tokens0, remaining, int(remaining.max()),
                                     s.now_s, self._until(), self._floor_s, self._steps_upto)
        if found is None:
            return False
        k, d, ends, alive, parts, table_bytes, finished = found
        add_through_finishes(self.totals, parts, table_bytes, d, ends, alive, len(run), s.now_s)
        taken = np.minimum(remaining, k)
        s.computed[run] = tokens0 + taken
        s.generated[run] += taken
        s.last_token_s[run] = ends[taken]
        # every request's growth at once (checked step by step in finish_segment); the finished ones then
        # release in finishing order, so each takes its last blocks from the pool when they are free
        self.policy.grow_many(run, tokens0 + taken, check=False)
        for i in finished.tolist():  # in finishing order
            s.now_s = float(ends[taken[i]])
            s.close(int(run[i]))
        s.now_s = float(ends[-1])
        if len(finished):
            gone_ids = set(run[finished].tolist())
            s.running = [r for r in s.running if r not in gone_ids]
            s.set_running()
        s.steady = True
        return True


def _is_grouped(policy: object) -> bool:
    """Whether `policy` is a hybrid pool's (paged_groups: imported here, so a plain run never loads it)."""
    from .paged_groups import GroupedPagedPolicy
    return isinstance(policy, GroupedPagedPolicy)
