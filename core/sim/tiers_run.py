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
    the GPU pool's evictions are handed to the tier cache (demotion), read off its free queue's hand-outs

Fast-forward stays on: its runs of decode steps start only while nothing is parked.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from ..errors import ParameterError
from ..pool.group_hits import derived_hashes
from .engine import Engine
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
from .workload import Workload


def listen_to_evictions(store: Any, on_evict: Callable[..., None], anchored: np.ndarray | None = None,
                        classes: np.ndarray | None = None, unresolved: list[int] | None = None) -> None:
    """Call `on_evict(keys)` with the content keys of the cached blocks `store` evicts, oldest first. Every
    hand-out of the pool's store takes its blocks from the free queue's `pop` (its head, in vLLM's order; the
    evicted ones still carry their keys); TierCache.demoted is checked against the store's own eviction
    counter after the run. On a hybrid pool, `anchored` are its groups other than full attention and `classes`
    the tier class of every group (tiers_groups.group_classes): `on_evict(keys, classes)` then says each evicted
    block's (group_of_evicted)."""
    queue, keys = store.queue, store.key
    pop = queue.pop
    salted = [] if anchored is None else anchored.tolist()
    chains = [] if classes is None else [c for g, c in enumerate(classes.tolist()) if g not in salted]
    chain = chains[0] if chains else -1  # the full groups' class (one: group_classes matches kind and window)
    # each block id's hash and version when it was last evicted: an anchor handed out again since its anchored
    # blocks were registered is read here
    last = (np.zeros(len(store.key), dtype=np.uint64), np.full(len(store.key), -1, dtype=np.int64))
    unresolved = [0] if unresolved is None else unresolved

    def pop_and_tell(n: int) -> tuple[np.ndarray, np.ndarray]:
        plain, evicted = pop(n)
        if len(evicted):
            if classes is None:
                on_evict(keys[evicted])
            else:
                on_evict(keys[evicted], group_of_evicted(store, evicted, last, salted, classes, chain, unresolved))
                last[0][evicted] = store.block_hash[evicted]
                last[1][evicted] = store.version[evicted]  # the version its evicted content had (bumped after)
        return plain, evicted

    queue.pop = pop_and_tell


def group_of_evicted(store: Any, evicted: np.ndarray, last: tuple[np.ndarray, np.ndarray], salted: list[int],
                     classes: np.ndarray, chain: int, unresolved: list[int]) -> np.ndarray:
    """int64 [n]: the tier class of each evicted block. An anchored group g's block is indexed under
    derived_hashes(its anchor's hash, g) (group_hits), its anchor `parent_id` at version `parent_ver`: that hash
    is the anchor's own while the anchor still holds that version, else the one it had when last evicted
    (`last`); a block no anchored group's hash matches is a full group's (its chain). `unresolved[0]` counts the
    blocks whose parent's hash at that version is gone (handed out twice since): told the full group's, which a
    chain block is (0 in 112,013 evictions on Gemma-3-27B's first 300 Mooncake conversation requests)."""
    parents, versions = store.parent_id[evicted], store.parent_ver[evicted]
    rooted = parents < 0  # a chain's first block (its parent the root): a full group's
    anchors = np.maximum(parents, 0)
    intact = store.version[anchors] == versions
    anchor_hash = np.where(intact, store.block_hash[anchors], last[0][anchors])
    known = ~rooted & (intact | (last[1][anchors] == versions))
    own = store.block_hash[evicted]
    of = np.full(len(evicted), chain, dtype=np.int64)
    for g in salted:
        of[known & (derived_hashes(anchor_hash, g) == own)] = classes[g]
    assert (of >= 0).all(), "an evicted block of no group"
    unresolved[0] += int((~rooted & ~known).sum())  # told the full group's: a chain block, or (rarely) wrong
    return of


class TierAdmission:
    """The policy with the tiers' hits added (module docstring); everything else is the policy's own."""

    def __init__(self, policy: MemoryPolicy, cache: TierCache, keys: list, clock: Callable[[], float],
                 full_groups: tuple[int, ...] = ()) -> None:
        self.policy, self.cache, self.keys, self.clock = policy, cache, keys, clock
        self.full_groups = full_groups  # a hybrid pool's full-attention groups (none: a plain pool)
        self.idle: Callable[[], bool] = lambda: False  # nothing running or parked (the scheduler's, once made)
        self.plans: dict[int, LoadPlan] = {}
        self.ready_s: dict[int, tuple[float, LoadPlan]] = {}  # admitted now, parked until then

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def hit_tokens(self, rid: int, num_tokens: int) -> int:
        B = self.policy.block_size
        gpu = self.policy.hit_tokens(rid, num_tokens) // B
        on_gpu = 0  # the full groups' own chain past the hit (another group cut it short): tiers_groups.find
        if self.full_groups:
            pool = self.policy.pool  # type: ignore[attr-defined]  # paged (checked): MemoryPolicy names no pool
            keys = getattr(self.policy, "prompt_keys", None)  # the policy's views: its look-up's memo serves
            keys = self.keys if keys is None else keys
            own = pool.group_hit_tokens(num_tokens, keys[rid][: num_tokens // B])
            on_gpu = min(own[g] for g in self.full_groups) // B - gpu
        plan = self.cache.plan(self.keys[rid], gpu, num_tokens, self.clock(), on_gpu)
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
        """The blocks the plan loads leave their tiers before the pool allocates, so that the GPU evictions
        this admission demotes cannot push them out of the host (vLLM pins the blocks it loads, too)."""
        if self._blocked(rid, from_swap):
            return False
        gpu = self._gpu_tokens(rid, start_tokens, from_swap)
        if from_swap:
            return self.policy.admit(rid, gpu, total_tokens, from_swap)
        if not self.policy.can_admit(rid, gpu, total_tokens):
            return False
        plan = self.plans.pop(rid)
        now = self.clock()
        ready = self.cache.commit(rid, self.keys[rid], plan, now)
        admitted = self.policy.admit(rid, gpu, total_tokens)
        assert admitted, f"request {rid}: the pool refused an admission it said it could take"
        if plan.load_blocks or ready > now:
            self.ready_s[rid] = (ready, plan)
        return True

    def _gpu_tokens(self, rid: int, start_tokens: int, from_swap: bool) -> int:
        return start_tokens if from_swap else self.plans[rid].gpu_blocks * self.policy.block_size


class TieredScheduler(Scheduler):
    """The plain scheduler plus parked requests (module docstring)."""

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
        computed = int(self.computed[rid])
        super()._preempt(rid)
        if not self.swapped[rid]:  # recompute: the blocks it had not computed are not on the GPU
            self.admission.cache.forget(self.admission.keys[rid], computed // self.admission.policy.block_size)

    def land(self) -> None:
        """Parked requests whose loads have ended join the running batch."""
        landed = False
        while self.parked and self.parked[0][0] <= self.now_s:
            rid = heapq.heappop(self.parked)[1]
            _, plan = self.admission.ready_s.pop(rid)
            self.admission.cache.landed(self.admission.keys[rid], plan)
            self.running.append(rid)
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
                 cancel_at: np.ndarray | None, cache: TierCache, keys: list, full_groups: tuple[int, ...] = (),
                 **kw: Any) -> None:
        super().__init__(workload, policy, executor, config, cancel_at, **kw)
        admission = TierAdmission(policy, cache, keys, lambda: self.scheduler.now_s, full_groups)
        self.scheduler = TieredScheduler(workload, admission, config, cancel_at, self._idle_until)
        admission.idle = lambda: not self.scheduler.running and not self.scheduler.parked

    def _idle_until(self, t: float) -> None:
        s = self.scheduler
        if t > s.now_s:
            parts, table_bytes = self.policy.parts(s.computed[s.running_ids], s.head())
            self.account(t - s.now_s, parts, table_bytes)
            s.now_s = t


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
    cache = TierCache(setup.tiers, setup.steptime, setup.block_size, len(workload), state_pages=align)
    store = policy.pool.store  # type: ignore[attr-defined]  # policy paged (checked): MemoryPolicy names no pool
    full = tuple(i for i, g in enumerate(groups) if g.kind == "full")
    if groups:
        if any(g.block_tokens is not None for g in groups):
            raise ParameterError("host_cache/disk_cache with groups of mixed block sizes are not modelled yet",
                                 "host_cache", "disk_cache")
        anchored = np.array([i for i, g in enumerate(groups) if g.kind != "full"], dtype=np.int64)
        listen_to_evictions(store, cache.demote, anchored, group_classes(cache.classes, groups), cache.unresolved)
    else:
        listen_to_evictions(store, cache.demote)
    engine = TieredEngine(workload, policy, StepTimeExecutor(setup.steptime), setup.scheduler, cancel_at, cache,
                          keys, full, record_timeline=record_timeline, progress=progress)
    fast = FastForward(engine, setup.steptime) if setup.scheduler.fast_forward else None
    record = engine.run(fast)
    assert record is not None, "a run without `stop` always ends with its record"
    assert cache.demoted == store.counters["evictions"], (
        f"the tiers saw {cache.demoted} GPU evictions, the pool counted {store.counters['evictions']}")
    assert not engine.scheduler.parked and not engine.scheduler.admission.ready_s, "a load never landed"
    record.tiers = cache.finish()
    return record
