"""verify on the hybrid model: the model and its contiguous reference checked against hand-built forms, the paged
run through HybridPool and the scheduler (every scenario, fp32: identical tokens), counts of what the pool did by
hand, the two hybrid faults caught where they act (and idle where they cannot); the CLI in test_hybrid_verify_cli.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvcalc.core.pool.groups import PoolGroup  # noqa: E402
from kvcalc.core.sim.paged_groups import GroupedPagedPolicy  # noqa: E402
from kvcalc.core.sim.scheduler import SchedulerConfig  # noqa: E402
from kvcalc.cuda_ext.verify.hybrid_executor import HybridExactPolicy, hybrid_pool_groups  # noqa: E402
from kvcalc.cuda_ext.verify.hybrid_model import (  # noqa: E402
    HYBRID_TINY,
    ContiguousHybridCache,
    HybridConfig,
    hybrid_reference_generate,
    init_hybrid_weights,
    masked_attention,
)
from kvcalc.cuda_ext.verify.hybrid_scenarios import (  # noqa: E402
    HYBRID_SCENARIOS,
    HybridFault,
    HybridScenario,
    build_hybrid,
)
from kvcalc.cuda_ext.verify.hybrid_suite import run_hybrid_scenario, run_hybrid_verify  # noqa: E402
from kvcalc.cuda_ext.verify.scenarios import _requests  # noqa: E402
from kvcalc.cuda_ext.verify.scheduled import block_keys  # noqa: E402


@pytest.fixture(scope="module")
def weights():
    return init_hybrid_weights(HYBRID_TINY, seed=0)


# ---- the model and its reference ---------------------------------------------------------------------------
def test_masked_attention_sees_exactly_the_window():
    """A query at p sees keys p − W + 1 .. p: with values = one-hot of the key's position and equal scores (q = 0),
    the output is the uniform average over the visible keys — 1/W on each of them, 1/(p + 1) before p reaches W."""
    W, L = 3, 6
    q, k = torch.zeros(L, 1, L), torch.zeros(L, 1, L)
    v = torch.eye(L)[:, None, :]  # the value of key j: e_j, so the output row is the attention weights
    pos = torch.arange(L)
    out = masked_attention(q, k, v, pos, pos, W)[:, 0]  # [L, L]: row p = the weights on each key
    for p in range(L):
        visible = [j for j in range(L) if 0 <= p - j < W]
        expected = torch.zeros(L)
        expected[visible] = 1.0 / len(visible)
        assert torch.allclose(out[p], expected), (p, out[p])
    full = masked_attention(q, k, v, pos, pos, None)[:, 0]
    assert torch.allclose(full[5], torch.full((L,), 1 / 6))  # no window: every key up to p


def test_reference_prefill_equals_token_by_token(weights):
    """The reference decodes token by token; one forward over the whole prompt (the window mask and the recurrence
    over many tokens at once, as the paged path's prefill chunks use them) gives the same last logits."""
    prompt = [int(t) for t in torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(3))]
    one = ContiguousHybridCache(weights, 40)
    for t in prompt:
        by_token = one.forward([t])
    whole = ContiguousHybridCache(weights, 40).forward(prompt)
    assert torch.allclose(by_token, whole, atol=1e-5, rtol=0)


def test_recurrent_state_is_the_closed_form(weights, monkeypatch):
    """s_t = a_t ⊙ s_{t−1} + (1 − a_t) ⊙ x_t from s = 0: after two tokens the reference's plain state tensor holds
    a2 ⊙ (1 − a1) ⊙ x1 + (1 − a2) ⊙ x2, written out here from the gates the layer computed."""
    import kvcalc.cuda_ext.verify.hybrid_model as hm

    cache = ContiguousHybridCache(weights, 4)
    seen, step = [], hm.recurrence

    def spy(state, a, x):
        seen.append((a.clone(), x.clone()))
        return step(state, a, x)

    monkeypatch.setattr(hm, "recurrence", spy)
    cache.forward([5, 9])
    (a1, x1), (a2, x2) = seen
    assert torch.equal(cache.state[2], a2 * ((1 - a1) * x1) + (1 - a2) * x2)
    assert bool(((a1 > 0) & (a1 < 1)).all())


def test_sliding_window_as_wide_as_the_sequence_is_full_attention():
    """W >= the sequence: the sliding layers see every key, so the model equals the one whose layers are full."""
    base = HYBRID_TINY.base
    wide = init_hybrid_weights(HybridConfig(base, ("full", "sliding", "recurrent", "sliding"), window=64), seed=1)
    full = init_hybrid_weights(HybridConfig(base, ("full", "full", "recurrent", "full"), window=64), seed=1)
    narrow = init_hybrid_weights(HybridConfig(base, ("full", "sliding", "recurrent", "sliding"), window=4), seed=1)
    prompt = list(range(3, 40))
    a, b, c = (hybrid_reference_generate(w, prompt, 3) for w in (wide, full, narrow))
    assert a.output_ids == b.output_ids and torch.equal(a.logits, b.logits)
    assert not torch.allclose(a.logits, c.logits)  # a window of 4 does change the model


def test_config_rejects_bad_layers():
    with pytest.raises(ValueError, match="layer 0 must be full"):
        HybridConfig(HYBRID_TINY.base, ("sliding", "full", "recurrent", "full"))
    with pytest.raises(ValueError, match="layer kind 'mamba'"):
        HybridConfig(HYBRID_TINY.base, ("full", "mamba", "recurrent", "full"))


# ---- the paged run ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", HYBRID_SCENARIOS)
def test_every_hybrid_scenario_passes_fp32(name, weights):
    result = run_hybrid_scenario(build_hybrid(name, 256, 0), weights, seed=0)
    assert result.status == "passed", result.to_dict()
    assert result.mismatched_tokens == 0 and result.tokens_compared > 40
    assert result.max_abs_logit_diff <= result.logit_tolerance
    assert not result.content_errors and result.invariant_error is None


def _one_request(weights, prompt_len: int, new: int, **kw):
    prompt = tuple(range(1, prompt_len + 1))
    scenario = HybridScenario("one", ("window_frees",), 60, _requests([prompt], [new], [0]), **kw)
    return run_hybrid_scenario(scenario, weights, seed=0)


def test_window_frees_by_hand(weights):
    """One request, prompt 20, 10 new tokens, B = 4, W = 8: the last token written is at position 28 (the 10th
    output is sampled, never written); before it the sliding table frees blocks wholly before 28 − 8 + 1 = 21:
    21 // 4 = 5 blocks (positions 0..19). Nothing else frees a sliding block."""
    result = _one_request(weights, 20, 10)
    assert result.status == "passed"
    assert result.events["window_frees"] == 5


def test_window_frees_by_hand_chunked(weights):
    """The same under a 7-token budget: chunks 0-6, 7-13, 14-19, then decodes; still 5 (frees depend on the
    written length only) and 3 prefill chunks that sample nothing (0-6, 7-13... the third ends the prompt and
    samples): 2."""
    chunked = SchedulerConfig(max_batched_tokens=7, max_seqs=8, max_model_len=1024)
    result = _one_request(weights, 20, 10, scheduler=chunked)
    assert result.status == "passed"
    assert result.events["window_frees"] == 5 and result.events["prefill_chunks"] == 2


def test_prefix_hits_only_where_a_state_was_saved(weights):
    """A 21-token system prompt + suffixes of 5, 11, 2, 8, 14: whole blocks of the common prefix = 20 tokens, hit by
    each of the 4 later requests in every group under mode all (80 tokens, 4 states restored); mode align saves a
    state only where a step ends: the 23-token prompt's at 20, which the two requests after it hit (40 tokens, 2
    states restored, the tokens the same as the reference's)."""
    saved = run_hybrid_scenario(build_hybrid("hybrid-prefix-cache", 256, 0), weights, seed=0)
    assert saved.events["prefix_hit_tokens"] == 4 * 20 and saved.events["state_restores"] == 4
    align = run_hybrid_scenario(build_hybrid("hybrid-no-saved-state", 256, 0), weights, seed=0)
    assert align.status == "passed" and align.events["prefix_hit_tokens"] == 2 * 20
    assert align.events["state_restores"] == 2
    assert [o[1] for o in saved.outputs[1:]] == [o[1] for o in align.outputs[1:]]  # same prompts, same tokens
    from dataclasses import replace

    running_only = replace(build_hybrid("hybrid-no-saved-state", 256, 0), state_mode="none",  # saves no state at all
                           expect_hits=tuple((row, 0) for row in range(5)))
    result = run_hybrid_scenario(running_only, weights, seed=0)
    assert result.status == "passed" and result.events["prefix_hit_tokens"] == 0


# ---- faults -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hybrid-ragged", "hybrid-prefix-cache", "hybrid-preempt-swap", "hybrid-forks"])
def test_swa_early_free_is_caught(name, weights):
    fault = HybridFault("swa-early-free")
    result = run_hybrid_scenario(build_hybrid(name, 256, 0), weights, seed=0, fault=fault)
    assert fault.fired > 0 and result.fault == "caught" and result.status == "failed"
    assert "freed a block inside its window" in result.invariant_error
    assert result.content_errors and "freed block" in result.first_content_error


@pytest.mark.parametrize("name", ["hybrid-prefix-cache", "hybrid-prefix-chunked"])
def test_stale_state_is_caught_by_the_content_check(name, weights):
    """The hit's state page one block early, logical 3 (the state after position 15), where the hit resumes at 20;
    the content check names the page and where the hit resumes. The table holds no page there (vLLM's MambaManager:
    a hit at 20 skips get_num_skipped_tokens(20) = 19 tokens, entries 0..19 // 4 − 1 = 3 null): page -1."""
    fault = HybridFault("stale-state")
    result = run_hybrid_scenario(build_hybrid(name, 256, 0), weights, seed=0, fault=fault)
    assert fault.fired == 4 and result.fault == "caught"
    assert "resumes at position 20 from state page -1 (logical 3)" in result.first_content_error


def test_stale_state_idle_without_hits(weights):
    fault = HybridFault("stale-state")
    result = run_hybrid_scenario(build_hybrid("hybrid-ragged", 256, 0), weights, seed=0, fault=fault)
    assert fault.fired == 0 and result.fault == "not exercised" and result.status == "passed"


def test_stale_state_caught_on_an_align_hit(weights):
    # mode align: the two hits at 20 resume from the page saved at 20; the fault hands them the page before it,
    # which align never kept (NULL): caught on the first
    fault = HybridFault("stale-state")
    result = run_hybrid_scenario(build_hybrid("hybrid-no-saved-state", 256, 0), weights, seed=0, fault=fault)
    assert fault.fired == 2 and result.fault == "caught"
    assert "resumes at position 20" in result.first_content_error


def test_unknown_fault_is_named():
    with pytest.raises(ValueError, match="'early-free' is not a fault of the hybrid model"):
        HybridFault("early-free")


def test_document_shape_and_status(weights):
    doc = run_hybrid_verify(scenarios=("hybrid-forks",), inject="stale-state").to_dict()
    assert doc["model"]["layer_kinds"] == ["full", "sliding", "recurrent", "sliding"]
    assert doc["model"]["groups"] == ["full", "sliding 8", "state"]
    assert doc["inject_status"] == "not exercised" and doc["scenarios"][0]["status"] == "passed"


# ---- a bug verify's hybrid-prefix-chunked found in core/sim/paged_groups.py (appends passed no block keys) ------
def test_grouped_policy_caches_blocks_later_prefill_chunks_complete():
    """A 26-token prompt prefilled in chunks of 7 (allocate 7, grow to 14, 21, 26), then released: the same prompt
    must hit min(26, 25) // 4 * 4 = 24 tokens (6 blocks) in every group (it hit 4, the first chunk's one block)."""
    prompt = tuple(range(100, 126))
    keys = [block_keys(prompt, 4)] * 2
    groups = (PoolGroup("full"), PoolGroup("sliding", 8), PoolGroup("state"))
    policy = GroupedPagedPolicy(60, 4, groups, "all", 2, keys, max_batched_tokens=7)
    assert policy.admit(0, 0, 7)
    for total in (14, 21, 26):
        assert policy.grow_many(np.array([0]), np.array([total]))
    policy.release(0, "finished")
    assert policy.hit_tokens(1, 26) == 24


# ---- found by the hybrid model in core/pool/hybrid.py: a state page freed before the step that resumes from it --
def test_align_keeps_the_page_a_chunk_resumes_from():
    """Mode align, B = 4: a first chunk of 6 tokens leaves the state after position 5 in page 1; the next chunk of
    7 (positions 6..12) must read it (the pool's after-growth rule max(0, 13 // 4 − 1) = 2 freed pages 0 and 1
    before the step ran: verify's hybrid-ragged under a 7-token budget in align had 55 tokens differ). The chunk
    jumps over a page ((13 − 1) // 4 = 3 > (6 − 1) // 4 + 1 = 2): it takes pages 2 (the state at boundary 12) and
    3 only, and lets page 1 go (vLLM frees it at the next step); page 1's entry still names it while the step runs,
    and the step's own pages are taken before it is let go, so never page 1."""
    from kvcalc.core.pool.hybrid import HybridPool

    pool = HybridPool(20, 4, (PoolGroup("full"), PoolGroup("state")), state_mode="align",
                      enable_prefix_caching=False)
    pool.allocate("a", 6)
    page = int(pool.block_tables("a")[1][1])
    pool.append("a", 7)
    state = pool.block_tables("a")[1]
    assert (state >= 0).tolist() == [False, False, True, True] and page not in state.tolist()
    assert pool.pools[1].seqs["a"].table[1] == page


def test_none_moves_the_state_page_in_place():
    """Mode none, B = 4: after 4 tokens the state is in page 0; appending token 4 moves it to logical page 1 as the
    same physical block (vLLM's one state block a request, updated in place): no copy, page 0's entry NULL, and the
    executor resumes from the table's last entry (an earlier version freed page 0 with no copy: hybrid-ragged in
    none had 90 tokens differ; then it copied page 0 -> page 1 and held both for a step)."""
    from kvcalc.core.pool.hybrid import HybridPool

    pool = HybridPool(20, 4, (PoolGroup("full"), PoolGroup("state")), state_mode="none",
                      enable_prefix_caching=False)
    pool.allocate("a", 4)
    old = int(pool.block_tables("a")[1][0])
    copies = pool.append("a", 1)
    table = pool.block_tables("a")[1]
    assert copies == [] and table.tolist() == [-1, old] and pool.num_used == 2 + 1


# ---- speculative decoding ----------------------------------------------------------------------------------
def test_speculative_rewinds_the_state(weights):
    """K = 3 drafts a step, one in three corrupted: every rejected tail (rollbacks = rejected drafts) leaves the
    state page at the last accepted position, and the tokens are plain greedy decoding's."""
    result = run_hybrid_scenario(build_hybrid("hybrid-speculative", 256, 0), weights, seed=0)
    ev = result.events
    assert result.status == "passed" and result.mismatched_tokens == 0
    assert ev["rollbacks"] > 0 and ev["accepted_drafts"] > 0 and ev["state_rewinds"] > 0
    # every emitted token is an accepted draft or a verification's own next token: one per verifying step, plus
    # the first token each prompt's prefill samples
    assert ev["accepted_drafts"] < result.tokens_compared


def test_no_state_rewind_is_caught(weights):
    fault = HybridFault("no-state-rewind")
    result = run_hybrid_scenario(build_hybrid("hybrid-speculative", 256, 0), weights, seed=0, fault=fault)
    assert fault.fired > 0 and result.fault == "caught"
    assert "of another prefix" in result.first_content_error


def test_no_state_rewind_idle_without_drafts(weights):
    fault = HybridFault("no-state-rewind")
    result = run_hybrid_scenario(build_hybrid("hybrid-forks", 256, 0), weights, seed=0, fault=fault)
    assert fault.fired == 0 and result.fault == "not exercised"


@pytest.mark.parametrize("mode", ["none", "align"])
def test_every_state_mode_under_chunked_prefill(mode, weights):
    """hybrid-ragged (prompts up to 40 tokens) under a 7-token budget — chunks resume mid-block and across blocks —
    with one running state page (none) or it and the last saved one (align): tokens identical, content clean."""
    from dataclasses import replace

    chunked = SchedulerConfig(max_batched_tokens=7, max_seqs=64, max_model_len=1024)
    scenario = replace(build_hybrid("hybrid-ragged", 256, 0), state_mode=mode, scheduler=chunked)
    result = run_hybrid_scenario(scenario, weights, seed=0)
    assert result.status == "passed", result.to_dict()
    assert result.events["prefill_chunks"] > 0 and result.mismatched_tokens == 0


# ---- a property: any small workload, any state mode, budget and preemption mode --------------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 10)), min_size=1, max_size=4),
       shared=st.integers(0, 12), budget=st.integers(3, 64), mode=st.sampled_from(["all", "align", "none"]),
       preempt=st.sampled_from(["recompute", "swap"]), caching=st.booleans(), slack=st.integers(1, 10))
def test_any_workload_decodes_exactly(weights, lengths, shared, budget, mode, preempt, caching, slack):
    """Prompts sharing a prefix of `shared` tokens, each with its own suffix, arriving a step apart, under any step
    budget and a pool of 1..10 blocks more than the policy's peak for the longest request (pressure: about a third
    of such runs preempt): fp32 tokens identical to the reference, the content check clean, the invariants held,
    the pool whole at the end. (Slack 0 runs into the mode-none bug below.)"""
    rng = np.random.default_rng(len(lengths) * 1000 + shared)
    prefix = tuple(int(t) for t in rng.integers(0, 256, shared))
    prompts = [prefix + tuple(int(t) for t in rng.integers(0, 256, n)) for n, _ in lengths]
    new = [m for _, m in lengths]
    sched = SchedulerConfig(max_batched_tokens=budget, max_seqs=8, max_model_len=1024, preempt=preempt)
    probe = HybridExactPolicy(1000, 4, hybrid_pool_groups(weights), mode, 1, None, budget)
    peak = max(probe.peak_blocks(len(p) + m - 1) for p, m in zip(prompts, new, strict=True))
    scenario = HybridScenario("property", (), peak + slack, _requests(prompts, new, list(range(len(prompts)))),
                              scheduler=sched, prefix_caching=caching, state_mode=mode)
    result = run_hybrid_scenario(scenario, weights, seed=0)
    assert result.status == "passed", result.to_dict()


# ---- found by the property above in the hybrid pool / policy (H5's, in progress): reproductions ------------------
def test_none_request_at_its_peak_finishes(weights):
    """Prompt 1 token, 5 new, B = 4, budget 3, mode none: at position 4 the state moves from page 0 to page 1 in place
    (one state page a request, as vLLM's block of max_model_len), so peak_blocks = full 2 + sliding 2 + state 1 = 5
    (an earlier pool held both pages for that step, peak 6, while peak_blocks counted 5: the request preempted
    itself and the engine stopped with "a step with nothing scheduled"). In 5 blocks it finishes; in 4 it is
    rejected up front, never admitted."""
    sched = SchedulerConfig(max_batched_tokens=3, max_seqs=8, max_model_len=1024)
    probe = HybridExactPolicy(1000, 4, hybrid_pool_groups(weights), "none", 1, None, 3)
    assert probe.peak_blocks(5) == 5
    scenario = HybridScenario("none-peak", (), 5, _requests([(1,)], [5], [0]), scheduler=sched, state_mode="none")
    result = run_hybrid_scenario(scenario, weights, seed=0)
    assert result.status == "passed", result.error
    too_small = HybridScenario("none-peak", (), 4, _requests([(1,)], [5], [0]), scheduler=sched, state_mode="none")
    result = run_hybrid_scenario(too_small, weights, seed=0)
    assert result.steps == 0 and result.first_mismatch["test_token"] is None  # rejected, not preempted for ever


def test_recompute_with_prefix_caching_readmits(weights):
    """Three prompts (36, 30, 15 tokens; a shared 7-token prefix) with prefix caching, recompute, budget 28, in 38
    blocks (30 is the longest request's peak): one preemption; the re-admission raises inside HybridPool.allocate
    (37 and 39 blocks pass)."""
    rng = np.random.default_rng(3 * 1000 + 7)
    prefix = tuple(int(t) for t in rng.integers(0, 256, 7))
    prompts = [prefix + tuple(int(t) for t in rng.integers(0, 256, n)) for n in (29, 23, 8)]
    sched = SchedulerConfig(max_batched_tokens=28, max_seqs=8, max_model_len=1024)
    scenario = HybridScenario("readmit", (), 38, _requests(prompts, [2, 6, 8], [0, 1, 2]), scheduler=sched,
                              prefix_caching=True)
    result = run_hybrid_scenario(scenario, weights, seed=0)
    assert result.status == "passed", result.error
