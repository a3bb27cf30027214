"""FlexAttention's paged attention (torch's experimental PagedAttention) on the bench's paged inputs.

A comparison point for `kvcalc bench`, never a reference: it exists only where the installed torch has
`torch.nn.attention.flex_attention` and the experimental `PagedAttention`, and it needs a block size that
flex's kernels accept (its KV block size equals the page size). `flex_paged_op` returns None otherwise.

Layout: our paged cache [num_blocks, block_size, Hkv, D] viewed as flex's [1, Hkv, num_blocks * block_size, D];
the block tables become PagedAttention's page table and its physical-to-logical map; the logical mask
keeps kv positions below each sequence's length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .bench import DecodeInputs


def flex_paged_op(x: DecodeInputs, *, compile: bool = True, scale: float | None = None) -> Callable[[], Any] | None:
    """A closure that runs flex paged decode on `x` (make_inputs' DecodeInputs) -> out [B, Hq, 1, D], or None."""
    try:
        import torch
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    q, k_cache, v_cache = x.q, x.k_cache, x.v_cache
    tables, lens = x.block_tables.to(torch.int64), x.seq_lens.to(torch.int64)
    batch, _, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    if block_size < 16:  # flex's kernels tile KV in blocks of at least 16
        return None
    paged = PagedAttention(num_blocks, block_size, batch, device=str(q.device))
    paged.page_table[:, : tables.shape[1]] = tables
    rows, cols = (tables >= 0).nonzero(as_tuple=True)
    paged.physical_to_logical[rows, tables[rows, cols]] = cols

    def within_length(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return kv_idx < lens[b]

    logical = create_block_mask(within_length, batch, None, 1, tables.shape[1] * block_size, device=str(q.device),
                                BLOCK_SIZE=(128, block_size))
    physical = paged.convert_logical_block_mask(logical, kv_len=lens)
    k = k_cache.view(1, num_blocks * block_size, num_kv_heads, head_dim).transpose(1, 2)
    v = v_cache.view(1, num_blocks * block_size, num_kv_heads, head_dim).transpose(1, 2)
    run = torch.compile(flex_attention) if compile else flex_attention
    q4 = q.unsqueeze(2)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    return lambda: run(q4, k, v, block_mask=physical, scale=scale, enable_gqa=True)
