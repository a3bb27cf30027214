"""The hit-rate curve of a Mamba / linear-attention hybrid whose recurrent states are saved only where a
request's full prompt blocks end (vLLM's mamba_cache_mode "align" with one prefill chunk; the hybrid pool
serves those hits, core/pool/hybrid.py), at every capacity from the same stack distances as the curve.

The cache is the curve's LRU of C blocks (stack_distance.py); a saved state lives with the block it was
saved after and leaves the cache with it. A request may resume after block j − 1 only where a state was
saved there and is still cached, and never past floor((p − 1) / B) blocks; after it runs, its state is
saved after its last full prompt block. So, with capacity C:

    hit(r, C) = max { j ≤ eligible(r) : a state was saved after block j − 1 of r's chain, and that block has
                      never been deeper than C in the LRU stack since the save (else it was evicted, state
                      and all) }

A block's depth only grows between its accesses, so the deepest it has been since the save is the largest of
its depths just before each access since then (the stack distances give them), and its depth now. Per
request that is a list of (j, T_j) — the hit at C is the largest j with T_j ≤ C — so one pass serves every
capacity, as the curve's. C = None (unbounded) gives capacity.saved_state_hit_blocks' count.
"""

from __future__ import annotations

import numpy as np

from ..inputs.traces import Trace, mooncake_blocks_per_id
from .stack_distance import StackDistances, chain_nodes
from .trace_blocks import check_requests, coarse_trace, in_arrival_order


def _block_keys(nodes: list[int], m: int, per_id: int) -> list[int]:
    """A content key per block of a request: its hash-id node and the block's index inside the id."""
    return [nodes[j // per_id] * per_id + j % per_id for j in range(m)]


def saved_state_candidates(trace: Trace, d: StackDistances) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(request, j, T) int64 arrays: request r may resume after j blocks at every capacity C ≥ T (module
    docstring). `d` must be the stack distances of `trace` at d.block_size."""
    B = d.block_size
    check_requests(trace, B, None)
    trace = coarse_trace(in_arrival_order(trace), B)
    rows_r: list[int] = []
    rows_j: list[int] = []
    rows_t: list[int] = []
    if not trace.has_prefix_ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    per_id = mooncake_blocks_per_id(B)
    assert trace.hash_offsets is not None  # has_prefix_ids: the ids and their offsets come together
    nodes, offsets = chain_nodes(trace).tolist(), trace.hash_offsets.tolist()
    seg_bounds = np.searchsorted(d.seg_request, np.arange(d.requests + 1))
    first, length, depth0 = d.seg_first.tolist(), d.seg_blocks.tolist(), d.seg_depth.tolist()
    saved: dict[int, int] = {}  # block key -> deepest since its state was saved
    for r, (m, e) in enumerate(zip(d.touched_blocks.tolist(), d.eligible_blocks.tolist(), strict=True)):
        keys = _block_keys(nodes[offsets[r] : offsets[r + 1]], m, per_id)
        found = list(filter(saved.__contains__, keys))
        if found:
            where = dict(zip(keys, range(m), strict=True))
            for key in found:
                j = where[key]
                depth = _depth(j, first, length, depth0, int(seg_bounds[r]), int(seg_bounds[r + 1]))
                deepest = saved[key] = max(saved[key], depth)
                if j + 1 <= e:
                    rows_r.append(r)
                    rows_j.append(j + 1)
                    rows_t.append(deepest)
        if m:
            saved[keys[m - 1]] = 0  # saved now, the request's blocks on top of the stack
    return np.array(rows_r, np.int64), np.array(rows_j, np.int64), np.array(rows_t, np.int64)


def _depth(j: int, first: list[int], length: list[int], depth0: list[int], lo: int, hi: int) -> int:
    """Block j's depth before its request (it was seen before, so a segment of the request holds it)."""
    for s in range(lo, hi):
        if first[s] <= j < first[s] + length[s]:
            return depth0[s] + j - first[s]
    raise AssertionError(f"block {j} has a saved state but no depth: the stack distances are of another trace")


def saved_state_hit_curve(trace: Trace, d: StackDistances, capacities_blocks: list[int | None]) -> list[int]:
    """Total hit blocks at each capacity (None: unbounded) when states are saved only where prompts end."""
    r, j, t = saved_state_candidates(trace, d)
    totals = []
    for c in capacities_blocks:
        keep = np.ones(len(t), bool) if c is None else t <= c
        best = np.zeros(d.requests, np.int64)
        np.maximum.at(best, r[keep], j[keep])
        totals.append(int(best.sum()))
    return totals
