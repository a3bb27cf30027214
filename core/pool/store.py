"""The physical side of the block pool: per-block state, the free queue and the hash index, handing blocks
out and taking them back — what vLLM v1 calls its block pool. `BlockPool` (block_pool) holds one, with a
`PrefixIndex` (prefix_lookup) that looks up and registers content over these arrays.

Per-block arrays, all indexed by block id:

    state       int8    USED / FREE_PLAIN / FREE_CACHED / PENDING (see free_queue)
    ref         int32   live block tables holding the block
    version     int32   raised each time the block is handed out for new content (int64 from the hand-out that
                        could take one past int32: `widen_versions`)
    fill        int32   tokens written in it
    block_slot  int32   slot of its hash-index entry, -1 when not indexed (`hashed` = block_slot >= 0)
    block_hash  uint64  its chain hash        } meaningful while indexed; the index reads them
    block_home  int32   that hash's home slot }
    key         int64   its content key                     } what a hit is verified against: the same key,
    klass       int64   its content's class                 } after the content of the block just matched
    parent_klass int64  the class of the content before it  } (its class), or after the root (-1 - the
                        extra key's id): a class is one content, exactly, while any block holds it

A full block is registered (indexed) when the sequence that wrote it gives its content key. Several blocks may
hold one content, as in vLLM: the first is the hash index's entry, the others follow it (dup_lists) and take
its place in turn as it is evicted. Evicting a cached block drops it through `block_slot`, no look-up.

Blocks whose ref drops to 0 during a step (`drop(..., defer=True)`) are PENDING — a running step may still
read them — and become free when the step ends (`free_pending`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from ..blocks import ceil_div
from ..errors import ParameterError
from ..units import format_int_short
from .accounting import PoolStats
from .free_queue import FREE_CACHED, PENDING, USED, FreeBlockQueue
from .hash_index import HashIndex
from .limits import MAX_BLOCK_TOKENS, MAX_BLOCKS, store_memory_bytes
from .prefix_cache import HashedKeys

BlockKeys = Sequence[Hashable] | np.ndarray | HashedKeys | None

VERSION_INT32_MAX = 2**31 - 1  # versions stay int32 while every hand-out so far would fit (widen_versions)

_NO_BLOCKS = np.empty(0, dtype=np.intp)
_NO_BLOCKS.flags.writeable = False


class PoolExhaustedError(RuntimeError):
    """An allocation that does not fit; ask `can_allocate` / `can_append` first. Nothing was changed."""


class BlockStore:
    """`num_blocks` physical blocks of `block_size` token slots; see the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"a pool needs num_blocks >= 1 and block_size >= 1, got num_blocks {num_blocks}, "
                f"block_size {block_size}"
            )
        if num_blocks > MAX_BLOCKS or block_size > MAX_BLOCK_TOKENS:
            raise ParameterError(
                f"a pool holds at most {MAX_BLOCKS:,} blocks of at most {MAX_BLOCK_TOKENS:,} tokens (block ids and "
                f"fills are int32), got num_blocks {format_int_short(num_blocks)}, block_size "
                f"{format_int_short(block_size)}: give a smaller pool or block size", "num_blocks", "block_size"
            )
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.enable_prefix_caching = enable_prefix_caching
        n = self.num_blocks
        self.state = np.zeros(n, dtype=np.int8)
        self.ref = np.zeros(n, dtype=np.int32)
        # int32, int64 once a long simulation has handed out 2^31 blocks
        self.version = np.zeros(n, dtype=np.int32)
        self.fill = np.zeros(n, dtype=np.int32)
        self.block_slot = np.full(n, -1, dtype=np.int32)
        self.block_hash = np.zeros(max(n, 2), dtype=np.uint64)  # >= 2: the index reads [-1], [-2] harmlessly
        self.block_home = np.zeros(max(n, 2), dtype=np.int32)
        # zeros, not -1: like the hash, these are read only for indexed blocks, which wrote them
        self.key = np.zeros(n, dtype=np.int64)
        self.klass = np.zeros(n, dtype=np.int64)
        self.parent_klass = np.zeros(n, dtype=np.int64)
        self.num_classes = 0  # classes handed out so far: the next is num_classes + 1 (never reused)
        self.queue = FreeBlockQueue(n, self.state)
        self.index = HashIndex(n if enable_prefix_caching else 1, self.block_hash, self.block_home, self.block_slot)
        self.pending: list[np.ndarray] = []  # blocks dropped during the running step, in drop order
        # running totals so that the pool's usage() is O(live sequences)
        self.num_used = 0
        self.useful_tokens = 0
        # PoolStats by name: the store counts hand-outs and evictions, the pool what happens to sequences
        self.counters = dict.fromkeys(PoolStats.counter_names(), 0)

    @staticmethod
    def memory_bytes(num_blocks: int) -> int:
        """Bytes a store of `num_blocks` allocates (with prefix caching): limits.store_memory_bytes."""
        return store_memory_bytes(num_blocks)

    def new_classes(self, n: int) -> np.ndarray:
        """int64 [n]: n content classes never handed out before."""
        start = self.num_classes + 1
        self.num_classes += n
        return np.arange(start, start + n, dtype=np.int64)

    # ---- sizes ----------------------------------------------------------------------------------
    def blocks_needed(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    @property
    def num_pending_blocks(self) -> int:
        return self.num_blocks - self.num_used - len(self.queue)

    @property
    def hashed(self) -> np.ndarray:
        """bool [num_blocks] (a fresh array): the block holds a prefix-cache entry."""
        return self.block_slot >= 0

    # ---- handing out ----------------------------------------------------------------------------
    def hand_out(self, n: int) -> tuple[np.ndarray, int]:
        """Pop n free blocks for new content (version + 1, state USED; evicted cache entries dropped):
        (block ids intp [n], evictions among them). Reference counts are the caller's."""
        if n == 0:
            return _NO_BLOCKS, 0
        if self.counters["allocated_blocks"] + n > VERSION_INT32_MAX:
            self.widen_versions()
        blocks, evicted = self.queue.pop(n)  # the queue's head, in order (free_queue)
        if len(evicted):
            self.index.delete(evicted)
            self.counters["evictions"] += len(evicted)
        versions = self.version.take(blocks)
        versions += 1
        self.version[blocks] = versions
        self.counters["allocated_blocks"] += n
        return blocks, len(evicted)

    def take(self, n: int, num_tokens: int) -> np.ndarray:
        """Hand out n free blocks for new content to one table (ref 1), holding `num_tokens` tokens: every
        block full but the last, which holds the rest."""
        blocks = self.hand_out(n)[0]
        self.ref[blocks] = 1
        self.num_used += n
        if n:
            self.fill[blocks] = self.block_size
            self.fill[blocks[-1]] = num_tokens - (n - 1) * self.block_size
        self.useful_tokens += num_tokens
        return blocks

    def take_one(self, num_tokens: int) -> int:
        """`take(1, num_tokens)` in scalar steps. NOTE: the array path costs a dozen numpy calls, too many
        for decode, which needs one block per block boundary of every sequence."""
        if self.counters["allocated_blocks"] >= VERSION_INT32_MAX:
            self.widen_versions()
        block = self.queue.pop_plain_one()
        if block < 0:  # the head holds a cache entry: evicted through the array path
            return int(self.take(1, num_tokens)[0])
        self.version[block] += 1
        self.ref[block] = 1
        self.fill[block] = num_tokens
        self.num_used += 1
        self.useful_tokens += num_tokens
        self.counters["allocated_blocks"] += 1
        return block

    def widen_versions(self) -> None:
        """Versions as int64 from now on (once; a no-op after). Called before a hand-out that could take a version
        past int32 — no version exceeds the blocks handed out in all."""
        if self.version.dtype != np.int64:
            self.version = self.version.astype(np.int64)

    def share(self, blocks: np.ndarray, state: np.ndarray, num_cached: int) -> None:
        """One more table holds these blocks (a prompt's cache hits; `state` their states, of which
        `num_cached` are FREE_CACHED): cached and pending ones are in use again (ref 0 -> 1), the cached ones
        leave the LRU; used ones get ref + 1."""
        if num_cached == len(blocks):  # the common case: all of them revived from the cache
            self.queue.revive(blocks)
            self.ref[blocks] = 1
            num_revived = len(blocks)
        else:
            revived = blocks[state != USED]
            self.queue.revive(blocks[state == FREE_CACHED])
            self.state[revived] = USED  # the PENDING ones, too
            self.ref[blocks] += 1
            num_revived = len(revived)
        self.num_used += num_revived
        self.useful_tokens += self.block_size * num_revived

    # ---- taking back ----------------------------------------------------------------------------
    def drop(self, blocks: np.ndarray, num_tokens: int | None = None, *, defer: bool = False) -> None:
        """Blocks whose ref reached 0 (holding `num_tokens` tokens, when the caller knows): free now, or,
        `defer`, pending until `free_pending` (a running step may read them)."""
        self.num_used -= len(blocks)
        self.useful_tokens -= int(np.add.reduce(self.fill[blocks])) if num_tokens is None else num_tokens
        if defer:
            self.state[blocks] = PENDING
            self.pending.append(blocks)
        else:
            self.free(blocks)

    def free_pending(self) -> None:
        """The step ended: the pending blocks that no hit revived meanwhile become free, in drop order."""
        for chunk in self.pending:
            self.free(chunk[self.state[chunk] == PENDING])
        self.pending.clear()

    def free(self, blocks: np.ndarray) -> None:
        """Blocks with ref 0 go to the free queue's tail in this order (vLLM's free_blocks): indexed ones keep
        their content (cache entries), the rest have it dropped."""
        if not self.enable_prefix_caching:  # then nothing is ever indexed
            self.fill[blocks] = 0
            self.queue.push_plain(blocks)
            return
        keep = self.block_slot.take(blocks) >= 0
        num_keep = int(np.count_nonzero(keep))
        if num_keep == len(blocks):
            self.queue.push_cached(blocks)
        elif not num_keep:
            self.fill[blocks] = 0
            self.queue.push_plain(blocks)
        else:
            self.fill[blocks[~keep]] = 0
            self.queue.push(blocks, keep, num_keep)
