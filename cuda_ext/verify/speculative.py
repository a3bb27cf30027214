"""verify's `speculative` scenario: greedy speculative decoding through the scheduler, the pool's reserve /
commit and the paged forward, which must give plain greedy decoding's tokens exactly.

The scheduler (core/sim/spec_run.py) schedules a decoding request's last token plus K drafts and reserves
1 + 2K slots (K lookahead, as vLLM does for a draft model); this executor, per step:

    draft    a smaller model (same vocabulary, its own seed) proposes K tokens greedily from the request's
             tokens; it keeps its own KV in a contiguous cache per request, cut back to the accepted
             prefix after each verification (its positions past it are written again)
    verify   ONE paged forward of the 1 + K query tokens (the drafts join the request's tokens for the
             pass, so the plan's token check and the shadow content check see them), logits of every
             position; the target's greedy token at each position; the longest prefix of drafts equal to
             them is accepted, then the target's own next token (the bonus) — j + 1 tokens
    report   StepOutcome.num_accepted = j, so the scheduler commits 1 + j positions and the pool rolls the
             rest back; a request's end (its length, an end-of-sequence token) cuts j short

The scenario runs twice, under rollback policy keep (vLLM v1) and free (SGLang), with prefix caching on
and a pool small enough to preempt; both runs must match the contiguous reference token for token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from ...core.sim.plan import StepOutcome, StepPlan
from ...core.sim.spec_run import SpeculativeEngine, SpeculativePagedPolicy
from ...core.sim.speculative import SimSpeculation
from ...core.sim.workload import from_token_ids
from .config import ModelConfig
from .contiguous import ContiguousKVCache, allocate_contiguous_kv, contiguous_forward
from .executor import ModelExecutor
from .faults import Fault
from .runner import (
    TOP_K,
    ScenarioResult,
    _CheckedExecutor,
    _decoding,
    _events,
    _new_executor,
    _references,
    _WindowedEngine,
    block_keys,
)
from .sampling import GREEDY, sample_token
from .scenarios import Scenario, sampling_of_row
from .verdict import Comparison, Decoding, compare
from .weights import ModelWeights, init_weights

ROLLBACK_POLICIES = ("keep", "free")


def draft_config(target: ModelConfig) -> ModelConfig:
    """A quarter of the target's width, one layer, the same vocabulary and positions."""
    return ModelConfig(vocab_size=target.vocab_size, hidden_size=64, intermediate_size=128, num_layers=1,
                       num_q_heads=2, num_kv_heads=1, head_dim=32, max_position=target.max_position)


def draft_weights(target: ModelWeights, seed: int) -> ModelWeights:
    return init_weights(draft_config(target.config), seed=seed + 1, dtype=target.dtype, device=target.device)


class SpeculativeModelExecutor(ModelExecutor):
    """ModelExecutor for plans with drafts (see the module docstring); greedy decoding only. `limits[r]`:
    the most tokens request r produces (its output length or cancellation point)."""

    def __init__(self, *args, draft: ModelWeights, limits: Sequence[int], **kw) -> None:
        super().__init__(*args, **kw)
        assert all(r.sampling.greedy for r in self.requests.values()), "speculative verification is greedy here"
        self.draft, self.limits = draft, list(limits)
        self.draft_caches: dict[int, ContiguousKVCache] = {}

    def execute(self, plan: StepPlan) -> StepOutcome:
        drafts = plan.num_draft_tokens
        if drafts is None or not drafts.any():
            return super().execute(plan)
        assert not plan.events.forks, "parallel samples are not speculated"
        proposals: dict[int, list[int]] = {}
        token_ids = list(plan.token_ids)
        for i, (rid, d) in enumerate(zip(plan.request_ids.tolist(), drafts.tolist(), strict=True)):
            if d:
                req = self.requests[rid]
                proposals[rid] = self._propose(rid, d)
                for token in proposals[rid]:  # in the request's tokens for the pass only (taken out below)
                    req.output.append(token)
                    req.ident.append(hash((req.ident[-1], token)))
                start = int(plan.num_computed_tokens[i])
                token_ids[i] = tuple(req.tokens[start : start + int(plan.num_new_tokens[i])])
        logits = self.forward(replace(plan, token_ids=tuple(token_ids)), all_logits=True)  # [N, vocab]
        ends = np.cumsum(plan.num_new_tokens).tolist()
        tokens: dict[int, int | tuple[int, ...]] = {}
        accepted: dict[int, int] = {}
        finished = set()
        for i, rid in enumerate(plan.request_ids.tolist()):
            rows = logits[ends[i] - int(plan.num_new_tokens[i]) : ends[i]]
            if rid in proposals:
                emitted = self._verify(rid, proposals[rid], rows)
                tokens[rid], accepted[rid] = tuple(emitted), len(emitted) - 1
            elif plan.samples[i]:
                req = self.requests[rid]
                emitted = [sample_token(rows[-1], req.sampling, len(req.tokens))]
                req.add(emitted[0], rows[-1])
                tokens[rid] = emitted[0]
            else:
                continue
            if emitted[-1] == self.eos_token_id:
                finished.add(rid)
        self.counts["eos"] += len(finished)
        self.counts["drafts"] += int(drafts.sum())
        self.counts["accepted_drafts"] += sum(accepted.values())
        return StepOutcome(self.step_s, tokens, frozenset(finished), num_accepted=accepted)

    def _propose(self, rid: int, num_drafts: int) -> list[int]:
        """`num_drafts` greedy tokens of the draft model after the request's tokens."""
        req = self.requests[rid]
        cache = self.draft_caches.get(rid)
        if cache is None:
            length = len(req.prompt) + self.limits[rid] + num_drafts + 1
            cache = self.draft_caches[rid] = allocate_contiguous_kv(self.draft.config, length, self.draft.dtype,
                                                                    self.draft.device)
        known = req.tokens
        row = contiguous_forward(self.draft, cache, known[cache.num_tokens :])[-1]
        proposal = [sample_token(row, GREEDY, len(known))]
        while len(proposal) < num_drafts:
            row = contiguous_forward(self.draft, cache, proposal[-1:])[-1]
            proposal.append(sample_token(row, GREEDY, len(known) + len(proposal)))
        return proposal

    def _verify(self, rid: int, proposal: list[int], rows: torch.Tensor) -> list[int]:
        """The drafts out of the request again; the target's greedy tokens from `rows` [1 + K, vocab] (row t
        predicts the token after draft t), while they agree with the drafts, plus the first that does not
        (or the bonus after all K) — cut at the request's end. Each is added with its logits row."""
        req = self.requests[rid]
        del req.output[-len(proposal) :], req.ident[-len(proposal) :]
        before = len(req.tokens)
        emitted: list[int] = []
        for t in range(len(proposal) + 1):
            token = sample_token(rows[t], req.sampling, len(req.tokens))
            req.add(token, rows[t])
            emitted.append(token)
            if token == self.eos_token_id or len(req.output) >= self.limits[rid]:
                break
            if t == len(proposal) or proposal[t] != token:
                break
        cache = self.draft_caches[rid]
        cache.num_tokens = min(cache.num_tokens, before + len(emitted) - 1)  # its positions past them: rejected
        return emitted


class _WindowedSpeculativeEngine(_WindowedEngine, SpeculativeEngine):
    """The speculative engine with runner's step window around each step."""


@dataclass
class SpeculativeRun:
    """One run of the scenario under one rollback policy, and what judging it needs."""

    verdict: Comparison
    policy: SpeculativePagedPolicy
    executor: SpeculativeModelExecutor
    engine: _WindowedSpeculativeEngine
    checked: _CheckedExecutor
    error: str | None


def _one_run(scenario: Scenario, weights: ModelWeights, draft: ModelWeights, seed: int, attention_backend: str,
             rollback_policy: str, fault: Fault | None) -> SpeculativeRun:
    reqs, B, K = scenario.requests, scenario.block_size, scenario.spec_tokens
    workload = from_token_ids([list(p) for p in reqs.prompts], list(reqs.max_new_tokens), list(reqs.arrival_s),
                              list(reqs.num_samples), description=f"verify {scenario.name} ({rollback_policy})")
    prompts = workload.prompt_token_ids
    keys = [block_keys(p, B) for p in prompts] if scenario.prefix_caching else None
    speculation = SimSpeculation(K, 1.0, rollback_policy=rollback_policy)  # acceptance: the model decides
    policy = SpeculativePagedPolicy(scenario.num_blocks, B, len(workload), keys, rollback_policy,
                                    speculation.speculation.extra_slots, scenario.scheduler.max_model_len)
    if fault is not None:
        fault.install(policy.pool)
    generations, lengths, eos = _references(weights, reqs, seed)
    limits = [reqs.cancel_after.get(row, reqs.max_new_tokens[row]) for row in range(len(workload))]
    executor = _new_executor(weights, scenario, attention_backend, prompts,
                             [sampling_of_row(reqs, row, seed) for row in range(len(workload))], eos,
                             executor_class=SpeculativeModelExecutor, draft=draft, limits=limits)
    checked = _CheckedExecutor(executor, policy.pool)
    engine = _WindowedSpeculativeEngine(workload, policy, checked, scenario.scheduler, None, checked=checked,
                                        speculation=speculation)
    error = None
    try:
        engine.run()
    except Exception as exc:  # as in runner: a fault may break the pool anywhere; the scenario then fails
        error = f"{rollback_policy}: {type(exc).__name__}: {exc}"
    refs = [Decoding(g.output_ids[:n], g.logits[:n], TOP_K) for g, n in zip(generations, lengths, strict=True)]
    tests = [_decoding(executor, row, weights, TOP_K) for row in range(len(workload))]
    return SpeculativeRun(compare(refs, tests, exact=weights.dtype == "fp32", num_layers=weights.config.num_layers),
                          policy, executor, engine, checked,
                          error)


def run_speculative_scenario(scenario: Scenario, weights: ModelWeights, *, seed: int, attention_backend: str,
                             fault: Fault | None = None) -> ScenarioResult:
    """Both rollback policies' runs, judged together: every token of both must match."""
    draft = draft_weights(weights, seed)
    verdicts, events, errors, content, invariant, steps = [], {}, [], [], None, 0
    for rollback_policy in ROLLBACK_POLICIES:
        run = _one_run(scenario, weights, draft, seed, attention_backend, rollback_policy, fault)
        verdicts.append(run.verdict)
        run_events = _events(run.policy.pool, run.executor, deferred_free_blocks=run.engine.deferred_free_blocks)
        for key, value in run_events.items():
            events[key] = events.get(key, 0) + value
        errors += [run.error] if run.error else []
        content += run.executor.content_errors
        if invariant is None and run.checked.invariant_error:
            invariant = f"{rollback_policy}: {run.checked.invariant_error}"
        steps += run.executor.counts["steps"]
    mismatch = next((v.first_mismatch for v in verdicts if v.first_mismatch), None)
    return ScenarioResult(
        scenario.name, sum(len(scenario.requests.prompts) for _ in ROLLBACK_POLICIES),
        sum(v.tokens_compared for v in verdicts), sum(v.mismatched_tokens for v in verdicts), mismatch,
        max(v.max_abs_logit_diff for v in verdicts), all(v.passed for v in verdicts), events,
        content_errors=len(content), first_content_error=content[0] if content else None,
        invariant_error=invariant, error="; ".join(errors) or None, steps=steps,
        logit_tolerance=None if verdicts[0].logit_tolerance is None else min(v.logit_tolerance for v in verdicts),
    )
