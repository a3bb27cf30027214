"""Prefix-cache replay of a trace on a hybrid model: one pool, one block table per KV cache group.

As replay.py, requests replay one at a time in arrival order, and a finished request's blocks stay cached
(LRU) until evicted. Here each request runs as an engine computes it: the prompt after its hit in chunks of
at most `chunk_tokens` (a sliding group holds a window and one chunk, not the whole prompt), then its output,
also a chunk at a time. Each group frees what its layers no longer read as the request advances; a block
that leaves a window while hashed stays in the cache. The hit is the longest prefix that every group can
serve; each group's own longest hit is counted too (`group_hit_tokens`), so the report can say which group
limits it. A Mamba hybrid's state group serves a hit only under mamba_cache_mode all (see core/pool/groups).

The pool needs a size (blocks), and the largest request must fit in it at its peak (`peak_blocks`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ParameterError
from ..inputs.traces import Trace, check_mooncake_chaining, mooncake_block_keys, mooncake_block_size_error
from ..pool.groups import PoolGroup, peak_blocks
from ..pool.hybrid import HybridPool
from .trace_blocks import in_arrival_order

DEFAULT_CHUNK_TOKENS = 8192  # vLLM's default max_num_batched_tokens


@dataclass(frozen=True)
class GroupReplayResult:
    block_size: int
    capacity_blocks: int
    requests: int
    prompt_tokens: int
    hit_tokens: int  # the hits every group served
    group_hit_tokens: tuple[int, ...]  # Σ over requests of each group's own longest hit
    peak_used_blocks: int
    peak_cached_blocks: int
    evictions: int
    largest_request_blocks: int  # the largest request's peak (chunked prefill)
    keyed: bool  # prefix caching could hit (the trace has ids, the block keys them, the state is saved)

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def largest_request_peak(trace: Trace, groups: tuple[PoolGroup, ...], block_size: int, state_mode: str,
                         chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> int:
    """Blocks the largest request holds at its peak: the least capacity a replay needs."""
    longest = int((trace.prompt_tokens + trace.output_tokens).max()) if len(trace) else 0
    return peak_blocks(groups, longest, block_size, state_mode, chunk_tokens)


def replay_groups(
    trace: Trace, groups: tuple[PoolGroup, ...], block_size: int, capacity_blocks: int, state_mode: str, *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS, progress: Callable[[int], None] | None = None,
) -> GroupReplayResult:
    """Replay `trace` through a HybridPool of `groups` (see the module docstring)."""
    need = largest_request_peak(trace, groups, block_size, state_mode, chunk_tokens)
    if need > capacity_blocks:
        raise ParameterError(f"capacity_blocks {capacity_blocks:,} is less than the {need:,} blocks the largest "
                             "request holds at its peak (all groups, chunked prefill): give more", "capacity_blocks")
    pool = HybridPool(capacity_blocks, block_size, groups, state_mode=state_mode)
    keyed = trace.has_prefix_ids and pool.caches and mooncake_block_size_error(block_size) is None
    if keyed:
        assert trace.hash_ids is not None and trace.hash_offsets is not None
        check_mooncake_chaining(trace.hash_ids, trace.hash_offsets, block_size, f"{trace.path}: ")
    trace = in_arrival_order(trace)
    prompts, outputs = trace.prompt_tokens.tolist(), trace.output_tokens.tolist()
    group_hits = [0] * len(groups)
    peak_used = peak_cached = 0
    B = block_size
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        keys = mooncake_block_keys(trace.request_hash_ids(i), prompt, B, f"request {i + 1}: ") if keyed else None
        if keys is not None:
            for g, p in enumerate(pool.pools):
                group_hits[g] += p.hit_tokens(prompt, keys, (g, None))
        hit = pool.hit_tokens(prompt, keys)
        held = min(prompt, hit + chunk_tokens)
        pool.allocate(i, held, None if keys is None else keys[: held // B])
        total = prompt + output
        while held < total:
            add = min(chunk_tokens, total - held)
            block_keys = None
            if keys is not None and held < prompt:
                block_keys = keys[held // B : min(held + add, prompt) // B]
            pool.append(i, add, block_keys)
            held += add
            peak_used = max(peak_used, pool.num_used)
        peak_used = max(peak_used, pool.num_used)
        pool.release(i)
        peak_cached = max(peak_cached, pool.store.queue.num_cached)
        if progress is not None:
            progress(1)
    stats = pool.stats()
    return GroupReplayResult(
        block_size=B, capacity_blocks=capacity_blocks, requests=len(trace), prompt_tokens=int(sum(prompts)),
        hit_tokens=stats.hit_tokens, group_hit_tokens=tuple(group_hits), peak_used_blocks=peak_used,
        peak_cached_blocks=peak_cached, evictions=stats.evictions, largest_request_blocks=need, keyed=keyed,
    )

