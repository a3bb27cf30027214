"""The reference path: one request alone, a contiguous KV cache per layer, no pool, no batching.

    cache.k[layer], cache.v[layer]   [max_len, num_kv_heads, head_dim]   positions 0..num_tokens-1 live

`contiguous_forward` appends T tokens at positions num_tokens.. and returns the logits of every one
(a prefill when T > 1, a decode step when T = 1); `reference_generate` prefills a prompt (whole, or in
chunks) and decodes token by token, returning each output token with the logits it was drawn from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .attention import causal_attention
from .config import ModelConfig, torch_dtype
from .layers import forward_hidden, lm_logits
from .sampling import GREEDY, SamplingParams, sample_token
from .weights import ModelWeights


@dataclass
class ContiguousKVCache:
    k: tuple[torch.Tensor, ...]  # per layer [max_len, num_kv_heads, head_dim]
    v: tuple[torch.Tensor, ...]
    num_tokens: int = 0

    @property
    def max_len(self) -> int:
        return self.k[0].shape[0]


def allocate_contiguous_kv(
    config: ModelConfig, max_len: int, dtype: str = "fp32", device: str | torch.device = "cpu"
) -> ContiguousKVCache:
    shape = (max_len, config.num_kv_heads, config.head_dim)
    kw = {"dtype": torch_dtype(dtype), "device": device}
    return ContiguousKVCache(
        k=tuple(torch.zeros(shape, **kw) for _ in range(config.num_layers)),
        v=tuple(torch.zeros(shape, **kw) for _ in range(config.num_layers)),
    )


def attend_alone(cache: ContiguousKVCache, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
    """One request's attention in one layer: its new k, v [T, Hkv, D] stored at positions num_tokens.. of its
    own cache (num_tokens moves on after the last layer), then q [T, Hq, D] causally over that cache alone."""
    start = cache.num_tokens
    end = start + q.shape[0]
    cache.k[layer][start:end] = k
    cache.v[layer][start:end] = v
    return causal_attention(q, cache.k[layer][:end], cache.v[layer][:end], positions)


def contiguous_forward(weights: ModelWeights, cache: ContiguousKVCache, token_ids: Sequence[int],
                       last_only: bool = False) -> torch.Tensor:
    """Appends token_ids (T of them) to the cache -> logits [T, vocab] float32, row t predicting the
    token after position num_tokens + t ([1, vocab], the last row, with `last_only`: a prefill's other rows
    cost a vocabulary-wide GEMM each and are not sampled)."""
    start, end = cache.num_tokens, cache.num_tokens + len(token_ids)
    if len(token_ids) == 0 or end > min(cache.max_len, weights.config.max_position):
        raise ValueError(
            f"{len(token_ids)} tokens after {start} do not fit max_len {cache.max_len} "
            f"(max_position {weights.config.max_position}); pass 1.. tokens and a larger cache"
        )
    device = weights.device
    ids = torch.as_tensor(list(token_ids), dtype=torch.int64, device=device)  # [T]
    positions = torch.arange(start, end, dtype=torch.int64, device=device)  # [T]

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attend_alone(cache, layer, q, k, v, positions)

    hidden = forward_hidden(weights, ids, positions, attend)  # [T, hidden]
    cache.num_tokens = end
    return lm_logits(weights, hidden[-1:] if last_only else hidden)


@dataclass(frozen=True)
class Generation:
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    logits: torch.Tensor  # [num_output, vocab] float32: row i is the distribution output i was drawn from


def reference_generate(
    weights: ModelWeights,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    sampling: SamplingParams = GREEDY,
    prefill_chunk_tokens: int | None = None,
) -> Generation:
    """Decodes one request alone: prefill (in chunks of prefill_chunk_tokens if given), then
    max_new_tokens - 1 decode steps; output token i is sampled at position len(prompt) + i."""
    if not prompt_ids or max_new_tokens < 1:
        raise ValueError(f"need a non-empty prompt and max_new_tokens >= 1, got {len(prompt_ids)} and {max_new_tokens}")
    cache = allocate_contiguous_kv(
        weights.config, len(prompt_ids) + max_new_tokens, weights.dtype, weights.device
    )
    chunk = prefill_chunk_tokens or len(prompt_ids)
    for start in range(0, len(prompt_ids), chunk):
        logits = contiguous_forward(weights, cache, prompt_ids[start : start + chunk], last_only=True)
    rows, outputs = [], []
    while True:
        row = logits[-1]  # [vocab]
        outputs.append(sample_token(row, sampling, cache.num_tokens))
        rows.append(row)
        if len(outputs) == max_new_tokens:
            break
        logits = contiguous_forward(weights, cache, outputs[-1:])
    return Generation(tuple(prompt_ids), tuple(outputs), torch.stack(rows))
