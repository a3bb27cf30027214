"""One scenario, run and judged: the requests through the scheduler, the pool and the paged model
(scheduled.run_requests; the speculative scenario through speculative.py, beam search through beam.py), each
request alone through the contiguous reference (references.py), the comparison, the pool's invariants and the
events.

    run_scenario(scenario, weights, seed=, attention_backend=, fault=) -> ScenarioResult
    pass only if the tokens pass, the content check found nothing, the pool's invariants held before every
    step and it is whole at the end, and every needed event is > 0 (result.settle)
"""

from __future__ import annotations

import time

import torch

from ...core.errors import CudaUnavailableError
from ...core.pool.block_pool import BlockPool
from .beam import BeamResult, paged_beam_search, reference_beam_search
from .dry_run import ObservedPolicy
from .executor import ModelExecutor
from .faults import Fault
from .result import ScenarioResult, settle
from .scenarios import Scenario
from .scheduled import new_executor, pool_events, run_requests
from .speculative import run_speculative_scenario
from .verdict import Decoding, compare
from .weights import ModelWeights


def run_scenario(scenario: Scenario, weights: ModelWeights, *, seed: int, attention_backend: str,
                 fault: Fault | None = None) -> ScenarioResult:
    started = time.perf_counter()
    if scenario.requests is None:
        result = _run_beams(scenario, weights, attention_backend, fault)
    elif scenario.spec_tokens:
        result = run_speculative_scenario(scenario, weights, seed=seed, attention_backend=attention_backend,
                                          fault=fault)
    else:
        result = _run_scheduled(scenario, weights, seed, attention_backend, fault)
    return settle(result, scenario.needs, fault, started)


def _run_scheduled(scenario: Scenario, weights: ModelWeights, seed: int, attention_backend: str,
                   fault: Fault | None) -> ScenarioResult:
    def make_policy(num_requests: int, keys: list | None) -> ObservedPolicy:
        return ObservedPolicy(scenario.num_blocks, scenario.block_size, num_requests, keys)

    run = run_requests(scenario, weights, seed, attention_backend, fault, make_policy)
    verdict, executor = run.verdict, run.executor
    run.events["cow_tight_fits"] = run.policy.cow_tight_fits
    return ScenarioResult(
        scenario.name, len(run.outputs), verdict.tokens_compared, verdict.mismatched_tokens, verdict.first_mismatch,
        verdict.max_abs_logit_diff, verdict.passed, run.events,
        content_errors=len(executor.content_errors),
        first_content_error=executor.content_errors[0] if executor.content_errors else None,
        invariant_error=run.checked.invariant_error, error=run.error, steps=executor.counts["steps"],
        hit_error=_hit_error(scenario, executor) if run.error is None else None,
        logit_tolerance=verdict.logit_tolerance, outputs=run.outputs,
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
    executor = new_executor(weights, scenario, attention_backend, [], [])
    prompts, width, num_tokens = scenario.beam_prompts, scenario.beam_width, scenario.beam_tokens
    refs = [reference_beam_search(weights, p, width, num_tokens) for p in prompts]
    error = invariant_error = None
    results: list[BeamResult] = []
    dropped = 0
    try:
        results, beam_events = paged_beam_search(executor, pool, prompts, width, num_tokens)
        dropped = beam_events.dropped
    except CudaUnavailableError:
        raise
    except Exception as exc:  # as in scheduled.run_requests
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
        verdict.max_abs_logit_diff, verdict.passed, pool_events(pool, executor, beams_dropped=dropped),
        content_errors=len(executor.content_errors),
        first_content_error=executor.content_errors[0] if executor.content_errors else None,
        invariant_error=invariant_error, error=error, steps=executor.counts["steps"],
        logit_tolerance=verdict.logit_tolerance,
    )
