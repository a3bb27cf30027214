"""The model's spec, its seeded weights, its building blocks against closed forms, and the comparison rules."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.verify.compare import first_mismatch, top_k_ids, top_k_rule  # noqa: E402
from kvcalc.cuda_ext.verify.config import ModelConfig  # noqa: E402
from kvcalc.cuda_ext.verify.layers import apply_rope, rms_norm, rope_cos_sin  # noqa: E402
from kvcalc.cuda_ext.verify.weights import init_weights, to_hf_llama_state_dict  # noqa: E402


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_q_heads": 6, "num_kv_heads": 4}, "not a multiple of num_kv_heads 4"),
        ({"head_dim": 33}, "must be even"),
        ({"num_layers": 0}, "num_layers must be a positive integer"),
        ({"rope_theta": 0.0}, "must be positive"),
    ],
)
def test_bad_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**kwargs)


def test_weights_are_a_function_of_the_seed():
    cfg = ModelConfig()
    a, b, c = init_weights(cfg, seed=1), init_weights(cfg, seed=1), init_weights(cfg, seed=2)
    assert torch.equal(a.layers[1].w_down, b.layers[1].w_down) and torch.equal(a.embedding, b.embedding)
    assert not torch.equal(a.layers[1].w_down, c.layers[1].w_down)
    assert a.lm_head is a.embedding  # tied by default
    bf16 = init_weights(cfg, seed=1, dtype="bf16")
    assert bf16.layers[0].wq.dtype == torch.bfloat16
    assert torch.equal(bf16.layers[0].wq, a.layers[0].wq.to(torch.bfloat16))  # the same draws, cast
    # Shapes as nn.Linear stores them: [out, in].
    assert a.layers[0].wq.shape == (4 * 64, 128) and a.layers[0].wk.shape == (2 * 64, 128)
    assert a.layers[0].wo.shape == (128, 4 * 64) and a.layers[0].w_down.shape == (128, 256)
    with pytest.raises(ValueError, match="dtype 'fp8'"):
        init_weights(cfg, dtype="fp8")


def test_hf_names_cover_every_tensor_once():
    untied = init_weights(ModelConfig(tie_word_embeddings=False, num_layers=3))
    state = to_hf_llama_state_dict(untied)
    assert len(state) == 2 + 9 * 3 + 1  # embed, final norm, 9 per layer, lm_head
    assert state["model.layers.2.mlp.down_proj.weight"] is untied.layers[2].w_down
    assert "lm_head.weight" not in to_hf_llama_state_dict(init_weights(ModelConfig()))


def test_rms_norm_and_rope_against_closed_forms():
    x = torch.tensor([[3.0, 4.0]])  # rms = sqrt((9 + 16) / 2) = 3.5355
    out = rms_norm(x, torch.tensor([1.0, 2.0]), eps=0.0)
    assert torch.allclose(out, torch.tensor([[3.0 / 3.5355339, 8.0 / 3.5355339]]))
    # head_dim 2 has one frequency, 1: position p rotates (x0, x1) by p radians.
    cos, sin = rope_cos_sin(torch.tensor([0, 1, 2]), head_dim=2, theta=10000.0)
    rotated = apply_rope(torch.tensor([[[1.0, 0.0]]] * 3), cos, sin)  # [3, 1, 2]
    expected = torch.tensor([[[math.cos(p), math.sin(p)]] for p in range(3)])
    assert torch.allclose(rotated, expected, atol=1e-6)
    # head_dim 4: frequencies 1 and theta^(-1/2) = 0.01.
    cos4, _ = rope_cos_sin(torch.tensor([3]), head_dim=4, theta=10000.0)
    assert torch.allclose(cos4[0], torch.tensor([math.cos(3), math.cos(0.03), math.cos(3), math.cos(0.03)]))


def test_top_k_ids_and_the_rule():
    logits = torch.tensor([0.5, 2.0, 1.0, 2.0, -1.0])
    assert top_k_ids(logits, 1) == {1, 3}  # tied with the best
    assert top_k_ids(logits, 3) == {1, 2, 3}
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5, 3]) == 1 and first_mismatch([1, 2], [1, 2, 3]) == 2
    ref_logits = torch.tensor([[0.0, 9.0, 0.0, 0.0], [0.0, 3.0, 2.9, -5.0]])
    test_logits = torch.tensor([[0.0, 9.0, 0.0, 0.0], [0.0, 2.9, 3.0, -5.0]])
    near_tie = top_k_rule([1, 1], ref_logits, [1, 2], test_logits, k=2)
    assert near_tie.passed and (near_tie.first_mismatch, near_tie.reference_token, near_tie.test_token) == (1, 1, 2)
    assert not top_k_rule([1, 1], ref_logits, [1, 3], test_logits, k=2).passed  # 3 is last on both sides
    assert top_k_rule([1, 1], ref_logits, [1, 1], test_logits, k=1).first_mismatch is None
