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
from dataclasses import replace

import numpy as np
import torch

from ...core.sim.plan import StepOutcome, StepPlan
from ...core.sim.spec_run import SpeculativeEngine, SpeculativePagedPolicy
from ...core.sim.speculative import SimSpeculation
from .config import ModelConfig
from .contiguous import ContiguousKVCache, allocate_contiguous_kv, contiguous_forward
from .executor import ModelExecutor
from .faults import Fault
from .result import ScenarioResult
from .sampling import GREEDY, sample_token
from .scenarios import Scenario
from .scheduled import ScheduledRun, WindowedEngine, run_requests, scheduled_requests
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
        assert plan.token_ids is not None, "a model runner needs plans with token ids"
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


class _WindowedSpeculativeEngine(WindowedEngine, SpeculativeEngine):
    """The speculative engine with the step window of scheduled.WindowedEngine around each step."""


def _one_run(scenario: Scenario, weights: ModelWeights, draft: ModelWeights, seed: int, attention_backend: str,
             rollback_policy: str, fault: Fault | None) -> ScheduledRun:
    """The scenario through the one run path (scheduled.run_requests) under one rollback policy."""
    reqs = scheduled_requests(scenario)
    speculation = SimSpeculation(scenario.spec_tokens, 1.0, rollback_policy=rollback_policy)  # the model accepts

    def make_policy(num_requests: int, keys: list | None) -> SpeculativePagedPolicy:
        return SpeculativePagedPolicy(scenario.num_blocks, scenario.block_size, num_requests, keys, rollback_policy,
                                      speculation.speculation.extra_slots, scenario.scheduler.max_model_len)

    rows = [i for i, n in enumerate(reqs.num_samples) for _ in range(n)]
    limits = [reqs.cancel_after.get(row, reqs.max_new_tokens[i]) for row, i in enumerate(rows)]
    return run_requests(scenario, weights, seed, attention_backend, fault, make_policy,
                        engine_class=_WindowedSpeculativeEngine, label=rollback_policy,
                        engine_kw={"speculation": speculation}, executor_class=SpeculativeModelExecutor,
                        executor_kw={"draft": draft, "limits": limits})


def run_speculative_scenario(scenario: Scenario, weights: ModelWeights, *, seed: int, attention_backend: str,
                             fault: Fault | None = None) -> ScenarioResult:
    """Both rollback policies' runs, judged together: every token of both must match."""
    draft = draft_weights(weights, seed)
    runs = [_one_run(scenario, weights, draft, seed, attention_backend, policy, fault) for policy in ROLLBACK_POLICIES]
    verdicts = [run.verdict for run in runs]
    events: dict[str, int] = {}
    for run in runs:
        for key, value in run.events.items():
            events[key] = events.get(key, 0) + value
    content = [e for run in runs for e in run.executor.content_errors]
    invariant = next((f"{policy}: {run.checked.invariant_error}" for policy, run in zip(ROLLBACK_POLICIES, runs,
                      strict=True) if run.checked.invariant_error), None)
    mismatch = next((v.first_mismatch for v in verdicts if v.first_mismatch), None)
    tolerances = [v.logit_tolerance for v in verdicts if v.logit_tolerance is not None]  # none or both runs'
    return ScenarioResult(
        scenario.name, sum(len(run.outputs) for run in runs),
        sum(v.tokens_compared for v in verdicts), sum(v.mismatched_tokens for v in verdicts), mismatch,
        max(v.max_abs_logit_diff for v in verdicts), all(v.passed for v in verdicts), events,
        content_errors=len(content), first_content_error=content[0] if content else None,
        invariant_error=invariant, error="; ".join(run.error for run in runs if run.error) or None,
        steps=sum(run.executor.counts["steps"] for run in runs),
        logit_tolerance=min(tolerances) if tolerances else None,
    )
