"""`kvcalc verify --model hybrid-tiny`: the hybrid model's scenarios run and judged, into the same VerifyRun as
suite.run_verify (so the same report and exit codes).

    scenario -> HybridExactPolicy (a HybridPool of groups full, sliding 8, state) -> Engine(scheduler,
      HybridExecutor) -> per request tokens + logits;  hybrid_reference_generate per request (alone, token by
      token, full K/V arrays with a window mask, the state in a plain tensor) -> verdict.compare
    pass only if the tokens pass, the content check found nothing, the pool's invariants held before every
    step and it is whole at the end, every hit is the one the construction implies, and every needed event > 0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ...core.errors import ParameterError
from ...core.sim.engine import Engine
from ...core.sim.plan import StepOutcome, StepPlan
from ...core.sim.spec_run import SpeculativeEngine
from ...core.sim.speculative import SimSpeculation
from ...core.sim.workload import from_token_ids
from .config import DTYPE_NAMES
from .contiguous import Generation
from .hybrid_executor import STATE_MODE, HybridExactPolicy, HybridExecutor, hybrid_pool_groups
from .hybrid_model import HYBRID_MODEL, HYBRID_TINY, HybridWeights, hybrid_reference_generate, init_hybrid_weights
from .hybrid_scenarios import (
    HYBRID_BLOCK_SIZE,
    HYBRID_EVENT_LABELS,
    HYBRID_INJECTIONS,
    HYBRID_SCENARIOS,
    HybridFault,
    HybridScenario,
    build_hybrid,
)
from .outcome import HybridModelInfo, ModelInfo, VerifyRun
from .references import Job, shared_references
from .result import EVENTS, ScenarioResult, settle
from .scenarios import sampling_of_row
from .scheduled import block_keys
from .suite import DEVICES, resolve_device
from .verdict import TOP_K, Decoding, compare


def _generate(weights: HybridWeights, jobs: Sequence[Job]) -> list[Generation]:
    """The hybrid reference of each job, alone, token by token (references.References decodes each prompt once)."""
    return [hybrid_reference_generate(weights, prompt, new, sampling) for prompt, new, sampling in jobs]


class _Checked:
    """The executor with the pool's invariants (every group) checked before every plan; the first failure kept."""

    def __init__(self, executor: HybridExecutor) -> None:
        self.executor = executor
        self.invariant_error: str | None = None

    def execute(self, plan: StepPlan) -> StepOutcome:
        if self.invariant_error is None:
            try:
                self.executor.pool.check_invariants()
            except AssertionError as exc:
                self.invariant_error = f"before step {plan.step}: {exc}"
        return self.executor.execute(plan)


def run_hybrid_scenario(scenario: HybridScenario, weights: HybridWeights, *, seed: int,
                        fault: HybridFault | None = None) -> ScenarioResult:
    started = time.perf_counter()
    reqs, B = scenario.requests, scenario.block_size
    workload = from_token_ids([list(p) for p in reqs.prompts], list(reqs.max_new_tokens), list(reqs.arrival_s),
                              list(reqs.num_samples), description=f"verify {scenario.name}")
    prompts = workload.prompt_token_ids
    assert prompts is not None, "from_token_ids keeps the token ids"
    keys = [block_keys(p, B) for p in prompts] if scenario.prefix_caching else None
    policy = HybridExactPolicy(scenario.num_blocks, B, hybrid_pool_groups(weights), scenario.state_mode,
                               len(workload), keys, scenario.scheduler.max_batched_tokens)
    if fault is not None:
        fault.install(policy)
    rows = [(i, j) for i, n in enumerate(reqs.num_samples) for j in range(n)]
    sampling = [sampling_of_row(reqs, row, seed) for row in range(len(workload))]
    lengths = [reqs.cancel_after.get(row, reqs.max_new_tokens[i]) for row, (i, _) in enumerate(rows)]
    references = shared_references(weights, _generate)
    generations = [references.get(reqs.prompts[i], n, sampling[row])
                   for row, ((i, _), n) in enumerate(zip(rows, lengths, strict=True))]
    drafter = None
    if scenario.spec_tokens:
        def drafter(rid: int, index: int, count: int) -> list[int]:
            """The reference's next tokens, one in three corrupted (+1): drafts of every acceptance length."""
            out = generations[rid].output_ids
            return [out[i] + (hash((rid, i)) % 3 == 0) if i < len(out) else 0 for i in range(index, index + count)]
    executor = HybridExecutor(weights, policy, prompts, sampling, fault=fault, drafter=drafter,
                              max_new_tokens=lengths)
    checked = _Checked(executor)
    cancel_at = np.zeros(len(workload), np.int64)
    for row, tokens in reqs.cancel_after.items():
        cancel_at[row] = tokens
    if scenario.spec_tokens:
        speculation = SimSpeculation(scenario.spec_tokens, 1.0)  # acceptance: the model decides
        engine: Engine = SpeculativeEngine(workload, policy, checked, scenario.scheduler, None, speculation=speculation)
    else:
        engine = Engine(workload, policy, checked, scenario.scheduler, cancel_at)
    error = None
    try:
        engine.run()  # ends with the policy's check that the pool is whole
    except Exception as exc:  # a planted fault may break the pool anywhere: the scenario then fails
        error = f"{type(exc).__name__}: {exc}"
    k = TOP_K if reqs.sampling.greedy else max(TOP_K, reqs.sampling.top_k or weights.config.base.vocab_size)
    refs = [Decoding(g.output_ids, g.logits, k) for g in generations]
    tests = []
    for row in range(len(workload)):
        req = executor.requests[row]
        logits = torch.stack(req.logits) if req.logits else torch.zeros(0, weights.config.base.vocab_size)
        tests.append(Decoding(tuple(req.output), logits, k))
    verdict = compare(refs, tests, exact=weights.dtype == "fp32", num_layers=weights.config.base.num_layers)
    result = ScenarioResult(
        scenario.name, len(workload), verdict.tokens_compared, verdict.mismatched_tokens, verdict.first_mismatch,
        verdict.max_abs_logit_diff, verdict.passed, _events(executor, policy), needs=list(scenario.needs),
        content_errors=len(executor.content_errors),
        first_content_error=executor.content_errors[0] if executor.content_errors else None,
        invariant_error=checked.invariant_error, error=error,
        hit_error=_hit_error(scenario, executor) if error is None else None, steps=executor.counts["steps"],
        logit_tolerance=verdict.logit_tolerance,
        outputs=[(tuple(prompts[row]), r.tokens, t.tokens) for row, (r, t) in enumerate(zip(refs, tests, strict=True))],
    )
    return settle(result, scenario.needs, fault, started)


def _events(executor: HybridExecutor, policy: HybridExactPolicy) -> dict[str, int]:
    """Every event of result.EVENTS, and the hybrid ones (hybrid_scenarios.HYBRID_EVENT_LABELS)."""
    counts = executor.counts
    events = {e: int(counts[e]) for e in EVENTS}
    events.update({"eos_finishes": int(counts["eos"]), "window_frees": policy.window_frees,
                   **{e: int(counts[e]) for e in HYBRID_EVENT_LABELS if e != "window_frees"}})
    return events


def _hit_error(scenario: HybridScenario, executor: HybridExecutor) -> str | None:
    """The first request whose prefix-cache hit differs from what the scenario's construction implies."""
    for row, tokens in scenario.expect_hits:
        got = executor.first_start.get(row)
        if got != tokens:
            return (f"request {row} hit {got} tokens; its construction implies {tokens} (every group's blocks of "
                    f"the common prefix, state mode {scenario.state_mode})")
    return None


def check_hybrid_options(scenarios: tuple[str, ...], inject: str | None, dtype: str, device: str = "cpu") -> None:
    """Bad input, named: a scenario or fault the hybrid model does not have, a device verify does not know."""
    if device not in DEVICES:  # else resolve_device takes any other name for cuda
        raise ParameterError(f"device {device!r} is not one of {', '.join(DEVICES)}", "device")
    unknown = [s for s in scenarios if s not in HYBRID_SCENARIOS]
    if unknown or not scenarios:
        raise ParameterError(f"scenario {', '.join(map(repr, unknown)) or '(none)'} is not a scenario of --model "
                             f"{HYBRID_MODEL}; use one or more of {', '.join(HYBRID_SCENARIOS)}", "scenario")
    if len(set(scenarios)) != len(scenarios):
        raise ParameterError("a scenario is given twice; name each scenario once", "scenario")
    if inject is not None and inject not in HYBRID_INJECTIONS:
        raise ParameterError(f"inject {inject!r} is not a fault of --model {HYBRID_MODEL}; use one of "
                             f"{', '.join(HYBRID_INJECTIONS)}", "inject")
    if dtype not in DTYPE_NAMES:
        raise ParameterError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_NAMES)}", "dtype")


def run_hybrid_verify(*, device: str = "cpu", dtype: str = "fp32", scenarios: tuple[str, ...] = HYBRID_SCENARIOS,
                      inject: str | None = None, seed: int = 0,
                      progress: Callable[[int], None] | None = None) -> VerifyRun:
    """Every hybrid scenario asked for -> a VerifyRun as suite.run_verify's, with `model.hybrid` (the layer kinds,
    window, state size, state mode and pool groups)."""
    check_hybrid_options(scenarios, inject, dtype, device)
    dev = resolve_device(device)
    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny ops: a second thread spins more than it works (suite.py)
    try:
        weights = init_hybrid_weights(HYBRID_TINY, seed=seed, dtype=dtype, device=dev)
        results = []
        for name in scenarios:
            fault = HybridFault(inject) if inject else None
            scenario = build_hybrid(name, HYBRID_TINY.base.vocab_size, seed)
            results.append(run_hybrid_scenario(scenario, weights, seed=seed, fault=fault))
            if progress is not None:
                progress(1)
    finally:
        torch.set_num_threads(threads)
    model = ModelInfo(HYBRID_TINY.base, seed, "seeded", HybridModelInfo(
        HYBRID_TINY.kinds, HYBRID_TINY.window, HYBRID_TINY.state_size, HYBRID_MODEL, STATE_MODE,
        tuple(g.name for g in hybrid_pool_groups(weights))))
    return VerifyRun(
        device=dev.type, device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", dtype=dtype,
        attention_backend="torch-reference", model=model, block_size=HYBRID_BLOCK_SIZE, inject=inject,
        scenarios=results, wall_s=time.perf_counter() - started)
