"""One request's whole life in the block pool, fused into one call: `serve_request`, what `BlockPool.serve`
runs once it has checked its arguments and looked the prompt up.

A prefix-cache replay runs requests one at a time: allocate the prompt (reusing its cached prefix), append
the output, release. `serve(prompt_tokens, block_keys, output_tokens)` makes exactly the changes of

    pool.allocate(seq, prompt_tokens, block_keys, extra_key)
    pool.append(seq, output_tokens)
    pool.release(seq)

through the same look-up, verification, hand-out, registration and free queue (tests compare the whole
pool state after every request, with and without capacity pressure), but writes each block's final state
once instead of passing it through every step — about half the numpy calls:

    hits     cached free ones leave the free queue while the request runs (so that its own hand-outs cannot
             evict them) and go back to its tail on release; hits held by live sequences stay theirs
    prompt   fresh blocks from the queue's head, version + 1; the full ones with a key are registered in the
             prefix cache and go back with their content (fill = B), the others hash-less
    output   fresh blocks, version + 1, back hash-less
    ref counts, used blocks, useful and logical tokens end where they started (each is +x then -x)

Order matters and is kept: prompt blocks are handed out, then registered, then the output's blocks are
handed out (an eviction for the output must not come before the registration, whose duplicate check it
would change); release appends the table reversed at the free queue's tail (vLLM's free order: output, fresh
prompt blocks, hits), indexed blocks as cache entries. Check, then change: a request whose prompt + output does
not fit raises before changing anything.
"""

from __future__ import annotations

import numpy as np

from ..blocks import ceil_div
from .free_queue import FREE_CACHED
from .prefix_lookup import PrefixIndex, Probe
from .store import BlockStore, PoolExhaustedError


def serve_request(
    store: BlockStore, prefix: PrefixIndex, probe: Probe, num_tokens: int, num_output_tokens: int
) -> tuple[int, int]:
    """allocate + append + release of one request whose prompt look-up is `probe`; returns (hit tokens,
    blocks in use while it ran). Raises PoolExhaustedError, changing nothing, when it does not fit."""
    hits = probe.hits
    B, num_hits = store.block_size, len(hits)
    prompt_blocks = ceil_div(num_tokens, B)
    total = ceil_div(num_tokens + num_output_tokens, B)
    cached_hits, num_cached = hits, 0
    if num_hits and not store.num_used:  # no block in use (no live sequence): every hit is cached free
        num_cached = num_hits
    elif num_hits:
        cached = store.state.take(hits) == FREE_CACHED
        num_cached = int(np.count_nonzero(cached))
        if num_cached < num_hits:
            cached_hits = hits[cached]  # the others are held by live sequences: they stay theirs
    if total - num_hits + num_cached > len(store.queue):
        raise PoolExhaustedError(
            f"{num_tokens} + {num_output_tokens} tokens need more than the {len(store.queue)} free blocks"
        )
    if num_cached:
        store.queue.revive(cached_hits)
    fresh, evicted = store.hand_out(prompt_blocks - num_hits)
    num_keyed = len(probe.keys) - num_hits
    if num_keyed > 0:
        table = np.concatenate((hits, fresh)) if num_hits else fresh
        inserted = prefix.register_prompt(table, probe, bool(evicted))
        keyed = fresh[:num_keyed]
        store.fill[keyed if inserted is None else keyed[inserted]] = B
    output = store.hand_out(total - prompt_blocks)[0]
    # release: the table reversed to the queue's tail, the indexed blocks (fresh or hits) as cache entries
    freed = [output[::-1], fresh[::-1], cached_hits[::-1]] if num_cached else [output[::-1], fresh[::-1]]
    store.free(np.concatenate(freed))
    counters = store.counters
    counters["hit_blocks"] += num_hits
    counters["hit_tokens"] += num_hits * B
    counters["prompt_tokens"] += num_tokens
    counters["released_finished"] += 1
    return num_hits * B, store.num_used + num_cached + total - num_hits

