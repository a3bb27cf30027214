"""A trace in the block pool's terms, for a replay: arrival order, blocks per request, the content keys of
their full blocks, the pool a replay needs — and every input error, found up front (vectorised) so that a
replay never fails midway.

Content keys for Mooncake: one hash id covers 512 tokens (equal ids = equal content, prefix-chained), so
with block size B dividing 512 full block j of a request has the key (hash_ids[j // S], j % S), S = 512 / B,
encoded exactly as the integer hash_id · S + j % S; with B = 512·m (m > 1) full block j covers the whole ids
m·j .. m·j + m - 1 and has the key hash_ids[m·j + m - 1], the id of its last 512-token block — exact because
the ids are prefix-chained (checked up front: inputs.traces.check_mooncake_chaining). Any other B is refused.
The last id may cover a partial 512-token block; a block that ends past the last id's coverage is an error in
the trace.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..blocks import ceil_div
from ..errors import ParameterError
from ..host_memory import check_fits
from ..inputs.traces import (
    MOONCAKE_BLOCK_TOKENS,
    Trace,
    check_mooncake_chaining,
    coarse_hash_ids,
    mooncake_block_keys,
    mooncake_blocks_per_id,
    mooncake_ids_per_block,
)
from ..pool.limits import store_memory_bytes
from .replay_result import check_block_size, check_positive_block_size


def _check_key_range(trace: Trace, block_size: int) -> None:
    if trace.hash_ids is None or not len(trace.hash_ids):
        return
    per_id = mooncake_blocks_per_id(block_size)
    limit = (2**63 - 1) // per_id - 1
    largest = int(np.abs(trace.hash_ids).max())
    if largest > limit:
        raise ParameterError(
            f"{trace.path}: hash id {largest:,} is larger than the {limit:,} that block_size {block_size} can key "
            f"exactly (an id times {per_id} sub-blocks must fit in int64): use a larger block_size", "block_size"
        )


def in_arrival_order(trace: Trace) -> Trace:
    """The trace with its requests sorted by arrival time, stably (ties keep file order); itself if sorted."""
    if not len(trace) or bool(np.all(trace.arrival_s[1:] >= trace.arrival_s[:-1])):
        return trace
    order = np.argsort(trace.arrival_s, kind="stable")
    ids, offsets = trace.hash_ids, trace.hash_offsets
    if ids is not None and offsets is not None:
        lengths = np.diff(offsets)[order]
        new_offsets = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths, out=new_offsets[1:])
        # each request's ids, moved from its old start to its new one
        ids = ids[np.arange(new_offsets[-1]) + np.repeat(offsets[:-1][order] - new_offsets[:-1], lengths)]
        offsets = new_offsets
    return Trace(trace.kind, trace.path, trace.arrival_s[order], trace.prompt_tokens[order],
                 trace.output_tokens[order], ids, offsets)


def written_outputs(output_tokens: np.ndarray) -> np.ndarray:
    """int64 [N]: the output tokens whose KV a request writes: all but the last. The last one is sampled from
    the logits of the position before it and the request ends, its KV never computed (vLLM; `kvcalc sim` counts
    so), so a request of P + O tokens writes P + O − 1 positions (P when O is 0)."""
    return np.maximum(output_tokens - 1, 0)


def kv_tokens(trace: Trace) -> np.ndarray:
    """int64 [N]: the positions each request writes, prompt + written_outputs."""
    return trace.prompt_tokens + written_outputs(trace.output_tokens)


def request_blocks(trace: Trace, block_size: int) -> np.ndarray:
    """int64 [N]: blocks each request holds at the end (its kv_tokens)."""
    return ceil_div(kv_tokens(trace), block_size)


def unlimited_capacity(trace: Trace, block_size: int) -> int:
    """Blocks that guarantee no eviction: every block the trace's requests hold, summed over the requests.

    vLLM's free queue (core/pool/free_queue) hands out the never-used blocks first and then the oldest freed one,
    evicting it if it holds a cache entry, whatever else is free: a pool evicts nothing only while the never-used
    blocks last, and a replay hands out at most the sum of its requests' blocks (the hits come off it, but which
    hits depends on what was evicted). (A plain-first pool would need only the distinct cacheable blocks plus the
    largest request: vLLM evicts a cached block freed before a hash-less one.)
    """
    return int(request_blocks(trace, block_size).sum())


class CheckedTrace(NamedTuple):
    """`trace` checked for a replay with prefix caching at `block_size` and `capacity_blocks` (check_trace): the
    blocks of its pool and of its largest request, so that the replay and its contrast need not check again."""

    trace: Trace
    block_size: int
    capacity_blocks: int | None
    pool_blocks: int
    largest_blocks: int

    def is_for(self, trace: Trace, block_size: int, capacity_blocks: int | None) -> bool:
        return self.trace is trace and (self.block_size, self.capacity_blocks) == (block_size, capacity_blocks)


def check_trace(trace: Trace, block_size: int, capacity_blocks: int | None) -> CheckedTrace:
    """Every user error a replay with prefix caching could meet — the memory of its pool included — found up
    front (vectorised) so a replay never fails midway."""
    largest = check_requests(trace, block_size, capacity_blocks)
    pool_blocks = _pool_blocks(trace, block_size, capacity_blocks, trace.has_prefix_ids, largest)
    return CheckedTrace(trace, block_size, capacity_blocks, pool_blocks, largest)


def checked_pool_blocks(trace: Trace, block_size: int, capacity_blocks: int | None, keyed: bool,
                        checked: CheckedTrace | None = None) -> int:
    """check_trace, then the blocks of the replay's pool (`keyed`: with prefix caching), refused when they
    would not fit in this machine's memory. `checked`: check_trace's result, when it is for these arguments."""
    if checked is not None and checked.is_for(trace, block_size, capacity_blocks):
        if keyed == trace.has_prefix_ids:
            return checked.pool_blocks
        largest = checked.largest_blocks
    else:
        largest = check_requests(trace, block_size, capacity_blocks)
    return _pool_blocks(trace, block_size, capacity_blocks, keyed, largest)


def _pool_blocks(trace: Trace, block_size: int, capacity_blocks: int | None, keyed: bool, largest: int) -> int:
    # blocks beyond what the trace can ever fill change nothing, so a huge capacity makes no huge pool
    pool_blocks = unlimited_capacity(trace, block_size) if keyed else largest
    if capacity_blocks is not None:
        pool_blocks = min(pool_blocks, capacity_blocks)
    check_fits(store_memory_bytes(pool_blocks), f"the replay's pool of {pool_blocks:,} blocks",
               "bound it with capacity_blocks", "capacity_blocks")
    return pool_blocks


def check_requests(trace: Trace, block_size: int, capacity_blocks: int | None) -> int:
    """The checks of every request against the block size and the capacity; the largest request's blocks."""
    if trace.has_prefix_ids:
        check_block_size(block_size)
        _check_key_range(trace, block_size)
        assert trace.hash_ids is not None and trace.hash_offsets is not None  # has_prefix_ids: both given
        check_mooncake_chaining(trace.hash_ids, trace.hash_offsets, block_size, f"{trace.path}: ")
        full_blocks = trace.prompt_tokens // block_size
        ids_needed = ceil_div(full_blocks * block_size, MOONCAKE_BLOCK_TOKENS)
        ids_given = np.diff(trace.hash_offsets)
        short = np.flatnonzero(ids_given < ids_needed)
        if len(short):
            i = int(short[0])
            mooncake_block_keys(trace.request_hash_ids(i), int(trace.prompt_tokens[i]), block_size,
                               f"{trace.path} request {i + 1}: ")
    else:
        check_positive_block_size(block_size)
    if capacity_blocks is not None and capacity_blocks < 1:
        raise ParameterError(f"capacity_blocks {capacity_blocks} must be a positive number of blocks",
                             "capacity_blocks")
    blocks = request_blocks(trace, block_size)
    largest = int(blocks.max())
    if capacity_blocks is not None and capacity_blocks < largest:
        i = int(blocks.argmax())
        raise ParameterError(
            f"capacity_blocks {capacity_blocks:,} is smaller than request {i + 1} of the trace, which needs "
            f"{largest:,} blocks of {block_size} tokens: give at least {largest:,}", "capacity_blocks"
        )
    return largest


def largest_request_blocks(trace: Trace, block_size: int) -> int:
    """Blocks of the largest request (its kv_tokens): the least capacity a replay of `trace` needs."""
    check_positive_block_size(block_size)
    return int(request_blocks(trace, block_size).max())


def trace_block_keys(trace: Trace, block_size: int, first: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(keys int64 [K], offsets int64 [n+1]): `mooncake_block_keys` of requests first .. stop - 1 end to end,
    vectorised (check_trace has made sure that every request has the hash ids its full blocks need)."""
    assert trace.hash_ids is not None and trace.hash_offsets is not None
    per_id, m = mooncake_blocks_per_id(block_size), mooncake_ids_per_block(block_size)
    full = trace.prompt_tokens[first:stop] // block_size
    offsets = np.zeros(len(full) + 1, dtype=np.int64)
    np.cumsum(full, out=offsets[1:])
    j = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], full)  # block index in its request
    ids = trace.hash_ids[np.repeat(trace.hash_offsets[first:stop], full) + (j // per_id) * m + m - 1]
    return ids * per_id + j % per_id, offsets


def coarse_trace(trace: Trace, block_size: int) -> Trace:
    """`trace` with one hash id per whole block of B = 512·m tokens (inputs.traces.coarse_hash_ids), so that a
    block covers at most one id — itself when B divides 512 or the trace has no ids. Call check_requests first."""
    if trace.hash_ids is None or trace.hash_offsets is None or mooncake_ids_per_block(block_size) == 1:
        return trace
    ids, offsets = coarse_hash_ids(trace.hash_ids, trace.hash_offsets, block_size)
    return Trace(trace.kind, trace.path, trace.arrival_s, trace.prompt_tokens, trace.output_tokens, ids, offsets)
