"""The content keys of the blocks holding sampled (output) tokens, as vLLM v1 hashes every full block.

A trace says what a prompt holds (token ids, Mooncake hash ids), never what was sampled, so a block holding
any sampled token gets a key of its request alone: -1 - rid among Mooncake's ids (never negative), the tuple
("sampled", rid) among tuples of token ids. One key for every such block of a request is exact: the pool chains
each block's hash after the block before it, so two positions never share a hash, and no two requests a key.

The pool registers them when the request is released (core/pool/register_full.py): until then the request
alone holds them, and only its own look-up after a preemption could find them. A request preempted by
recompute keeps its keys extended over every full block of its tokens, so that its re-admission looks its
own blocks up and its re-prefill registers the blocks it computes again, as vLLM's does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..pool.accounting import ReleaseReason


def sampled_keys(keys: Any, rid: int, count: int) -> Any:
    """`count` keys of blocks holding sampled tokens of request `rid`, of the kind of its prompt's `keys`."""
    if isinstance(keys, np.ndarray):
        return np.full(count, -1 - rid, dtype=np.int64)
    return [("sampled", rid)] * count


def register_released(register: Callable[[Any, int, int, Any], Any], pool: Any, prompt_keys: Any, rid: int,
                      tokens: int, block_size: int, reason: ReleaseReason) -> None:
    """Request `rid`, holding `tokens` committed tokens in `pool`, is released for `reason`: `register(pool, rid,
    first block, keys)` (core/pool/register_full.py) its full blocks past its keys. A request preempted has its keys
    in `prompt_keys` extended over the blocks its next admission fills (`tokens` + 1: one was sampled since)."""
    keys = prompt_keys[rid]
    first = len(keys)
    if reason is ReleaseReason.PREEMPTED and (tokens + 1) // block_size > first:
        more = sampled_keys(keys, rid, (tokens + 1) // block_size - first)
        prompt_keys[rid] = np.concatenate([keys, more]) if isinstance(keys, np.ndarray) else [*keys, *more]
    count = tokens // block_size - first
    if count > 0:
        register(pool, rid, first, sampled_keys(keys, rid, count))
