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

    hits     cached free ones leave the LRU while the request runs (so that its own hand-outs cannot evict
             them) and go back to the LRU tail on release; hits held by live sequences stay theirs
    prompt   fresh blocks, version + 1; the full ones with a key are registered in the prefix cache and
             go to the LRU with their content (fill = B), the others to the plain stack
    output   fresh blocks, version + 1, to the plain stack
    ref counts, used blocks, useful and logical tokens end where they started (each is +x then -x)

Order matters and is kept: prompt blocks are handed out, then registered, then the output's blocks are
handed out (an eviction for the output must not come before the registration, whose duplicate check it
would change); release pushes the table reversed, indexed blocks to the LRU tail, the rest to the plain
stack. Check, then change: a request whose prompt + output does not fit raises before changing anything.
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
    to_cache, to_drop = cached_hits[::-1], fresh[::-1]  # release order: the table reversed
    num_keyed = len(probe.keys) - num_hits
    if num_keyed > 0:
        table = np.concatenate((hits, fresh)) if num_hits else fresh
        inserted = prefix.register_prompt(table, probe, bool(evicted))
        keyed = fresh[:num_keyed]
        indexed = keyed if inserted is None else keyed[inserted]
        store.fill[indexed] = B
        to_cache = np.concatenate((indexed[::-1], to_cache))
        to_drop = fresh[num_keyed:][::-1]
        if inserted is not None:
            to_drop = np.concatenate((to_drop, keyed[~inserted][::-1]))
    output, evicted_for_output = store.hand_out(total - prompt_blocks)
    if len(output):
        to_drop = np.concatenate((output[::-1], to_drop))
    if evicted or evicted_for_output:
        store.fill[to_drop] = 0  # plain free blocks hold nothing; evicted ones held a full block
    if len(to_drop):
        store.queue.push_plain(to_drop)
    if len(to_cache):
        store.queue.push_cached(to_cache)
    counters = store.counters
    counters["hit_blocks"] += num_hits
    counters["hit_tokens"] += num_hits * B
    counters["prompt_tokens"] += num_tokens
    counters["released_finished"] += 1
    return num_hits * B, store.num_used + num_cached + total - num_hits
