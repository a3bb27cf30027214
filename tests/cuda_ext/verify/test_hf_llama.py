"""The independent check: our weights in Hugging Face transformers' LlamaForCausalLM (built from a config,
no download) give the same logits, and transformers' own paged, continuously batched `generate_batch`
gives the same greedy tokens as our contiguous reference. Skipped when transformers is not installed
(a test dependency only: kvcalc runs without it)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kvcalc.cuda_ext.verify.config import ModelConfig  # noqa: E402
from kvcalc.cuda_ext.verify.contiguous import (  # noqa: E402
    allocate_contiguous_kv,
    contiguous_forward,
    reference_generate,
)
from kvcalc.cuda_ext.verify.weights import init_weights, to_hf_llama_state_dict  # noqa: E402

FP32_LOGIT_TOL = 1e-5
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 40)), [200]]
NEW_TOKENS = 8

CONFIGS = {
    "tied": ModelConfig(),
    "untied-3-layers-rope-5e5": ModelConfig(tie_word_embeddings=False, num_layers=3, rope_theta=500000.0),
    "mha-head-dim-32": ModelConfig(num_q_heads=4, num_kv_heads=4, head_dim=32, hidden_size=96),
}


def hf_llama(config: ModelConfig, weights):
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_q_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        max_position_embeddings=config.max_position,
        tie_word_embeddings=config.tie_word_embeddings,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="eager",
    )
    model = transformers.LlamaForCausalLM(hf_config).eval()
    result = model.load_state_dict(to_hf_llama_state_dict(weights), strict=False)
    tied = ["lm_head.weight"] if config.tie_word_embeddings else []
    assert (result.missing_keys, result.unexpected_keys) == (tied, [])
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr() or not tied
    return model


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request):
    config = CONFIGS[request.param]
    weights = init_weights(config, seed=11)
    return weights, hf_llama(config, weights)


def test_same_logits_as_hf_llama_fp32(pair):
    weights, model = pair
    for seq in ([5, 9, 200, 3], list(range(40)), PROMPTS[2] + [17] * 20):
        with torch.no_grad():
            theirs = model(torch.tensor([seq])).logits[0]  # [T, vocab]
        ours = contiguous_forward(weights, allocate_contiguous_kv(weights.config, len(seq)), seq)
        diff = float((theirs - ours).abs().max())
        assert diff <= FP32_LOGIT_TOL, f"max |Δlogit| {diff:.3g} over {len(seq)} positions"


def test_hf_continuous_batching_gives_our_greedy_tokens(pair, caplog):
    weights, model = pair
    generation = transformers.GenerationConfig(
        max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    # Small pages and a small token budget: several pages per request and prefill spread over steps.
    paging = transformers.ContinuousBatchingConfig(page_size=4, num_blocks=64, max_batch_tokens=16)
    implementations = []  # one entry per forward pass, read from the first attention layer
    hook = model.model.layers[0].self_attn.register_forward_hook(
        lambda *_: implementations.append(model.config._attn_implementation)
    )
    try:
        with caplog.at_level(logging.CRITICAL):  # it logs an error when psutil is absent (a memory report only)
            results = model.generate_batch(PROMPTS, generation_config=generation, continuous_batching_config=paging,
                                           warmup=False)
    finally:
        hook.remove()
    assert set(implementations) == {"paged|eager"}  # its paged attention over its paged KV cache ...
    assert len(implementations) < len(PROMPTS) * NEW_TOKENS  # ... with requests batched in the forward passes
    assert len(results) == len(PROMPTS)
    for prompt, result in zip(PROMPTS, results.values(), strict=True):
        assert result.error is None
        assert tuple(result.generated_tokens) == reference_generate(weights, prompt, NEW_TOKENS).output_ids
