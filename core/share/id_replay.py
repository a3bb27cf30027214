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
c < S, or all its full blocks, capped at (n - 1) // B; and the blocks cached at the end (the peak: the count
only grows) are the sum over nodes of the most covered.

Vectorised over all (request, position) pairs: sort them by node (stably: request order within a node), a
segmented exclusive running maximum gives each pair's c, a per-request minimum the hit. O(ids) numpy work, no
per-block array: ~2 % of the block pool's time and memory at block 16 on the Mooncake conversation trace.
"""

from __future__ import annotations

import numpy as np

from ..inputs.traces import Trace, first_unchained_id, mooncake_blocks_per_id
from .trace_blocks import coarse_trace


def id_level_hits(trace: Trace, block_size: int) -> tuple[int, int]:
    """(hit blocks, cached blocks at the end) of the replay of `trace` (in arrival order, checked by check_trace)
    with prefix caching and no eviction; see the module docstring."""
    coarse = coarse_trace(trace, block_size)
    ids, offsets = coarse.hash_ids, coarse.hash_offsets
    assert ids is not None and offsets is not None  # keyed: the trace has prefix ids
    S = mooncake_blocks_per_id(block_size)
    prompts = trace.prompt_tokens
    full = prompts // block_size
    full_ids = -(-full // S)  # ids holding a full block (check_requests: every request has them)
    pairs = int(full_ids.sum())
    if not pairs:
        return 0, 0
    request = np.repeat(np.arange(len(full), dtype=np.int64), full_ids)
    first = np.zeros(len(full) + 1, dtype=np.int64)
    np.cumsum(full_ids, out=first[1:])
    position = np.arange(pairs, dtype=np.int64) - first[request]
    node = trie_nodes(ids, offsets)[offsets[request] + position]
    cover = np.minimum(full[request] - position * S, S)
    before, cached = _covered_before(node, cover, S)
    # a pair whose node is not wholly cached ends its request's hit there; the other pairs end nothing
    ends = np.where(before < S, position * S + before, np.iinfo(np.int64).max)
    has = full_ids > 0
    hits = np.zeros(len(full), dtype=np.int64)
    hits[has] = np.minimum.reduceat(ends, first[:-1][has])
    np.minimum(hits, full, out=hits)
    np.minimum(hits, np.maximum(prompts - 1, 0) // block_size, out=hits)  # never the last prompt token's block
    return int(hits.sum()), cached


def _covered_before(node: np.ndarray, cover: np.ndarray, S: int) -> tuple[np.ndarray, int]:
    """(int64 [pairs]: the most any earlier pair of the same node covered, 0 for the first; the sum over nodes of
    the most covered). A running maximum per node, one pass: sorted by node, pair i gets cover + S' · (its node's
    rank) with S' = S + 1 > any cover, so one running maximum never carries a node's value into the next node."""
    order = np.argsort(node, kind="stable")
    sorted_node = node[order]
    starts = np.empty(len(order), dtype=bool)
    starts[0] = True
    np.not_equal(sorted_node[1:], sorted_node[:-1], out=starts[1:])
    base = np.cumsum(starts) - 1
    base *= S + 1
    running = cover[order] + base
    np.maximum.accumulate(running, out=running)
    ends = np.flatnonzero(np.r_[starts[1:], True])
    cached = int((running[ends] - base[ends]).sum())
    shifted = np.empty_like(running)
    shifted[0] = 0
    shifted[1:] = running[:-1]
    shifted -= base
    np.maximum(shifted, 0, out=shifted)  # a node's first pair: the previous node's value less this base is < 0
    before = np.empty_like(shifted)
    before[order] = shifted
    return before, cached


def trie_nodes(ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """int64 [len(ids)]: a label per position of the flat ids, equal exactly where the whole id sequences up to
    it are equal (a node of the trie). The ids themselves when they are prefix-chained (first_unchained_id: an id
    then fixes its whole prefix), else one labelling round per position."""
    if first_unchained_id(ids, offsets) is None:
        return ids
    lengths = np.diff(offsets)
    labels = np.empty(len(ids), dtype=np.int64)
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
    return labels
