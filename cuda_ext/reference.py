"""Pure-torch references for decode attention: paged (gather through the block table) and contiguous.

Layouts (the same as the CUDA extension, see csrc/decode_params.h):

    q             [batch, num_q_heads, head_dim]
    paged:        k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim]
                  block_tables [batch, max_blocks_per_seq] int32 (physical block ids)
    contiguous:   k, v [batch, max_len, num_kv_heads, head_dim]
    seq_lens      [batch] int32
    out           [batch, num_q_heads, head_dim]

Query head h attends with KV head h // group (group = num_q_heads // num_kv_heads). A sequence of
length 0 gives zeros. Computation is in `compute_dtype` (float64 by default, float32 allowed).
"""

from __future__ import annotations

import math

import torch


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def gather_paged_kv(
    cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int | None = None
) -> torch.Tensor:
    """[num_blocks, block_size, H, D] + tables -> contiguous [batch, max_len, H, D]; positions past a
    sequence's length are zero (they are never read through the table)."""
    block_size = cache.shape[1]
    batch = block_tables.shape[0]
    lens = seq_lens.to(torch.int64).cpu()
    max_len = int(lens.max().item()) if max_len is None and batch > 0 else (max_len or 0)
    positions = torch.arange(max_len, dtype=torch.int64)
    live = positions[None, :] < lens[:, None]  # [batch, max_len]
    logical = (positions // block_size).clamp(max=max(block_tables.shape[1] - 1, 0))
    physical = block_tables.to(torch.int64).cpu()[:, logical] if block_tables.shape[1] else torch.zeros(
        batch, max_len, dtype=torch.int64
    )
    physical = torch.where(live, physical, torch.zeros_like(physical))
    flat = cache.reshape(-1, *cache.shape[2:])
    slots = (physical * block_size + positions[None, :] % block_size).to(cache.device)
    gathered = flat[slots.reshape(-1)].reshape(batch, max_len, *cache.shape[2:])
    return gathered * live.to(cache.device)[:, :, None, None].to(gathered.dtype)


def decode_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Contiguous decode attention: q [B, Hq, D], k/v [B, T, Hkv, D], seq_lens [B] -> [B, Hq, D]."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    group = num_q_heads // num_kv_heads
    scale = default_scale(head_dim) if scale is None else scale
    qf = q.to(compute_dtype).reshape(batch, num_kv_heads, group, head_dim)
    kf = k.to(compute_dtype)
    vf = v.to(compute_dtype)
    scores = torch.einsum("bhgd,bthd->bhgt", qf, kf) * scale  # [B, Hkv, G, T]
    positions = torch.arange(k.shape[1], device=q.device)
    live = positions[None, :] < seq_lens.to(q.device).to(torch.int64)[:, None]  # [B, T]
    scores = scores.masked_fill(~live[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # an empty row (length 0) is all -inf -> NaN -> zeros
    out = torch.einsum("bhgt,bthd->bhgd", probs, vf)
    return out.reshape(batch, num_q_heads, head_dim)


def paged_decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Paged decode attention: gathers K and V through the block table, then the contiguous reference.

    NOTE: the gather spans the table's whole capacity (max_blocks_per_seq x block_size), the T of the
    contiguous layout, so both references reduce over the same shapes in the same order and agree bit for
    bit on any CPU. Gathering only to the longest length changes T, and with it how BLAS/ATen split the
    float32 sums (differences of 1e-6..1e-4 seen on other CPUs)."""
    capacity = block_tables.shape[1] * k_cache.shape[1]
    k = gather_paged_kv(k_cache, block_tables, seq_lens, capacity)
    v = gather_paged_kv(v_cache, block_tables, seq_lens, capacity)
    return decode_attention_reference(q, k, v, seq_lens, scale, compute_dtype)
