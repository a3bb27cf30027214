"""Prefix-cache replay of a trace on a hybrid model: one pool, one block table per KV cache group.

As replay.py, requests replay one at a time in arrival order, and a finished request's blocks stay cached
(LRU) until evicted. Here each request runs as an engine computes it: the prompt after its hit in chunks of
at most `chunk_tokens` (a sliding group holds a window and one chunk, not the whole prompt), then its output,
also a chunk at a time, all of it but the last token (sampled, never written: trace_blocks.written_outputs), so
a window ends at the request's last written position. Each group frees what its layers no longer read as the
request advances; a block that leaves a window while hashed stays in the cache. The hit is the longest prefix
that every group can serve; each group's own longest hit is counted too (`group_hit_tokens`), so the report
can say which group limits it. A sliding group needs only its window's blocks before the hit, a chunked group
the current chunk's (core/pool/group_hits). A Mamba hybrid's state group serves a hit only where a state was
saved: mode all at every block boundary; mode align at the end of each step, so the prompt is chunked as
vLLM's scheduler does under align (`aligned_chunk_end`): chunks end on block boundaries, and the one that
passes the prompt's last full block ends there; mode none saves none.

Keys: Mooncake's prefix ids cover 512 tokens each. A block that tiles them (B divides 512, or is a multiple)
is keyed exactly (inputs/traces). A block that does not — vLLM's layout raises a Mamba hybrid's block to 80,
528, 544 or 4,128 tokens — is keyed by the id that holds its last token (`trace_block_keys`): equal keys still
mean equal content (prefix-chained ids, checked), but two prompts that share a block and differ later in that
id miss: the hits are then a lower bound (`keys_lower_bound`, said in the report).

The pool needs a size (blocks), and the largest request must fit in it at its peak (`peak_blocks`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ParameterError
from ..inputs.traces import (
    MOONCAKE_BLOCK_TOKENS,
    Trace,
    check_mooncake_chaining,
    first_unchained_id,
    mooncake_block_keys,
    mooncake_block_size_error,
)
from ..model.vllm_memory import DEFAULT_MAX_NUM_BATCHED_TOKENS
from ..pool.groups import PoolGroup, peak_blocks
from ..pool.hybrid import HybridPool
from ..pool.weighted import cached_units
from .trace_blocks import in_arrival_order, kv_tokens, written_outputs

DEFAULT_CHUNK_TOKENS = DEFAULT_MAX_NUM_BATCHED_TOKENS  # a prefill chunk: vLLM's default max_num_batched_tokens


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
    keyed: bool  # prefix caching could hit (the trace has ids, the state is saved)
    keys_lower_bound: bool = False  # the block does not tile the trace's ids: hits are a lower bound (see module)

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def trace_block_keys(hash_ids: np.ndarray, prompt_tokens: int, block_size: int, where: str = "") -> np.ndarray:
    """int64 [prompt_tokens // B]: each full block's key. A block that does not tile the 512-token ids is keyed
    by the id holding its last token, (j + 1)·B − 1 (see the module docstring)."""
    if mooncake_block_size_error(block_size) is None:
        return mooncake_block_keys(hash_ids, prompt_tokens, block_size, where)
    last = (np.arange(1, prompt_tokens // block_size + 1, dtype=np.int64) * block_size - 1) // MOONCAKE_BLOCK_TOKENS
    if len(last) and last[-1] >= len(hash_ids):
        raise ValueError(f"{where}{prompt_tokens} prompt tokens need {int(last[-1]) + 1} hash_ids (one per "
                         f"{MOONCAKE_BLOCK_TOKENS} tokens), the request has {len(hash_ids)}")
    return hash_ids[last].astype(np.int64)


def check_keys_exact(trace: Trace, block_size: int) -> None:
    """The ids must be prefix-chained for a block keyed by one id (a block of B = 512·m, or one not tiling)."""
    assert trace.hash_ids is not None and trace.hash_offsets is not None
    check_ids_key_blocks(trace.hash_ids, trace.hash_offsets, block_size, f"{trace.path}: ")


def check_ids_key_blocks(hash_ids: np.ndarray, hash_offsets: np.ndarray, block_size: int, where: str = "") -> None:
    """check_keys_exact over a trace's id arrays (`kvcalc sim` keys its pool through this and trace_block_keys)."""
    if mooncake_block_size_error(block_size) is None:
        check_mooncake_chaining(hash_ids, hash_offsets, block_size, where)
    elif (bad := first_unchained_id(hash_ids, hash_offsets)) is not None:
        raise ParameterError(f"{where}request {bad[0] + 1}'s hash id at position {bad[1]} follows different "
                             f"ids in different requests (not prefix-chained), so a block of {block_size:,} tokens "
                             "keyed by one id would not be exact: use layout ideal with a block_size dividing "
                             f"{MOONCAKE_BLOCK_TOKENS}", "layout", "block_size")


def check_ids_cover_prompts(trace: Trace, block_size: int) -> None:
    """Every request has the hash id of each full block's last token (trace_block_keys' keys, the same need for a
    block tiling the ids or not): checked up front, vectorised, the first short request named by its line in the
    file, so that a replay never fails midway."""
    assert trace.hash_offsets is not None
    full = trace.prompt_tokens // block_size
    need = np.where(full > 0, (full * block_size - 1) // MOONCAKE_BLOCK_TOKENS + 1, 0)
    short = np.flatnonzero(np.diff(trace.hash_offsets) < need)
    if len(short):
        i = int(short[0])
        trace_block_keys(trace.request_hash_ids(i), int(trace.prompt_tokens[i]), block_size,
                         f"{trace.path} request {i + 1}: ")


def keys_lower_bound(block_size: int) -> bool:
    """Whether hits on blocks of `block_size` keyed from Mooncake ids are a lower bound (the block does not tile
    the 512-token ids: keyed by the id of its last token, see the module docstring)."""
    return mooncake_block_size_error(block_size) is not None


def aligned_chunk_end(computed: int, prompt: int, chunk_tokens: int, block_size: int) -> int:
    """Where a prefill chunk from `computed` ends under mamba_cache_mode align (vLLM's block-aligned split): a
    whole number of blocks while the prompt's last full block is ahead; exactly at that block's end when the
    chunk passes it; the prompt's tail after it. Past the prompt (the output) the chunk is not split."""
    B = block_size
    last = prompt - prompt % B  # the last boundary of the prompt, where its state is saved
    end = computed + chunk_tokens
    if end < last:
        return computed + max(chunk_tokens // B, 1) * B
    if computed < last < end:
        return last
    return end


def largest_request_peak(trace: Trace, groups: tuple[PoolGroup, ...], block_size: int, state_mode: str,
                         chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> int:
    """Blocks the largest request holds at its peak: the least capacity a replay needs."""
    longest = int(kv_tokens(trace).max()) if len(trace) else 0
    return peak_blocks(groups, longest, block_size, state_mode, chunk_tokens)


def replay_pool(trace: Trace, groups: tuple[PoolGroup, ...], block_size: int, capacity_blocks: int, state_mode: str,
                chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> HybridPool:
    """The empty pool a replay of `trace` runs on, after every refusal of replay_groups: a caller that announces
    its replay builds it first, so that a refused input prints only its error."""
    need = largest_request_peak(trace, groups, block_size, state_mode, chunk_tokens)
    if need > capacity_blocks:
        raise ParameterError(f"capacity_blocks {capacity_blocks:,} is less than the {need:,} blocks the largest "
                             "request holds at its peak (all groups, chunked prefill): give more", "capacity_blocks")
    pool = HybridPool(capacity_blocks, block_size, groups, state_mode=state_mode)
    if trace.has_prefix_ids and pool.caches:
        check_keys_exact(trace, block_size)
        check_ids_cover_prompts(trace, block_size)
    return pool


def replay_groups(
    trace: Trace, groups: tuple[PoolGroup, ...], block_size: int, capacity_blocks: int, state_mode: str, *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS, progress: Callable[[int], None] | None = None,
    pool: HybridPool | None = None,
) -> GroupReplayResult:
    """Replay `trace` through a HybridPool of `groups` (see the module docstring); `pool`: replay_pool's of the same
    arguments, built already."""
    if pool is None:
        pool = replay_pool(trace, groups, block_size, capacity_blocks, state_mode, chunk_tokens)
    need = largest_request_peak(trace, groups, block_size, state_mode, chunk_tokens)
    keyed = trace.has_prefix_ids and pool.caches
    trace = in_arrival_order(trace)
    prompts, outputs = trace.prompt_tokens.tolist(), written_outputs(trace.output_tokens).tolist()
    group_hits = [0] * len(groups)
    peak_used = peak_cached = 0
    B = block_size
    align = state_mode == "align" and any(g.kind == "state" for g in groups)
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        keys = trace_block_keys(trace.request_hash_ids(i), prompt, B, f"request {i + 1}: ") if keyed else None
        if keys is not None:
            for g, own in enumerate(pool.group_hit_tokens(prompt, keys)):
                group_hits[g] += own
        hit = pool.hit_tokens(prompt, keys)
        held = min(prompt, aligned_chunk_end(hit, prompt, chunk_tokens, B) if align else hit + chunk_tokens)
        pool.allocate(i, held, None if keys is None else keys[: held // B])
        peak_used = max(peak_used, pool.num_used)  # the first chunk's blocks, held while it is computed
        total = prompt + output  # the output's KV but its last token's (written_outputs)
        while held < total:
            add = min(chunk_tokens, total - held)
            if align and held < prompt:
                add = min(aligned_chunk_end(held, prompt, chunk_tokens, B), prompt) - held
            block_keys = None
            if keys is not None and held < prompt:
                block_keys = keys[held // B : min(held + add, prompt) // B]
            pool.append(i, add, block_keys)
            held += add
            peak_used = max(peak_used, pool.num_used)
        pool.release(i)
        peak_cached = max(peak_cached, cached_units(pool.store))
        if progress is not None:
            progress(1)
    stats = pool.stats()
    return GroupReplayResult(
        block_size=B, capacity_blocks=capacity_blocks, requests=len(trace), prompt_tokens=int(sum(prompts)),
        hit_tokens=stats.hit_tokens, group_hit_tokens=tuple(group_hits), peak_used_blocks=peak_used,
        peak_cached_blocks=peak_cached, evictions=stats.evictions, largest_request_blocks=need, keyed=keyed,
        keys_lower_bound=keyed and keys_lower_bound(B),
    )

