"""The transformer body, shared by the contiguous and the paged path: they differ only in `attend`.

    token_ids [N] ─ embedding ─▶ x [N, hidden]
    per layer:  x += o_proj(attend(i, rope(q), rope(k), v))      q [N, Hq, D], k/v [N, Hkv, D]
                x += down(silu(gate(h)) * up(h)),  h = rms_norm(x)
    rms_norm(x) ─ lm_head ─▶ logits [M, vocab] (float32), M = the rows asked for

`attend(layer_index, q, k, v)` owns the KV cache: it stores k and v of the N new tokens, then returns
the attention output [N, Hq, D] of each query over its own sequence's context, causally. The N tokens
may belong to one request (contiguous path) or to several (paged path, "flat tokens").

The math follows Hugging Face's Llama (rotate-half RoPE, RMSNorm in float32 then cast, F.linear), so
the same weights give the same logits there. RoPE is applied in float32 and cast back to the model dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .weights import ModelWeights

AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [N, hidden] -> [N, hidden]: normalised in float32, cast back, then scaled."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [N] -> cos, sin [N, head_dim] float32; frequency j is theta^(-2j/head_dim), repeated for
    both halves of the head (the rotate-half layout)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponent)  # [head_dim / 2]
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device)[None, :]  # [N, head_dim / 2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [N, head_dim]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] rotated by position: x * cos + rotate_half(x) * sin, in float32."""
    xf = x.to(torch.float32)
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


def forward_hidden(
    weights: ModelWeights, token_ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn
) -> torch.Tensor:
    """token_ids [N], positions [N] -> final-normed hidden states [N, hidden]."""
    cfg = weights.config
    num_tokens = token_ids.shape[0]
    assert token_ids.dim() == 1 and positions.shape == (num_tokens,), (
        f"token_ids {tuple(token_ids.shape)} and positions {tuple(positions.shape)} must both be [N]"
    )
    x = weights.embedding[token_ids]  # [N, hidden]
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)  # [N, head_dim]
    for i, layer in enumerate(weights.layers):
        h = rms_norm(x, layer.attn_norm, cfg.rms_norm_eps)
        q = F.linear(h, layer.wq).view(num_tokens, cfg.num_q_heads, cfg.head_dim)  # [N, Hq, D]
        k = F.linear(h, layer.wk).view(num_tokens, cfg.num_kv_heads, cfg.head_dim)  # [N, Hkv, D]
        v = F.linear(h, layer.wv).view(num_tokens, cfg.num_kv_heads, cfg.head_dim)  # [N, Hkv, D]
        out = attend(i, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        assert out.shape == q.shape, f"attend returned {tuple(out.shape)}, expected {tuple(q.shape)}"
        x = x + F.linear(out.reshape(num_tokens, cfg.q_width), layer.wo)
        h = rms_norm(x, layer.mlp_norm, cfg.rms_norm_eps)
        x = x + F.linear(F.silu(F.linear(h, layer.w_gate)) * F.linear(h, layer.w_up), layer.w_down)
    return rms_norm(x, weights.final_norm, cfg.rms_norm_eps)


def lm_logits(weights: ModelWeights, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [M, hidden] -> logits [M, vocab] float32."""
    return F.linear(hidden, weights.lm_head).to(torch.float32)
