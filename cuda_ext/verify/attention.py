"""Attention for the verify model: causal attention over a gathered context (prefill chunks and the
contiguous path) and paged decode attention behind one seam, `attention_backend`.

Both compute in float32 whatever the model dtype and return the model dtype. Query head h reads KV
head h // group (Hugging Face's `repeat_kv` order, and the CUDA kernel's).

Backends for decode (one query token per sequence, the paged path only):

* "torch-reference": `cuda_ext.reference.paged_decode_attention_reference`, float32 — any device/dtype.
* "cuda-kernel": `cuda_ext.ops.paged_decode_attention`, the CUDA extension — a CUDA device, bf16/fp16,
  head_dim 64/128/256, block sizes that are powers of two up to 256. It accumulates in float32 too.
"""

from __future__ import annotations

import math

import torch

from ..reference import paged_decode_attention_reference
from .config import ModelConfig

ATTENTION_BACKENDS = ("torch-reference", "cuda-kernel")
_KERNEL_HEAD_DIMS = (64, 128, 256)
_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """q [T, Hq, D] at positions q_positions [T] over a context k, v [L, Hkv, D] (key j at position j):
    query t sees keys 0..q_positions[t]. -> [T, Hq, D] in q's dtype."""
    num_q, num_q_heads, head_dim = q.shape
    ctx_len, num_kv_heads, _ = k.shape
    assert v.shape == k.shape and k.shape[2] == head_dim, f"k {tuple(k.shape)}, v {tuple(v.shape)}, q {tuple(q.shape)}"
    assert q_positions.shape == (num_q,), f"q_positions {tuple(q_positions.shape)}, expected [{num_q}]"
    group = num_q_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    qf = q.to(torch.float32).view(num_q, num_kv_heads, group, head_dim)  # [T, Hkv, G, D]
    scores = torch.einsum("thgd,lhd->hgtl", qf, k.to(torch.float32)) * scale  # [Hkv, G, T, L]
    key_positions = torch.arange(ctx_len, device=q.device)
    future = key_positions[None, :] > q_positions.to(q.device)[:, None]  # [T, L]
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    out = torch.einsum("hgtl,lhd->thgd", probs, v.to(torch.float32))  # [T, Hkv, G, D]
    return out.reshape(num_q, num_q_heads, head_dim).to(q.dtype)


def check_attention_backend(
    backend: str, config: ModelConfig, dtype: torch.dtype, device: torch.device, block_size: int
) -> None:
    """ValueError when `backend` cannot run this model on this device (says what would)."""
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend {backend!r} is unknown; use one of {', '.join(ATTENTION_BACKENDS)}")
    if backend != "cuda-kernel":
        return
    problems = []
    if device.type != "cuda":
        problems.append(f"device {device} is not CUDA")
    if dtype not in _KERNEL_DTYPES:
        problems.append(f"dtype {dtype} is not bf16/fp16")
    if config.head_dim not in _KERNEL_HEAD_DIMS:
        problems.append(f"head_dim {config.head_dim} is not one of {_KERNEL_HEAD_DIMS}")
    if block_size > 256 or block_size & (block_size - 1):
        problems.append(f"block_size {block_size} is not a power of two up to 256")
    if problems:
        raise ValueError(f"attention_backend 'cuda-kernel' cannot run: {'; '.join(problems)}; use 'torch-reference'")


def default_attention_backend(config: ModelConfig, dtype: torch.dtype, device: torch.device, block_size: int) -> str:
    """'cuda-kernel' where it can run (CUDA device, bf16/fp16, supported dims), else 'torch-reference'.
    Whether the extension builds is not checked here: the first call raises CudaUnavailableError if not."""
    try:
        check_attention_backend("cuda-kernel", config, dtype, device, block_size)
    except ValueError:
        return "torch-reference"
    return "cuda-kernel"


def paged_decode(
    backend: str,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    """One query per sequence: q [S, Hq, D] over k/v_cache [num_blocks, block_size, Hkv, D] through
    block_tables [S, max_blocks] int32 for seq_lens [S] int32 tokens -> [S, Hq, D] in q's dtype."""
    if backend == "cuda-kernel":
        from ..ops import paged_decode_attention

        return paged_decode_attention(q.contiguous(), k_cache, v_cache, block_tables, seq_lens)
    assert backend == "torch-reference", f"unchecked attention backend {backend!r}"
    out = paged_decode_attention_reference(q, k_cache, v_cache, block_tables, seq_lens, compute_dtype=torch.float32)
    return out.to(q.dtype)
