"""The one path that runs a scenario's requests through the scheduler, the pool and the paged model, and
compares them with the contiguous reference: plain scenarios (runner.py) and each rollback policy's run of
the speculative scenario (speculative.py) go through `run_requests`.

    run_requests(scenario, weights, seed, backend, fault, make_policy, ...) -> ScheduledRun
        workload (token ids, parallel samples) -> the policy over a BlockPool (a fault installed, maybe)
        -> engine(scheduler, CheckedExecutor(ModelExecutor)) -> per request: tokens + logits
        references.references per request -> verdict.compare

A step's finishes and cancellations are released inside the pool's step window (`BlockPool.step()`): their
blocks are pending while the step's results are read out and come back when it ends, so the next plan can
hand them out at once. An exception in a run (a fault can make the pool assert) is kept in `error`, not
raised; only CudaUnavailableError (the kernel cannot run here) goes up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...core.errors import CudaUnavailableError
from ...core.pool.block_pool import BlockPool
from ...core.sim.engine import Engine
from ...core.sim.plan import StepOutcome, StepPlan
from ...core.sim.workload import from_token_ids
from .executor import ModelExecutor
from .faults import Fault
from .paged import allocate_paged_kv
from .references import references
from .scenarios import Requests, Scenario, sampling_of_row
from .verdict import TOP_K, Comparison, Decoding, compare
from .weights import ModelWeights


class CheckedExecutor:
    """The model executor, with the pool's invariants checked before every plan (the first failure kept),
    and the pool's step window opened as the plan starts to run (`close_window` closes it).

    `late`: an asynchronous executor — a step's K/V is read again one step later, after the next plan's copies,
    swaps and writes (as a GPU runs a step's attention after the host planned the next one), so the step's
    window may only close then: it stays open through the releases of the step and the next plan.
    """

    def __init__(self, executor: ModelExecutor, pool: BlockPool, late: bool = False) -> None:
        self.executor, self.pool, self.late = executor, pool, late
        self.invariant_error: str | None = None
        self.in_window = False
        self.deferred_free_blocks = 0
        self._step = -1

    def execute(self, plan: StepPlan) -> StepOutcome:
        if self.invariant_error is None:
            try:
                self.pool.check_invariants()
            except AssertionError as exc:
                self.invariant_error = f"before step {plan.step}: {exc}"
        if not self.late:
            self.pool.begin_step()
            self.in_window = True
            return self.executor.execute(plan)
        outcome = self.executor.execute(plan)
        self.close_window()  # the previous step's reads happen only now, after this step's writes
        self.pool.begin_step()
        self.in_window, self._step = True, plan.step
        self.executor.remember_reads(plan)
        return outcome

    def close_window(self) -> None:
        if self.in_window:
            if self.late:
                self.executor.late_read(self._step)
            self.deferred_free_blocks += self.pool.usage().pending_free_blocks
            self.in_window = False
            self.pool.end_step()


class WindowedEngine(Engine):
    """The engine with each step's releases inside the pool's step window: the window opens when the
    executor starts the plan and closes after the step's finishes and cancellations were released (with a
    late executor: when the next step has run, or nothing is left to run)."""

    def __init__(self, *args: Any, checked: CheckedExecutor, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.checked = checked

    def step(self) -> None:
        try:
            super().step()
        finally:
            s = self.scheduler
            if not self.checked.late or not (s.running or s.waiting):
                self.checked.close_window()


def block_keys(prompt: tuple[int, ...], block_size: int) -> list[tuple[int, ...]]:
    """The prefix-cache content key of each full block of a prompt: its token ids."""
    return [prompt[i : i + block_size] for i in range(0, len(prompt) - block_size + 1, block_size)]


def new_executor(weights: ModelWeights, scenario: Scenario, attention_backend: str, prompts, sampling,
                 eos: int | None = None, executor_class: type[ModelExecutor] = ModelExecutor, **kw: Any,
                 ) -> ModelExecutor:
    kv = allocate_paged_kv(weights.config, scenario.num_blocks, scenario.block_size, weights.dtype, weights.device)
    # the blocks start as finite garbage, not zeros: a read of a slot nobody wrote changes the logits
    gen = torch.Generator().manual_seed(1234)
    for cache in (*kv.k, *kv.v):
        cache.copy_(torch.randn(cache.shape, generator=gen) * 30)
    return executor_class(weights, kv, prompts, sampling, attention_backend=attention_backend, eos_token_id=eos,
                          **kw)


def pool_events(pool: BlockPool, executor: ModelExecutor, **extra: int) -> dict[str, int]:
    """Every event (result.EVENTS) the pool and the executor counted; `extra` sets the others."""
    stats, counts = pool.stats(), executor.counts
    events = {
        "prefix_hit_tokens": stats.hit_tokens, "cow_copies": stats.cow_copies, "forks": stats.forks,
        "preemptions": counts["preemptions"], "swaps": counts["swaps"], "cancellations": stats.released_cancelled,
        "evictions": stats.evictions, "prefill_chunks": counts["prefill_chunks"], "mixed_steps": counts["mixed_steps"],
        "eos_finishes": counts["eos"], "beams_dropped": 0,
        "cancelled_blocks_reused": counts["cancelled_blocks_reused"], "deferred_free_blocks": 0,
        "rollbacks": pool.speculative_stats().rolled_back_slots, "mid_block_chunks": counts["mid_block_chunks"],
        "capped_hits": counts["capped_hits"], "cow_tight_fits": 0, "late_reads": counts["late_reads"],
    }
    events.update(extra)
    return events


def decoding(executor: ModelExecutor, rid: int, weights: ModelWeights, top_k: int) -> Decoding:
    """What the paged path decoded for request `rid`, for the comparison."""
    req = executor.requests[rid]
    return Decoding(tuple(req.output), req.logits or torch.zeros(0, weights.config.vocab_size), top_k)


@dataclass
class ScheduledRun:
    """One pass of a scenario's requests through the engine, and what judging it needs."""

    verdict: Comparison
    events: dict[str, int]
    policy: Any  # the paged policy the run scheduled with (make_policy's)
    engine: Engine
    executor: ModelExecutor
    checked: CheckedExecutor
    error: str | None  # the run stopped with this exception
    outputs: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]  # (prompt, reference, paged) per row


# (number of requests, block keys per request or None) -> the paged policy the run schedules with
PolicyFactory = Callable[[int, list | None], Any]


def run_requests(scenario: Scenario, weights: ModelWeights, seed: int, attention_backend: str, fault: Fault | None,
                 make_policy: PolicyFactory, *, engine_class: Callable[..., Engine] = WindowedEngine, label: str = "",
                 engine_kw: dict[str, Any] | None = None, executor_class: type[ModelExecutor] = ModelExecutor,
                 executor_kw: dict[str, Any] | None = None) -> ScheduledRun:
    """The scenario's requests through `engine_class` over `make_policy`'s pool -> the run, judged against the
    references (`label` names the run in its workload and its error)."""
    reqs, B = scheduled_requests(scenario), scenario.block_size
    workload = from_token_ids([list(p) for p in reqs.prompts], list(reqs.max_new_tokens), list(reqs.arrival_s),
                              list(reqs.num_samples), description=f"verify {scenario.name}{label and f' ({label})'}")
    prompts = workload.prompt_token_ids
    assert prompts is not None, "from_token_ids keeps the token ids"
    policy = make_policy(len(workload), [block_keys(p, B) for p in prompts] if scenario.prefix_caching else None)
    if fault is not None:
        fault.install(policy.pool)
    generations, lengths, eos = references(weights, reqs, seed)
    sampling = [sampling_of_row(reqs, row, seed) for row in range(len(workload))]
    executor = new_executor(weights, scenario, attention_backend, prompts, sampling, eos, executor_class,
                            **(executor_kw or {}))
    checked = CheckedExecutor(executor, policy.pool, late=scenario.async_reads)
    cancel_at = np.zeros(len(workload), np.int64)
    for row, tokens in reqs.cancel_after.items():
        cancel_at[row] = tokens
    engine = engine_class(workload, policy, checked, scenario.scheduler, cancel_at, checked=checked,
                          **(engine_kw or {}))
    error = None
    try:
        engine.run()  # ends with the policy's check that the pool is whole
    except CudaUnavailableError:
        raise
    except Exception as exc:  # a planted fault may break the pool anywhere: the scenario then fails
        error = f"{label + ': ' if label else ''}{type(exc).__name__}: {exc}"
    k = TOP_K if reqs.sampling.greedy else max(TOP_K, reqs.sampling.top_k or weights.config.vocab_size)
    refs = [Decoding(g.output_ids[:n], g.logits[:n], k) for g, n in zip(generations, lengths, strict=True)]
    tests = [decoding(executor, row, weights, k) for row in range(len(workload))]
    verdict = compare(refs, tests, exact=weights.dtype == "fp32", num_layers=weights.config.num_layers)
    events = pool_events(policy.pool, executor, deferred_free_blocks=checked.deferred_free_blocks)
    return ScheduledRun(verdict, events, policy, engine, executor, checked, error,
                        [(tuple(prompts[row]), r.tokens, t.tokens) for row, (r, t) in enumerate(zip(refs, tests,
                                                                                                    strict=True))])


def scheduled_requests(scenario: Scenario) -> Requests:
    """The requests the scheduler runs: every scenario has them but beam search."""
    if scenario.requests is None:
        raise ValueError(f"scenario {scenario.name} is a beam search: the scheduler runs no requests")
    return scenario.requests
