"""What a trace's prefix-cache replay gives (ReplayResult, TraceShareResult) and the block sizes it takes — without
numpy, so that a small trace's replay on plain lists (id_replay_lists.py) needs none."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ParameterError
from ..inputs.trace_text import mooncake_block_size_error
from ..pool.limits import MAX_BLOCK_TOKENS
from ..units import format_int_short


@dataclass(frozen=True)
class ReplayResult:
    """One replay of a trace (with or without prefix caching)."""

    prefix_caching: bool
    block_size: int
    capacity_blocks: int | None  # None: unlimited
    pool_blocks: int  # blocks the pool was created with
    requests: int
    prompt_tokens: int
    output_tokens: int
    hit_tokens: int
    hit_blocks: int
    peak_used_blocks: int  # one request at a time: the largest request's blocks
    longest_request_tokens: int  # the most positions a request writes: prompt + output − 1 (trace_blocks.kv_tokens)
    peak_cached_blocks: int  # most free blocks holding a cache entry at once: the cache's footprint
    evictions: int

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def prefill_tokens_saved(self) -> int:
        """Prompt tokens whose KV is reused instead of recomputed."""
        return self.hit_tokens


@dataclass(frozen=True)
class TraceShareResult:
    trace_description: str
    has_prefix_ids: bool
    cached: ReplayResult
    uncached: ReplayResult


def check_block_size(block_size: int) -> None:
    """A block size that Mooncake's prefix ids can key (inputs/trace_text.py: mooncake_block_size_error)."""
    check_positive_block_size(block_size)
    message = mooncake_block_size_error(block_size)
    if message:  # short: a typed 1e400 has 401 digits
        raise ParameterError(message, "block_size")


def check_positive_block_size(block_size: int) -> None:
    """At least one token, at most the most a block holds (fills are int32)."""
    if block_size < 1:
        raise ParameterError(f"block_size {block_size} must be a positive number of tokens", "block_size")
    if block_size > MAX_BLOCK_TOKENS:
        raise ParameterError(f"block_size {format_int_short(block_size)} is more tokens than a block holds (at most "
                             f"{MAX_BLOCK_TOKENS:,}): give a block size such as 16", "block_size")
