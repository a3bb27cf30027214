"""A prefix-cache replay with no eviction, computed per Mooncake hash id instead of per block: the hits and cached
blocks `replay` gets through the block pool when its capacity can hold every block the trace caches (tests
compare the two on the real traces at every block size and on random traces).

Why it is exact. Requests run one at a time, so between requests every block is free and every hit is a cached
free block; with room for every cacheable block nothing is evicted, so a full prompt block, once registered, stays
cached for good. A hit is the longest verified prefix of cached blocks (at most (n - 1) // B of a prompt of n
tokens). Full block j of a request lies in its id at position p = j // S (S = 512 / B blocks per id; with B =
512·m the trace is first coarsened to one id per whole block, S = 1). Its chain is the path of ids to p (a node of
the trie of id sequences; when the ids are prefix-chained, the id itself) and its index j - p·S in that id: the
blocks of one node that earlier requests registered are the first c of its S, c the most any of them covered
(each covers a prefix, min(S, full blocks - p·S)). So a request hits p·S + c blocks at the first of its nodes with
c < S, or all its full blocks, capped at (n - 1) // B. Every full block a request computes is cached, a duplicate
of a cached content too (as vLLM's cache_full_blocks: the prompt's last block, recomputed for its logits, is one),
so the blocks cached at the end (the peak: the count only grows) are the sum over requests of full blocks - hits.

Vectorised over all (request, position) pairs: sort them by node (stably: request order within a node), a
segmented exclusive running maximum gives each pair's c, a per-request minimum the hit. O(ids) numpy work, no
per-block array: ~2 % of the block pool's time and memory at block 16 on the Mooncake conversation trace.
"""

from __future__ import annotations

import itertools

import numpy as np

from ..inputs.traces import Trace, first_unchained_id, mooncake_blocks_per_id
from .trace_blocks import coarse_trace

_CHUNK_PAIRS = 1 << 14  # (request, position) pairs at a time: a chunk's arrays stay in a core's L2 cache


def id_level_hits(trace: Trace, block_size: int) -> tuple[int, int]:
    """(hit blocks, cached blocks at the end) of the replay of `trace` (in arrival order, checked by check_trace)
    with prefix caching and no eviction; see the module docstring."""
    coarse = coarse_trace(trace, block_size)
    ids, offsets = coarse.hash_ids, coarse.hash_offsets
    assert ids is not None and offsets is not None  # keyed: the trace has prefix ids
    S = mooncake_blocks_per_id(block_size)
    full = trace.prompt_tokens // block_size
    first = np.zeros(len(full) + 1, dtype=np.int64)  # request r's pairs are first[r] .. first[r + 1] - 1
    np.cumsum(-(-full // S), out=first[1:])  # the ids holding a full block (check_requests: the trace has them)
    if not first[-1]:
        return 0, 0
    nodes, num_nodes = trie_nodes(ids, offsets)
    covered = np.zeros(num_nodes, dtype=np.int32)  # per node, the most blocks (<= S) the requests so far covered
    hits = np.zeros(len(full), dtype=np.int64)
    cuts = np.searchsorted(first[1:], np.arange(_CHUNK_PAIRS, int(first[-1]), _CHUNK_PAIRS), side="right")
    bounds = np.unique(np.concatenate(([0], cuts, [len(full)]))).tolist()
    for r0, r1 in itertools.pairwise(bounds):
        hits[r0:r1] = _chunk_hits(nodes[offsets[r0] : offsets[r1]], offsets[r0 : r1 + 1] - offsets[r0],
                                  full[r0:r1], first[r0 : r1 + 1] - first[r0], covered, S)
    np.minimum(hits, np.maximum(trace.prompt_tokens - 1, 0) // block_size, out=hits)  # never the last token's block
    return int(hits.sum()), int(full.sum() - hits.sum())


def _chunk_hits(nodes: np.ndarray, offsets: np.ndarray, full: np.ndarray, first: np.ndarray, covered: np.ndarray,
                S: int) -> np.ndarray:
    """Hit blocks (before the last-token cap) of consecutive requests with these trie nodes (`offsets` from
    0), full blocks and pairs (`first` from 0); `covered` (per node, by the requests before these) is brought up to
    date."""
    counts = np.diff(first)
    if not first[-1]:  # no request here has a full block
        return np.zeros(len(full), dtype=np.int64)
    request = np.repeat(np.arange(len(full)), counts)
    position = np.arange(int(first[-1]), dtype=np.int64)
    position -= first[request]
    node = nodes[offsets[request] + position]
    cover = full[request] - position * S
    np.minimum(cover, S, out=cover)
    before, node_of, most = _covered_before(node, cover, S)
    np.maximum(before, covered[node], out=before)
    covered[node_of] = np.maximum(covered[node_of], most)
    # a pair whose node is not wholly cached ends its request's hit there; the other pairs end nothing
    ends = np.where(before < S, position * S + before, np.iinfo(np.int64).max)
    hits = full.copy()
    has = counts > 0
    hits[has] = np.minimum(full[has], np.minimum.reduceat(ends, first[:-1][has]))
    return hits


def _covered_before(node: np.ndarray, cover: np.ndarray, S: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int64 [pairs]: the most any earlier pair of the same node covered, 0 for the first; each node's label and
    most covered). A running maximum per node, one pass: sorted by node (stably: request order within a node),
    pair i gets cover + S' · (its node's rank) with S' = S + 1 > any cover, so one running maximum never carries a
    node's value into the next node."""
    order = np.argsort(node, kind="stable")
    sorted_node = node[order]
    starts = np.empty(len(order), dtype=bool)
    starts[0] = True
    np.not_equal(sorted_node[1:], sorted_node[:-1], out=starts[1:])
    base = np.cumsum(starts)
    base -= 1
    base *= S + 1
    running = cover[order]
    running += base
    np.maximum.accumulate(running, out=running)
    last = np.flatnonzero(np.r_[starts[1:], True])
    shifted = np.empty_like(running)
    shifted[0] = 0
    shifted[1:] = running[:-1]
    shifted -= base
    np.maximum(shifted, 0, out=shifted)  # a node's first pair: the previous node's value less this base is < 0
    before = np.empty_like(shifted)
    before[order] = shifted
    return before, sorted_node[last], running[last] - base[last]


def trie_nodes(ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, int]:
    """(int32 or int64 [len(ids)], n): a label in 0 .. n - 1 per position of the flat ids (of the requests of
    `offsets`), equal exactly where the whole id sequences up to it are equal (a node of the trie). When the ids are
    prefix-chained (first_unchained_id: an id then fixes its whole prefix), the ids less the least (or their rank
    among the distinct ids, when they span a range much larger than their number); else one labelling round per
    position."""
    if first_unchained_id(ids, offsets) is None:
        used = ids[offsets[0] : offsets[-1]]
        if not len(used):
            return np.zeros(len(ids), dtype=np.int64), 0
        low, high = int(used.min()), int(used.max())
        if high - low < 4 * len(used) + (1 << 20):  # then the labels fit in int32: half the memory traffic
            return np.subtract(ids, low, out=np.empty(len(ids), dtype=np.int32), casting="unsafe"), high - low + 1
        labels = np.zeros(len(ids), dtype=np.int64)
        distinct, labels[offsets[0] : offsets[-1]] = np.unique(used, return_inverse=True)
        return labels, len(distinct)
    lengths = np.diff(offsets)
    labels = np.zeros(len(ids), dtype=np.int64)
    parents = np.full(len(lengths), -1, dtype=np.int64)  # each request's node at the position before
    rows = np.arange(len(lengths))
    next_label = 0
    for p in range(int(lengths.max(initial=0))):
        rows = rows[lengths[rows] > p]
        at = offsets[rows] + p
        pair_parent, pair_id = parents[rows], ids[at]
        order = np.lexsort((pair_id, pair_parent))
        new = np.empty(len(order), dtype=bool)
        new[:1] = True
        new[1:] = (pair_parent[order][1:] != pair_parent[order][:-1]) | (pair_id[order][1:] != pair_id[order][:-1])
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.cumsum(new) - 1 + next_label
        next_label += int(np.count_nonzero(new))
        labels[at] = rank
        parents[rows] = rank
    return labels, next_label
