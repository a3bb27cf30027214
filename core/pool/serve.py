"""One request's whole life in the block pool, fused into one call: `BlockPool.serve`.

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

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

from ..blocks import ceil_div
from .free_queue import FREE_CACHED
from .store import PoolExhaustedError

if TYPE_CHECKING:
    from .block_pool import BlockPool
    from .store import BlockKeys


class ServeOneRequest:
    """`BlockPool.serve` (a mixin of BlockPool: see the module docstring)."""

    def serve(
        self: BlockPool,
        num_tokens: int,
        block_keys: BlockKeys = None,
        num_output_tokens: int = 0,
        extra_key: Hashable = None,
    ) -> tuple[int, int]:
        """allocate + append + release of one request; returns (hit tokens, blocks in use while it ran)."""
        if self._in_step:
            raise ValueError("serve runs a request start to finish: call it outside a step")
        if num_output_tokens < 0:
            raise ValueError(f"cannot append a negative number of tokens ({num_output_tokens})")
        hits, hashes, keys, homes, present, slots, extra_id = self._probe(num_tokens, block_keys, extra_key)
        B, num_hits = self.block_size, len(hits)
        prompt_blocks = ceil_div(num_tokens, B)
        total = ceil_div(num_tokens + num_output_tokens, B)
        cached_hits, num_cached = hits, 0
        if num_hits and not self.num_used:  # no block in use (no live sequence): every hit is cached free
            num_cached = num_hits
        elif num_hits:
            cached = self.state.take(hits) == FREE_CACHED
            num_cached = np.count_nonzero(cached)
            if num_cached < num_hits:
                cached_hits = hits[cached]  # the others are held by live sequences: they stay theirs
        if total - num_hits + num_cached > len(self.queue):
            raise PoolExhaustedError(
                f"{num_tokens} + {num_output_tokens} tokens need more than the {len(self.queue)} free blocks"
            )
        self._epoch += 1
        if num_cached:
            self.queue.revive(cached_hits)
        fresh, evicted = self._hand_out(prompt_blocks - num_hits)
        to_cache, to_drop = cached_hits[::-1], fresh[::-1]  # release order: the table reversed
        if len(keys) > num_hits:
            present = present[num_hits:]
            if evicted:
                present = self._present_after_evictions(present)
            table = np.concatenate((hits, fresh)) if num_hits else fresh
            rest = slice(num_hits, None)
            inserted = self._register(table, num_hits, extra_id, hashes[rest], keys[rest], homes[rest], present,
                                      slots[rest])
            keyed = fresh[: len(keys) - num_hits]
            indexed = keyed if inserted is None else keyed[inserted]
            self.fill[indexed] = B
            to_cache = np.concatenate((indexed[::-1], to_cache))
            to_drop = fresh[len(keyed) :][::-1]
            if inserted is not None:
                to_drop = np.concatenate((to_drop, keyed[~inserted][::-1]))
        output, evicted_for_output = self._hand_out(total - prompt_blocks)
        if len(output):
            to_drop = np.concatenate((output[::-1], to_drop))
        if evicted or evicted_for_output:
            self.fill[to_drop] = 0  # plain free blocks hold nothing; evicted ones held a full block
        if len(to_drop):
            self.queue.push_plain(to_drop)
        if len(to_cache):
            self.queue.push_cached(to_cache)
        stats = self._stats
        stats["hit_blocks"] += num_hits
        stats["hit_tokens"] += num_hits * B
        stats["prompt_tokens"] += num_tokens
        stats["released_finished"] += 1
        return num_hits * B, self.num_used + num_cached + total - num_hits
