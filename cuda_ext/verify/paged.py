"""The path under test: a batched forward over a paged KV cache, and the pool's block copies and swaps.

    kv.k[layer], kv.v[layer]   [num_blocks, block_size, num_kv_heads, head_dim]   (the pool's blocks)

`paged_forward` runs the new tokens of several sequences together (a PagedBatch). In every layer it
first writes each new token's K/V into its slot, then attends each query token causally over its own
sequence's context through the block table:

* a sequence with one new token (decode): `attention.paged_decode`, batched over all such sequences,
  through the `attention_backend` seam ("torch-reference" or "cuda-kernel");
* a sequence with several (a prefill chunk, or tokens to verify): its context gathered through the
  table, then causal attention where the query at position p sees positions 0..p.

`copy_blocks` performs copy-on-write copies; `swap_out` / `swap_in` move blocks to and from host memory.
Each acts on every layer. The pool decides the block ids; nothing here allocates or frees a block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .attention import causal_attention, check_attention_backend, paged_decode
from .config import ModelConfig, torch_dtype
from .layers import forward_hidden, lm_logits
from .paged_batch import PagedBatch, validate_paged_batch
from .weights import ModelWeights


@dataclass(frozen=True)
class PagedKVCache:
    k: tuple[torch.Tensor, ...]  # per layer [num_blocks, block_size, num_kv_heads, head_dim]
    v: tuple[torch.Tensor, ...]

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[0]

    @property
    def block_size(self) -> int:
        return self.k[0].shape[1]


def allocate_paged_kv(
    config: ModelConfig, num_blocks: int, block_size: int, dtype: str = "fp32", device: str | torch.device = "cpu"
) -> PagedKVCache:
    if num_blocks < 1 or block_size < 1:
        raise ValueError(f"num_blocks {num_blocks} and block_size {block_size} must be >= 1")
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    kw = {"dtype": torch_dtype(dtype), "device": device}
    return PagedKVCache(
        k=tuple(torch.zeros(shape, **kw) for _ in range(config.num_layers)),
        v=tuple(torch.zeros(shape, **kw) for _ in range(config.num_layers)),
    )


def paged_forward(
    weights: ModelWeights,
    kv: PagedKVCache,
    batch: PagedBatch,
    *,
    attention_backend: str = "torch-reference",
    return_all_logits: bool = False,
    validate: bool = True,
) -> torch.Tensor:
    """One step -> logits [S, vocab] float32 for the last new token of each sequence (row s predicts the
    token at position seq_lens[s]), or [N, vocab] for every new token with return_all_logits."""
    cfg = weights.config
    check_attention_backend(attention_backend, cfg, kv.k[0].dtype, kv.k[0].device, kv.block_size)
    assert kv.k[0].dtype == weights.torch_dtype, f"KV cache is {kv.k[0].dtype}, weights {weights.torch_dtype}"
    if validate:
        validate_paged_batch(batch, kv.num_blocks, kv.block_size)
    starts = batch.query_start_loc.cpu().tolist()
    seq_lens = batch.seq_lens.cpu().tolist()
    decode_seqs = [s for s in range(batch.num_seqs) if starts[s + 1] - starts[s] == 1]
    chunk_seqs = [s for s in range(batch.num_seqs) if starts[s + 1] - starts[s] > 1]
    device = kv.k[0].device
    decode_rows = torch.tensor([starts[s] for s in decode_seqs], dtype=torch.int64, device=device)
    decode_index = torch.tensor(decode_seqs, dtype=torch.int64, device=device)
    decode_tables = batch.block_tables[decode_index].contiguous()  # [S_decode, max_blocks]
    decode_lens = batch.seq_lens[decode_index].contiguous()  # [S_decode]
    # a chunk's context, positions 0..seq_len-1, read through its block table: slot = table[p // B] * B + p % B
    chunk_slots = {}
    for s in chunk_seqs:
        context = torch.arange(seq_lens[s], dtype=torch.int64, device=device)
        chunk_slots[s] = batch.block_tables[s].to(torch.int64)[context // kv.block_size] * kv.block_size + (
            context % kv.block_size)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = kv.k[layer], kv.v[layer]
        k_cache.view(-1, cfg.num_kv_heads, cfg.head_dim)[batch.slot_mapping] = k  # write first: a query
        v_cache.view(-1, cfg.num_kv_heads, cfg.head_dim)[batch.slot_mapping] = v  # reads its own K/V too
        out = torch.empty_like(q)  # [N, Hq, D]
        if decode_seqs:
            out[decode_rows] = paged_decode(
                attention_backend, q[decode_rows], k_cache, v_cache, decode_tables, decode_lens
            )
        k_flat, v_flat = k_cache.view(-1, cfg.num_kv_heads, cfg.head_dim), v_cache.view(-1, cfg.num_kv_heads,
                                                                                        cfg.head_dim)
        for s in chunk_seqs:
            a, b = starts[s], starts[s + 1]  # the context [seq_len, Hkv, D] through the table
            out[a:b] = causal_attention(q[a:b], k_flat[chunk_slots[s]], v_flat[chunk_slots[s]], batch.positions[a:b])
        return out

    hidden = forward_hidden(weights, batch.token_ids, batch.positions, attend)  # [N, hidden]
    if not return_all_logits:
        hidden = hidden[batch.query_start_loc[1:].to(torch.int64) - 1]  # [S, hidden]
    return lm_logits(weights, hidden)


def _block_ids(kv: PagedKVCache, ids: Sequence[int], what: str) -> torch.Tensor:
    bad = [b for b in ids if not 0 <= b < kv.num_blocks]
    if bad:
        raise ValueError(f"{what} block ids {bad} lie outside 0..{kv.num_blocks - 1}")
    return torch.tensor(list(ids), dtype=torch.int64, device=kv.k[0].device)


def copy_blocks(kv: PagedKVCache, pairs: Sequence[tuple[int, int]]) -> None:
    """Copy-on-write: block src -> block dst for every (src, dst) pair, in every layer. All sources are
    read before any destination is written; a destination may appear once."""
    if not pairs:
        return
    dsts = [d for _, d in pairs]
    if len(set(dsts)) != len(dsts):
        raise ValueError(f"copy destinations {dsts} repeat a block")
    src = _block_ids(kv, [s for s, _ in pairs], "copy source")
    dst = _block_ids(kv, dsts, "copy destination")
    for cache in (*kv.k, *kv.v):
        cache[dst] = cache[src]


@dataclass(frozen=True)
class SwappedBlocks:
    """Blocks copied to host memory, in the order they were asked for."""

    k: tuple[torch.Tensor, ...]  # per layer [num_swapped, block_size, num_kv_heads, head_dim], CPU
    v: tuple[torch.Tensor, ...]

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[0]


def swap_out(kv: PagedKVCache, block_ids: Sequence[int]) -> SwappedBlocks:
    """Copies the blocks to the CPU (the pool may then hand the device blocks out again)."""
    ids = _block_ids(kv, block_ids, "swap-out")
    return SwappedBlocks(k=tuple(c[ids].cpu() for c in kv.k), v=tuple(c[ids].cpu() for c in kv.v))


def swap_in(kv: PagedKVCache, swapped: SwappedBlocks, block_ids: Sequence[int]) -> None:
    """Writes swapped blocks back, the i-th into block_ids[i] (usually other ids than they left from)."""
    if len(block_ids) != swapped.num_blocks or len(set(block_ids)) != len(block_ids):
        raise ValueError(f"swap-in needs {swapped.num_blocks} distinct block ids, got {list(block_ids)}")
    ids = _block_ids(kv, block_ids, "swap-in")
    for cache, host in zip((*kv.k, *kv.v), (*swapped.k, *swapped.v), strict=True):
        cache[ids] = host.to(cache.device)
