"""verify's hybrid model: full attention, sliding-window attention and a gated linear recurrence in one stack,
with its contiguous reference (one request alone, token by token, no pool).

    layer kinds (HYBRID_TINY):  full · sliding W=8 · recurrent · sliding W=8
    attention layers            as the Llama body of layers.py (RMSNorm, RoPE, GQA, SwiGLU MLP)
    sliding layer               position p attends to positions max(0, p − W + 1) .. p (W tokens, itself included)
    recurrent layer             a gated linear recurrence (a diagonal, Mamba-like SSM without its conv):
                                    a_t = sigmoid(W_a h_t + b_a)        decay per state channel, in (0, 1)
                                    s_t = a_t ⊙ s_{t−1} + (1 − a_t) ⊙ (W_u h_t)      s_{−1} = 0
                                    y_t = W_o (s_t ⊙ silu(W_g h_t))
                                the whole past of a sequence lives in s (S floats per layer): what a state
                                page of the pool holds, saved after the last token of its block

`hybrid_forward(weights, ids, positions, attend, recur)` runs the stack; the two paths differ only in their
callbacks: the reference keeps full K/V arrays and masks the window explicitly (`masked_attention`), and
carries the state in a plain tensor; the paged path (hybrid_executor.py) reads K/V and states only through
the per-group block tables of the pool. `recurrence` is the one step both use, so fp32 states agree bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import ModelConfig, torch_dtype
from .contiguous import Generation
from .layers import apply_rope, lm_logits, rms_norm, rope_cos_sin
from .sampling import GREEDY, SamplingParams, sample_token
from .weights import ModelWeights, init_weights

LAYER_KINDS = ("full", "sliding", "recurrent")
HYBRID_MODEL = "hybrid-tiny"


@dataclass(frozen=True)
class HybridConfig:
    """The Llama dimensions of `base` plus each layer's kind, the sliding window W and the state width S."""

    base: ModelConfig
    kinds: tuple[str, ...]
    window: int = 8
    state_size: int = 64

    def __post_init__(self) -> None:
        if len(self.kinds) != self.base.num_layers:
            raise ValueError(f"{len(self.kinds)} layer kinds for {self.base.num_layers} layers")
        bad = [k for k in self.kinds if k not in LAYER_KINDS]
        if bad:
            raise ValueError(f"layer kind {bad[0]!r}: choose one of {', '.join(LAYER_KINDS)}")
        if self.kinds[0] != "full":
            raise ValueError("layer 0 must be full attention (the scheduler's plans carry the full group's table)")
        if self.window < 1 or self.state_size < 1:
            raise ValueError(f"window {self.window} and state_size {self.state_size} must be positive")

    def layers_of(self, kind: str) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.kinds) if k == kind)

    def to_dict(self) -> dict:
        return {**self.base.to_dict(), "layer_kinds": list(self.kinds), "window": self.window,
                "state_size": self.state_size}


HYBRID_TINY = HybridConfig(
    ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=4, num_q_heads=4,
                num_kv_heads=2, head_dim=16, max_position=1024),
    ("full", "sliding", "recurrent", "sliding"), window=8, state_size=64)


@dataclass(frozen=True)
class RecurrentWeights:
    w_a: torch.Tensor  # [S, hidden]
    b_a: torch.Tensor  # [S]
    w_u: torch.Tensor  # [S, hidden]
    w_g: torch.Tensor  # [S, hidden]
    w_o: torch.Tensor  # [hidden, S]


@dataclass(frozen=True)
class HybridWeights:
    config: HybridConfig
    body: ModelWeights  # embedding, norms, MLPs and the attention projections (unused in recurrent layers)
    recurrent: dict[int, RecurrentWeights]  # layer index -> its recurrence

    @property
    def dtype(self) -> str:
        return self.body.dtype

    @property
    def device(self) -> torch.device:
        return self.body.device


def init_hybrid_weights(config: HybridConfig = HYBRID_TINY, seed: int = 0, dtype: str = "fp32",
                        device: str | torch.device = "cpu") -> HybridWeights:
    """The body from `init_weights(config.base, seed)`; the recurrences from their own generator (seed + 1):
    linear weights of std 1/sqrt(fan_in), decay biases N(1, 0.5²) so that a ≈ sigmoid(1) ≈ 0.73 (a state
    remembers a few blocks back, and a stale one changes the logits)."""
    body = init_weights(config.base, seed=seed, dtype=dtype, device=device)
    gen = torch.Generator(device="cpu").manual_seed(seed + 1)
    hidden, S = config.base.hidden_size, config.state_size

    def normal(*shape: int, std: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, dtype=torch.float32) * std).to(device, torch_dtype(dtype))

    recurrent = {}
    for i in config.layers_of("recurrent"):
        recurrent[i] = RecurrentWeights(
            w_a=normal(S, hidden, std=1 / math.sqrt(hidden)), b_a=1.0 + normal(S, std=0.5),
            w_u=normal(S, hidden, std=1 / math.sqrt(hidden)), w_g=normal(S, hidden, std=1 / math.sqrt(hidden)),
            w_o=normal(hidden, S, std=1 / math.sqrt(S)))
    return HybridWeights(config, body, recurrent)


# attend(layer, q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D]) -> [N, Hq, D]
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# recur(layer, a [N, S], x [N, S]) -> states [N, S]: s_t after each new token (reads and saves the state)
RecurFn = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


def recurrence(state: torch.Tensor, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One token: s_t = a ⊙ s_{t−1} + (1 − a) ⊙ x."""
    return a * state + (1 - a) * x


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
                     k_positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """q [T, Hq, D] at q_positions [T] over keys k, v [L, Hkv, D] at k_positions [L] -> [T, Hq, D]. A query at p
    sees a key at j iff j <= p and (no window or p − j < window); float32 scores and softmax."""
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    qf = q.to(torch.float32).view(T, Hkv, Hq // Hkv, D)
    scores = torch.einsum("thgd,lhd->hgtl", qf, k.to(torch.float32)) / math.sqrt(D)  # [Hkv, G, T, L]
    dist = q_positions[:, None] - k_positions[None, :]  # [T, L]
    hidden = dist < 0
    if window is not None:
        hidden |= dist >= window
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    out = torch.einsum("hgtl,lhd->thgd", probs, v.to(torch.float32))
    return out.reshape(T, Hq, D).to(q.dtype)


def hybrid_forward(weights: HybridWeights, token_ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn,
                   recur: RecurFn) -> torch.Tensor:
    """token_ids [N], positions [N] of one sequence's new tokens -> final-normed hidden states [N, hidden]."""
    cfg, body = weights.config.base, weights.body
    N = token_ids.shape[0]
    x = body.embedding[token_ids]
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
    for i, (kind, layer) in enumerate(zip(weights.config.kinds, body.layers, strict=True)):
        h = rms_norm(x, layer.attn_norm, cfg.rms_norm_eps)
        if kind == "recurrent":
            r = weights.recurrent[i]
            a = torch.sigmoid(F.linear(h, r.w_a, r.b_a))
            states = recur(i, a, F.linear(h, r.w_u))  # [N, S]
            x = x + F.linear(states * F.silu(F.linear(h, r.w_g)), r.w_o)
        else:
            q = F.linear(h, layer.wq).view(N, cfg.num_q_heads, cfg.head_dim)
            k = F.linear(h, layer.wk).view(N, cfg.num_kv_heads, cfg.head_dim)
            v = F.linear(h, layer.wv).view(N, cfg.num_kv_heads, cfg.head_dim)
            out = attend(i, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
            x = x + F.linear(out.reshape(N, cfg.q_width), layer.wo)
        h = rms_norm(x, layer.mlp_norm, cfg.rms_norm_eps)
        x = x + F.linear(F.silu(F.linear(h, layer.w_gate)) * F.linear(h, layer.w_up), layer.w_down)
    return rms_norm(x, body.final_norm, cfg.rms_norm_eps)


class ContiguousHybridCache:
    """One request's cache with no pool: full K/V arrays [max_len, Hkv, D] per attention layer (a sliding
    layer keeps every token too; its window is a mask), and each recurrent layer's state in a plain tensor."""

    def __init__(self, weights: HybridWeights, max_len: int) -> None:
        cfg = weights.config
        kw = {"dtype": weights.body.torch_dtype, "device": weights.device}
        shape = (max_len, cfg.base.num_kv_heads, cfg.base.head_dim)
        self.weights = weights
        self.k = {i: torch.zeros(shape, **kw) for i, kind in enumerate(cfg.kinds) if kind != "recurrent"}
        self.v = {i: torch.zeros(shape, **kw) for i in self.k}
        self.state = {i: torch.zeros(cfg.state_size, **kw) for i in cfg.layers_of("recurrent")}
        self.num_tokens = 0

    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Appends the tokens -> logits [1, vocab] of the last one."""
        cfg, device = self.weights.config, self.weights.device
        start, end = self.num_tokens, self.num_tokens + len(token_ids)
        positions = torch.arange(start, end, device=device)
        everything = torch.arange(end, device=device)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.k[layer][start:end], self.v[layer][start:end] = k, v
            window = cfg.window if cfg.kinds[layer] == "sliding" else None
            return masked_attention(q, self.k[layer][:end], self.v[layer][:end], positions, everything, window)

        def recur(layer: int, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            out = []
            for t in range(a.shape[0]):
                self.state[layer] = recurrence(self.state[layer], a[t], x[t])
                out.append(self.state[layer])
            return torch.stack(out)

        hidden = hybrid_forward(self.weights, torch.as_tensor(list(token_ids), device=device), positions,
                                attend, recur)
        self.num_tokens = end
        return lm_logits(self.weights.body, hidden[-1:])


def hybrid_reference_generate(weights: HybridWeights, prompt_ids: Sequence[int], max_new_tokens: int,
                              sampling: SamplingParams = GREEDY) -> Generation:
    """One request alone, token by token (the prompt too): output i is sampled at position len(prompt) + i."""
    if not prompt_ids or max_new_tokens < 1:
        raise ValueError(f"need a non-empty prompt and max_new_tokens >= 1, got {len(prompt_ids)} and {max_new_tokens}")
    cache = ContiguousHybridCache(weights, len(prompt_ids) + max_new_tokens)
    for token in prompt_ids:
        logits = cache.forward([token])
    rows, outputs = [], []
    while True:
        row = logits[-1]
        outputs.append(sample_token(row, sampling, cache.num_tokens))
        rows.append(row)
        if len(outputs) == max_new_tokens:
            break
        logits = cache.forward(outputs[-1:])
    return Generation(tuple(prompt_ids), tuple(outputs), torch.stack(rows))
