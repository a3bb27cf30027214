"""verify's speculative scenario: greedy speculative decoding through the scheduler, the pool's reserve /
commit and one paged forward per step equals plain greedy decoding, under both rollback policies, with
prefix caching and preemption; drafts that the target accepts are committed; no-rollback is caught."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.verify import speculative  # noqa: E402
from kvcalc.cuda_ext.verify.config import ModelConfig  # noqa: E402
from kvcalc.cuda_ext.verify.faults import Fault  # noqa: E402
from kvcalc.cuda_ext.verify.runner import run_scenario  # noqa: E402
from kvcalc.cuda_ext.verify.scenarios import build  # noqa: E402
from kvcalc.cuda_ext.verify.weights import init_weights  # noqa: E402

SEED = 0


@pytest.fixture(scope="module")
def fp32():
    return init_weights(ModelConfig(), seed=SEED)


@pytest.fixture(scope="module")
def scenario(fp32):
    return build("speculative", fp32.config.vocab_size, SEED)


@pytest.mark.parametrize("rollback", ["keep", "free"])
def test_each_rollback_policy_alone_matches_plain_greedy(fp32, scenario, rollback):
    draft = speculative.draft_weights(fp32, SEED)
    run = speculative._one_run(scenario, fp32, draft, SEED, "torch-reference", rollback, None)
    verdict, policy, executor = run.verdict, run.policy, run.executor
    assert run.error is None and run.checked.invariant_error is None and not executor.content_errors
    assert verdict.passed and verdict.mismatched_tokens == 0 and verdict.tokens_compared > 0
    stats = policy.pool.speculative_stats()
    assert stats.rolled_back_slots > 0 and stats.reservations > 0
    assert executor.counts["preemptions"] > 0 and policy.pool.stats().hit_tokens > 0
    # every decode step verified 1 + K tokens: the drafts the executor saw are K per decode step
    assert executor.counts["drafts"] % scenario.spec_tokens == 0 and executor.counts["drafts"] > 0
    if rollback == "free":
        assert stats.freed_blocks > 0
    else:
        assert stats.freed_blocks == 0


def test_the_scenario_passes_with_its_events(fp32):
    result = run_scenario(build("speculative", fp32.config.vocab_size, SEED), fp32, seed=SEED,
                          attention_backend="torch-reference")
    assert result.passed, result.to_dict()
    assert result.events["rollbacks"] > 0 and result.events["preemptions"] > 0
    assert result.events["prefix_hit_tokens"] > 0


def test_drafts_the_target_agrees_with_are_committed(fp32, scenario):
    # the target as its own drafter: every draft matches, so steps emit up to K + 1 tokens — the accept path
    run = speculative._one_run(scenario, fp32, fp32, SEED, "torch-reference", "keep", None)
    verdict, executor = run.verdict, run.executor
    assert run.error is None and verdict.passed and verdict.mismatched_tokens == 0
    totals = run.engine.totals_speculative()
    assert executor.counts["accepted_drafts"] == totals.accepted > 0
    assert totals.accepted > 0.5 * totals.drafts  # ends and EOS cut some short
    # fewer steps than tokens: several tokens per decode step
    generated = sum(len(r.output) for r in executor.requests.values())
    assert totals.emitted > totals.steps and generated == verdict.tokens_compared


def test_a_random_draft_is_mostly_rejected_but_never_changes_a_token(fp32, scenario):
    draft = init_weights(speculative.draft_config(fp32.config), seed=99)
    run = speculative._one_run(scenario, fp32, draft, SEED, "torch-reference", "free", None)
    assert run.verdict.passed and run.policy.pool.speculative_stats().rolled_back_slots > 0


def test_no_rollback_is_caught(fp32, scenario):
    fault = Fault("no-rollback")
    result = run_scenario(scenario, fp32, seed=SEED, attention_backend="torch-reference", fault=fault)
    assert fault.fired > 0 and not result.passed
    assert result.error and "rejected slots were kept as committed" in result.error
    assert "rollbacks" in result.missing_events


def test_other_scenarios_report_zero_rollbacks(fp32):
    result = run_scenario(build("ragged", fp32.config.vocab_size, SEED), fp32, seed=SEED,
                          attention_backend="torch-reference")
    assert result.events["rollbacks"] == 0 and result.passed


def test_draft_model_is_smaller_with_the_same_vocabulary(fp32):
    draft = speculative.draft_weights(fp32, SEED)
    assert draft.config.vocab_size == fp32.config.vocab_size
    assert draft.config.num_layers < fp32.config.num_layers and draft.config.hidden_size < fp32.config.hidden_size
    assert not torch.equal(draft.embedding[:, :8], fp32.embedding[:, :8])


def test_more_drafts_per_step(fp32, scenario):
    # K = 5 in the same pool: 11 slots per reservation, still token for token
    wider = replace(scenario, spec_tokens=5)
    result = run_scenario(wider, fp32, seed=SEED, attention_backend="torch-reference")
    assert result.passed, result.to_dict()
    assert np.isfinite(result.max_abs_logit_diff)
