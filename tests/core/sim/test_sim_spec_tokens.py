"""Tokens a model runner hands back from a speculative step (spec_run._take_speculated_tokens): numpy integers,
0-d arrays and numpy arrays of emitted tokens are tokens as Python ints and tuples are (a real runner samples
with numpy or torch, not Python ints)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvcalc.core.sim.plan import StepOutcome, StepPlan
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.speculative import speculation_from_options
from kvcalc.core.sim.workload import from_token_ids

from .test_sim_engine import constant_steptime, make_setup


def token_of(rid: int, position: int) -> int:
    return 100 * (rid + 1) + position


class NumpyRunner:
    """Every step 10 ms; drafts are all accepted (`accept_all`) or all rejected; each sampling request gets the
    tokens of its next positions, as numpy values: `kind` "scalar" (np.int64), "array0" (0-d array) for one token,
    an int64 array for several."""

    def __init__(self, outputs: list[int], accept_all: bool, kind: str) -> None:
        self.left = list(outputs)  # tokens each request still has to emit
        self.accept_all, self.kind = accept_all, kind

    def execute(self, plan: StepPlan) -> StepOutcome:
        tokens: dict = {}
        accepted: dict[int, int] = {}
        rows = zip(plan.request_ids.tolist(), plan.num_computed_tokens.tolist(), plan.num_new_tokens.tolist(),
                   plan.num_draft_tokens.tolist(), plan.samples.tolist(), strict=True)
        for rid, start, new, drafts, samples in rows:
            if drafts:
                accepted[rid] = drafts if self.accept_all else 0
            if not samples:
                continue
            emit = min(accepted.get(rid, 0) + 1, self.left[rid])
            first = start + new - drafts  # the position of the first token it emits
            values = np.array([token_of(rid, first + j) for j in range(emit)], dtype=np.int64)
            if emit > 1:
                tokens[rid] = values
            else:
                tokens[rid] = values[0] if self.kind == "scalar" else np.array(values[0])
            self.left[rid] -= emit
        return StepOutcome(0.01, tokens, num_accepted=accepted)


@pytest.mark.parametrize("kind", ["scalar", "array0"])
@pytest.mark.parametrize("accept_all", [False, True])
def test_numpy_tokens_from_a_speculative_runner(kind, accept_all):
    # two requests, prompts of 5 and 3 tokens, 6 and 4 output tokens, K = 2 drafts per decode step.
    # All rejected: one token per step, each an np.int64 (or a 0-d array). All accepted: the prefill samples
    # one token, then each decode step emits min(3, left): request 0 emits 1 + 3 + 2 = 6, request 1 1 + 3 = 4
    # (several tokens as an int64 array). Either way request r's tokens are token_of(r, prompt + j), j < output.
    w = from_token_ids([[1, 2, 3, 4, 5], [7, 8, 9]], [6, 4], arrival_s=[0.0, 0.0])
    spec = speculation_from_options(2, 0.5, "ngram", None, None, 0)
    setup = make_setup(64, 4, constant_steptime(0.01))
    record = run_policy(w, "paged", replace(setup, speculation=spec), executor=NumpyRunner([6, 4], accept_all, kind))
    expected = [[token_of(0, 5 + j) for j in range(6)], [token_of(1, 3 + j) for j in range(4)]]
    assert record.generated_token_ids == expected
    assert all(type(t) is int for row in record.generated_token_ids for t in row)
    # all accepted: 3 verifying steps (request 0: 2 of them, request 1: 1), each accepting both drafts: 6; they emit
    # 3 + 2 + 3 = 8 tokens (the prefill samples the other 2)
    spec_totals = record.speculative
    assert (spec_totals.steps, spec_totals.accepted, spec_totals.emitted) == ((3, 6, 8) if accept_all else (8, 0, 8))
