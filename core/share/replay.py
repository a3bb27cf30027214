"""Prefix-cache replay of a real trace through the block pool.

Requests replay one at a time in arrival order (by timestamp; requests that arrive together keep their file
order): the prompt is allocated — its longest cached prefix of full blocks is revived from the cache
instead of recomputed — the output is appended (all of it but the last token, which is sampled and never
written: trace_blocks.written_outputs), then the request finishes and its blocks go to the LRU cache.
Capacity is unlimited (no eviction ever), or a number of blocks (then LRU evictions happen and are counted).
The same replay without prefix caching is the contrast. The trace's blocks, content keys and checks are in
trace_blocks. When nothing can be evicted — no capacity, or one above every block the trace can cache — the
same results are computed per hash id instead of per block (id_replay: no pool; tests compare the two field by
field).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..inputs.traces import Trace, mooncake_block_keys
from .id_replay import id_level_hits
from .replay_result import ReplayResult, TraceShareResult
from .trace_blocks import (
    CheckedTrace,
    check_requests,
    check_trace,
    checked_pool_blocks,
    in_arrival_order,
    kv_tokens,
    request_blocks,
    trace_block_keys,
    written_outputs,
)

if TYPE_CHECKING:
    from ..pool.store import BlockKeys

_BATCH_BLOCKS = 1 << 17  # prompt blocks hashed at a time: ~4 MiB of keys, hashes and home slots


def _key_batches(trace: Trace, block_size: int) -> list[tuple[int, int]]:
    """[first, stop) request ranges of about _BATCH_BLOCKS prompt blocks each (one request may exceed it)."""
    ends = np.cumsum(trace.prompt_tokens // block_size)
    cuts = np.searchsorted(ends, np.arange(_BATCH_BLOCKS, int(ends[-1]), _BATCH_BLOCKS), side="right")
    bounds = np.unique(np.concatenate(([0], cuts, [len(trace)]))).tolist()
    return list(itertools.pairwise(bounds))


def replay(
    trace: Trace, block_size: int, capacity_blocks: int | None, prefix_caching: bool, *, fast: bool = True,
    progress: Callable[[int], None] | None = None, checked: CheckedTrace | None = None, by_ids: bool = True,
) -> ReplayResult:
    """Replay every request of `trace` through one BlockPool, in arrival order; see the module docstring.

    `by_ids`: when nothing can be evicted (the pool holds every block the trace caches) and `fast`, the same
    results are computed per hash id instead (id_replay: no pool, O(ids) numpy work).

    `fast` hashes the block keys of ~_BATCH_BLOCKS prompt blocks at a time (`BlockPool.hash_prompts`) and
    runs each request with the pool's fused `serve`; otherwise each prompt is hashed on its own and runs
    through allocate, append and release. The same pool changes, the same results (tests compare both).
    `progress(n)` is called as the requests are replayed, n at a time; `checked`: check_trace's result for
    these arguments (then the trace is not checked again).
    """
    keyed = prefix_caching and trace.has_prefix_ids
    pool_blocks = checked_pool_blocks(trace, block_size, capacity_blocks, keyed, checked)
    trace = in_arrival_order(trace)
    if by_ids and fast and (not keyed or capacity_blocks is None or pool_blocks < capacity_blocks):  # no eviction
        hit_blocks, cached = id_level_hits(trace, block_size) if keyed else (0, 0)
        if progress is not None:
            progress(len(trace))
        return _result(trace, block_size, capacity_blocks, pool_blocks, prefix_caching, hit_blocks,
                       int(request_blocks(trace, block_size).max()), cached, 0)
    from ..pool.block_pool import BlockPool  # NOTE: here, not above: a replay by ids starts ~10 ms CPU sooner

    pool = BlockPool(max(pool_blocks, 1), block_size, enable_prefix_caching=keyed)
    prompts = trace.prompt_tokens.tolist()
    outputs = written_outputs(trace.output_tokens).tolist()  # the last output token writes no KV
    peak_used = peak_cached = 0
    batches = _key_batches(trace, block_size) if keyed and fast else [(0, len(trace))]
    for first, stop in batches:
        hashed = pool.hash_prompts(*trace_block_keys(trace, block_size, first, stop)) if keyed and fast else None
        for i in range(first, stop):
            keys: BlockKeys = None
            if hashed is not None:
                keys = hashed.prompt(i - first)
            elif keyed:
                where = f"{trace.path} request {i + 1}: "
                keys = mooncake_block_keys(trace.request_hash_ids(i), prompts[i], block_size, where)
            if fast:
                used = pool.serve(prompts[i], keys, outputs[i])[1]
            else:
                pool.allocate(i, prompts[i], keys)
                pool.append(i, outputs[i])
                used = pool.num_used
                pool.release(i)
            peak_used = max(peak_used, used)
            peak_cached = max(peak_cached, pool.num_cached_free_blocks)
        if progress is not None:
            progress(stop - first)
    stats = pool.stats()
    assert stats.hit_tokens == stats.hit_blocks * block_size
    return _result(trace, block_size, capacity_blocks, pool_blocks, prefix_caching, stats.hit_blocks, peak_used,
                   peak_cached, stats.evictions)


def _result(trace: Trace, block_size: int, capacity_blocks: int | None, pool_blocks: int, prefix_caching: bool,
            hit_blocks: int, peak_used: int, peak_cached: int, evictions: int) -> ReplayResult:
    return ReplayResult(
        prefix_caching=prefix_caching,
        block_size=block_size,
        capacity_blocks=capacity_blocks,
        pool_blocks=pool_blocks,
        requests=len(trace),
        prompt_tokens=int(trace.prompt_tokens.sum()),
        output_tokens=int(trace.output_tokens.sum()),
        hit_tokens=hit_blocks * block_size,
        hit_blocks=hit_blocks,
        peak_used_blocks=peak_used,
        longest_request_tokens=_longest(trace),
        peak_cached_blocks=peak_cached,
        evictions=evictions,
    )


def uncached_replay(
    trace: Trace, block_size: int, capacity_blocks: int | None, checked: CheckedTrace | None = None
) -> ReplayResult:
    """What `replay(..., prefix_caching=False)` gives, in closed form: requests one at a time share
    nothing, so no hit, no cached block, no eviction, and the peak is the largest request. Tests check it
    against the pool; the CLI uses it to save a second pass over a large trace."""
    if checked is not None and checked.is_for(trace, block_size, capacity_blocks):
        largest = checked.largest_blocks
    else:
        largest = check_requests(trace, block_size, capacity_blocks)
    return ReplayResult(
        prefix_caching=False,
        block_size=block_size,
        capacity_blocks=capacity_blocks,
        pool_blocks=max(largest if capacity_blocks is None else min(largest, capacity_blocks), 1),
        requests=len(trace),
        prompt_tokens=int(trace.prompt_tokens.sum()),
        output_tokens=int(trace.output_tokens.sum()),
        hit_tokens=0,
        hit_blocks=0,
        peak_used_blocks=largest,
        longest_request_tokens=_longest(trace),
        peak_cached_blocks=0,
        evictions=0,
    )


def _longest(trace: Trace) -> int:
    return int(kv_tokens(trace).max())


def share_trace(
    trace: Trace, block_size: int, capacity_blocks: int | None = None, *,
    progress: Callable[[int], None] | None = None, checked: CheckedTrace | None = None,
) -> TraceShareResult:
    """The replay with prefix caching and, for contrast, without (`progress` and `checked` as for `replay`:
    the trace is checked once)."""
    if checked is None or not checked.is_for(trace, block_size, capacity_blocks):
        checked = check_trace(trace, block_size, capacity_blocks)
    cached = replay(trace, block_size, capacity_blocks, prefix_caching=True, progress=progress, checked=checked)
    uncached = uncached_replay(trace, block_size, capacity_blocks, checked)
    return TraceShareResult(trace.description, trace.has_prefix_ids, cached, uncached)
