"""Continuous batching in the style of vLLM v1: the scheduler's queues and decisions, over a memory policy.

One engine step (engine.py runs the loop) at time `now_s`:

    1. arrivals up to `now_s` join the waiting queue (a request that can never run — longer than the
       model's max length, or more KV than the whole pool — is rejected and kept as an OOM sample);
       requests still without a first token `timeout` after arriving are dropped (timed out).
    2. running requests, in admission order, get their next tokens under the token budget
       (`max_batched_tokens`): a decode token, or the next prefill chunk. When memory cannot grow one,
       the most recently admitted request is preempted — recompute (release everything, requeue at the
       front) or swap (KV to the host, back in when re-admitted).
    3. if nobody was preempted, waiting requests are admitted FCFS while the budget, `max_seqs` and
       memory allow; the head blocks the queue when it does not fit. Prefix-cache hits skip prefill.
    4. the decision goes to an executor as a `StepPlan` (plan.py, with the diagram of a request's token
       regions). Every request whose chunk reaches its known tokens samples one token; a request that
       reaches its output length, its cancellation point or an end of sequence the executor reports
       leaves at the end of the step and releases its memory. A request with parallel samples forks them
       (they share its blocks) when its first token comes; they join the running batch at once, past
       `max_seqs` if need be.

The scheduler knows neither the executor nor the pool behind the policy.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable

import numpy as np

from ..blocks import ceil_div
from ..pool.block_pool import ReleaseReason
from .plan import Preemption, SwapIn
from .policies import MemoryPolicy
from .prefix_stats import prefix_counts
from .record import CANCELLED, COMPLETED, REJECTED, RUNNING, TIMED_OUT, WAITING
from .scheduler_config import SchedulerConfig  # its settings; callers import it from here too
from .workload import Workload


class Scheduler:
    """The state of every request of one run [N], the queues, and steps 1-3 of the module docstring."""

    def __init__(self, workload: Workload, policy: MemoryPolicy, config: SchedulerConfig,
                 cancel_at: np.ndarray | None = None) -> None:
        n = len(workload)
        self.policy, self.config = policy, config
        self.prompt_tokens = workload.prompt_tokens.astype(np.int64)
        self.output_tokens = workload.output_tokens.astype(np.int64)
        self.arrival_s = workload.arrival_s
        self.arrival_list = workload.arrival_s.tolist()  # scalar look-ups without numpy overhead
        self.total_tokens = (self.prompt_tokens + self.output_tokens).tolist()
        self.num_requests = n
        cancel_at = np.zeros(n, np.int64) if cancel_at is None else cancel_at
        self.stop_at = np.where(cancel_at > 0, cancel_at, self.output_tokens)
        self.computed = np.zeros(n, np.int64)  # tokens whose KV is held (prefix-cache hits included)
        self.generated = np.zeros(n, np.int64)
        self.first_token_s = np.full(n, np.nan)
        self.last_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.status = np.full(n, WAITING, np.int8)
        self.preemptions = np.zeros(n, np.int64)
        self.swapped = np.zeros(n, bool)
        self.swap_bytes: dict[int, int] = {}  # swapped-out request -> the bytes its swap-out moved, when known
        self.align_block = getattr(policy, "aligned_prefill_block", 0)  # B: prefill split at block boundaries
        self.running: list[int] = []
        self.running_ids = np.zeros(0, np.int64)  # = running, as an array
        self.peak_running = 0
        self.waiting: deque[int] = deque()
        self.next_arrival = 0
        self.next_deadline = np.inf
        self.now_s = 0.0
        self.rejected_reason: dict[str, int] = {}
        self.finished_now = 0  # requests that left in the last step
        self.steady = False  # every running request decodes and got a token at `now_s` (fast-forward may start)
        self.token_ids = None if workload.prompt_token_ids is None else [list(p) for p in workload.prompt_token_ids]
        self.unborn = workload.fork_children()  # parent -> parallel samples not forked yet
        self.is_fork = None if workload.fork_parent is None else workload.fork_parent >= 0
        # what the next plan reports besides its tokens
        self.preempted_now: list[Preemption] = []
        self.swapped_in_now: list[SwapIn] = []
        self.released: list[tuple[int, str]] = []
        self.prefix = prefix_counts(policy, n)  # prefix-cache look-ups, hits and recomputation (prefix_stats.py)

    # ---- bookkeeping ---------------------------------------------------------------------------
    def set_running(self) -> None:
        self.running_ids = np.array(self.running, dtype=np.int64)
        self.peak_running = max(self.peak_running, len(self.running))

    def head(self) -> int | None:
        return self.waiting[0] if self.waiting else None

    def _end(self, rid: int, status: int, reason: ReleaseReason) -> None:
        self.status[rid] = status
        self.finish_s[rid] = self.now_s
        self.prefix.ended(rid, int(self.computed[rid]))
        self.policy.release(rid, reason)
        self.released.append((rid, reason.value))

    def close(self, rid: int, end_of_sequence: bool = False) -> None:
        """A request reached its last token: completed, or cancelled when that was its cancellation point."""
        if not end_of_sequence and self.stop_at[rid] < self.output_tokens[rid]:
            self._end(rid, CANCELLED, ReleaseReason.CANCELLED)
        else:
            self._end(rid, COMPLETED, ReleaseReason.FINISHED)

    def _drop_unborn(self, parent: int, status: int) -> None:
        """The parallel samples of a parent that never produced a first token end with it."""
        for child in self.unborn.pop(parent, ()):
            self.status[child] = status
            self.finish_s[child] = self.finish_s[parent]

    # ---- 1. arrivals and timeouts --------------------------------------------------------------
    def ingest(self) -> None:
        if self.next_arrival >= self.num_requests or self.arrival_list[self.next_arrival] > self.now_s:
            return
        end = bisect_right(self.arrival_list, self.now_s, self.next_arrival)  # those before have arrived
        for rid in range(self.next_arrival, end):
            if self.is_fork is not None and self.is_fork[rid]:
                continue  # a parallel sample: forked from its parent's first token
            total = self.total_tokens[rid]
            reason = None
            if total > self.config.max_model_len:
                reason = "longer than the model's max length"
            elif self.policy.never_fits(rid, total):
                reason = "more KV than the whole pool (OOM)"
            if reason:
                self.status[rid] = REJECTED
                self.finish_s[rid] = self.arrival_s[rid]
                self.rejected_reason[reason] = self.rejected_reason.get(reason, 0) + 1 + len(self.unborn.get(rid, ()))
                self._drop_unborn(rid, REJECTED)
                continue
            self.waiting.append(rid)
            if self.config.timeout_s is not None:
                self.next_deadline = min(self.next_deadline, self.arrival_s[rid] + self.config.timeout_s)
        self.next_arrival = end

    def timeouts(self) -> None:
        if self.config.timeout_s is None or self.now_s < self.next_deadline:
            return
        limit = self.now_s - self.config.timeout_s
        late = [r for r in self.waiting if np.isnan(self.first_token_s[r]) and self.arrival_s[r] <= limit]
        for rid in late:
            self.waiting.remove(rid)
            self.swap_bytes.pop(rid, None)
            self.status[rid] = TIMED_OUT
            self.finish_s[rid] = self.now_s
            self.released.append((rid, ReleaseReason.TIMED_OUT.value))  # it may have run before a preemption
            self._drop_unborn(rid, TIMED_OUT)
        late_running = [r for r in self.running if np.isnan(self.first_token_s[r]) and self.arrival_s[r] <= limit]
        for rid in late_running:
            self.running.remove(rid)
            self._end(rid, TIMED_OUT, ReleaseReason.TIMED_OUT)
            self._drop_unborn(rid, TIMED_OUT)
        if late_running:
            self.set_running()
        pending = [self.arrival_s[r] for r in self.waiting if np.isnan(self.first_token_s[r])]
        self.next_deadline = min(pending) + self.config.timeout_s if pending else np.inf

    # ---- 2-3. scheduling -------------------------------------------------------------------------
    def _preempt(self, rid: int) -> None:
        """Preempt `rid` (already removed from running)."""
        self.preemptions[rid] += 1
        swap = self.config.preempt == "swap"
        tokens = int(self.computed[rid])
        block_ids = tuple(self.policy.block_table(rid).tolist()) if swap and self.policy.exact_block_tables else None
        num_bytes = None
        if swap:
            self.swapped[rid] = True
            # a hybrid pool says what it holds per group, state included (GroupedPagedPolicy.swap_bytes); else
            # the step time counts tokens × bytes per token. The same bytes come back at the swap-in.
            measure = getattr(self.policy, "swap_bytes", None)
            num_bytes = None if measure is None else measure(rid)
            if num_bytes is not None:
                self.swap_bytes[rid] = num_bytes
        else:
            self.prefix.preempted(rid, tokens)
            self.computed[rid] = 0
        self.policy.release(rid, ReleaseReason.PREEMPTED)
        self.status[rid] = WAITING
        self.waiting.appendleft(rid)
        if self.config.timeout_s is not None and np.isnan(self.first_token_s[rid]):
            self.next_deadline = min(self.next_deadline, self.arrival_s[rid] + self.config.timeout_s)
        self.preempted_now.append(Preemption(rid, self.config.preempt, tokens, block_ids, num_bytes))

    def schedule(self) -> tuple[np.ndarray, np.ndarray, int]:
        """Steps 2-3: (request ids [m], new tokens [m], how many of them were running) of this step."""
        budget = self.config.max_batched_tokens
        ids: list[int] = []
        news: list[int] = []
        preempted = False
        run = self.running_ids
        if len(run):
            steady = self.steady and len(run) <= budget  # every running request decodes one token
            if steady:
                totals = self.computed[run] + 1
            else:
                remaining = self.prompt_tokens[run] + self.generated[run] - self.computed[run]
                if self.align_block:
                    new = self._aligned_news(run, remaining, budget)
                else:
                    before = np.cumsum(remaining) - remaining
                    new = np.minimum(np.maximum(budget - before, 0), remaining)
                totals = self.computed[run] + new
            grown = run if steady or new.all() else run[new > 0]  # vLLM allocates for (and frees skipped blocks of)
            if self.policy.grow_many(grown, totals if grown is run else totals[new > 0]):  # the scheduled only
                if steady:
                    ids, news = run.tolist(), [1] * len(run)
                    budget -= len(run)
                else:
                    keep = new > 0
                    ids, news = run[keep].tolist(), new[keep].tolist()
                    budget -= int(new.sum())
            else:
                budget, preempted = self._schedule_running_one_by_one(budget, ids, news)
        num_running = len(ids)
        if not preempted:
            self.admit_waiting(budget, ids, news)
        return np.array(ids, dtype=np.int64), np.array(news, dtype=np.int64), num_running

    def _aligned(self, rid: int, computed: int, new: int) -> int:
        """vLLM's block-aligned prefill split (mamba_cache_mode align with prefix caching: a state is saved only
        where a step ends): a chunk from `computed` that ends before the last block boundary of the request's
        tokens is cut to whole blocks (0 under one block: not this step), the one that passes it ends on it, the
        tail after it runs as is; decode steps are not split."""
        tokens = int(self.prompt_tokens[rid] + self.generated[rid])
        if computed >= max(int(self.prompt_tokens[rid]), tokens - 1):
            return new
        B = self.align_block
        last, end = tokens - tokens % B, computed + new
        if end < last:
            return new // B * B
        return last - computed if computed < last < end else new

    def _aligned_news(self, run: np.ndarray, remaining: np.ndarray, budget: int) -> np.ndarray:
        """The running requests' chunks under the token budget, in order, each split as `_aligned`."""
        news = []
        for rid, rest in zip(run.tolist(), remaining.tolist(), strict=True):
            new = self._aligned(rid, int(self.computed[rid]), min(rest, budget))
            news.append(new)
            budget -= new
        return np.array(news, dtype=np.int64)

    def _schedule_running_one_by_one(self, budget: int, ids: list[int], news: list[int]) -> tuple[int, bool]:
        preempted, i = False, 0
        while i < len(self.running) and budget > 0:
            rid = self.running[i]
            new = min(int(self.prompt_tokens[rid] + self.generated[rid] - self.computed[rid]), budget)
            if self.align_block and not (new := self._aligned(rid, int(self.computed[rid]), new)):
                i += 1
                continue
            total = int(self.computed[rid]) + new
            if not self.policy.grow(rid, total):
                preempted = True
                if not self._preempt_until(rid, self.policy.grow, total):
                    break
            ids.append(rid)
            news.append(new)
            budget -= new
            i += 1
        self.set_running()
        return budget, preempted

    def _preempt_until(self, rid: int, grow: Callable[[int, int], bool], size: int) -> bool:
        """`grow(rid, size)`, the policy growing running request `rid`, did not fit: preempt from the back of the
        running batch until it does. Whether `rid` still runs (False: it was preempted itself)."""
        while True:
            victim = self.running.pop()
            self._preempt(victim)
            if victim == rid:
                return False
            if grow(rid, size):
                return True

    def admit_waiting(self, budget: int, ids: list[int], news: list[int]) -> None:
        """Step 3: admit from the head of the queue into `ids`/`news`; swap-ins go to `swapped_in_now`."""
        admitted = False
        while self.waiting and len(self.running) < self.config.max_seqs and budget > 0:
            rid = self.waiting[0]
            start, new = self._admission_size(rid, budget)
            from_swap = bool(self.swapped[rid])
            num_tokens = int(self.prompt_tokens[rid] + self.generated[rid])
            group_hits = None if from_swap else self.prefix.probe(rid, num_tokens)  # before the pool changes
            if self._waits_for_boundary(rid, new) or not self.policy.admit(rid, start, start + new,
                                                                           from_swap=from_swap):
                break
            self.waiting.popleft()
            if not from_swap:
                self.prefix.admitted(rid, num_tokens, start, group_hits)
            if from_swap:
                self.swapped[rid] = False
                block_ids = None
                if self.policy.exact_block_tables:
                    block_ids = tuple(self.policy.block_table(rid)[: ceil_div(start, self.policy.block_size)].tolist())
                self.swapped_in_now.append(SwapIn(rid, start, block_ids, self.swap_bytes.pop(rid, None)))
            self.computed[rid] = start
            self.status[rid] = RUNNING
            self.running.append(rid)
            ids.append(rid)
            news.append(new)
            budget -= new
            admitted = True
        if admitted:
            self.set_running()

    def _admission_size(self, rid: int, budget: int) -> tuple[int, int]:
        """(tokens already held at admission: swapped-in KV or prefix-cache hits, first chunk size)."""
        num_tokens = int(self.prompt_tokens[rid] + self.generated[rid])
        start = int(self.computed[rid]) if self.swapped[rid] else self.policy.hit_tokens(rid, num_tokens)
        new = min(num_tokens - start, budget)
        return start, self._aligned(rid, start, new) if self.align_block else new

    def _waits_for_boundary(self, rid: int, new: int) -> bool:
        """Under the block-aligned split, an admission with no chunk this step (under one block before a
        boundary: `_aligned`) waits for a later step."""
        return bool(self.align_block) and not new

    def can_admit_head(self, budget: int) -> bool:
        if not self.waiting or len(self.running) >= self.config.max_seqs or budget <= 0:
            return False
        rid = self.waiting[0]
        start, new = self._admission_size(rid, budget)
        if self._waits_for_boundary(rid, new):
            return False
        return self.policy.can_admit(rid, start, start + new, from_swap=bool(self.swapped[rid]))

    # ---- after a step ------------------------------------------------------------------------------------
    def finish(self, sampled: np.ndarray, end_of_sequence: frozenset[int] = frozenset()) -> None:
        """Requests of `sampled` that reached their last token (or an end of sequence) leave."""
        done_mask = self.generated[sampled] >= self.stop_at[sampled]
        if end_of_sequence:
            assert end_of_sequence <= set(sampled.tolist()), f"requests {end_of_sequence} ended without sampling"
            done_mask |= np.isin(sampled, list(end_of_sequence))
        self.leave(sampled[done_mask].tolist(), end_of_sequence)

    def leave(self, done_ids: list[int], end_of_sequence: frozenset[int] = frozenset()) -> None:
        """`done_ids`, running requests at their last token (or an end of sequence), leave in this order."""
        self.finished_now = len(done_ids)
        if not done_ids:
            return
        for rid in done_ids:
            self.close(rid, rid in end_of_sequence)
        gone = set(done_ids)
        self.running = [r for r in self.running if r not in gone]
        self.set_running()

