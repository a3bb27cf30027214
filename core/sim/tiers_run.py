"""One `kvcalc sim` run with host and disk tiers below the GPU pool (tiers.py says what they hold and the
rule); the engine, scheduler and policy are the plain ones, with three small additions made here:

    TierAdmission   the policy as the scheduler sees it: its prefix-cache hit is the GPU hit plus the
                    lower-tier blocks the rule loads; admission allocates the GPU hit as the pool finds it
                    and fresh blocks for the loaded ones (the pool registers their keys)
    TieredScheduler a request admitted with a load (or with GPU hits whose own load is still under way)
                    holds its blocks but is parked, neither running nor waiting, until the load ends — as
                    vLLM's WAITING_FOR_REMOTE_KVS — and then joins the running batch with its loaded tokens
                    computed; it is never a preemption victim while parked. When nothing can run before a
                    load ends, the clock moves to it (idle time, accounted as such).
    the stores         after every step or run of steps, what its requests computed goes to the top tier
                       (tiers_store.StoreSync, read off the scheduler: vLLM's connector stores at each step)

Fast-forward stays on: its runs of decode steps start only while nothing is parked.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from ..errors import ParameterError
from .engine import Engine, WholeLoop
from .fastforward import FastForward
from .plan import Executor
from .policies import MemoryPolicy
from .record import RunRecord
from .scheduler import Scheduler, SchedulerConfig
from .settings import SimSetup, prompt_block_keys
from .steptime import StepTimeExecutor
from .tiers import LoadPlan, TierCache
from .tiers_groups import group_classes
from .tiers_options import check_tier_setup
from .tiers_store import StoreSync
from .workload import Workload


class TierAdmission:
    """The policy with the tiers' hits added (module docstring); everything else is the policy's own."""

    def __init__(self, policy: MemoryPolicy, cache: TierCache, clock: Callable[[], float],
                 on_admit: Callable[[int, int], None]) -> None:
        self.policy, self.cache, self.clock, self.on_admit = policy, cache, clock, on_admit
        self.idle: Callable[[], bool] = lambda: False  # nothing running or parked (the scheduler's, once made)
        self.plans: dict[int, LoadPlan] = {}
        self.ready_s: dict[int, tuple[float, LoadPlan]] = {}  # admitted now, parked until then

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def hit_tokens(self, rid: int, num_tokens: int) -> int:
        B = self.policy.block_size
        gpu = self.policy.hit_tokens(rid, num_tokens) // B
        plan = self.cache.plan(rid, gpu, num_tokens, self.clock())
        if plan.load_blocks and self.idle() and not self.policy.can_admit(rid, gpu * B, (gpu + plan.load_blocks) * B):
            # nothing runs or waits for a load, and the pool cannot take this one: it never will (the loaded tokens
            # are allocated as a prefill chunk): the longest load it can take
            plan = self.cache.shrink(plan, lambda k: self.policy.can_admit(rid, gpu * B, (gpu + k) * B), self.clock())
        self.plans[rid] = plan
        return (gpu + plan.load_blocks) * B

    def loads(self, rid: int) -> bool:
        plan = self.plans.get(rid)
        return plan is not None and plan.load_blocks > 0

    def _blocked(self, rid: int, from_swap: bool) -> bool:
        """Its GPU hits are still being loaded for another request, and it loads nothing itself: it waits at the
        head of the queue (a request that loads is parked until the later of the two)."""
        if from_swap:
            return False
        plan = self.plans[rid]
        return plan.load_blocks == 0 and plan.ready_s > self.clock()

    def can_admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        gpu = self._gpu_tokens(rid, start_tokens, from_swap)
        return not self._blocked(rid, from_swap) and self.policy.can_admit(rid, gpu, total_tokens, from_swap)

    def admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        """The plan's loads are queued (their host entries pinned) before the pool allocates."""
        if self._blocked(rid, from_swap):
            return False
        gpu = self._gpu_tokens(rid, start_tokens, from_swap)
        if from_swap:
            if not self.policy.admit(rid, gpu, total_tokens, from_swap):
                return False
            self.on_admit(rid, gpu)
            return True
        if not self.policy.can_admit(rid, gpu, total_tokens):
            return False
        plan = self.plans.pop(rid)
        now = self.clock()
        ready = self.cache.commit(rid, plan, now)
        admitted = self.policy.admit(rid, gpu, total_tokens)
        assert admitted, f"request {rid}: the pool refused an admission it said it could take"
        self.on_admit(rid, gpu + plan.load_blocks * self.policy.block_size)
        if plan.load_blocks or ready > now:
            self.ready_s[rid] = (ready, plan)
        return True

    def _gpu_tokens(self, rid: int, start_tokens: int, from_swap: bool) -> int:
        return start_tokens if from_swap else self.plans[rid].gpu_blocks * self.policy.block_size


class TieredScheduler(Scheduler):
    """The plain scheduler plus parked requests (module docstring)."""

    sync: StoreSync  # the engine's, set once both are made

    def __init__(self, workload: Workload, admission: TierAdmission, config: SchedulerConfig,
                 cancel_at: np.ndarray | None, idle_until: Callable[[float], None]) -> None:
        self._steady = False
        # the admission is the policy by delegation (TierAdmission.__getattr__), which a static checker cannot see
        super().__init__(workload, cast(MemoryPolicy, admission), config, cancel_at)
        self.admission, self.idle_until = admission, idle_until
        self.parked: list[tuple[float, int]] = []  # heap of (ready_s, rid)

    # every running request decoded last step, and nothing is parked (fast-forward may start)
    @property
    def steady(self) -> bool:
        return self._steady and not self.parked

    @steady.setter
    def steady(self, value: bool) -> None:
        self._steady = value

    def _admission_size(self, rid: int, budget: int) -> tuple[int, int]:
        start, new = super()._admission_size(rid, budget)
        if not self.swapped[rid] and self.admission.loads(rid):
            new = 0  # blocks for its hits only (the loaded ones end on a block boundary): parked until they land
        return start, new

    def _waits_for_boundary(self, rid: int, new: int) -> bool:
        """A request that loads is admitted with no chunk on purpose (its loaded blocks end on a boundary, the
        align split's too): it is parked, not held back."""
        return super()._waits_for_boundary(rid, new) and (bool(self.swapped[rid]) or not self.admission.loads(rid))

    def admit_waiting(self, budget: int, ids: list[int], news: list[int]) -> None:
        first = len(ids)
        super().admit_waiting(budget, ids, news)
        ready = self.admission.ready_s
        parked = [i for i in range(first, len(ids)) if ids[i] in ready]
        for i in reversed(parked):
            rid = ids.pop(i)
            news.pop(i)
            self.running.remove(rid)
            heapq.heappush(self.parked, (ready[rid][0], rid))
        if parked:
            self.set_running()

    def _preempt(self, rid: int) -> None:
        super()._preempt(rid)
        if not self.swapped[rid]:  # recompute: its blocks are gone from the GPU
            self.sync.preempted(rid)

    def _end(self, rid: int, status: int, reason: Any) -> None:
        super()._end(rid, status, reason)
        self.sync.ending.append(rid)

    def land(self) -> None:
        """Parked requests whose loads have ended join the running batch."""
        landed = False
        while self.parked and self.parked[0][0] <= self.now_s:
            rid = heapq.heappop(self.parked)[1]
            _, plan = self.admission.ready_s.pop(rid)
            self.admission.cache.landed(rid, plan)
            self.running.append(rid)
            self.sync.admitted.append(rid)  # scheduled as a new request once its load is done (its stores first)
            landed = True
        if landed:
            self.set_running()
            self._steady = False  # a landed request prefills: the batch is not all decodes

    def wait(self) -> None:
        """Nothing can run before the next load ends or the next request arrives: idle until then."""
        t = self.parked[0][0]
        if self.next_arrival < self.num_requests:
            t = min(t, self.arrival_list[self.next_arrival])
        self.idle_until(t)
        super().ingest()
        self.land()

    def ingest(self) -> None:
        super().ingest()
        self.land()
        while not self.running and not self.waiting and self.parked:
            self.wait()

    def schedule(self) -> tuple[np.ndarray, np.ndarray, int]:
        while True:
            self.land()
            ids, news, num_running = super().schedule()
            if len(ids) or not self.parked:
                return ids, news, num_running
            self.wait()


class TieredEngine(Engine):
    scheduler: TieredScheduler

    def __init__(self, workload: Workload, policy: MemoryPolicy, executor: Executor, config: SchedulerConfig,
                 cancel_at: np.ndarray | None, cache: TierCache, **kw: Any) -> None:
        super().__init__(workload, policy, executor, config, cancel_at, **kw)
        admission = TierAdmission(policy, cache, lambda: self.scheduler.now_s, lambda r, t: self.sync.admit(r, t))
        self.scheduler = TieredScheduler(workload, admission, config, cancel_at, self._idle_until)
        self.sync = self.scheduler.sync = StoreSync(cache, self.scheduler)
        admission.idle = lambda: not self.scheduler.running and not self.scheduler.parked

    def _idle_until(self, t: float) -> None:
        s = self.scheduler
        if t > s.now_s:
            parts, table_bytes = self.policy.parts(s.computed[s.running_ids], s.head())
            self.account(t - s.now_s, parts, table_bytes)
            s.now_s = t

    def step(self) -> None:
        run0 = list(self.scheduler.running)
        super().step()
        self.sync.after(run0, 1, None)


class SyncedFast:
    """The fast path with the tiers' stores after each of its steps or runs of steps (engine.FastPath)."""

    def __init__(self, fast: FastForward, engine: TieredEngine) -> None:
        self.fast, self.engine = fast, engine

    def whole_loop(self) -> WholeLoop | None:
        return None  # the lean loop runs without a prefix cache: never with tiers

    def advance(self) -> bool:
        s, totals = self.engine.scheduler, self.engine.totals
        run0, steps = list(s.running), totals.steps
        head = s.head() if len(run0) < s.config.max_seqs else None  # vLLM looks the head up only below max_num_seqs
        done = self.fast.advance()
        self.engine.sync.after(run0, totals.steps - steps, head)
        return done


def run_tiered(workload: Workload, name: str, policy: MemoryPolicy, setup: SimSetup, *, cancel_at: np.ndarray,
               record_timeline: bool = False, progress: Callable[[int], None] | None = None) -> RunRecord:
    """`workload` under `policy` (named `name`: paged) of `setup` with `setup.tiers` below its pool; the record's
    `tiers` holds the tiers' counters (TierTotals)."""
    check_tier_setup(setup, workload, [name])
    if workload.fork_parent is not None:
        raise ParameterError("parallel samples with host_cache/disk_cache are not modelled yet", "host_cache")
    keys = prompt_block_keys(workload, setup)
    assert isinstance(keys, list), "check_tier_setup: prefix caching on and prefix ids, so one key list per prompt"
    groups = setup.groups or ()
    align = any(g.kind == "state" for g in groups) and setup.state_mode == "align"  # states only at step ends
    positions = int(np.max(workload.prompt_tokens + workload.output_tokens, initial=0)) // setup.block_size + 1
    cache = TierCache(setup.tiers, setup.steptime, setup.block_size, keys, positions, state_pages=align)
    if groups:
        if any(g.block_tokens is not None for g in groups):
            raise ParameterError("host_cache/disk_cache with groups of mixed block sizes are not modelled yet",
                                 "host_cache", "disk_cache")
        group_classes(cache.classes, groups)  # every pool group is one of the tier's classes (else refused)
    engine = TieredEngine(workload, policy, StepTimeExecutor(setup.steptime), setup.scheduler, cancel_at, cache,
                          record_timeline=record_timeline, progress=progress)
    fast = SyncedFast(FastForward(engine, setup.steptime), engine) if setup.scheduler.fast_forward else None
    record = engine.run(fast)
    assert record is not None, "a run without `stop` always ends with its record"
    assert not engine.scheduler.parked and not engine.scheduler.admission.ready_s, "a load never landed"
    record.tiers = cache.finish()
    return record
