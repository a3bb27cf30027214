"""Seeded sampling draws from (request seed, position) alone, so batching cannot change a token."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.verify.config import ModelConfig  # noqa: E402
from kvcalc.cuda_ext.verify.contiguous import reference_generate  # noqa: E402
from kvcalc.cuda_ext.verify.sampling import SamplingParams, sample_token, sample_tokens, uniform_draw  # noqa: E402
from kvcalc.cuda_ext.verify.weights import init_weights  # noqa: E402

NEW_TOKENS = 8


def test_uniform_draw_is_a_pure_function_of_seed_and_position():
    draws = [uniform_draw(7, p) for p in range(1000)]
    assert draws == [uniform_draw(7, p) for p in range(1000)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert len(set(draws)) == 1000 and draws != [uniform_draw(8, p) for p in range(1000)]
    assert abs(sum(draws) / 1000 - 0.5) < 0.03  # mean of 1000 uniforms: std 0.009


def test_draws_follow_the_distribution_and_top_k():
    logits = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4, 1e-9]))
    params = SamplingParams(temperature=1.0, seed=3)
    counts = torch.bincount(torch.tensor([sample_token(logits, params, p) for p in range(4000)]), minlength=5)
    assert ((counts / 4000 - torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])).abs() < 0.025).all(), counts  # 3+ sigma
    top2 = SamplingParams(temperature=1.0, top_k=2, seed=3)
    assert {sample_token(logits, top2, p) for p in range(200)} == {2, 3}
    assert {sample_token(logits, SamplingParams(temperature=0.5, top_k=1, seed=s), 0) for s in range(20)} == {3}
    assert sample_token(logits, SamplingParams(), 0) == 3  # greedy


def test_a_row_samples_the_same_whatever_the_other_rows():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen)
    params = [SamplingParams(temperature=0.8, top_k=10, seed=100 + i) for i in range(6)]
    positions = [5, 9, 9, 30, 2, 17]
    together = sample_tokens(logits, params, positions)
    alone = [sample_tokens(logits[i : i + 1], params[i : i + 1], positions[i : i + 1])[0] for i in range(6)]
    reversed_rows = sample_tokens(logits.flip(0), params[::-1], positions[::-1])[::-1]
    assert together == alone == reversed_rows


def test_seeded_decoding_is_the_same_alone_and_in_any_batch(harness):
    weights = init_weights(ModelConfig(), seed=2)
    prompts = [[9, 8, 7, 6], [1, 2], list(range(20, 33)), [250, 251, 252]]
    params = [SamplingParams(temperature=1.0, top_k=20, seed=40 + i) for i in range(len(prompts))]
    alone = [reference_generate(weights, p, NEW_TOKENS, s).output_ids for p, s in zip(prompts, params, strict=True)]
    batched = harness.decode_paged(weights, prompts, NEW_TOKENS, 4, sampling=params)
    order = [2, 0, 3, 1]
    shuffled = harness.decode_paged(weights, [prompts[i] for i in order], NEW_TOKENS, 1, prefill_chunk_tokens=3,
                                    sampling=[params[i] for i in order], layout_seed=5)
    pair = harness.decode_paged(weights, [prompts[3], prompts[1]], NEW_TOKENS, 16, sampling=[params[3], params[1]])
    assert [tuple(o) for o in batched.outputs] == alone
    assert [tuple(shuffled.outputs[order.index(i)]) for i in range(4)] == alone
    assert [tuple(o) for o in pair.outputs] == [alone[3], alone[1]]
    # The draws are not greedy in disguise, and another seed gives another decoding.
    assert alone != [reference_generate(weights, p, NEW_TOKENS).output_ids for p in prompts]
    reseeded = SamplingParams(temperature=1.0, top_k=20, seed=999)
    assert reference_generate(weights, prompts[0], NEW_TOKENS, reseeded).output_ids != alone[0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"temperature": -1.0}, "temperature"), ({"top_k": -2}, "top_k"), ({"seed": -1}, "seed")],
)
def test_bad_sampling_params_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
