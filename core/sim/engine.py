"""The engine loop: arrivals, then a step — the scheduler's plan, run by an executor, applied — until every
request has ended; returns the run's RunRecord (the pool is checked whole at the end).

    scheduler.schedule() -> StepPlan -> executor.execute(plan) -> StepOutcome -> apply: clock, tokens,
    first tokens, forks, finishes, memory integrals

The executor is the step-time model in `kvcalc sim` (steptime.StepTimeExecutor) or a model runner. A
fast path (fastforward.py; step-time executor only) may do runs of decode steps at once instead of a plan
per step, with the same results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from .plan import NO_EVENTS, BlockLayout, Executor, StepEvents, StepOutcome, StepPlan
from .policies import MemoryPolicy
from .record import RUNNING, RunRecord, RunTotals
from .scheduler import Scheduler, SchedulerConfig
from .workload import Workload

STOP_EVERY = 64  # a run's stop condition is asked every this many steps (or runs of steps)
PROGRESS_EVERY = 2000  # steps (or runs of steps) between progress reports


class WholeLoop(Protocol):
    def run(self, stop: Callable[[Scheduler], bool] | None) -> bool:
        """The whole loop of `Engine.run` (arrivals, idle gaps, steps, `stop` and progress as it asks them);
        True when `stop` ended it early."""


class FastPath(Protocol):
    def advance(self) -> bool:
        """Do one or more steps without a plan; False: nothing done, take a plain step."""

    def whole_loop(self) -> WholeLoop | None:
        """A loop that runs this whole run itself with the same results (lean.LeanLoop), or None."""


class Engine:
    """One run of one policy over one workload with one executor. `run()` returns a RunRecord."""

    def __init__(self, workload: Workload, policy: MemoryPolicy, executor: Executor, config: SchedulerConfig,
                 cancel_at: np.ndarray | None = None, *, record_timeline: bool = False,
                 progress: Callable[[int], None] | None = None) -> None:
        self.workload, self.policy, self.executor = workload, policy, executor
        self.scheduler = Scheduler(workload, policy, config, cancel_at)
        self.totals = RunTotals(record_timeline)
        self.progress = progress  # called with the number of arrivals taken in since the last call
        self.progress_done = 0
        self._group_blocks_of = getattr(policy, "group_blocks", None)  # a hybrid pool's; looked up once

    def account(self, duration_s: float, parts: np.ndarray, table_bytes: float) -> None:
        s = self.scheduler
        self.totals.account(s.now_s, duration_s, parts, table_bytes, len(s.running), len(s.waiting),
                            self._group_blocks())

    def _group_blocks(self) -> list[int] | None:
        """A hybrid pool's blocks per group now (None for a single-group pool)."""
        group_blocks = self._group_blocks_of
        return None if group_blocks is None else group_blocks()

    # ---- one plain step: plan, execute, apply ------------------------------------------------------------
    def step(self) -> None:
        s = self.scheduler
        ids, new, num_running = s.schedule()
        assert len(ids), "a step with nothing scheduled (the head of the queue cannot run on an empty pool)"
        start = s.computed[ids]
        samples = start + new == s.prompt_tokens[ids] + s.generated[ids]
        sampled = ids[samples]
        # NOTE: the helpers test these conditions themselves too; testing them here first spares a plain step of
        # `kvcalc sim`, which needs none of them, three calls (~3 % of a --no-fast-forward run)
        events = self._events(sampled) if s.unborn or s.preempted_now or s.swapped_in_now or s.released else NO_EVENTS
        token_ids = None if s.token_ids is None else self._token_ids(ids, start, new)
        layout = self._layout(ids, start, new) if self.policy.exact_block_tables else None
        plan = StepPlan(self.totals.steps, s.now_s, ids, start, new, samples, num_running, events, token_ids, layout)
        self._apply(plan, self.executor.execute(plan), sampled)

    def _events(self, sampled: np.ndarray) -> StepEvents:
        s = self.scheduler
        forks: tuple[tuple[int, int], ...] = ()
        if s.unborn:
            forks = tuple((p, c) for p in sampled.tolist() if p in s.unborn for c in s.unborn[p])
        if not (forks or s.preempted_now or s.swapped_in_now or s.released):
            return NO_EVENTS
        events = StepEvents(tuple(s.preempted_now), tuple(s.swapped_in_now), forks, tuple(s.released))
        s.preempted_now, s.swapped_in_now, s.released = [], [], []
        return events

    def _token_ids(self, ids: np.ndarray, start: np.ndarray, new: np.ndarray) -> tuple[tuple[int, ...], ...] | None:
        tokens = self.scheduler.token_ids
        if tokens is None:
            return None
        return tuple(tuple(tokens[r][a : a + m]) for r, a, m in zip(ids.tolist(), start.tolist(), new.tolist(),
                                                                     strict=True))

    def _layout(self, ids: np.ndarray, start: np.ndarray, new: np.ndarray) -> BlockLayout | None:
        if not self.policy.exact_block_tables:
            return None
        B = self.policy.block_size
        tables = tuple(self.policy.block_table(r) for r in ids.tolist())
        positions = [np.arange(a, a + m) for a, m in zip(start.tolist(), new.tolist(), strict=True)]
        slots = np.concatenate([t[p // B] * B + p % B for t, p in zip(tables, positions, strict=True)])
        return BlockLayout(tables, slots, tuple(self.policy.take_copies()))

    def _apply(self, plan: StepPlan, outcome: StepOutcome, sampled: np.ndarray) -> None:
        """The end of the step: `sampled` (= the plan's sampling requests) got their tokens."""
        s = self.scheduler
        ids, d = plan.request_ids, outcome.duration_s
        s.computed[ids] = plan.num_computed_tokens + plan.num_new_tokens
        s.finished_now = 0
        parts, table_bytes = self.policy.parts(s.computed[s.running_ids], s.head())
        # memory held while the step runs (its new tokens included)
        self.totals.account(s.now_s, d, parts, table_bytes, len(s.running), len(s.waiting), self._group_blocks())
        s.now_s += d
        self.totals.busy_s += d
        self.totals.steps += 1
        if len(sampled):
            self._sampled(sampled, 1)
            if s.token_ids is not None:
                self._take_tokens(sampled, outcome)
            if plan.events.forks:
                sampled = self._fork(plan.events.forks, sampled, outcome)
            s.finish(sampled, outcome.finished)
        s.steady = len(sampled) - s.finished_now == len(s.running)

    def _sampled(self, sampled: np.ndarray, tokens: np.ndarray | int) -> None:
        """`sampled` got `tokens` tokens each at the end of the step (now): the time of each one's first, or one
        inter-token gap since its last (tokens that arrive together are one gap)."""
        s = self.scheduler
        first = np.isnan(s.first_token_s[sampled])
        s.first_token_s[sampled[first]] = s.now_s
        later = sampled[~first]
        if len(later):
            self.totals.add_itl(s.now_s - s.last_token_s[later], 1)
        s.last_token_s[sampled] = s.now_s
        s.generated[sampled] += tokens

    def _reported_tokens(self, outcome: StepOutcome) -> tuple[list[list[int]], Mapping[int, int | tuple[int, ...]]]:
        """(the workload's token ids per request, the tokens the executor reports for this step), for a workload with
        token ids, whose executor must report the tokens of every sampling request."""
        if outcome.token_ids is None:
            raise ValueError("the workload has token ids: the executor must return the tokens each sampling "
                             "request produced (StepOutcome.token_ids)")
        assert self.scheduler.token_ids is not None  # the caller takes tokens only for a workload with token ids
        return self.scheduler.token_ids, outcome.token_ids

    def _take_tokens(self, sampled: np.ndarray, outcome: StepOutcome) -> None:
        token_ids, given = self._reported_tokens(outcome)
        for rid in sampled.tolist():
            token_ids[rid].append(one_token(rid, given[rid]))

    def _fork(self, forks: tuple[tuple[int, int], ...], sampled: np.ndarray, outcome: StepOutcome) -> np.ndarray:
        """The parallel samples of parents that just produced their first token: same blocks, own first token."""
        s = self.scheduler
        for parent, child in forks:
            s.unborn.pop(parent, None)
            self.policy.fork(parent, child)
            s.computed[child] = s.computed[parent]
            s.status[child] = RUNNING
            s.running.append(child)
            s.first_token_s[child] = s.last_token_s[child] = s.now_s
            s.generated[child] = 1
            if s.token_ids is not None:
                assert outcome.token_ids is not None  # _take_tokens, before the forks, raised otherwise
                s.token_ids[child].append(one_token(child, outcome.token_ids[child]))
        s.set_running()
        return np.concatenate([sampled, np.array([c for _, c in forks], np.int64)])

    # ---- the loop --------------------------------------------------------------------------------------
    def run(self, fast: FastPath | None = None, stop: Callable[[Scheduler], bool] | None = None) -> RunRecord | None:
        """The whole run's record; None when `stop` (asked every STOP_EVERY steps or runs of steps, with the
        scheduler) said to stop early: the search's verdict is then already certain (verdict.py)."""
        s = self.scheduler
        loop = None if fast is None else fast.whole_loop()
        if loop is not None:
            if loop.run(stop):
                return None
        else:
            if self._loop(fast, stop):
                return None
        assert not s.unborn, f"parallel samples never forked: {s.unborn}"
        self.policy.check_whole()
        if self.progress is not None:
            self._report_progress()
        return self._record()

    def _loop(self, fast: FastPath | None, stop: Callable[[Scheduler], bool] | None) -> bool:
        """The loop of `run`, one step (or run of steps) at a time; True when `stop` ended it early."""
        s = self.scheduler
        ticks = 0
        while True:
            s.ingest()
            s.timeouts()
            if not s.running and not s.waiting:
                if s.next_arrival >= s.num_requests:
                    break
                idle_until = float(s.arrival_s[s.next_arrival])
                parts, table_bytes = self.policy.parts(np.zeros(0, np.int64), None)
                self.account(idle_until - s.now_s, parts, table_bytes)
                s.now_s = idle_until
                continue
            if fast is None or not fast.advance():
                self.step()
            ticks += 1
            if stop is not None and ticks % STOP_EVERY == 0 and stop(s):
                return True
            if self.progress is not None and ticks % PROGRESS_EVERY == 0:
                self._report_progress()
        return False

    def _report_progress(self) -> None:
        arrived = self.scheduler.next_arrival
        assert self.progress is not None  # the loop reports progress only to a caller that asked for it
        self.progress(arrived - self.progress_done)
        self.progress_done = arrived

    def _record(self) -> RunRecord:
        s, totals = self.scheduler, self.totals
        itl_values, itl_weights = totals.itl_samples()
        return RunRecord(
            policy=self.policy.name, workload=self.workload, capacity_slots=self.policy.capacity_slots,
            arrival_s=s.arrival_s, first_token_s=s.first_token_s, finish_s=s.finish_s, generated=s.generated,
            status=s.status, preemptions=s.preemptions, itl_values_s=itl_values, itl_weights=itl_weights,
            memory_slot_s=totals.memory_slot_s, block_table_byte_s=totals.block_table_byte_s, end_s=s.now_s,
            busy_s=totals.busy_s, running_s=totals.running_s, in_system_s=totals.in_system_s,
            peak_running=s.peak_running, steps=totals.steps, segments=totals.segments,
            timeline=totals.timeline or [], rejected_reason=s.rejected_reason, group_block_s=totals.group_block_s,
            prefix=s.prefix.totals(),
            generated_token_ids=None if s.token_ids is None else [
                t[p:] for t, p in zip(s.token_ids, s.prompt_tokens.tolist(), strict=True)],
        )


def one_token(rid: int, token: int | tuple[int, ...]) -> int:
    """The token a plain step sampled for `rid`: one token, never the tuple of a speculative step."""
    if isinstance(token, tuple):
        raise ValueError(f"the executor returned {len(token)} tokens for request {rid} in a step without drafts: "
                         "a plain step samples one token per request (StepOutcome.token_ids)")
    return int(token)
