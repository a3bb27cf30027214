"""Continuous batching in the style of vLLM v1, over a memory policy, timed by the step-time model.

One engine step at time `now`:

    1. arrivals up to `now` join the waiting queue (a request that can never run — longer than the
       model's max length, or more KV than the whole pool — is rejected and kept as an OOM sample);
       requests still without a first token `timeout` after arriving are dropped (timed out).
    2. running requests, in admission order, get their next tokens under the token budget
       (`max_batched_tokens`): a decode token, or the next prefill chunk. When memory cannot grow one,
       the most recently admitted request is preempted — recompute (release everything, requeue at the
       front) or swap (KV bytes to the host over `swap_bandwidth`, back in when re-admitted).
    3. if nobody was preempted, waiting requests are admitted FCFS while the budget, `max_seqs` and
       memory allow; the head blocks the queue when it does not fit. Prefix-cache hits skip prefill.
    4. the step takes `steptime.step_s(...)`; every request whose computed tokens reach its known tokens
       samples one token; a request that reaches its output length (or its cancellation point) leaves
       at the end of this step and releases its memory.

Per request, vLLM's v1 token regions:

    |<------------- prompt ------------->|<--- generated --->|
    |<---------- computed (KV held) ---------------->|        num_tokens = prompt + generated
                                                     |<-new->| scheduled this step

Fast-forward (runs of steps done at once, with identical results) lives in core/sim_fastforward.py.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .fastforward import FastForward
from .policies import MEMORY_PARTS
from .steptime import StepTimeModel
from .workload import Workload

# request states
WAITING, RUNNING, COMPLETED, CANCELLED, TIMED_OUT, REJECTED = range(6)
STATUS_NAMES = ("waiting", "running", "completed", "cancelled", "timed_out", "rejected")


@dataclass(frozen=True)
class SchedulerConfig:
    max_batched_tokens: int = 8192
    max_seqs: int = 256
    max_model_len: int = 8192
    preempt: str = "recompute"
    timeout_s: float | None = None
    fast_forward: bool = True

    def __post_init__(self) -> None:
        if self.max_batched_tokens < 1:
            raise ValueError(f"--max-batched-tokens must be at least 1, got {self.max_batched_tokens}")
        if self.max_seqs < 1:
            raise ValueError(f"--max-seqs must be at least 1, got {self.max_seqs}")
        if self.preempt not in ("recompute", "swap"):
            raise ValueError(f"--preempt must be recompute or swap, got {self.preempt!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"--timeout must be a positive number of seconds, got {self.timeout_s}")


@dataclass(eq=False)
class RunRecord:
    """Everything a run leaves behind: per-request arrays [N], ITL samples, time integrals.

    memory_slot_s  float64 [6]  Σ over time of each MEMORY_PARTS value (slots · s)
    """

    policy: str
    workload: Workload
    capacity_slots: int
    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    generated: np.ndarray
    status: np.ndarray
    preemptions: np.ndarray
    itl_values_s: np.ndarray
    itl_weights: np.ndarray
    memory_slot_s: np.ndarray
    block_table_byte_s: float
    end_s: float
    busy_s: float
    running_s: float  # ∫ running count dt
    in_system_s: float  # ∫ (running + waiting) count dt
    peak_running: int
    steps: int
    segments: int
    timeline: list[tuple] = field(default_factory=list)
    rejected_reason: dict[str, int] = field(default_factory=dict)


class Engine(FastForward):
    """One run of one policy over one workload. `run()` returns a RunRecord; the policy is whole after."""

    def __init__(self, workload: Workload, policy, steptime: StepTimeModel, config: SchedulerConfig,
                 cancel_at: np.ndarray | None = None, *, record_timeline: bool = False,
                 progress: Callable[[float], None] | None = None) -> None:
        n = len(workload)
        self.w, self.policy, self.st, self.cfg = workload, policy, steptime, config
        self.prompt = workload.prompt_tokens.astype(np.int64)
        self.output = workload.output_tokens.astype(np.int64)
        self.arrival = workload.arrival_s
        self.arrival_list = workload.arrival_s.tolist()  # scalar look-ups without numpy overhead
        self.num_requests = n
        self._steps_index = np.arange(1024, dtype=np.int64)
        cancel_at = np.zeros(n, np.int64) if cancel_at is None else cancel_at
        self.stop_at = np.where(cancel_at > 0, cancel_at, self.output)
        self.computed = np.zeros(n, np.int64)
        self.generated = np.zeros(n, np.int64)
        self.first_token = np.full(n, np.nan)
        self.last_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.status = np.full(n, WAITING, np.int8)
        self.preemptions = np.zeros(n, np.int64)
        self.swapped = np.zeros(n, bool)
        self.running: list[int] = []
        self.run_arr = np.zeros(0, np.int64)
        self.waiting: deque[int] = deque()
        self.next_arrival = 0
        self.next_deadline = np.inf
        self.now = 0.0
        self.itl_v: list[np.ndarray] = []  # chunks of inter-token latencies
        self.itl_w: list[int] = []  # how many requests saw each value of the chunk
        self.mem = np.zeros(len(MEMORY_PARTS))
        self.table_byte_s = 0.0
        self.busy_s = self.running_s = self.in_system_s = 0.0
        self.peak_running = self.steps = self.segments = 0
        self.timeline: list[tuple] | None = [] if record_timeline else None
        self.progress = progress
        self.rejected_reason: dict[str, int] = {}
        self._finished_now = 0
        self.steady = False  # every running request decodes and got a token at `now` (fast-forward may start)

    # ---- bookkeeping ---------------------------------------------------------------------------
    def _set_running(self) -> None:
        self.run_arr = np.array(self.running, dtype=np.int64)
        self.peak_running = max(self.peak_running, len(self.running))

    def _end(self, rid: int, status: int, reason: str) -> None:
        self.status[rid] = status
        self.finish[rid] = self.now
        self.policy.release(rid, reason)

    def _close(self, rid: int) -> None:
        """A request reached its last token: completed, or cancelled when that was its cancellation point."""
        cancelled = self.stop_at[rid] < self.output[rid]
        self._end(rid, CANCELLED if cancelled else COMPLETED, "cancelled" if cancelled else "finished")

    def _head(self) -> int | None:
        return self.waiting[0] if self.waiting else None

    def _account(self, d: float, parts: np.ndarray, table_bytes: float) -> None:
        self.mem += d * parts
        self.table_byte_s += d * table_bytes
        self.running_s += d * len(self.running)
        self.in_system_s += d * (len(self.running) + len(self.waiting))
        if self.timeline is not None:
            self.timeline.append((self.now, self.now + d, len(self.running), len(self.waiting), *parts.tolist()))

    # ---- 1. arrivals and timeouts --------------------------------------------------------------
    def _ingest(self) -> None:
        if self.next_arrival >= self.num_requests or self.arrival_list[self.next_arrival] > self.now:
            return
        end = int(np.searchsorted(self.arrival, self.now, side="right"))
        for rid in range(self.next_arrival, end):
            total = int(self.prompt[rid] + self.output[rid])
            reason = None
            if total > self.cfg.max_model_len:
                reason = "longer than the model's max length"
            elif self.policy.never_fits(rid, total):
                reason = "more KV than the whole pool (OOM)"
            if reason:
                self.status[rid] = REJECTED
                self.finish[rid] = self.arrival[rid]
                self.rejected_reason[reason] = self.rejected_reason.get(reason, 0) + 1
                continue
            self.waiting.append(rid)
            if self.cfg.timeout_s is not None:
                self.next_deadline = min(self.next_deadline, self.arrival[rid] + self.cfg.timeout_s)
        self.next_arrival = end

    def _timeouts(self) -> None:
        if self.cfg.timeout_s is None or self.now < self.next_deadline:
            return
        limit = self.now - self.cfg.timeout_s
        late = [r for r in self.waiting if np.isnan(self.first_token[r]) and self.arrival[r] <= limit]
        for rid in late:
            self.waiting.remove(rid)
            self.status[rid] = TIMED_OUT
            self.finish[rid] = self.now
        late_running = [r for r in self.running if np.isnan(self.first_token[r]) and self.arrival[r] <= limit]
        for rid in late_running:
            self.running.remove(rid)
            self._end(rid, TIMED_OUT, "timed_out")
        if late_running:
            self._set_running()
        pending = [self.arrival[r] for r in self.waiting if np.isnan(self.first_token[r])]
        self.next_deadline = min(pending) + self.cfg.timeout_s if pending else np.inf

    # ---- 2-3. scheduling -------------------------------------------------------------------------
    def _preempt(self, rid: int) -> float:
        """Preempt `rid` (already removed from running); returns the bytes swapped out."""
        self.preemptions[rid] += 1
        swap_bytes = 0.0
        if self.cfg.preempt == "swap":
            swap_bytes = float(self.computed[rid] * self.st.kv_bytes_per_token)
            self.swapped[rid] = True
        else:
            self.computed[rid] = 0
        self.policy.release(rid, "preempted")
        self.status[rid] = WAITING
        self.waiting.appendleft(rid)
        if self.cfg.timeout_s is not None and np.isnan(self.first_token[rid]):
            self.next_deadline = min(self.next_deadline, self.arrival[rid] + self.cfg.timeout_s)
        return swap_bytes

    def _schedule(self) -> tuple[np.ndarray, np.ndarray, float]:
        """Steps 2-3: (request ids [m], new tokens [m], swap bytes) of this step."""
        budget = self.cfg.max_batched_tokens
        ids: list[int] = []
        news: list[int] = []
        swap_bytes = 0.0
        preempted = False
        run = self.run_arr
        if len(run):
            steady = self.steady and len(run) <= budget  # every running request decodes one token
            if steady:
                totals = self.computed[run] + 1
            else:
                rem = self.prompt[run] + self.generated[run] - self.computed[run]
                before = np.cumsum(rem) - rem
                new = np.minimum(np.maximum(budget - before, 0), rem)
                totals = self.computed[run] + new
            if self.policy.grow_many(run, totals):
                if steady:
                    ids, news = run.tolist(), [1] * len(run)
                    budget -= len(run)
                else:
                    keep = new > 0
                    ids, news = run[keep].tolist(), new[keep].tolist()
                    budget -= int(new.sum())
            else:
                budget, swap_bytes, preempted = self._schedule_running_one_by_one(budget, ids, news)
        if not preempted:
            swap_bytes += self._admit(budget, ids, news)
        return np.array(ids, dtype=np.int64), np.array(news, dtype=np.int64), swap_bytes

    def _schedule_running_one_by_one(self, budget: int, ids: list[int], news: list[int]) -> tuple[int, float, bool]:
        swap_bytes, preempted, i = 0.0, False, 0
        while i < len(self.running) and budget > 0:
            rid = self.running[i]
            new = min(int(self.prompt[rid] + self.generated[rid] - self.computed[rid]), budget)
            victim = None
            while not self.policy.grow(rid, int(self.computed[rid]) + new):
                victim = self.running.pop()
                swap_bytes += self._preempt(victim)
                preempted = True
                if victim == rid:
                    break
            if victim == rid:
                break
            ids.append(rid)
            news.append(new)
            budget -= new
            i += 1
        self._set_running()
        return budget, swap_bytes, preempted

    def _admit(self, budget: int, ids: list[int], news: list[int]) -> float:
        swap_bytes = 0.0
        admitted = False
        while self.waiting and len(self.running) < self.cfg.max_seqs and budget > 0:
            rid = self.waiting[0]
            start, new = self._admission_size(rid, budget)
            if not self.policy.admit(rid, start, start + new, from_swap=bool(self.swapped[rid])):
                break
            self.waiting.popleft()
            if self.swapped[rid]:
                swap_bytes += float(self.computed[rid] * self.st.kv_bytes_per_token)
                self.swapped[rid] = False
            self.computed[rid] = start
            self.status[rid] = RUNNING
            self.running.append(rid)
            ids.append(rid)
            news.append(new)
            budget -= new
            admitted = True
        if admitted:
            self._set_running()
        return swap_bytes

    def _admission_size(self, rid: int, budget: int) -> tuple[int, int]:
        """(tokens already held at admission: swapped-in KV or prefix-cache hits, first chunk size)."""
        num_tokens = int(self.prompt[rid] + self.generated[rid])
        start = int(self.computed[rid]) if self.swapped[rid] else self.policy.hit_tokens(rid, num_tokens)
        return start, min(num_tokens - start, budget)

    def _can_admit_head(self, budget: int) -> bool:
        if not self.waiting or len(self.running) >= self.cfg.max_seqs or budget <= 0:
            return False
        rid = self.waiting[0]
        start, new = self._admission_size(rid, budget)
        return self.policy.can_admit(rid, start, start + new, from_swap=bool(self.swapped[rid]))

    # ---- 4. one general step -------------------------------------------------------------------------
    def _step(self) -> None:
        ids, new, swap_bytes = self._schedule()
        assert len(ids), "a step with nothing scheduled (the head of the queue cannot run on an empty pool)"
        start = self.computed[ids]
        tokens = int(new.sum())
        positions = int((start * new + new * (new + 1) // 2).sum())
        moved = int((start + new).sum()) + tokens
        d = float(self.st.step_s(float(tokens), float(positions), float(moved), swap_bytes,
                                 *self.st.chunk_excess(start, new)))
        self.computed[ids] = start + new
        sampled = ids[self.computed[ids] == self.prompt[ids] + self.generated[ids]]
        run = self.run_arr
        self._finished_now = 0
        parts, table_bytes = self.policy.parts(self.computed[run], self._head())
        self._account(d, parts, table_bytes)
        self.now += d
        self.busy_s += d
        self.steps += 1
        if len(sampled):
            first = np.isnan(self.first_token[sampled])
            self.first_token[sampled[first]] = self.now
            later = sampled[~first]
            if len(later):
                self.itl_v.append(self.now - self.last_token[later])
                self.itl_w.append(1)
            self.last_token[sampled] = self.now
            self.generated[sampled] += 1
            self._finish(sampled)
        self.steady = len(sampled) - self._finished_now == len(self.running)

    def _finish(self, sampled: np.ndarray) -> None:
        done = sampled[self.generated[sampled] >= self.stop_at[sampled]]
        self._finished_now = len(done)
        if not len(done):
            return
        for rid in done.tolist():
            self._close(rid)
        gone = set(done.tolist())
        self.running = [r for r in self.running if r not in gone]
        self._set_running()

    # ---- the loop --------------------------------------------------------------------------------------
    def run(self) -> RunRecord:
        n = len(self.arrival)
        ticks = 0
        while True:
            self._ingest()
            self._timeouts()
            if not self.running and not self.waiting:
                if self.next_arrival >= n:
                    break
                idle_until = float(self.arrival[self.next_arrival])
                parts, table_bytes = self.policy.parts(np.zeros(0, np.int64), None)
                self._account(idle_until - self.now, parts, table_bytes)
                self.now = idle_until
                continue
            k, plan = self._segment_length() if self.cfg.fast_forward else (0, None)
            if k == -1:
                if not self._segment_through_finishes() and not self._steady_step():
                    self._step()
            elif (k < 2 or not self._segment(k, plan)) and not (self.cfg.fast_forward and self._steady_step()):
                self._step()
            ticks += 1
            if self.progress is not None and ticks % 2000 == 0:
                self.progress(self.next_arrival / n)
        self.policy.check_whole()
        itl_v = np.concatenate(self.itl_v) if self.itl_v else np.zeros(0)
        itl_w = np.repeat(np.array(self.itl_w, np.int64), [len(v) for v in self.itl_v])
        return RunRecord(
            policy=self.policy.name, workload=self.w, capacity_slots=self.policy.capacity_slots,
            arrival_s=self.arrival, first_token_s=self.first_token, finish_s=self.finish, generated=self.generated,
            status=self.status, preemptions=self.preemptions, itl_values_s=itl_v, itl_weights=itl_w,
            memory_slot_s=self.mem, block_table_byte_s=self.table_byte_s, end_s=self.now, busy_s=self.busy_s,
            running_s=self.running_s, in_system_s=self.in_system_s, peak_running=self.peak_running,
            steps=self.steps, segments=self.segments, timeline=self.timeline or [],
            rejected_reason=self.rejected_reason,
        )
