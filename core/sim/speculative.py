"""Speculative decoding in `kvcalc sim`: what a step verifies, how many drafts it accepts, what it costs.

Each decode step of a speculating request computes 1 + K query tokens — its last sampled token and K
drafts — in one verification pass, and reserves vLLM's 1 + K + λ slots past its committed tokens (λ = K
lookahead slots for a draft model / EAGLE / MTP, 0 for n-gram; core/spec_decode.py). Drafts are accepted
independently with probability A until the first rejection, so the accepted count j of a step with K
drafts is a truncated geometric variable, and the step emits j + 1 tokens (the target's own token after
the accepted prefix — the "bonus" token), on average (Leviathan et al. 2023)

    E[j + 1] = Σ_{i=0..K} A^i = (1 − A^(K+1)) / (1 − A)        (K + 1 at A = 1)

fewer at the end of a request, whose last step emits no more than the tokens it has left. The KV of the
last sampled token and of the j accepted drafts is committed; the K − j rejected drafts and the lookahead
slots are rolled back (spec_run.py does it through the pool's reserve / commit).

Time: the verification pass is charged by the step-time model like a prefill chunk of 1 + K tokens after
the committed context (1 + K tokens of FLOPs, causal attention over them, the context read once and 1 + K
KV tokens written); the drafter runs K passes, each `draft_cost` F times the target's plain decode step of
the same sequences (0 for n-gram drafting, which runs no model). The drafter's prefill is not charged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ParameterError
from ..pool.speculative import DEFAULT_ROLLBACK_POLICY, check_rollback_policy
from ..spec_decode import DEFAULT_SPEC_METHOD, SPEC_METHODS, Speculation
from .plan import StepOutcome, StepPlan
from .steptime import StepTimeExecutor, StepTimeModel

DEFAULT_DRAFT_COST = 0.1  # a draft model ~10x smaller than the target (e.g. 7B drafting for 70B)
_ACCEPTANCE_STREAM = 0x5BEC  # keeps the acceptance draws apart from the workload's samples of the same seed


@dataclass(frozen=True)
class SimSpeculation:
    """K drafts per decode step accepted with probability `acceptance`, under `method`'s lookahead, a
    drafter costing `draft_cost` of the target's decode step per draft, and the pool's `rollback_policy`."""

    spec_tokens: int
    acceptance: float
    method: str = DEFAULT_SPEC_METHOD
    draft_cost: float = DEFAULT_DRAFT_COST
    rollback_policy: str = DEFAULT_ROLLBACK_POLICY
    seed: int = 0

    def __post_init__(self) -> None:
        Speculation(self.spec_tokens, self.method)  # checks K and the method
        if not isinstance(self.acceptance, int | float) or not 0 <= self.acceptance <= 1:
            raise ParameterError(f"spec_acceptance {self.acceptance!r} must be a probability between 0 and 1 "
                                 "(e.g. 0.7)", "spec_acceptance")
        if not math.isfinite(self.draft_cost) or self.draft_cost < 0:
            raise ParameterError(f"draft_cost {self.draft_cost!r} must be a finite share >= 0 of the target's "
                                 "decode step (e.g. 0.1)", "draft_cost")
        check_rollback_policy(self.rollback_policy)

    @property
    def speculation(self) -> Speculation:
        return Speculation(self.spec_tokens, self.method)

    @property
    def lookahead_slots(self) -> int:
        return self.speculation.lookahead_slots

    @property
    def closed_form_tokens_per_step(self) -> float:
        """(1 − A^(K+1)) / (1 − A): tokens a step with all K drafts emits on average (K + 1 at A = 1)."""
        a, k = self.acceptance, self.spec_tokens
        return float(k + 1) if a == 1 else (1.0 - a ** (k + 1)) / (1.0 - a)

    def describe(self) -> str:
        drafter = ("n-gram drafting (no drafter model, no drafter time, no lookahead slots)"
                   if self.method == "ngram" else
                   f"{SPEC_METHODS[self.method]} (each of the K drafts costs {self.draft_cost:g} of the target's "
                   "decode step; "
                   f"{self.lookahead_slots} lookahead slots)")
        return (f"speculative decoding: K = {self.spec_tokens} drafts per decode step by {drafter}, each accepted "
                f"with probability {self.acceptance:g} until the first rejection (seeded); the target verifies "
                f"1 + K query tokens per sequence in one pass, charged as a chunk of 1 + K tokens; each step "
                f"reserves 1 + K + λ = {self.speculation.slots_per_step} slots through the pool (rollback "
                f"{self.rollback_policy}); fast-forward is off (every step simulated)")


def speculation_from_options(spec_tokens: int | None, acceptance: float | None, method: str | None,
                             draft_cost: float | None, rollback_policy: str | None, seed: int) -> SimSpeculation | None:
    """The speculation `kvcalc sim`'s options ask for (None without spec_tokens); options that would change
    nothing are refused."""
    if spec_tokens is None:
        given = [name for name, value in (("spec_acceptance", acceptance), ("spec_method", method),
                                          ("draft_cost", draft_cost), ("rollback_policy", rollback_policy))
                 if value is not None]
        if given:
            raise ParameterError(f"{', '.join(given)} applies to speculative decoding: add spec_tokens K (e.g. 4) "
                                 "or drop it", *given, "spec_tokens")
        return None
    if acceptance is None:
        raise ParameterError(f"spec_tokens {spec_tokens} needs spec_acceptance A, the probability that a draft is "
                             "accepted (e.g. 0.7)", "spec_acceptance", "spec_tokens")
    if isinstance(acceptance, float) and math.isnan(acceptance):
        raise ParameterError("spec_acceptance nan is not a probability: give a number between 0 and 1",
                             "spec_acceptance")
    if spec_tokens == 0:  # as vLLM, which takes num_speculative_tokens > 0 only
        raise ParameterError("spec_tokens 0 drafts nothing, so spec_acceptance and the drafter change nothing: give "
                             "K of 1 or more (e.g. 4), or drop spec_tokens and spec_acceptance", "spec_tokens",
                             "spec_acceptance")
    method = DEFAULT_SPEC_METHOD if method is None else method.strip().lower()
    if method == "ngram" and draft_cost is not None and draft_cost != 0:
        raise ParameterError(f"draft_cost {draft_cost:g} with spec_method ngram: n-gram drafting runs no model; "
                             "drop draft_cost or use spec_method draft", "draft_cost", "spec_method")
    cost = 0.0 if method == "ngram" else (DEFAULT_DRAFT_COST if draft_cost is None else draft_cost)
    return SimSpeculation(spec_tokens, float(acceptance), method, cost,
                          DEFAULT_ROLLBACK_POLICY if rollback_policy is None else rollback_policy.strip().lower(),
                          seed)


def check_speculative_setup(speculation: SimSpeculation, max_batched_tokens: int, max_model_len: int,
                            policies: tuple[str, ...] | list[str], *, rollback_given: bool = False) -> None:
    """Refuse a K that no step could hold, and a rollback policy that no run would use."""
    if rollback_given and "paged" not in policies:
        raise ParameterError(f"rollback_policy {speculation.rollback_policy} applies to the paged policy's blocks; "
                             f"{', '.join(policies)} reserve whole regions: add paged or drop rollback_policy",
                             "rollback_policy", "policy")
    slots = speculation.speculation.slots_per_step
    if slots > max_batched_tokens:
        raise ParameterError(f"spec_tokens {speculation.spec_tokens}: a decode step verifies 1 + K tokens and "
                             f"reserves {slots} slots, more than max_batched_tokens {max_batched_tokens}; lower K or "
                             "raise max_batched_tokens", "spec_tokens", "max_batched_tokens")
    if 1 + speculation.spec_tokens >= max_model_len:
        raise ParameterError(f"spec_tokens {speculation.spec_tokens} leaves no room in max_model_len {max_model_len}: "
                             "lower K", "spec_tokens", "max_model_len")


def accepted_drafts(rng: np.random.Generator, drafts: np.ndarray, acceptance: float) -> np.ndarray:
    """Accepted prefix length per request [m] int64: each of its `drafts[i]` drafts passes with probability
    `acceptance`, and the first that fails stops the rest (exactly 0 at A = 0, exactly drafts at A = 1)."""
    width = int(drafts.max()) if len(drafts) else 0
    if width == 0:
        return np.zeros(len(drafts), np.int64)
    passed = rng.random((len(drafts), width)) < acceptance
    passed &= np.arange(width)[None, :] < drafts[:, None]
    return np.cumprod(passed, axis=1).sum(axis=1).astype(np.int64)


class SpeculativeStepTimeExecutor:
    """The step-time model for plans with drafts: verification charged as chunks (StepTimeExecutor), plus
    the drafter's K passes; the accepted drafts drawn with the run's seeded generator."""

    def __init__(self, model: StepTimeModel, speculation: SimSpeculation) -> None:
        self.model, self.speculation = model, speculation
        self.target = StepTimeExecutor(model)
        self.rng = np.random.default_rng([speculation.seed, _ACCEPTANCE_STREAM])

    def execute(self, plan: StepPlan) -> StepOutcome:
        duration = self.target.duration_s(plan)
        drafts = plan.num_draft_tokens
        if drafts is None or not drafts.any():
            return StepOutcome(duration, num_accepted={})
        spec = drafts > 0
        contexts = plan.num_computed_tokens[spec] + 1  # what a plain decode step of these sequences attends
        plain_decode_s = float(self.model.decode_steps_s(int(spec.sum()), float(contexts.sum()),
                                                         float(self._excess(contexts))))
        duration += self.speculation.draft_cost * int(drafts.max()) * plain_decode_s
        accepted = accepted_drafts(self.rng, drafts[spec], self.speculation.acceptance)
        return StepOutcome(duration, num_accepted=dict(zip(plan.request_ids[spec].tolist(), accepted.tolist(),
                                                           strict=True)))

    def _excess(self, contexts: np.ndarray) -> float:
        if not self.model.sliding_share:
            return 0.0
        return float(self.model.decode_excess(contexts, 1)[0])  # one decode step: sliding or chunked


@dataclass(frozen=True)
class SpeculativeTotals:
    """Counters of one run's decode steps (one per request per step; fewer than K drafts where the token budget
    or max_model_len trims them, none with K = 0)."""

    steps: int
    drafts: int
    accepted: int
    emitted: int  # tokens those steps produced (accepted + bonus, less what a request's end cut off)
    rolled_back_slots: int  # pool slots reserved and rolled back (rejected drafts and lookahead)
    speculative_slot_s: float  # ∫ slots held past the committed tokens dt (reservations, kept blocks)

    @property
    def mean_accepted_per_step(self) -> float:
        return self.accepted / self.steps if self.steps else float("nan")

    @property
    def mean_tokens_per_step(self) -> float:
        return self.emitted / self.steps if self.steps else float("nan")
