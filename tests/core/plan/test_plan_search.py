"""run_plan on inputs whose answer is known: the hand-checked constructed workload, each pruning rule, the
fronts and the choice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvcalc.core.errors import ParameterError
from kvcalc.core.plan.evaluate import DOES_NOT_FIT, LONGER_THAN_CONTEXT, SERVES, SLO_MISSED, STORM, evaluate_point
from kvcalc.core.plan.planner import PlanRequest, pareto_front, run_plan
from kvcalc.core.plan.space import Point, Space, point_options
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.simulate import simulate


def test_hand_checked_plan_picks_a100_tp4(hand_plan, cases):
    by_setting = {(p["gpu"], p["tp"]): p for p in hand_plan.points}
    for key, p in by_setting.items():
        # TPOT p99 within 1 % of the hand roofline (KV reads and overlaps add a little, never less)
        assert cases.HAND_STEP_S[key] <= p["tpot_p99_s"] <= cases.HAND_STEP_S[key] * 1.01, key
        assert p["verdict"] == (SERVES if cases.HAND_STEP_S[key] <= 4e-3 else SLO_MISSED), key
    chosen = hand_plan.points[hand_plan.chosen]
    assert (chosen["gpu"], chosen["tp"], chosen["cost_per_hour"]) == ("A100-80GB", 4, 6.0)
    # cost front: A100 tp4 ($6, 2.96 ms) and H100 tp4 ($16, 2.00 ms); H100 tp2 ($8, 3.50 ms) is dominated
    assert [(hand_plan.points[i]["gpu"], hand_plan.points[i]["tp"]) for i in hand_plan.front] == [
        ("A100-80GB", 4), ("H100-SXM", 4)]


def test_next_cheaper_point_simulated_alone_misses_the_slo(hand_plan, cases):
    chosen = hand_plan.points[hand_plan.chosen]
    cheaper = max((p for p in hand_plan.points if p["cost_per_hour"] < chosen["cost_per_hour"]),
                  key=lambda p: p["cost_per_hour"])
    assert (cheaper["gpu"], cheaper["tp"], cheaper["cost_per_hour"]) == ("H100-SXM", 1, 4.0)
    alone = simulate(build(point_options(cases.HAND_BASE, cheaper["point"])))
    assert alone.summaries["paged"].slo_attainment < 0.9
    assert alone.summaries["paged"].slo_attainment == cheaper["slo_attainment"]


def test_a_point_is_exactly_sims_run_and_search(hand_plan, cases):
    """Same code path, same seed: the plan's figures are what simulate() gives for the point's options."""
    chosen = hand_plan.points[hand_plan.chosen]
    alone = simulate(build(point_options(cases.HAND_BASE, chosen["point"])))
    summary, search = alone.summaries["paged"], alone.searches["paged"]
    assert chosen["tpot_p99_s"] == summary.tpot_s.p99
    assert chosen["slo_attainment"] == summary.slo_attainment
    assert chosen["max_rate_rps"] == search.max_rate_rps
    assert chosen["evaluations"] == [list(e) for e in search.evaluations]


def test_weights_that_do_not_fit_are_pruned_with_the_reason(cases):
    result = evaluate_point(replace(cases.HAND_BASE, model="Llama-3.1-70B"), Point("A100-80GB", 1, 16, 8192,
                                                                                  "bf16", 1))
    assert result["verdict"] == DOES_NOT_FIT
    assert "weights need" in result["reason"] and "GiB short" in result["reason"]
    assert "max_rate_rps" not in result


def test_a_pool_smaller_than_one_max_length_sequence_is_pruned(cases):
    # Llama-3.1-8B on H100-SXM tp1 holds 28,628 blocks of 16 = 458,048 tokens (sim's memory plan)
    result = evaluate_point(replace(cases.HAND_BASE, max_model_len=2_000_000), Point("H100-SXM", 1, 16, 8192,
                                                                                        "bf16", 1))
    assert result["verdict"] == DOES_NOT_FIT
    assert result["memory"]["num_blocks"] < 125_000  # ceil((2,000,000 - 1) / 16): sim's never_fits
    assert "cannot hold one max-length sequence (2,000,000 tokens)" in result["reason"]


def test_requests_longer_than_the_context_are_pruned(cases):
    # every request is 64 + 128 = 192 tokens > 150
    result = evaluate_point(replace(cases.HAND_BASE, max_model_len=150), Point("H100-SXM", 1, 16, 8192, "bf16", 1))
    assert result["verdict"] == LONGER_THAN_CONTEXT
    assert result["reason"].startswith("40 of 40 requests are longer than max_model_len 150")


def test_a_tiny_pool_under_load_is_a_preemption_storm(cases):
    # Memory utilisation 0.45 of an A100-40GB (0.45 · 39.39 = 17.73 GiB) leaves a small pool after 15 GiB of
    # weights, 1.09 GiB of activations, 0.25 GiB of non-torch memory and 0.84 GiB of CUDA graphs (sim plans as
    # size --gpu); requests of 0.3 + 0.3 of it each, arriving at 50/s, are admitted two at a time on their prompts
    # and push each other out as they grow (two need 1.2 pools), over and over
    point = Point("A100-40GB", 1, 16, 8192, "bf16", 1)
    small = replace(cases.HAND_BASE, rate="50", memory_utilization=0.45)
    tokens = build(point_options(small, point)).sim.capacity_blocks * 16
    third = tokens * 3 // 10
    base = replace(small, prompt_dist=f"uniform:low={third},high={third}",
                   output_dist=f"uniform:low={third},high={third}", max_model_len=tokens, slo="ttft=10,tpot=40ms")
    result = evaluate_point(base, point)
    assert result["verdict"] == STORM, result
    assert result["preemptions"] >= result["requests"]
    assert "max_rate_rps" not in result  # the SLO was lost at the point's load: no search


def test_replicas_split_the_rate(cases):
    options = point_options(cases.HAND_BASE, Point("H100-SXM", 2, 32, 4096, "fp8", 4))
    assert (options.gpu, options.tp, options.block_size, options.max_batched_tokens, options.dtype) == (
        "H100-SXM", 2, 32, 4096, "fp8")
    assert options.rate == "0.0125" and options.find_max_rate
    trace = replace(cases.HAND_BASE, rate=None, requests=None, prompt_dist=None, output_dist=None,
                    trace=("azure", "x.csv"), time_scale=3.0)
    assert point_options(trace, Point("H100-SXM", 1, 16, 8192, "bf16", 4)).time_scale == 0.75


def test_pareto_front_by_hand():
    def r(index, cost, metric):
        return {"index": index, "cost_per_hour": cost, "m": metric}

    records = [r(0, 1, 5.0), r(1, 2, 4.0), r(2, 2, 4.5), r(3, 3, 4.0), r(4, 4, 1.0), r(5, 4, 1.0)]
    # 2 is beaten by 1 (same cost, faster); 3 by 1 (cheaper, as fast); 4 and 5 tie on both: both kept
    assert pareto_front(records, "m", lower_is_better=True) == [0, 1, 4, 5]
    assert pareto_front(records, "m", lower_is_better=False) == [0]


def test_plan_refuses_what_it_cannot_search(cases):
    with pytest.raises(ParameterError, match="slo is required"):
        run_plan(replace(cases.HAND_REQUEST, base=replace(cases.HAND_BASE, slo=None)))
    with pytest.raises(ParameterError, match="has no price"):
        run_plan(PlanRequest(cases.HAND_BASE, Space(gpus=("H200",)), cases.HAND_PRICES, "t"))
    with pytest.raises(ParameterError, match="tp 3"):
        run_plan(PlanRequest(cases.HAND_BASE, Space(gpus=("H100-SXM",), tp=(3,)), cases.HAND_PRICES, "t"))
    with pytest.raises(ParameterError, match="rate"):
        run_plan(replace(cases.HAND_REQUEST, base=replace(cases.HAND_BASE, rate="inf")))


@pytest.mark.parametrize(("model", "point"), [
    ("Gemma-2-9B", Point("H100-SXM", 1, 16, 8192, "bf16", 1)),  # sliding-window layers
    ("Nemotron-H-56B", Point("H100-SXM", 4, 16, 8192, "bf16", 1)),  # Mamba hybrid: recurrent state per sequence
    ("Nemotron-H-56B", Point("H200", 8, 16, 8192, "bf16", 1)),
])
def test_hybrid_models_are_judged_by_sims_own_memory_plan_and_runs(cases, model, point):
    """The plan's verdict for a hybrid is sim's: a prune carries the error sim itself gives for those options
    (windows, recurrent state and all), and a simulated point's figures are sim's."""
    base = replace(cases.HAND_BASE, model=model, requests=20, slo="tpot=200ms")
    options = point_options(base, point)
    result = evaluate_point(base, point)
    if result["verdict"] == DOES_NOT_FIT and "memory" not in result:
        with pytest.raises(ParameterError) as caught:
            build(options)
        assert str(caught.value) == result["reason"]
    else:
        alone = simulate(build(options)).summaries["paged"]
        assert (result["slo_attainment"], result["tpot_p99_s"]) == (alone.slo_attainment, alone.tpot_s.p99)
