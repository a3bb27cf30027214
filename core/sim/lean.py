"""The whole engine loop of a plain paged run in plain Python: the running batch's tokens and tokens to go kept as
lists across finishes and admissions, with no StepPlan, no per-event numpy on the ~13 running requests and no chain
of scheduler and policy calls — the fast path (fastforward.py) of `kvcalc sim`'s default runs, with its results.

It applies where the fast path's general steps provably reduce to a few integers (`applies`): the paged policy
without a prefix cache and with lazy admission (paged.py: the pool is never touched, so every decision counts free
blocks only: free = the pool's blocks, owed = Σ ceil(tokens / B) over the running requests), preemption by
recompute, no timeout, no sliding window, no token ids, no parallel samples, no block-aligned prefill.

Each tick is what FastForward.advance (or the plain step) does in the same state, in the same order:

    _steady    every running request decodes one token and waiting requests are admitted (steady_step.steady_step)
    _preempt   that step's growth does not fit: running requests preempted from the back (steady_step._preempting_step)
    _segment   a run of decode steps to the next finish or the memory limit while the head of the queue cannot be
               admitted, in pieces where arrivals join (FastForward._segment; the same numpy sums: paged_run)
    through_finishes  nobody waits: the batch shrinks as requests finish, to the next arrival (lean_runs)

Anything else (a batch that is not steady: a prefill chunk) is handed to the fast path or the plain step after the
lists are written back (`_sync_out`), and read again after (`_sync_in`). Step times are step_s's operations in the
same order (StepTimeModel.step_fn, decode_run_s); every float is summed as the fast path sums it (test_sim_lean.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..blocks import BLOCK_TABLE_ENTRY_BYTES
from .decode_plan import boundary_counts, steps_covered
from .engine import PROGRESS_EVERY, STOP_EVERY, Engine
from .lean_runs import LeanBatch
from .paged import PagedPolicy
from .record import CANCELLED, COMPLETED, RUNNING, WAITING
from .scheduler import Scheduler

if TYPE_CHECKING:
    from collections.abc import Callable

    from .steptime import StepTimeModel


def applies(engine: Engine, steptime: StepTimeModel) -> bool:
    """The run is one the lean loop takes whole (module docstring)."""
    s, policy = engine.scheduler, engine.policy
    return (type(engine) is Engine and type(s) is Scheduler and type(policy) is PagedPolicy  # no subclass's hooks
            and policy.lazy_admission and s.config.preempt == "recompute" and s.config.timeout_s is None
            and not s.align_block and s.token_ids is None and not s.unborn and s.is_fork is None
            and not steptime.sliding_share and policy.owed_blocks == 0 and not policy.pool.seqs
            and policy.pool.num_free_blocks == policy.pool.num_blocks)


class LeanLoop(LeanBatch):
    """Engine.run's loop for a run that `applies`; `run` returns True when `stop` ended it early. `advance`: the fast
    path's (FastForward.advance), for what the loop hands back."""

    def __init__(self, engine: Engine, steptime: StepTimeModel, advance: Callable[[], bool]) -> None:
        self.engine, self.s, self.totals, self.advance = engine, engine.scheduler, engine.totals, advance
        policy = engine.policy
        assert isinstance(policy, PagedPolicy), "applies() takes only the paged policy"
        self.policy, self.st, self.step_s = policy, steptime, steptime.step_fn()  # step_s without swaps or windows
        self.steps_float, self.floor_s = np.arange(1024, dtype=np.float64), float(steptime.step_s(1.0, 0.0, 0.0))
        self.B, self.free, self.capacity = policy.block_size, policy.pool.num_blocks, policy.capacity_slots
        s = self.s
        self.prompt, self.stop_at, self.output = s.prompt_tokens.tolist(), s.stop_at.tolist(), s.output_tokens.tolist()
        self.budget, self.max_seqs = s.config.max_batched_tokens, s.config.max_seqs
        self.tok, self.rem, self.owed, self.last_s = [], [], 0, 0.0  # LeanBatch's (read by _sync_in)
        self.unsampled: list[int] = []  # admitted in the last step without completing their prompt
        self.gen: list[int] = s.generated.tolist()  # tokens generated per request: current for those not running
        self.synced: list[int] = []  # the requests whose holdings the policy was last told of (_sync_out/_sync_in)
        self.mem, self.itl, self.itl_weight = [], [], []  # LeanBatch's: gathered here between write-backs
        self._sync_in()

    def run(self, stop: Callable[[Scheduler], bool] | None) -> bool:
        s, engine = self.s, self.engine
        arrivals, num_requests = s.arrival_list, s.num_requests
        ticks = 0
        while True:
            if s.next_arrival < num_requests and arrivals[s.next_arrival] <= s.now_s:
                s.ingest()
            running, waiting = s.running, s.waiting
            if not running and not waiting:
                if s.next_arrival >= num_requests:
                    break
                idle_until = float(s.arrival_s[s.next_arrival])
                self._account(idle_until - s.now_s, 0)
                s.now_s = idle_until
                continue
            self._tick(len(running), waiting)
            ticks += 1
            if stop is not None and ticks % STOP_EVERY == 0:
                self._sync_out()
                if stop(s):
                    return True
            if engine.progress is not None and ticks % PROGRESS_EVERY == 0:
                engine._report_progress()
        self._sync_out()
        return False

    def _tick(self, n: int, waiting: object) -> None:
        """One tick of the loop with `n` running requests (FastForward.advance's choice, then its step)."""
        s = self.s
        if not s.steady or n == 0 or n > self.budget:
            self._fallback()
        elif waiting and self._can_admit_head(self.budget - n):
            self._steady(n)
        elif not waiting:  # a run through finishes, else FastForward's general step
            if not self.through_finishes():
                self._steady(n)
        elif (k := min(self.rem)) < 2:
            self._steady(n)  # one step at most before a finish: no run (its plan need not be counted)
        else:
            counts = boundary_counts(self.tok, self.B)  # decode_steps_plan's, in plain ints
            k_memory = steps_covered(counts, self.free - self.owed)
            if not (min(k, k_memory) >= 2 and self._segment(min(k, k_memory), counts)):
                self._steady(n)

    def _can_admit_head(self, budget: int) -> bool:
        """Scheduler.can_admit_head: no hit without a prefix cache, nothing swapped (recompute)."""
        s = self.s
        if len(s.running) >= self.max_seqs or budget <= 0:
            return False
        rid = s.waiting[0]
        new = min(self.prompt[rid] + self.gen[rid], budget)
        return -(-new // self.B) <= self.free - self.owed

    # ---- the general step, in plain ints ------------------------------------------------------------
    def _steady(self, n: int) -> None:
        """steady_step.steady_step: the running requests decode, waiting ones are admitted (prefill from 0)."""
        s, B, tok = self.s, self.B, self.tok
        grow = sum([1 for t in tok if not t % B])  # ceil((t + 1) / B) − ceil(t / B)
        if grow > self.free - self.owed:
            self._preempt()
            return
        self.owed += grow
        context = sum(tok) + n
        admitted, chunks, whole = self._admit(self.budget - n)
        tokens, positions, moved = n, context, context + n
        for new in chunks:  # a prefill chunk from 0: 0·m + m(m + 1)/2 positions, m read and m written
            tokens += new
            positions += new * (new + 1) // 2
            moved += 2 * new
        d = self.step_s(float(tokens), float(positions), float(moved), float(n + len(chunks)))
        self.tok = tok = [t + 1 for t in tok]
        tok.extend(chunks)
        self._account(d, context + tokens - n)  # Σ tok: each running request one more, the chunks admitted
        now = s.now_s = s.now_s + d
        totals = self.totals
        totals.busy_s += d
        totals.steps += 1
        self.itl += [now - self.last_s] * n
        self.itl_weight += [1] * n
        self.rem = rem = [r - 1 for r in self.rem]
        sampled: list[int] = []
        self.unsampled = []
        if admitted:
            gen, stop_at = self.gen, self.stop_at
            for rid, done in zip(admitted, whole, strict=True):
                (sampled if done else self.unsampled).append(rid)
                rem.append(stop_at[rid] - gen[rid] - done)  # one token more if it sampled (gen read before)
            self._first_tokens(sampled, now)
        self.last_s = now
        finished = self._leave()
        s.steady = n + len(sampled) - finished == len(s.running)

    def _admit(self, budget: int) -> tuple[list[int], list[int], list[bool]]:
        """Scheduler.admit_waiting under lazy admission: (admitted, their chunks, whether each completes its known
        tokens and samples)."""
        s, B, waiting, running = self.s, self.B, self.s.waiting, self.s.running
        admitted: list[int] = []
        chunks: list[int] = []
        whole: list[bool] = []
        while waiting and len(running) < self.max_seqs and budget > 0:
            rid = waiting[0]
            num_tokens = self.prompt[rid] + self.gen[rid]
            new = min(num_tokens, budget)
            blocks = -(-new // B)
            if blocks > self.free - self.owed:
                break
            self.owed += blocks
            waiting.popleft()
            s.prefix.admitted(rid, num_tokens, 0, None)
            running.append(rid)  # its status RUNNING when written back (_sync_out)
            admitted.append(rid)
            chunks.append(new)
            whole.append(new == num_tokens)
            budget -= new
        if admitted:
            s.peak_running = max(s.peak_running, len(running))
        return admitted, chunks, whole

    def _first_tokens(self, sampled: list[int], now: float) -> None:
        """steady_step._admitted_tokens: the first token of each admitted request that sampled, or the gap since its
        last one (recomputed after a preemption: it has generated tokens, as every request with a first token)."""
        s, gen = self.s, self.gen
        later = [rid for rid in sampled if gen[rid]]
        if later:
            last_token_s = s.last_token_s
            self.itl += [now - last_token_s[rid] for rid in later]
            self.itl_weight += [1] * len(later)
        first_token_s = s.first_token_s
        for rid in sampled:
            if not gen[rid]:
                first_token_s[rid] = now

    def _preempt(self) -> None:
        """steady_step._preempting_step: grown one by one in admission order, preempting from the back by recompute
        while one does not fit; then the decode step of those left (nobody admitted)."""
        s, B, tok = self.s, self.B, self.tok
        running = s.running
        i = 0
        while i < len(running):
            grow = 0 if tok[i] % B else 1
            while grow > self.free - self.owed:
                victim = len(running) - 1
                self._requeue(victim)
                if victim == i:
                    break
            else:
                self.owed += grow
                i += 1
                continue
            break
        m = len(running)
        positions = sum(tok) + m
        d = self.step_s(float(m), float(positions), float(positions + m), float(m))
        self.tok = tok = [t + 1 for t in tok]
        self.rem = [r - 1 for r in self.rem]
        self._account(d, sum(tok))
        now = s.now_s = s.now_s + d
        self.totals.busy_s += d
        self.totals.steps += 1
        self.itl += [now - self.last_s] * m
        self.itl_weight += [1] * m
        self.last_s = now
        self.unsampled = []
        self._leave()
        s.steady = True

    def _requeue(self, i: int) -> None:
        """Scheduler._preempt of the running request at `i` (the last) by recompute."""
        s = self.s
        rid = s.running.pop()
        tokens, rest = self.tok.pop(), self.rem.pop()
        s.preemptions[rid] += 1
        s.prefix.preempted(rid, tokens)
        s.computed[rid] = 0
        s.generated[rid] = self.gen[rid] = self.stop_at[rid] - rest
        s.last_token_s[rid] = self.last_s
        self.owed -= -(-tokens // self.B)
        s.status[rid] = WAITING
        s.waiting.appendleft(rid)

    # ---- a run of decode steps ----------------------------------------------------------------------
    def _segment(self, k: int, counts: list[int]) -> bool:
        """FastForward._segment for a paged run through arrivals (someone waits, no timeout: up to the first finish
        or the memory limit): lean_runs.decode_run; then who reached the last token leaves."""
        if not self.decode_run(k, counts):
            return False
        self._leave()
        self.s.steady = True
        return True

    # ---- bookkeeping ---------------------------------------------------------------------------------
    def _account(self, d: float, held: int) -> None:
        """RunTotals.account of a span of `d` with the running requests holding `held` tokens in `owed` blocks: the
        policy's parts, [held, owed·B − held, 0, 0, 0, capacity − owed·B] (no pool block is used or cached, every
        held block is owed, so the tables have `owed` entries); a part of 0 adds d·0 = 0.0, nothing."""
        s, totals, mem = self.s, self.totals, self.mem
        slots = self.owed * self.B
        running, waiting = len(s.running), len(s.waiting)
        mem[0] += d * held
        mem[1] += d * (slots - held)
        mem[5] += d * (self.capacity - slots)
        totals.block_table_byte_s += d * (self.owed * BLOCK_TABLE_ENTRY_BYTES)
        totals.running_s += d * running
        totals.in_system_s += d * (running + waiting)
        if totals.timeline is not None:
            totals.timeline.append((s.now_s, s.now_s + d, running, waiting, held, slots - held, 0, 0, 0,
                                    self.capacity - slots))

    def _leave(self) -> int:
        """Scheduler.finish after a step: the running requests with nothing left to generate leave, in order (every
        one of them sampled in it: one admitted without sampling has tokens to go); returns how many."""
        rem = self.rem
        if 0 not in rem:  # tokens to go never drop below 0 (a run stops at the first finish)
            return 0
        done = [i for i, r in enumerate(rem) if not r]
        s, tok, B = self.s, self.tok, self.B
        running, stop_at, output = s.running, self.stop_at, self.output
        for i in done:
            rid = running[i]
            cancelled = stop_at[rid] < output[rid]
            s.status[rid] = CANCELLED if cancelled else COMPLETED
            s.finish_s[rid] = s.now_s
            s.computed[rid] = tok[i]
            s.generated[rid] = stop_at[rid]
            s.prefix.ended(rid, tok[i])
            self.owed -= -(-tok[i] // B)
        keep = [i for i, r in enumerate(rem) if r]
        s.running = [running[i] for i in keep]
        self.tok = [tok[i] for i in keep]
        self.rem = [rem[i] for i in keep]
        return len(done)

    def _fallback(self) -> None:
        """What the fast path (or the plain step) does now, on the scheduler and policy written back."""
        self._sync_out()
        if not self.advance():
            self.engine.step()
        self._sync_in()

    def _sync_out(self) -> None:
        """Write the lists back: the scheduler's arrays of the running requests, the policy's holdings."""
        s, policy = self.s, self.policy
        ids = np.array(s.running, dtype=np.int64)
        s.running_ids = ids
        s.computed[ids] = self.tok
        s.generated[ids] = s.stop_at[ids] - np.array(self.rem, dtype=np.int64)
        unsampled = set(self.unsampled)
        s.last_token_s[[r for r in s.running if r not in unsampled]] = self.last_s
        policy.held_tokens[self.synced] = 0  # those that left since hold nothing
        policy.held_blocks[self.synced] = 0
        self.synced = s.running[:]
        policy.held_tokens[ids] = self.tok
        policy.held_blocks[ids] = [-(-t // self.B) for t in self.tok]
        policy.owed_blocks = self.owed
        policy.owing = set(s.running)
        s.status[ids] = RUNNING
        s.released, s.preempted_now = [], []  # a plain step's events: none of them changes its time here
        self.totals.memory_slot_s[:] = self.mem
        if self.itl:
            self.totals.add_itl_each(self.itl, self.itl_weight)
            self.itl, self.itl_weight = [], []

    def _sync_in(self) -> None:
        """Read the lists from the scheduler and policy (after a step taken by the fast path or a plain step)."""
        s, policy = self.s, self.policy
        ids = np.array(s.running, dtype=np.int64)
        self.tok = s.computed[ids].tolist()
        self.rem = (s.stop_at[ids] - s.generated[ids]).tolist()
        self.owed = policy.owed_blocks
        gen, generated = self.gen, s.generated
        for rid in (*self.synced, *s.running):  # only the requests running around the step may have generated
            gen[rid] = int(generated[rid])
        self.synced = s.running[:]  # the policy holds these (the step released the others)
        self.mem = self.totals.memory_slot_s.tolist()
        assert self.owed == sum([-(-t // self.B) for t in self.tok]) and not policy.pool.seqs, "lazy holdings"
        self.last_s = s.now_s
        self.unsampled = [] if s.steady else list(s.running)  # not steady: the plain step comes next (no write)
