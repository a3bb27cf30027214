"""A hand-run stand-in for the scheduler and the pool: every sequence in every step, blocks in a shuffled
physical order, so the paged path can be compared with the contiguous reference without core/.

torch is imported inside the helpers, so collecting this folder without torch still skips cleanly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest


@dataclass
class PagedRun:
    """What `decode_paged` produced per sequence: outputs and the logits each was drawn from."""

    outputs: list[list[int]]
    logits: list[list[Any]] = field(default_factory=list)  # per sequence, rows [vocab]
    tables: list[tuple[int, ...]] = field(default_factory=list)


def shuffled_tables(
    lengths: Sequence[int], block_size: int, num_blocks: int, seed: int
) -> list[tuple[int, ...]]:
    """Disjoint block tables covering each length, ids drawn from a seeded permutation of the pool."""
    import torch

    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    tables, used = [], 0
    for length in lengths:
        n = -(-length // block_size)
        tables.append(tuple(order[used : used + n]))
        used += n
    assert used <= num_blocks, f"{used} blocks needed, the pool has {num_blocks}"
    return tables


def poisoned_paged_kv(config, num_blocks: int, block_size: int, dtype: str = "fp32", device: Any = "cpu"):
    """A paged cache full of finite garbage: a read of a slot nobody wrote changes the logits."""
    import torch

    from kvcalc.cuda_ext.verify.paged import allocate_paged_kv

    kv = allocate_paged_kv(config, num_blocks, block_size, dtype, device)
    gen = torch.Generator().manual_seed(1234)
    for t in (*kv.k, *kv.v):
        t.copy_(torch.randn(t.shape, generator=gen) * 30)
    return kv


def decode_paged(
    weights,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    block_size: int,
    *,
    prefill_chunk_tokens: int | None = None,
    sampling: Sequence[Any] | None = None,
    layout_seed: int = 0,
    num_blocks: int | None = None,
    attention_backend: str = "torch-reference",
) -> PagedRun:
    """Decodes all prompts together through `paged_forward`: each step carries every unfinished sequence,
    its next prefill chunk or its one decode token, so prefill chunks and decodes share batches."""
    from kvcalc.cuda_ext.verify.paged import paged_forward
    from kvcalc.cuda_ext.verify.paged_batch import SequenceChunk, build_paged_batch
    from kvcalc.cuda_ext.verify.sampling import GREEDY, sample_token

    cfg = weights.config
    lengths = [len(p) + max_new_tokens for p in prompts]
    num_blocks = num_blocks or sum(-(-n // block_size) for n in lengths) + 3
    kv = poisoned_paged_kv(cfg, num_blocks, block_size, weights.dtype, weights.device)
    tables = shuffled_tables(lengths, block_size, num_blocks, layout_seed)
    sampling = sampling or [GREEDY] * len(prompts)
    tokens = [list(p) for p in prompts]
    computed = [0] * len(prompts)
    run = PagedRun(outputs=[[] for _ in prompts], logits=[[] for _ in prompts], tables=tables)
    while True:
        live = [i for i in range(len(prompts)) if len(run.outputs[i]) < max_new_tokens]
        if not live:
            return run
        chunks = []
        for i in live:
            end = len(tokens[i])
            if computed[i] < len(prompts[i]) and prefill_chunk_tokens:
                end = min(end, computed[i] + prefill_chunk_tokens)
            chunks.append(SequenceChunk(tuple(tokens[i][computed[i] : end]), computed[i], tables[i]))
        batch = build_paged_batch(chunks, block_size, weights.device)
        logits = paged_forward(weights, kv, batch, attention_backend=attention_backend)
        for row, i, chunk in zip(logits, live, chunks, strict=True):
            computed[i] += len(chunk.token_ids)
            if computed[i] == len(tokens[i]):  # the whole prompt is in: this row predicts the next token
                token = sample_token(row, sampling[i], computed[i])
                run.outputs[i].append(token)
                run.logits[i].append(row)
                tokens[i].append(token)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These tests run thousands of tiny ops: on a shared 2-core machine, torch's second intra-op thread
    spins and waits more than it works (measured: 46 s with 2 threads, 18 s with 1, under load)."""
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def harness() -> SimpleNamespace:
    """The helpers above, for tests (conftest modules cannot be imported under --import-mode=importlib)."""
    return SimpleNamespace(
        decode_paged=decode_paged, shuffled_tables=shuffled_tables, poisoned_paged_kv=poisoned_paged_kv
    )
