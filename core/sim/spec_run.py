"""A simulated run with speculative decoding (speculative.py): the same scheduler and engine, taught that a
decoding request computes 1 + K query tokens in a step and keeps only what verification accepts.

One decode step of request r, committed length c (vLLM's num_computed_tokens = prompt + generated − 1):

    reserve  1 + K + λ slots past c (trimmed at max_model_len) — the pool's `reserve`, check then change;
             the plan schedules 1 + K new tokens of which K are drafts (`StepPlan.num_draft_tokens`)
    verify   the executor reports j accepted drafts (`StepOutcome.num_accepted`)
    commit   c + 1 + j: the pool's `commit(r, 1 + j)` rolls the other K − j + λ slots back (keep: the
             blocks stay r's for the next step, as vLLM v1; free: blocks wholly past c + 1 + j go back, as
             SGLang); r gets j + 1 tokens, no more than it has left

Prefill chunks grow as without speculation. Every request steps one by one (no batched fast path, no
fast-forward: runs of decode steps in closed form would need the acceptance draws), so a run is slower than
a plain one. The reservation policies reserve each request's peak, K + λ slots more than its length
(reserve-max: max_model_len, where vLLM trims the slots).

Memory while a step runs is accounted with the reservations open: the slots past the committed tokens
(blocks of reservations past them, kept blocks; for a reservation its reserved positions past them) are
the `speculative` share, out of the six parts of MEMORY_PARTS, which then sum to the pool less it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from ..blocks import ceil_div
from ..pool.block_pool import BlockPool
from .engine import Engine
from .paged_exact import ExactPagedPolicy
from .plan import Executor, StepOutcome, StepPlan
from .policies import MemoryPolicy
from .record import RunRecord
from .reserve import ReservationPolicy
from .scheduler import Scheduler
from .settings import SimSetup, prompt_block_keys
from .speculative import SimSpeculation, SpeculativeStepTimeExecutor, SpeculativeTotals
from .workload import Workload


class SpeculativePolicy(MemoryPolicy, Protocol):
    """A memory policy with decode growth by reserve / commit (see the module docstring)."""

    def reserve(self, rid: int, num_slots: int) -> bool:
        """Room for `num_slots` slots past `rid`'s committed tokens, or False and no change."""
        ...

    def commit(self, rid: int, num_accepted: int) -> int:
        """Keep `num_accepted` of the reserved slots; the slots rolled back."""
        ...

    def speculative_parts(self, tokens: np.ndarray, head_rid: int | None,
                          steps: dict[int, tuple[int, int]]) -> tuple[np.ndarray, int, int]:
        """(the six parts less the speculative slots, block-table bytes, speculative slots)."""
        ...


class SpeculativePagedPolicy(ExactPagedPolicy):
    """The paged policy over a pool with the run's rollback policy; decode growth by reserve / commit."""

    def __init__(self, num_blocks: int, block_size: int, num_requests: int, prompt_keys: list | np.ndarray | None,
                 rollback_policy: str, extra_slots: int, max_model_len: int) -> None:
        super().__init__(num_blocks, block_size, num_requests, prompt_keys)
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching=prompt_keys is not None,
                              rollback_policy=rollback_policy)
        self.extra_slots, self.max_model_len = extra_slots, max_model_len

    def never_fits(self, rid: int, total_tokens: int) -> bool:
        peak = min(total_tokens - 1 + self.extra_slots, max(self.max_model_len, total_tokens - 1))
        return ceil_div(max(peak, 1), self.block_size) > self.pool.num_blocks

    def reserve(self, rid: int, num_slots: int) -> bool:
        if not self.pool.can_reserve(rid, num_slots):
            return False
        self.copies += self.pool.reserve(rid, num_slots)
        self._track(rid)
        return True

    def commit(self, rid: int, num_accepted: int) -> int:
        expected = self.pool.committed_tokens(rid) + num_accepted
        rolled_back = self.pool.commit(rid, num_accepted)
        committed = self.pool.committed_tokens(rid)
        assert committed == expected, (f"request {rid}: the pool committed {committed} tokens, the scheduler "
                                       f"{expected}: rejected slots were kept as committed")
        self._track(rid)
        return rolled_back

    def _track(self, rid: int) -> None:
        tokens = self.pool.num_tokens(rid)
        self.pool_tokens[rid] = self.held_tokens[rid] = tokens
        self.held_blocks[rid] = ceil_div(tokens, self.block_size)

    def speculative_parts(self, tokens: np.ndarray, head_rid: int | None,
                          steps: dict[int, tuple[int, int]]) -> tuple[np.ndarray, int, int]:
        """(the six parts less the speculative slots, block-table bytes, speculative slots) while the step's
        reservations are open; running requests will hold `tokens` once committed; `steps` maps each open
        reservation's request to its committed tokens (before the step, after its commit)."""
        parts, table_bytes = self.parts(tokens, head_rid)
        B = self.block_size
        usage = self.pool.speculative_usage()
        # usage counts the blocks past the committed length before this step's commit; the accepted tokens
        # fill some of them
        filled = sum(ceil_div(after, B) - ceil_div(before, B) for before, after in steps.values())
        spec = (usage.speculative_blocks - filled) * B
        parts = parts.copy()
        parts[0] -= spec  # `parts` counts every used slot outside the tables' tails as useful
        return parts, table_bytes, spec


class SpeculativeReservationPolicy(ReservationPolicy):
    """A reservation policy whose regions hold each request's speculative peak."""

    def __init__(self, name: str, capacity_slots: int, prompt: np.ndarray, output: np.ndarray, max_model_len: int,
                 extra_slots: int) -> None:
        super().__init__(name, capacity_slots, prompt, output + extra_slots, max_model_len)
        if name == "reserve-oracle":  # the lookahead past max_model_len is trimmed, as vLLM does
            self.reserved = np.minimum(self.reserved, np.maximum(max_model_len, prompt + output))
        self.open: dict[int, int] = {}  # request -> slots reserved past its committed tokens in this step

    def reserve(self, rid: int, num_slots: int) -> bool:
        self.open[rid] = num_slots
        return True

    def commit(self, rid: int, num_accepted: int) -> int:
        return self.open.pop(rid) - num_accepted

    def speculative_parts(self, tokens: np.ndarray, head_rid: int | None,
                          steps: dict[int, tuple[int, int]]) -> tuple[np.ndarray, int, int]:
        parts, table_bytes = self.parts(tokens, head_rid)
        spec = sum(self.open[rid] - (after - before) for rid, (before, after) in steps.items())
        parts = parts.copy()
        parts[2] -= spec  # the reserved positions past the committed tokens are inside the reservation
        return parts, table_bytes, spec


class SpeculativeScheduler(Scheduler):
    """The scheduler with decode steps of 1 + K tokens through reserve (see the module docstring)."""

    policy: SpeculativePolicy

    def __init__(self, *args, speculation: SimSpeculation, **kw) -> None:
        super().__init__(*args, **kw)
        self.spec_tokens, self.lookahead = speculation.spec_tokens, speculation.lookahead_slots
        self.drafts_now: dict[int, int] = {}  # decoding request -> its drafts in the step being scheduled
        self.reserved_from: dict[int, int] = {}  # decoding request -> its committed tokens before the step

    def schedule(self) -> tuple[np.ndarray, np.ndarray, int]:
        self.drafts_now, self.reserved_from = {}, {}
        budget = self.config.max_batched_tokens
        ids: list[int] = []
        news: list[int] = []
        preempted, i = False, 0
        while i < len(self.running) and budget > 0:
            rid = self.running[i]
            computed = int(self.computed[rid])
            remaining = int(self.prompt_tokens[rid] + self.generated[rid]) - computed
            decoding = remaining == 1 and self.generated[rid] >= 1
            if decoding:
                drafts = max(min(self.spec_tokens, budget - 1, self.config.max_model_len - computed - 1), 0)
                new = 1 + drafts
                slots = min(new + (self.lookahead if drafts else 0), self.config.max_model_len - computed)
                slots = max(slots, new)
            else:
                new = min(remaining, budget)
            grow = self.policy.reserve if decoding else self.policy.grow
            size = slots if decoding else computed + new
            if not grow(rid, size):
                preempted = True
                if not self._preempt_until(rid, grow, size):
                    break
            if decoding:
                self.drafts_now[rid] = drafts
                self.reserved_from[rid] = computed
            ids.append(rid)
            news.append(new)
            budget -= new
            i += 1
        self.set_running()
        num_running = len(ids)
        if not preempted:
            self.admit_waiting(budget, ids, news)
        return np.array(ids, dtype=np.int64), np.array(news, dtype=np.int64), num_running


class SpeculativeEngine(Engine):
    """The engine loop with SpeculativeScheduler: plans carry drafts, outcomes the accepted counts."""

    policy: SpeculativePolicy
    scheduler: SpeculativeScheduler

    def __init__(self, workload, policy, executor: Executor, config, cancel_at=None, *, speculation: SimSpeculation,
                 record_timeline: bool = False, progress: Callable[[int], None] | None = None) -> None:
        super().__init__(workload, policy, executor, config, cancel_at, record_timeline=record_timeline,
                         progress=progress)
        self.scheduler = SpeculativeScheduler(workload, policy, config, cancel_at, speculation=speculation)
        self.counts: dict[str, int] = dict.fromkeys(("steps", "drafts", "accepted", "emitted", "rolled_back_slots"), 0)
        self.speculative_slot_s = 0.0

    def step(self) -> None:
        s = self.scheduler
        ids, new, num_running = s.schedule()
        assert len(ids), "a step with nothing scheduled (the head of the queue cannot run on an empty pool)"
        start = s.computed[ids]
        drafts = np.array([s.drafts_now.get(r, 0) for r in ids.tolist()], dtype=np.int64)
        samples = start + new - drafts == s.prompt_tokens[ids] + s.generated[ids]
        sampled = ids[samples]
        plan = StepPlan(self.totals.steps, s.now_s, ids, start, new, samples, num_running, self._events(sampled),
                        self._token_ids(ids, start, new), self._layout(ids, start, new), num_draft_tokens=drafts)
        self._apply_speculative(plan, self.executor.execute(plan), sampled)

    def _apply_speculative(self, plan: StepPlan, outcome: StepOutcome, sampled: np.ndarray) -> None:
        s = self.scheduler
        accepted = {} if outcome.num_accepted is None else dict(outcome.num_accepted)
        missing = [r for r, d in s.drafts_now.items() if d and r not in accepted]
        if missing:
            raise ValueError(f"the executor reported no accepted drafts for requests {missing}: a plan with drafts "
                             "needs StepOutcome.num_accepted")
        ids, d = plan.request_ids, outcome.duration_s
        committed = plan.num_computed_tokens + plan.num_new_tokens - plan.num_draft_tokens
        for k, rid in enumerate(ids.tolist()):
            if rid in s.drafts_now:
                committed[k] += accepted.get(rid, 0)
        s.computed[ids] = committed
        steps = {rid: (s.reserved_from[rid], int(s.computed[rid])) for rid in s.drafts_now}
        parts, table_bytes, spec = self.policy.speculative_parts(s.computed[s.running_ids], s.head(), steps)
        self.account(d, parts, table_bytes)
        self.speculative_slot_s += d * spec
        for rid, (before, after) in steps.items():
            self.counts["rolled_back_slots"] += self.policy.commit(rid, after - before)
        emitted = {}
        for rid, drafts in s.drafts_now.items():
            j = accepted.get(rid, 0)
            emitted[rid] = min(j + 1, int(s.stop_at[rid] - s.generated[rid]))
            for key, value in (("steps", 1), ("drafts", drafts), ("accepted", j), ("emitted", emitted[rid])):
                self.counts[key] += value
        s.finished_now = 0
        s.now_s += d
        self.totals.busy_s += d
        self.totals.steps += 1
        if len(sampled):  # one inter-token gap per request and step: its tokens arrive together
            self._sampled(sampled, np.array([emitted.get(r, 1) for r in sampled.tolist()], dtype=np.int64))
            if s.token_ids is not None:
                self._take_speculated_tokens(sampled, outcome, emitted)
            s.finish(sampled, outcome.finished)

    def _take_speculated_tokens(self, sampled: np.ndarray, outcome: StepOutcome, emitted: dict[int, int]) -> None:
        """As Engine._take_tokens; a request that verified drafts reports the tuple of tokens it emitted."""
        token_ids, reported = self._reported_tokens(outcome)
        for rid in sampled.tolist():
            given = reported[rid]
            # one token: an int or any integer scalar (numpy's from a model runner); else a sequence of them
            tokens = list(given) if isinstance(given, tuple) else np.atleast_1d(given).tolist()
            assert len(tokens) == emitted.get(rid, 1), f"request {rid}: {len(tokens)} tokens for {emitted.get(rid, 1)}"
            token_ids[rid].extend(int(t) for t in tokens)

    def totals_speculative(self) -> SpeculativeTotals:
        return SpeculativeTotals(**self.counts, speculative_slot_s=self.speculative_slot_s)


def make_speculative_policy(name: str, workload: Workload, setup: SimSetup,
                            speculation: SimSpeculation) -> SpeculativePolicy:
    extra = speculation.speculation.extra_slots
    max_len = setup.scheduler.max_model_len
    if name == "paged":
        keys = prompt_block_keys(workload, setup)
        return SpeculativePagedPolicy(setup.capacity_blocks, setup.block_size, len(workload), keys,
                                      speculation.rollback_policy, extra, max_len)
    return SpeculativeReservationPolicy(name, setup.capacity_blocks * setup.block_size, workload.prompt_tokens,
                                        workload.output_tokens, max_len, extra)


def run_speculative(workload: Workload, name: str, setup: SimSetup, speculation: SimSpeculation, *,
                    executor: Executor | None = None, record_timeline: bool = False,
                    progress: Callable[[int], None] | None = None,
                    cancel_at: np.ndarray | None = None) -> RunRecord:
    """run_policy with speculation: the record's `speculative` holds the run's SpeculativeTotals."""
    if workload.fork_parent is not None:
        raise ValueError("speculative decoding with parallel samples (forks) is not simulated: drop one of them")
    policy = make_speculative_policy(name, workload, setup, speculation)
    engine = SpeculativeEngine(workload, policy, executor or SpeculativeStepTimeExecutor(setup.steptime, speculation),
                               setup.scheduler, cancel_at, speculation=speculation, record_timeline=record_timeline,
                               progress=progress)
    record = engine.run(None)
    assert record is not None  # without a stop condition the run goes to its end
    record.speculative = engine.totals_speculative()
    return record

