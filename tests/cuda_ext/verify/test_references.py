"""The references decoded together (references.py) are each request decoded alone (contiguous.reference_generate):
the same tokens, logits within the fp32 tolerance, a cache per request, and one decoding per (prompt, sampling)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.verify import references as refs  # noqa: E402
from kvcalc.cuda_ext.verify.config import ModelConfig  # noqa: E402
from kvcalc.cuda_ext.verify.contiguous import reference_generate  # noqa: E402
from kvcalc.cuda_ext.verify.sampling import GREEDY, SamplingParams  # noqa: E402
from kvcalc.cuda_ext.verify.scenarios import build  # noqa: E402
from kvcalc.cuda_ext.verify.verdict import fp32_logit_tolerance  # noqa: E402
from kvcalc.cuda_ext.verify.weights import init_weights  # noqa: E402


@pytest.fixture(scope="module")
def weights():
    return init_weights(ModelConfig(), seed=3)


def _jobs():
    # ragged prompt lengths (1 token to 3 blocks), different lengths to decode, greedy and seeded sampling
    rng = torch.Generator().manual_seed(5)
    prompts = [tuple(torch.randint(0, 256, (n,), generator=rng).tolist()) for n in (1, 7, 12, 3, 30, 5)]
    sampling = [GREEDY, SamplingParams(0.8, 20, 11), GREEDY, SamplingParams(1.0, 0, 12), GREEDY, GREEDY]
    return [(p, n, s) for p, n, s in zip(prompts, (9, 1, 6, 12, 4, 7), sampling, strict=True)]


def test_decoded_together_equals_each_alone(weights):
    jobs = _jobs()
    together = refs.generate_alone_together(weights, jobs)
    for (prompt, new, sampling), g in zip(jobs, together, strict=True):
        alone = reference_generate(weights, prompt, new, sampling)
        assert g.prompt_ids == alone.prompt_ids and g.output_ids == alone.output_ids and len(g.output_ids) == new
        assert g.logits.shape == alone.logits.shape
        tolerance = fp32_logit_tolerance(weights.config.num_layers, alone.logits.abs().max().item())
        assert (g.logits - alone.logits).abs().max().item() <= tolerance


def test_a_job_reads_only_its_own_cache(weights):
    # a job's decoding does not depend on which jobs run beside it: alone in the batch, or with five others
    jobs = _jobs()
    together = refs.generate_alone_together(weights, jobs)
    for i, job in enumerate(jobs):
        (single,) = refs.generate_alone_together(weights, [job])
        assert single.output_ids == together[i].output_ids
        assert torch.allclose(single.logits, together[i].logits, rtol=0, atol=1e-5)


def test_one_decoding_per_prompt_and_sampling_cut_to_each_length(weights):
    calls = []

    def counted(w, jobs):
        calls.append(list(jobs))
        return refs.generate_alone_together(w, jobs)

    shared = refs.References(weights, counted)
    prompt = (1, 2, 3, 4, 5)
    shared.prefetch([(prompt, 4, GREEDY), (prompt, 9, GREEDY), ((7, 8), 3, GREEDY)])
    assert [[(len(p), n) for p, n, _ in c] for c in calls] == [[(5, 9), (2, 3)]]  # the longest of each prompt
    short = shared.get(prompt, 4, GREEDY)
    assert len(calls) == 1 and short.output_ids == reference_generate(weights, prompt, 4).output_ids
    shared.get(prompt, 12, GREEDY)  # longer than decoded: decoded again, at the new length
    assert [(len(p), n) for p, n, _ in calls[-1]] == [(5, 12)]


def test_a_scenarios_rows_are_its_jobs(weights):
    scenario = build("cancel-reuse", weights.config.vocab_size, 0)
    reqs = scenario.requests
    jobs = refs.jobs_of(reqs, 0)
    assert len(jobs) == sum(reqs.num_samples)
    # row 0 and 1 are prompt 0's two samples; row 0 is cancelled after its cancellation point
    assert jobs[0][0] == jobs[1][0] == reqs.prompts[0] and jobs[0][1] == reqs.cancel_after[0]
    assert jobs[1][1] == reqs.max_new_tokens[0]
