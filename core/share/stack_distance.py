"""Stack distances of a trace's prefix-cache blocks: every LRU capacity from one pass (Mattson).

The cache modelled (`prefix cache of C blocks`): requests run one at a time in arrival order. A request
with p prompt tokens has m = floor(p / B) full prompt blocks, keyed by chained prefix hashes (block j's key
is fixed by blocks 0..j, so a key implies its whole prefix). Its hit is the longest prefix of its blocks
found in the cache, at most floor((p - 1) / B) blocks (a hit never covers the last prompt token: it is
recomputed for the logits). Then all m blocks enter the cache as most recently used, block 0 on top —
vLLM frees a request's blocks tail first so that a prefix's tail is evicted before its head — and the
least recently used blocks are evicted until at most C remain. The running request's own blocks and its
output's blocks are working memory, not cache (the trace has no content ids for the output); `kvcalc share
--capacity-blocks` replays the pool where they compete (see docs/share.md).

Why one pass gives every C: the update ("move these keys to the top, in this order") does not depend on
C, so a cache of C blocks always holds the top C of one unbounded LRU stack, and a block hits at capacity
C iff its depth in that stack before the request is <= C (Mattson et al., 1970). Parents always sit above
their children, so depths grow along a request's blocks and its hit at C is the number of its hit-eligible
blocks with depth <= C.

Depths without a per-block tree: a block's last access is request r' (the latest earlier request holding
it). Every later request that touched a block of r' touched all its ancestors too, so the blocks of r'
whose last access is still r' are a suffix j >= D[r'] of its blocks. Hence, for block j last held by r',

    depth(j) = 1 + sum(alive[r''] for r' < r'' < r) + (j - D[r']),    alive[r''] = m[r''] - D[r'']

— a Fenwick tree over requests (not blocks) gives the sum. A request's blocks fall into a few segments of
equal r', and depth is j plus a constant along a segment, so the result is a list of segments
(request, first block, blocks, depth of the first): the hit count at any C is a sum of clipped ramps.

Mooncake keys: one hash id covers 512 tokens, so a block of B < 512 tokens is (hash-id prefix, index inside
the id). Two prompts that share 700 tokens share one id (512 tokens): the trace cannot show the other 188,
so for B < 512 the curve is what the trace's 512-token granularity allows, not what an engine hashing every
B tokens would find. A block of B = 512·m tokens covers m whole ids and is keyed by its last one (ids are
prefix-chained, checked up front), so it is read as one coarse id per block (trace_blocks.coarse_trace).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..inputs.traces import Trace, mooncake_blocks_per_id
from .trace_blocks import check_requests, coarse_trace, in_arrival_order

_PROGRESS_EVERY = 500  # requests between progress calls


@dataclass(frozen=True, eq=False)
class StackDistances:
    """Stack depths of every cached-block access of a trace at one block size (see the module docstring).

    Per request r (arrival order), int64 [R] unless noted:
      arrival_s        float64 [R] arrival time, seconds
      prompt_tokens    prompt length p
      touched_blocks   m = floor(p / B): the blocks the request puts in the cache
      eligible_blocks  floor((p - 1) / B): the most blocks a hit may cover
      stack_blocks     distinct blocks in the unbounded stack before r
    Per segment s, int64 [S]: blocks first .. first + blocks - 1 of request `seg_request`, each seen before,
    the first at depth `seg_depth` (depth grows by one per block along a segment). Blocks of a request in no
    segment were never seen before: misses at every capacity.
    """

    block_size: int
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    touched_blocks: np.ndarray
    eligible_blocks: np.ndarray
    stack_blocks: np.ndarray
    seg_request: np.ndarray
    seg_first: np.ndarray
    seg_blocks: np.ndarray
    seg_depth: np.ndarray

    @property
    def requests(self) -> int:
        return len(self.prompt_tokens)

    def _eligible_segment_blocks(self) -> np.ndarray:
        """int64 [S]: blocks of each segment that a hit may cover."""
        room = self.eligible_blocks[self.seg_request] - self.seg_first
        return np.clip(room, 0, self.seg_blocks)

    def clamp(self, capacity_blocks: int) -> int:
        """`capacity_blocks`, or the blocks the trace touches if fewer: no block is ever deeper in the LRU stack
        than that, so a larger cache hits exactly as much, and numpy's int64 never sees a capacity like 2^90."""
        return min(capacity_blocks, int(self.touched_blocks.sum()) + 1)

    def hit_blocks(self, capacity_blocks: int | None) -> np.ndarray:
        """int64 [R]: each request's hit blocks with a cache of `capacity_blocks` (None: unbounded)."""
        length = self._eligible_segment_blocks()
        if capacity_blocks is not None:
            length = np.clip(self.clamp(capacity_blocks) - self.seg_depth + 1, 0, length)
        return np.bincount(self.seg_request, weights=length, minlength=self.requests).astype(np.int64)

    def blocks_within(self, depth: int) -> np.ndarray:
        """int64 [R]: blocks of each request at depth <= `depth` before it (any block, hit-eligible or not)."""
        length = np.clip(self.clamp(depth) - self.seg_depth + 1, 0, self.seg_blocks)
        return np.bincount(self.seg_request, weights=length, minlength=self.requests).astype(np.int64)

    def total_hit_blocks(self, capacity_blocks: int | None) -> int:
        return int(self.hit_blocks(capacity_blocks).sum())

    def capacity_for(self, hit_blocks: int) -> int | None:
        """The least capacity in blocks whose total hit blocks reach `hit_blocks` (None: not even unbounded).

        The total is a sum of ramps (one per segment: 0 below its first depth, +1 per block of capacity, flat
        after its length), so it is piecewise linear: evaluate it at the ramps' corners and solve the piece.
        """
        if hit_blocks <= 0:
            return 0
        length = self._eligible_segment_blocks()
        keep = length > 0
        starts, ends = self.seg_depth[keep], self.seg_depth[keep] + length[keep]  # ramp rises on [start, end)
        if int(length.sum()) < hit_blocks:
            return None
        corners = np.unique(np.concatenate((starts, ends)))
        slope = np.cumsum(np.bincount(np.searchsorted(corners, starts), minlength=len(corners))
                          - np.bincount(np.searchsorted(corners, ends), minlength=len(corners)))
        # for corners[k] <= C < corners[k + 1]: hits(C) = hits(corners[k] - 1) + slope[k] · (C - corners[k] + 1)
        widths = np.diff(corners)
        at_corner = np.concatenate(([0], np.cumsum(slope[:-1] * widths)))  # hits(corners[k] - 1)
        # the first piece whose last value, hits(corners[k + 1] - 1), reaches the target; it rises there
        k = int(np.searchsorted(np.append(at_corner[1:], at_corner[-1]), hit_blocks, side="left"))
        assert at_corner[k] < hit_blocks and slope[k] > 0, "the target lies within piece k"
        return int(corners[k]) + -(-(hit_blocks - int(at_corner[k])) // int(slope[k])) - 1


def chain_nodes(trace: Trace) -> np.ndarray:
    """int64 [H]: a node id per hash id of every request: equal ids and equal prefixes give equal nodes."""
    assert trace.hash_ids is not None and trace.hash_offsets is not None
    nodes = np.empty(len(trace.hash_ids), dtype=np.int64)
    trie: dict[tuple[int, int], int] = {}
    flat, offsets = trace.hash_ids.tolist(), trace.hash_offsets.tolist()
    for i in range(len(trace)):
        node = -1
        for k in range(offsets[i], offsets[i + 1]):
            node = trie.setdefault((node, flat[k]), len(trie))
            nodes[k] = node
    return nodes


class _Fenwick:
    """Prefix sums over request indices with point updates, O(log n) each."""

    def __init__(self, n: int) -> None:
        self.tree = [0] * (n + 1)

    def add(self, i: int, delta: int) -> None:
        i += 1
        while i < len(self.tree):
            self.tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of entries 0 .. i - 1."""
        total = 0
        while i > 0:
            total += self.tree[i]
            i -= i & -i
        return total


def stack_distances(
    trace: Trace, block_size: int, *, progress: Callable[[int], None] | None = None
) -> StackDistances:
    """The stack depths of `trace` at `block_size` (module docstring); `progress(n)` as requests are done."""
    # Over 60 lines on purpose (issue 23): one pass over every request and its hash-id chunks, all steps sharing
    # the holder maps, `dead` and the Fenwick tree. Measured on the Mooncake conversation trace at block 16
    # (12,031 requests, 288,190 chunks, 0.39 s CPU): the per-chunk step as a function call costs +5 %.
    check_requests(trace, block_size, None)
    trace = coarse_trace(in_arrival_order(trace), block_size)  # B = 512·m: one id per block
    n = len(trace)
    prompts = trace.prompt_tokens
    touched = prompts // block_size
    eligible = np.maximum(prompts - 1, 0) // block_size
    empty = np.zeros(0, dtype=np.int64)
    if not trace.has_prefix_ids:  # no content ids: every request's blocks are its own, seen once, never hit
        if progress is not None:
            progress(n)
        seen_before = np.concatenate(([0], np.cumsum(touched)[:-1])).astype(np.int64)
        return StackDistances(block_size, trace.arrival_s, prompts, touched, eligible, seen_before,
                              empty, empty, empty, empty)
    per_id = mooncake_blocks_per_id(block_size)
    nodes = chain_nodes(trace).tolist()
    assert trace.hash_offsets is not None  # has_prefix_ids: the ids and their offsets come together
    offsets = trace.hash_offsets.tolist()
    m_list = touched.tolist()
    last_full: dict[int, int] = {}  # node -> latest request that held all per_id blocks of it
    partial: dict[int, list[tuple[int, int]]] = {}  # node -> (request, blocks held) after it, blocks decreasing
    dead = [0] * n  # D[r]: request r's blocks 0 .. D - 1 have been touched since
    alive = _Fenwick(n)
    stack = 0
    seg_request: list[int] = []
    seg_first: list[int] = []
    seg_blocks: list[int] = []
    seg_depth: list[int] = []
    stack_blocks = np.zeros(n, dtype=np.int64)
    for r in range(n):
        m = m_list[r]
        stack_blocks[r] = stack
        # (first block, last request holding it) pieces along the request, last holder non-increasing
        pieces: list[tuple[int, int]] = []
        for i in range(-(-m // per_id)):
            node = nodes[offsets[r] + i]
            held = min(per_id, m - i * per_id)
            base = i * per_id
            start = 0
            for holder, blocks in reversed(partial.get(node, ())):
                if start < held:
                    pieces.append((base + start, holder))
                start = max(start, blocks)
            if start < held:
                pieces.append((base + start, last_full.get(node, -1)))
            if held == per_id:
                last_full[node] = r
                partial.pop(node, None)
            else:
                entries = partial.setdefault(node, [])
                while entries and entries[-1][1] <= held:
                    entries.pop()
                entries.append((r, held))
        before_r = alive.prefix(r)
        touched_now: list[tuple[int, int]] = []  # (holder, stop): depths first, from the state before r
        new_blocks = m
        k = 0
        while k < len(pieces):
            first, holder = pieces[k]
            while k + 1 < len(pieces) and pieces[k + 1][1] == holder:
                k += 1
            stop = pieces[k + 1][0] if k + 1 < len(pieces) else m
            k += 1
            if holder < 0:
                continue
            seg_request.append(r)
            seg_first.append(first)
            seg_blocks.append(stop - first)
            seg_depth.append(1 + before_r - alive.prefix(holder + 1) + first - dead[holder])
            touched_now.append((holder, stop))
            new_blocks -= stop - first
        for holder, stop in touched_now:
            # blocks first .. stop - 1 of `holder` are touched now: its alive suffix starts at `stop`
            alive.add(holder, dead[holder] - stop)
            dead[holder] = stop
        alive.add(r, m)
        stack += new_blocks
        if progress is not None and (r + 1) % _PROGRESS_EVERY == 0:
            progress(_PROGRESS_EVERY)
    if progress is not None and n % _PROGRESS_EVERY:
        progress(n % _PROGRESS_EVERY)
    as_array = np.asarray
    return StackDistances(
        block_size, trace.arrival_s, prompts, touched, eligible, stack_blocks,
        as_array(seg_request, dtype=np.int64), as_array(seg_first, dtype=np.int64),
        as_array(seg_blocks, dtype=np.int64), as_array(seg_depth, dtype=np.int64),
    )
