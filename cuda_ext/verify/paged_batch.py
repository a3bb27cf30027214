"""The inputs of one paged forward step: the new tokens of several sequences, flattened (vLLM's model-runner layout).

    sequence s:   [ context already in the cache | q_len(s) new tokens ]        seq_len(s) = both together
                    positions 0 .. seq_len-q_len-1   seq_len-q_len .. seq_len-1

    token_ids        [N] int64     the new tokens of sequence 0, then of sequence 1, ...
    positions        [N] int64     each token's position in its sequence
    slot_mapping     [N] int64     where its K/V is written: block_table[pos // block_size] * block_size
                                   + pos % block_size (a flat index into [num_blocks * block_size])
    query_start_loc  [S+1] int32   sequence s owns tokens query_start_loc[s] .. query_start_loc[s+1]-1
    seq_lens         [S] int32     tokens in context after this step (the new ones included)
    block_tables     [S, max_blocks] int32   physical block ids in logical order, -1 where unused

A pool-driven executor fills these from its block tables; `build_paged_batch` does it from plain lists.
`validate_paged_batch` checks every relation above and raises InvalidPagedBatch (a RuntimeError: a bug
in whoever built the batch, not bad user input), e.g. two tokens written into one slot in one step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch


class InvalidPagedBatch(RuntimeError):
    """A paged step's inputs contradict each other or the KV cache (an executor or pool bug)."""


@dataclass(frozen=True)
class PagedBatch:
    token_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    slot_mapping: torch.Tensor  # [N] int64
    query_start_loc: torch.Tensor  # [S+1] int32
    seq_lens: torch.Tensor  # [S] int32
    block_tables: torch.Tensor  # [S, max_blocks] int32, -1 unused

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


@dataclass(frozen=True)
class SequenceChunk:
    """One sequence's share of a step, as a scheduler sees it."""

    token_ids: tuple[int, ...]  # the tokens computed this step (a prefill chunk, or one decode token)
    num_computed_tokens: int  # tokens of this sequence already in the KV cache
    block_table: tuple[int, ...]  # physical block ids, logical order; must cover the new tokens


def build_paged_batch(
    chunks: Sequence[SequenceChunk], block_size: int, device: str | torch.device = "cpu", max_blocks: int | None = None
) -> PagedBatch:
    """Flattens the chunks into a PagedBatch (block tables padded with -1 to max_blocks, default the longest)."""
    widest = max((len(c.block_table) for c in chunks), default=0)
    max_blocks = widest if max_blocks is None else max_blocks
    if max_blocks < widest:
        raise ValueError(f"max_blocks {max_blocks} is shorter than a block table of {widest} blocks")
    token_ids, positions, slots, starts, seq_lens, tables = [], [], [], [0], [], []
    for c in chunks:
        seq_len = c.num_computed_tokens + len(c.token_ids)
        if len(c.block_table) * block_size < seq_len:
            raise ValueError(f"a block table of {len(c.block_table)} x {block_size} slots cannot hold {seq_len} tokens")
        for pos, token in enumerate(c.token_ids, start=c.num_computed_tokens):
            token_ids.append(token)
            positions.append(pos)
            slots.append(c.block_table[pos // block_size] * block_size + pos % block_size)
        starts.append(len(token_ids))
        seq_lens.append(seq_len)
        tables.append(list(c.block_table) + [-1] * (max_blocks - len(c.block_table)))
    return PagedBatch(
        token_ids=torch.tensor(token_ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device).reshape(len(chunks), max_blocks),
    )


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidPagedBatch(message)


def validate_paged_batch(batch: PagedBatch, num_blocks: int, block_size: int) -> None:
    """Every relation in the module docstring, checked on the host (one copy of each tensor)."""
    n, s = batch.num_tokens, batch.num_seqs
    for name, t, dtype, shape in (
        ("token_ids", batch.token_ids, torch.int64, (n,)),
        ("positions", batch.positions, torch.int64, (n,)),
        ("slot_mapping", batch.slot_mapping, torch.int64, (n,)),
        ("query_start_loc", batch.query_start_loc, torch.int32, (s + 1,)),
        ("seq_lens", batch.seq_lens, torch.int32, (s,)),
    ):
        _expect(t.dtype == dtype and tuple(t.shape) == shape,
                f"{name} is {t.dtype} {tuple(t.shape)}, expected {dtype} {list(shape)}")
    tables = batch.block_tables.cpu()
    _expect(tables.dtype == torch.int32 and tables.dim() == 2 and tables.shape[0] == s,
            f"block_tables is {tables.dtype} {tuple(tables.shape)}, expected int32 [{s}, max_blocks]")
    starts = batch.query_start_loc.cpu().tolist()
    q_lens = [b - a for a, b in pairwise(starts)]
    _expect(starts[0] == 0 and starts[-1] == n and min(q_lens, default=1) >= 1,
            f"query_start_loc {starts} must rise strictly from 0 to {n} (every sequence computes >= 1 token)")
    positions, slots = batch.positions.cpu(), batch.slot_mapping.cpu()
    _expect(torch.unique(slots).numel() == n, "slot_mapping writes two tokens into one slot in one step")
    for i, seq_len in enumerate(batch.seq_lens.cpu().tolist()):
        a, b = starts[i], starts[i + 1]
        _expect(q_lens[i] <= seq_len <= tables.shape[1] * block_size,
                f"sequence {i}: seq_len {seq_len} must lie in {q_lens[i]}..{tables.shape[1] * block_size}")
        expected_pos = torch.arange(seq_len - q_lens[i], seq_len)
        _expect(torch.equal(positions[a:b], expected_pos),
                f"sequence {i}: positions {positions[a:b].tolist()}, expected {expected_pos.tolist()}")
        live = tables[i, : -(-seq_len // block_size)].to(torch.int64)
        _expect(bool(((live >= 0) & (live < num_blocks)).all()),
                f"sequence {i}: block table {live.tolist()} has ids outside 0..{num_blocks - 1}")
        expected_slots = live[expected_pos // block_size] * block_size + expected_pos % block_size
        _expect(torch.equal(slots[a:b], expected_slots),
                f"sequence {i}: slot_mapping {slots[a:b].tolist()} disagrees with its block table "
                f"({expected_slots.tolist()})")
