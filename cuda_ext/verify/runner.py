"""One scenario, run and judged: the requests through the scheduler, the pool and the paged model, each
request alone through the contiguous reference, the comparison, the pool's invariants and the events.

    workload (token ids, parallel samples) -> ExactPagedPolicy over a BlockPool (a fault installed, maybe)
      -> Engine(scheduler, ModelExecutor) -> per request: tokens + logits
    reference_generate per request (its own sampling seed, its cancellation point, its end of sequence)
      -> verdict.compare -> pass only if the tokens pass, the content check found nothing, the pool's
         invariants held before every step and it is whole at the end, and every needed event is > 0

A step's finishes and cancellations are released inside the pool's step window (`BlockPool.step()`): their
blocks are pending while the step's results are read out and come back when it ends, so the next plan can
hand them out at once. An exception in a run (a fault can make the pool assert) fails the scenario and is
reported, not raised; only CudaUnavailableError (the kernel cannot run here) goes up.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from ...core.errors import CudaUnavailableError
from ...core.pool.block_pool import BlockPool
from ...core.sim.engine import Engine
from ...core.sim.plan import StepOutcome, StepPlan
from ...core.sim.workload import from_token_ids
from .beam import paged_beam_search, reference_beam_search
from .contiguous import Generation, reference_generate
from .dry_run import ObservedPolicy
from .executor import ModelExecutor
from .faults import Fault
from .paged import allocate_paged_kv
from .scenarios import Requests, Scenario, sampling_of_row
from .verdict import TOP_K, Decoding, compare
from .weights import ModelWeights

EVENTS = ("prefix_hit_tokens", "cow_copies", "forks", "preemptions", "swaps", "cancellations", "evictions",
          "prefill_chunks", "mixed_steps", "eos_finishes", "beams_dropped", "cancelled_blocks_reused",
          "deferred_free_blocks", "rollbacks", "mid_block_chunks", "capped_hits", "cow_tight_fits", "late_reads")


@dataclass
class ScenarioResult:
    name: str
    requests: int
    tokens_compared: int
    mismatched_tokens: int
    first_mismatch: dict[str, Any] | None
    max_abs_logit_diff: float
    passed: bool
    events: dict[str, int]
    needs: list[str] = field(default_factory=list)  # the events the scenario's name needs non-zero
    missing_events: list[str] = field(default_factory=list)  # needed, but zero
    content_errors: int = 0
    first_content_error: str | None = None
    invariant_error: str | None = None
    hit_error: str | None = None  # a prefix-cache hit other than the scenario's construction implies
    error: str | None = None  # the run stopped with an exception
    fault_fired: int | None = None
    status: str = "passed"  # passed | failed (a check failed) | not exercised (checks clean, a needed event 0)
    fault: str | None = None  # with a fault planted: caught | undetected | not exercised (it never acted here)
    steps: int = 0
    wall_s: float = 0.0
    logit_tolerance: float | None = None  # fp32: the bound on max_abs_logit_diff (verdict.fp32_logit_tolerance)
    # per request: (prompt, reference tokens, paged tokens), for a report that shows text; not in to_dict
    outputs: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        del doc["outputs"]
        return doc


class _CheckedExecutor:
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


class _WindowedEngine(Engine):
    """The engine with each step's releases inside the pool's step window: the window opens when the
    executor starts the plan and closes after the step's finishes and cancellations were released (with a
    late executor: when the next step has run, or nothing is left to run)."""

    def __init__(self, *args: Any, checked: _CheckedExecutor, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.checked = checked

    @property
    def deferred_free_blocks(self) -> int:
        return self.checked.deferred_free_blocks

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


def _truncate(tokens: tuple[int, ...], eos: int | None) -> int:
    """How many tokens a decoding that stops at `eos` keeps (the end-of-sequence token included)."""
    return tokens.index(eos) + 1 if eos is not None and eos in tokens else len(tokens)


_MEMO: list = [None, {}]  # [the weights, {(prompt, sampling): Generation}]: one model's references at a time


def memo_reference(weights: ModelWeights, prompt: tuple[int, ...], new: int, sampling) -> Generation:
    """reference_generate, remembered per (prompt, sampling) for these weights: a decoding of n tokens is the
    first n of a longer one (each token depends on its prefix alone; a seeded draw on (seed, position)), so
    scenarios that send the same prompt share one decoding, cut to each one's length."""
    if _MEMO[0] is not weights:
        _MEMO[:] = [weights, {}]
    memo = _MEMO[1]
    generation = memo.get((prompt, sampling))
    if generation is None or len(generation.output_ids) < new:
        generation = memo[(prompt, sampling)] = reference_generate(weights, prompt, new, sampling)
    return Generation(generation.prompt_ids, generation.output_ids[:new], generation.logits[:new])


def _references(weights: ModelWeights, requests: Requests, seed: int) -> tuple[list, list[int], int | None]:
    """(reference Generation per row, its expected length, the end-of-sequence token or None)."""
    rows = [(i, j) for i, n in enumerate(requests.num_samples) for j in range(n)]
    generations = []
    for row, (i, _) in enumerate(rows):
        new = requests.cancel_after.get(row, requests.max_new_tokens[i])
        generations.append(memo_reference(weights, requests.prompts[i], new, sampling_of_row(requests, row, seed)))
    eos = requests.eos_token
    if requests.eos_from_reference:  # a token the longest decoding produces half-way: some requests stop at it
        longest = max(generations, key=lambda g: len(g.output_ids))
        eos = longest.output_ids[len(longest.output_ids) // 2]
    return generations, [_truncate(g.output_ids, eos) for g in generations], eos


def _events(pool: BlockPool, executor: ModelExecutor, **extra: int) -> dict[str, int]:
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


def _decoding(executor: ModelExecutor, rid: int, weights: ModelWeights, top_k: int) -> Decoding:
    req = executor.requests[rid]
    return Decoding(tuple(req.output), req.logits or torch.zeros(0, weights.config.vocab_size), top_k)


def fault_verdict(fired: int, status: str) -> str:
    """A planted fault in one scenario: caught (it acted and a check failed), undetected (it acted and every
    check passed: a hole in the checks), or not exercised (it never acted here). A scenario that only missed
    its events did not catch anything."""
    if not fired:
        return "not exercised"
    return "caught" if status == "failed" else "undetected"


def run_scenario(scenario: Scenario, weights: ModelWeights, *, seed: int, attention_backend: str,
                 fault: Fault | None = None) -> ScenarioResult:
    started = time.perf_counter()
    if scenario.requests is None:
        result = _run_beams(scenario, weights, attention_backend, fault)
    elif scenario.spec_tokens:
        from .speculative import run_speculative_scenario

        result = run_speculative_scenario(scenario, weights, seed=seed, attention_backend=attention_backend,
                                          fault=fault)
    else:
        result = _run_scheduled(scenario, weights, seed, attention_backend, fault)
    return settle(result, scenario.needs, fault, started)


def settle(result: ScenarioResult, needs: tuple[str, ...] | list[str], fault: Fault | None,
           started: float) -> ScenarioResult:
    """A run's status (failed / not exercised / passed), its fault's verdict and its wall time: one rule for
    every model's scenarios (`result` is completed in place and returned)."""
    result.needs = list(needs)
    result.missing_events = [e for e in needs if not result.events.get(e)]
    checks_failed = (not result.passed or result.content_errors or result.invariant_error or result.error
                     or result.hit_error)
    result.status = "failed" if checks_failed else "not exercised" if result.missing_events else "passed"
    result.passed = result.status == "passed"
    if fault is not None:
        result.fault_fired = fault.fired
        result.fault = fault_verdict(fault.fired, result.status)
    result.wall_s = time.perf_counter() - started
    return result


def _new_executor(weights: ModelWeights, scenario: Scenario, attention_backend: str, prompts, sampling,
                  eos: int | None = None, executor_class: type[ModelExecutor] = ModelExecutor, **kw: Any,
                  ) -> ModelExecutor:
    kv = allocate_paged_kv(weights.config, scenario.num_blocks, scenario.block_size, weights.dtype, weights.device)
    # the blocks start as finite garbage, not zeros: a read of a slot nobody wrote changes the logits
    gen = torch.Generator().manual_seed(1234)
    for cache in (*kv.k, *kv.v):
        cache.copy_(torch.randn(cache.shape, generator=gen) * 30)
    return executor_class(weights, kv, prompts, sampling, attention_backend=attention_backend, eos_token_id=eos,
                          **kw)


def _run_scheduled(scenario: Scenario, weights: ModelWeights, seed: int, attention_backend: str,
                   fault: Fault | None) -> ScenarioResult:
    reqs, B = scenario.requests, scenario.block_size
    workload = from_token_ids([list(p) for p in reqs.prompts], list(reqs.max_new_tokens), list(reqs.arrival_s),
                              list(reqs.num_samples), description=f"verify {scenario.name}")
    prompts = workload.prompt_token_ids
    keys = [block_keys(p, B) for p in prompts] if scenario.prefix_caching else None
    policy = ObservedPolicy(scenario.num_blocks, B, len(workload), keys)
    if fault is not None:
        fault.install(policy.pool)
    generations, lengths, eos = _references(weights, reqs, seed)
    sampling = [sampling_of_row(reqs, row, seed) for row in range(len(workload))]
    executor = _new_executor(weights, scenario, attention_backend, prompts, sampling, eos)
    checked = _CheckedExecutor(executor, policy.pool, late=scenario.async_reads)
    cancel_at = np.zeros(len(workload), np.int64)
    for row, tokens in reqs.cancel_after.items():
        cancel_at[row] = tokens
    engine = _WindowedEngine(workload, policy, checked, scenario.scheduler, cancel_at, checked=checked)
    error = None
    try:
        engine.run()  # ends with the policy's check that the pool is whole
    except CudaUnavailableError:
        raise
    except Exception as exc:  # a planted fault may break the pool anywhere: the scenario then fails
        error = f"{type(exc).__name__}: {exc}"
    k = TOP_K if reqs.sampling.greedy else max(TOP_K, reqs.sampling.top_k or weights.config.vocab_size)
    refs = [Decoding(g.output_ids[:n], g.logits[:n], k) for g, n in zip(generations, lengths, strict=True)]
    tests = [_decoding(executor, row, weights, k) for row in range(len(workload))]
    verdict = compare(refs, tests, exact=weights.dtype == "fp32", num_layers=weights.config.num_layers)
    return ScenarioResult(
        scenario.name, len(workload), verdict.tokens_compared, verdict.mismatched_tokens, verdict.first_mismatch,
        verdict.max_abs_logit_diff, verdict.passed,
        _events(policy.pool, executor, deferred_free_blocks=engine.deferred_free_blocks,
                cow_tight_fits=policy.cow_tight_fits),
        content_errors=len(executor.content_errors),
        first_content_error=executor.content_errors[0] if executor.content_errors else None,
        invariant_error=checked.invariant_error, error=error, steps=executor.counts["steps"],
        hit_error=_hit_error(scenario, executor) if error is None else None,
        logit_tolerance=verdict.logit_tolerance,
        outputs=[(tuple(prompts[row]), r.tokens, t.tokens) for row, (r, t) in enumerate(zip(refs, tests, strict=True))],
    )


def _hit_error(scenario: Scenario, executor: ModelExecutor) -> str | None:
    """The first request whose prefix-cache hit differs from what the scenario's construction implies."""
    for row, tokens in scenario.expect_hits:
        got = executor.first_start.get(row)
        if got != tokens:
            return f"request {row} hit {got} tokens; its construction implies {tokens} (an LRU cache of whole blocks)"
    return None


def _run_beams(scenario: Scenario, weights: ModelWeights, attention_backend: str,
               fault: Fault | None) -> ScenarioResult:
    pool = BlockPool(scenario.num_blocks, scenario.block_size, enable_prefix_caching=False)
    if fault is not None:
        fault.install(pool)
    executor = _new_executor(weights, scenario, attention_backend, [], [])
    prompts, width, num_tokens = scenario.beam_prompts, scenario.beam_width, scenario.beam_tokens
    refs = [reference_beam_search(weights, p, width, num_tokens) for p in prompts]
    error = invariant_error = None
    results, dropped = [], 0
    try:
        results, beam_events = paged_beam_search(executor, pool, prompts, width, num_tokens)
        dropped = beam_events.dropped
    except CudaUnavailableError:
        raise
    except Exception as exc:  # as in _run_scheduled
        error = f"{type(exc).__name__}: {exc}"
    if error is None:
        try:
            pool.check_invariants()
            assert not pool.seqs and pool.num_used == 0, "blocks still in use after every beam ended"
        except AssertionError as exc:
            invariant_error = f"after the search: {exc}"
    ref_beams = [Decoding(t, lg) for r in refs for t, lg in zip(r.tokens, r.logits, strict=True)]
    test_beams = [Decoding(t, lg) for r in results for t, lg in zip(r.tokens, r.logits, strict=True)]
    test_beams += [Decoding((), torch.zeros(0, weights.config.vocab_size))] * (len(ref_beams) - len(test_beams))
    verdict = compare(ref_beams, test_beams, exact=weights.dtype == "fp32", num_layers=weights.config.num_layers)
    return ScenarioResult(
        scenario.name, len(prompts), verdict.tokens_compared, verdict.mismatched_tokens, verdict.first_mismatch,
        verdict.max_abs_logit_diff, verdict.passed, _events(pool, executor, beams_dropped=dropped),
        content_errors=len(executor.content_errors),
        first_content_error=executor.content_errors[0] if executor.content_errors else None,
        invariant_error=invariant_error, error=error, steps=executor.counts["steps"],
        logit_tolerance=verdict.logit_tolerance,
    )
