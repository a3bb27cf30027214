"""One decode step's inputs for `kvcalc bench` (bench.py): q, K/V in the paged and the contiguous layout with the
same values, the bytes a step moves, and the back-end interface that runs them.

Bytes moved per decode step (what `bytes` counts): K and V of every live token, q, out, the live
block-table entries and seq_lens. Achieved TB/s = bytes / paged time (1 TB = 1e12 bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


@dataclass(frozen=True)
class DecodeInputs:
    """One decode step's inputs in both layouts (make_inputs), the same K/V in each.

    q             [batch, num_q_heads, head_dim]
    k_cache       [num_blocks, block_size, num_kv_heads, head_dim]  the paged layout; v_cache the same
    block_tables  [batch, max_blocks] int32, physical block ids, unused entries -1
    seq_lens      [batch] int32
    k             [batch, max_len, num_kv_heads, head_dim]  the contiguous layout; v the same
    out           [batch, num_q_heads, head_dim] or None: where a timed run writes (no checks, no allocation);
                  None on untimed runs, which validate and allocate
    """

    q: Any
    k_cache: Any
    v_cache: Any
    block_tables: Any
    seq_lens: Any
    k: Any
    v: Any
    out: Any | None = None


def make_inputs(lens: list[int], num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: Any,
                device: Any, gen: Any) -> DecodeInputs:
    """Random q/K/V (standard normal) made on `device` with `gen` (a generator on that device), physical
    blocks in a random order, unused table entries -1, and the same K/V in the contiguous layout with
    max_len = the table capacity."""
    import torch

    from .reference import gather_paged_kv

    batch = len(lens)
    blocks = [math.ceil(n / block_size) for n in lens]
    max_blocks = max([*blocks, 1])
    num_blocks = sum(blocks) + 1
    order = torch.randperm(num_blocks, generator=gen, device=gen.device).cpu()
    tables = torch.full((batch, max_blocks), -1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = order[used:used + n].to(torch.int32)
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, dtype=dtype, device=device)
    v_cache = torch.randn(shape, generator=gen, dtype=dtype, device=device)
    q = torch.randn(batch, num_q_heads, head_dim, generator=gen, dtype=dtype, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    capacity = max_blocks * block_size
    return DecodeInputs(
        q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables.to(device), seq_lens=seq_lens.to(device),
        k=gather_paged_kv(k_cache, tables, seq_lens, capacity), v=gather_paged_kv(v_cache, tables, seq_lens, capacity),
    )


def bytes_moved(lens: list[int], num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int | None,
                elem_bytes: int = 2) -> int:
    """Unique bytes one decode step must move; `block_size` None: the contiguous layout (no block tables)."""
    kv = 2 * sum(lens) * num_kv_heads * head_dim * elem_bytes
    q_and_out = 2 * len(lens) * num_q_heads * head_dim * elem_bytes
    tables = 4 * sum(math.ceil(n / block_size) for n in lens) if block_size is not None else 0
    return kv + q_and_out + tables + 4 * len(lens)  # + seq_lens


class Backend:
    """Runs paged/contiguous decode for one input set; subclasses decide how and time it."""

    label: str

    def paged(self, x: DecodeInputs, num_splits: int | None) -> Any:
        raise NotImplementedError

    def contiguous(self, x: DecodeInputs, num_splits: int | None) -> Any:
        raise NotImplementedError
