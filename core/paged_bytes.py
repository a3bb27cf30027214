"""Equations 2 and 3 in bytes for a model, group by group: what fixed reservation and paging hold.

A model's layers fall into KV cache groups (core/model/kv_groups.py, layout `vllm` or `ideal`). For a
sequence of n tokens each group holds, per block table, the blocks of the module docstring there:

    full      ceil(n / B)                                        tokens held n
    sliding   ceil(n / B) − floor(max(n − W, 0) / B)            tokens held min(n, W)
    chunked   ceil(n / B) − floor(C · floor((n − 1) / C) / B)   tokens held n − C · floor((n − 1) / C)
    state     the pages the pool holds (below)                   one state

with B the group's own tokens per block (vLLM may raise it: Mamba hybrids, unified pages). A block costs
the group's `block_bytes` (padding layers and padded state pages included); what the real layers store in
it is `used_block_bytes`. So for each scheme:

    useful     equation 1 over the sequences (the current chunk for chunked layers), the state apart
    allocated  Σ blocks · block_bytes over the attention groups; the state groups apart
    padding    Σ blocks · (block_bytes − used_block_bytes): padding layers and padded state pages
    tables     int32 entries: ceil(n / B) per table (exact; blocks freed by a window stay as null entries, as
               vLLM keeps them; a state table 1 entry in "none"), or N × ceil(M / B) per table (dense)
    held       allocated KV + allocated state + exact block tables: the objective of the block-size sweep

A sequence is counted as it stands after the step that computed its last token, n − 1 (computed n − 1, table
grown to n), as the attention rows are (a sliding layer then holds the last W tokens, the ones that token read):
what the pool holds until its next step frees the blocks behind. A state table holds the pages from
core/pool/groups.py PoolGroup.first_block(n − 1, n) to (n − 1) // B, the pool's own rule (vLLM v1's
MambaManager): "none" 1 page; "align" and "all" pages (n − 2) // B .. (n − 1) // B, so 1, or 2 when n − 1 is a
multiple of B (n > 1: the step crossed into a new page and the page it resumed from is freed at the next step).
At a speculative peak (`extra` slots, the step from n − 1 to n + extra) the same rule to page (n + extra − 1) // B:
"all" every page between, "align" at most 2.

Fixed reservation gives every full layer M positions, a sliding or chunked layer min(M, W), a recurrent
layer one state; no padding and no block tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .blocks import BLOCK_TABLE_ENTRY_BYTES, ceil_div
from .model.kv_groups import VLLM_BLOCK_SIZES, KVCacheGroup, KVLayout, kv_layout
from .model.layers import bits_to_bytes
from .model.models import ModelSpec
from .paging import PASS_CHUNK, FixedReservation, exact_sum
from .pool.groups import PoolGroup


@dataclass(frozen=True)
class GroupBytes:
    """One KV cache group's share of a scheme: blocks per table summed over the sequences, and bytes."""

    group: KVCacheGroup
    blocks: int  # Σ over sequences of the blocks one of the group's block tables holds
    held_tokens: int  # Σ over sequences of the tokens its layers hold (state groups: the sequences)
    table_entries: int  # Σ over sequences of one table's entries (freed blocks stay as null entries)

    @property
    def block_ids(self) -> int:
        """Blocks in all of the group's tables (vllm: block ids; ideal: blocks of the group's own size)."""
        return self.blocks * self.group.tables

    @property
    def allocated_bytes(self) -> int:
        return self.blocks * self.group.block_bytes

    @property
    def useful_bytes(self) -> int:
        return bits_to_bytes(self.held_tokens * self.group.token_bits)

    @property
    def padding_bytes(self) -> int:
        return self.blocks * self.group.padding_bytes_per_block

    @property
    def block_table_bytes(self) -> int:
        return self.table_entries * self.group.tables * BLOCK_TABLE_ENTRY_BYTES


@dataclass(frozen=True)
class KvBytes:
    """Bytes of one scheme for a model; `block_size` None is fixed reservation, else the block size asked
    for, `used_block_size` the one the layout pages attention with. State bytes are kept apart from KV."""

    block_size: int | None
    useful_kv_bytes: int
    allocated_kv_bytes: int
    block_table_bytes_exact: int = 0
    block_table_bytes_dense: int = 0
    state_bytes: int = 0  # what the sequences' recurrent states hold
    allocated_state_bytes: int = 0  # the state pages allocated for them (padded; pages as the pool holds them)
    padding_bytes: int = 0  # of the allocated bytes (KV and state): padding layers and padded state pages
    used_block_size: int | None = None
    groups: tuple[GroupBytes, ...] = ()
    engine_accepts: bool = True  # vllm layout: the block size is one vLLM's block_size option accepts

    @property
    def waste_kv_bytes(self) -> int:
        """Allocated minus useful KV: reservation waste (fixed), or tail blocks and padding layers (paged)."""
        return self.allocated_kv_bytes - self.useful_kv_bytes

    @property
    def kv_padding_bytes(self) -> int:
        """Padding in the attention groups' blocks (padding layers); the state's is with the state."""
        return sum(g.padding_bytes for g in self.groups if not g.group.is_state)

    @property
    def fragmentation_bytes(self) -> int:
        """The tail-block part of the KV waste: partly filled blocks (and blocks a window or chunk still holds
        for a few tokens), padding layers aside."""
        return self.waste_kv_bytes - self.kv_padding_bytes

    @property
    def held_bytes(self) -> int:
        """What the scheme holds: KV and state allocated, and the exact block tables."""
        return self.allocated_kv_bytes + self.allocated_state_bytes + self.block_table_bytes_exact


def kv_cache_groups(spec: ModelSpec) -> int:
    """Block tables per sequence under vLLM's layout at the default block size (its KV cache groups)."""
    return kv_layout(spec, 16).num_tables


def _chunked_sum(tokens: np.ndarray, transform: Callable[[np.ndarray, np.ndarray], np.ndarray], extra: int = 0) -> int:
    """Σ transform(chunk + extra) over the lengths, exact; `transform(chunk, out)` writes into a reused
    scratch, so a pass over 10^9 lengths allocates a few MiB instead of 8 GB."""
    scratch = np.empty(min(tokens.size, PASS_CHUNK), dtype=np.int64)
    shifted = np.empty(min(tokens.size, PASS_CHUNK), dtype=np.int64) if extra else None
    total = 0
    for i in range(0, tokens.size, PASS_CHUNK):
        chunk = tokens[i : i + PASS_CHUNK]
        if shifted is not None:
            chunk = np.add(chunk, extra, out=shifted[: chunk.size])
        total += exact_sum(transform(chunk, scratch[: chunk.size]))
    return total


def _chunk_start(chunk: np.ndarray, out: np.ndarray, c: int) -> np.ndarray:
    """C · floor((n − 1) / C): the first position of the last token's chunk."""
    start = np.subtract(chunk, 1, out=out)
    start = np.floor_divide(start, c, out=start)
    return np.multiply(start, c, out=start)


Sums = dict[tuple[str, int, int], int]  # (pass, its parameter, extra) -> Σ over the lengths


def group_totals(tokens: np.ndarray, group: KVCacheGroup, mamba_cache_mode: str = "none", extra: int = 0,
                 sums: Sums | None = None) -> GroupBytes:
    """Σ blocks held per table and Σ tokens held over the lengths `tokens` + `extra` (int64 [N]), exact.

    `sums` keeps the passes already made over these lengths (Σ ceil(n/B), Σ min(n, W), ...), so that groups
    and block sizes that share one are counted once."""
    b, w, n = group.block_tokens, group.window, int(tokens.size)
    memo: Sums = {} if sums is None else sums

    def total(name: str, param: int, transform: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> int:
        key = (name, param, extra)
        if key not in memo:
            memo[key] = _chunked_sum(tokens, transform, extra)
        return memo[key]

    def ceil_blocks(chunk: np.ndarray, out: np.ndarray) -> np.ndarray:
        return np.floor_divide(np.add(chunk, b - 1, out=out), b, out=out)

    if group.kind == "state":
        if mamba_cache_mode == "none":  # one page a sequence (state_pages is 1 for every n)
            return GroupBytes(group, n, n, n)
        entries = total("ceil", b, ceil_blocks)
        key = (f"state-pages/{mamba_cache_mode}", b, extra)
        if key not in memo:
            memo[key] = _state_page_total(tokens, b, mamba_cache_mode, extra)
        return GroupBytes(group, memo[key], n, entries)
    blocks = total("ceil", b, ceil_blocks)
    if ("sum", 0, 0) not in memo:
        memo[("sum", 0, 0)] = exact_sum(tokens)
    tokens_total = memo[("sum", 0, 0)] + n * extra  # Σ (n + extra)
    if group.kind == "full":
        return GroupBytes(group, blocks, tokens_total, blocks)
    assert w is not None
    if group.kind == "sliding":
        def freed(chunk: np.ndarray, out: np.ndarray) -> np.ndarray:
            beyond = np.maximum(np.subtract(chunk, w, out=out), 0, out=out)  # positions out of the window
            return np.floor_divide(beyond, b, out=beyond)

        held = total("min", w, lambda chunk, out: np.minimum(chunk, w, out=out))
        return GroupBytes(group, blocks - total(f"window-freed/{w}", b, freed), held, blocks)

    def freed_chunks(chunk: np.ndarray, out: np.ndarray) -> np.ndarray:
        return np.floor_divide(_chunk_start(chunk, out, w), b, out=out)

    before = total("chunk-start", w, lambda chunk, out: _chunk_start(chunk, out, w))
    return GroupBytes(group, blocks - total(f"chunk-freed/{w}", b, freed_chunks), tokens_total - before, blocks)


_STATE = PoolGroup("state")


def state_pages(num_tokens: int, block_size: int, mode: str, extra: int = 0) -> int:
    """The pages one state table of a sequence of `num_tokens` n holds at the step from n − 1 to n + `extra` (see
    the module docstring): the pool's rule, PoolGroup.first_block, to the step's last page (extra 0: held_blocks)."""
    last = ceil_div(num_tokens + extra, block_size)
    return last - min(_STATE.first_block(num_tokens - 1, num_tokens + extra, block_size, mode), last)


def _state_page_total(tokens: np.ndarray, block_size: int, mode: str, extra: int) -> int:
    """Σ state_pages over the lengths, exact. The rule reads n only through floor divisions by B and the tests
    n − 1 > 0 and n + extra > B, so from n = B + 2 on it repeats with period B: the lengths are counted by value
    below B + 2 and by residue (n − B − 2) mod B above, and state_pages is asked once per class present."""
    B, start = block_size, block_size + 2
    low = np.zeros(start, dtype=np.int64)
    high = np.zeros(B, dtype=np.int64)
    for i in range(0, tokens.size, PASS_CHUNK):
        chunk = tokens[i : i + PASS_CHUNK]
        small = chunk < start
        low += np.bincount(chunk[small], minlength=start)
        high += np.bincount((chunk[~small] - start) % B, minlength=B)
    total = sum(int(low[n]) * state_pages(int(n), B, mode, extra) for n in np.flatnonzero(low))
    return total + sum(int(high[r]) * state_pages(start + int(r), B, mode, extra) for r in np.flatnonzero(high))


def paged_kv_bytes(tokens: np.ndarray, layout: KVLayout, max_len: int, extra: int = 0,
                   sums: Sums | None = None) -> KvBytes:
    """Bytes of paging the lengths `tokens` (+ `extra` each: a speculative peak) under `layout`; dense tables
    are N × ceil(max_len / B) entries per table. `sums`: see `group_totals` (one dict per set of lengths)."""
    groups = tuple(group_totals(tokens, g, layout.mamba_cache_mode, extra, sums) for g in layout.groups)
    kv = [g for g in groups if not g.group.is_state]
    state = [g for g in groups if g.group.is_state]
    dense_entries = sum(g.tables * _dense_entries(g, max_len, layout.mamba_cache_mode) for g in layout.groups)
    accepts = layout.layout != "vllm" or layout.requested_block_size in VLLM_BLOCK_SIZES
    return KvBytes(
        layout.requested_block_size,
        sum(g.useful_bytes for g in kv),
        sum(g.allocated_bytes for g in kv),
        sum(g.block_table_bytes for g in groups),
        int(tokens.size) * dense_entries * BLOCK_TABLE_ENTRY_BYTES,
        sum(g.useful_bytes for g in state),
        sum(g.allocated_bytes for g in state),
        sum(g.padding_bytes for g in groups),
        layout.block_size,
        groups,
        accepts,
    )


def _dense_entries(group: KVCacheGroup, max_len: int, mode: str) -> int:
    """Columns of the group's [num_seqs, max_blocks] block-table tensor: ceil(M / B) (a state in "none": 1)."""
    if group.is_state and mode == "none":
        return 1
    return ceil_div(max_len, group.block_tokens)


def fixed_kv_bytes(layout: KVLayout, fixed: FixedReservation, paged: KvBytes) -> KvBytes:
    """Fixed reservation to M = fixed.max_len: M tokens per full layer, min(M, W) per windowed one, one state
    per recurrent layer; the useful bytes are those of `paged` (any block size of the same lengths)."""
    kv_bits = state_bits = 0
    for g in layout.groups:
        if g.is_state:
            state_bits += g.token_bits
        else:
            kv_bits += g.token_bits * (fixed.max_len if g.window is None else min(fixed.max_len, g.window))
    n = fixed.num_seqs
    return KvBytes(None, paged.useful_kv_bytes, bits_to_bytes(n * kv_bits), state_bytes=paged.state_bytes,
                   allocated_state_bytes=bits_to_bytes(n * state_bits))
