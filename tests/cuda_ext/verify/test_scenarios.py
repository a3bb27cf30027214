"""verify's scenarios through the scheduler, the pool and the paged model: every one passes in fp32 with the
events its name needs, bf16 passes by the top-k rule, and each planted pool fault is caught."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.verify.config import ModelConfig  # noqa: E402
from kvcalc.cuda_ext.verify.faults import Fault  # noqa: E402
from kvcalc.cuda_ext.verify.runner import run_scenario  # noqa: E402
from kvcalc.cuda_ext.verify.scenarios import SCENARIOS, build  # noqa: E402
from kvcalc.cuda_ext.verify.weights import init_weights  # noqa: E402

SEED = 0


@pytest.fixture(scope="module")
def fp32():
    return init_weights(ModelConfig(), seed=SEED)


def run(name, weights, fault=None, **changes):
    scenario = replace(build(name, weights.config.vocab_size, SEED), **changes)
    return run_scenario(scenario, weights, seed=SEED, attention_backend="torch-reference", fault=fault)


_RUNS: dict = {}


def run_once(name, weights, fault_name=None):
    """(result, fault) of a plain run, computed once per module (several tests read the same run)."""
    key = (name, weights.dtype, fault_name)
    if key not in _RUNS:
        fault = Fault(fault_name) if fault_name else None
        _RUNS[key] = (run(name, weights, fault), fault)
    return _RUNS[key]


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_scenario_passes_in_fp32_with_its_events(fp32, name):
    result, _ = run_once(name, fp32)
    assert result.error is None and result.invariant_error is None and result.content_errors == 0
    assert result.mismatched_tokens == 0 and result.first_mismatch is None
    assert result.tokens_compared > 0
    assert 0 < result.max_abs_logit_diff <= result.logit_tolerance  # not bit-identical: other reduction orders
    assert result.needs and all(result.events[e] > 0 for e in result.needs), result.events
    assert result.passed


def test_tiny_pool_events_are_what_its_requests_imply(fp32):
    result, _ = run_once("tiny-pool", fp32)
    assert result.events["swaps"] == result.events["preemptions"]  # tiny-pool preempts by swap only
    assert result.events["forks"] == 3  # requests 0, 2 and 6 ask for two samples each: one fork each
    assert result.events["cancellations"] == 3  # rows 1, 5 and 9 are cancelled mid-generation
    assert result.requests == 11  # 8 prompts + 3 second samples


def test_a_scenario_whose_events_stay_zero_fails(fp32):
    # preempt-recompute never swaps: asking it to prove swaps must fail it, tokens notwithstanding
    result = run("preempt-recompute", fp32, needs=("preemptions", "swaps"))
    assert result.mismatched_tokens == 0 and not result.passed and result.missing_events == ["swaps"]


def test_bf16_passes_by_the_top_k_rule():
    weights = init_weights(ModelConfig(), seed=SEED, dtype="bf16")
    for name in SCENARIOS:
        result = run(name, weights)
        assert result.passed, (name, result.first_mismatch, result.error)
        if result.first_mismatch is not None:
            assert result.first_mismatch["within_top_k"]


# each fault against a scenario that gives it a chance to act; what must catch it
@pytest.mark.parametrize(("fault", "name"), [
    ("early-free", "cancel-reuse"),  # a cancelled parallel sample frees blocks its sibling still reads
    ("early-free", "tiny-pool"),
    ("skip-cow", "parallel-sampling"),  # the samples append into their shared last prompt block
    ("skip-cow", "beam-search"),
    ("stale-hash", "prefix-cache"),  # the first system prompt's evicted blocks are "hit" again
    ("stale-hash", "tiny-pool"),
])
def test_each_planted_fault_is_caught(fp32, fault, name):
    result, planted = run_once(name, fp32, fault)
    assert planted.fired > 0 and result.fault_fired == planted.fired
    assert not result.passed
    assert result.invariant_error or result.error  # the pool's own checks see it too


@pytest.mark.parametrize(("fault", "name"), [("early-free", "cancel-reuse"), ("stale-hash", "prefix-cache")])
def test_wrong_kv_changes_the_tokens_and_the_content_check_names_it(fp32, fault, name):
    result, _ = run_once(name, fp32, fault)
    m = result.first_mismatch
    assert m is not None and m["test_token"] is not None and m["test_token"] != m["reference_token"]
    assert result.max_abs_logit_diff > 0.1
    assert result.content_errors > 0 and "holds another token's K/V" in result.first_content_error


def test_skip_cow_writes_one_slot_twice(fp32):
    result, _ = run_once("parallel-sampling", fp32, "skip-cow")
    assert "writes two tokens into one slot" in result.error
    assert result.events["cow_copies"] == 0


def test_a_fault_with_nothing_to_act_on_changes_nothing(fp32):
    # ragged has no sharing, no prefix cache: the faults never fire and the scenario passes
    for fault in ("early-free", "skip-cow", "stale-hash"):
        planted = Fault(fault)
        assert run("ragged", fp32, fault=planted).passed and planted.fired == 0
