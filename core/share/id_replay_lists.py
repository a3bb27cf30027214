"""A Mooncake trace's prefix-cache replay with nothing evicted, on the plain lists inputs/trace_text.py reads — no
numpy: for a small trace, importing numpy (~0.1 s CPU) costs more than the whole replay does. It gives what
`share_trace` (replay.py, per hash id by id_replay.py) gives, field by field — tests compare the two on random
traces, prefix-chained or not, and the CLI's JSON on the real traces — or None wherever `share_trace` would do
anything else: an input error (which it names), a capacity small enough to evict (the pool), no hash ids.

The walk is per request. The ids holding a request's full blocks are nodes of the trie of id sequences (when the
ids are prefix-chained, each id itself: it fixes its whole prefix); with B = 512·m a block covers m ids and is
keyed by its last (S = 1 block per node), with B dividing 512 a node holds S = 512 / B blocks. A node is full once
a request covered all S of its blocks, else it holds the most blocks a request covered (partial). A request
covers every node of its path but the last fully, so the full nodes of a path are a prefix of it: the first node
not full (a binary search) is where the hit ends — p·S blocks before it plus its partial count — and every node
after it is new, so the update is one set insertion of a slice. O(requests · log ids + new ids), no per-id loop
when the ids are prefix-chained (both Mooncake traces are).
"""

from __future__ import annotations

from ..errors import ParameterError
from ..host_memory import check_fits
from ..inputs.trace_text import (
    MOONCAKE_BLOCK_TOKENS,
    MooncakeLines,
    mooncake_block_size_error,
    mooncake_blocks_per_id,
    mooncake_ids_per_block,
    trace_description,
)
from ..pool.limits import MAX_BLOCK_TOKENS, store_memory_bytes
from .replay_result import ReplayResult, TraceShareResult

_INT64_MAX = 2**63 - 1


def share_trace_lists(lines: MooncakeLines, kind: str, name: str, block_size: int, capacity_blocks: int | None,
                      limit: int | None = None) -> TraceShareResult | None:
    """`share_trace(read_trace(...).head(limit), block_size, capacity_blocks)` of a Mooncake trace read into
    `lines` from `name`, or None where that is not a replay by ids that succeeds (see the module docstring)."""
    arrivals, prompts, outputs, ids, offsets = lines
    if limit is not None:
        if limit <= 0:
            return None
        arrivals, prompts, outputs = arrivals[:limit], prompts[:limit], outputs[:limit]
        if ids is not None and offsets is not None:
            offsets = offsets[: len(prompts) + 1]
            ids = ids[: offsets[-1]]
    if not prompts or ids is None or offsets is None or sum(prompts) + sum(outputs) > _INT64_MAX:
        return None  # an empty trace is an error; no ids: no hits (the general path); int64 sums as numpy's
    B, capacity = block_size, capacity_blocks
    longest = max(p + max(o - 1, 0) for p, o in zip(prompts, outputs, strict=True))  # the last token writes no KV
    largest = -(-longest // B) if B >= 1 else 0  # (trace_blocks.kv_tokens)
    checked = _checked_labels(prompts, ids, offsets, B, capacity, largest)
    if checked is None:
        return None
    labels, _ = checked
    # every request's blocks (trace_blocks.unlimited_capacity: no eviction in vLLM's free-queue order)
    pool_blocks = sum(-(-(p + max(o - 1, 0)) // B) for p, o in zip(prompts, outputs, strict=True))
    if capacity is not None:
        if capacity <= pool_blocks:  # the pool could fill: LRU evictions, replayed through the pool
            return None
        pool_blocks = min(pool_blocks, capacity)
    try:
        check_fits(store_memory_bytes(pool_blocks), "", "", "capacity_blocks")
    except ParameterError:
        return None  # the general path names it
    order = sorted(range(len(prompts)), key=arrivals.__getitem__)  # stable: requests that arrive together keep
    hit_blocks, cached = _hits(order, prompts, labels, offsets, B)  # their file order
    requests, prompt_tokens, output_tokens = len(prompts), sum(prompts), sum(outputs)
    cached_run = ReplayResult(True, B, capacity, pool_blocks, requests, prompt_tokens, output_tokens, hit_blocks * B,
                              hit_blocks, largest, longest, cached, 0)
    uncached_pool = max(largest if capacity is None else min(largest, capacity), 1)
    uncached_run = ReplayResult(False, B, capacity, uncached_pool, requests, prompt_tokens, output_tokens, 0, 0,
                                largest, longest, 0, 0)
    return TraceShareResult(trace_description(kind, name, requests), True, cached_run, uncached_run)


def _checked_labels(prompts: list[int], ids: list[int], offsets: list[int], B: int, capacity: int | None,
                    largest: int) -> tuple[list[int], int] | None:
    """(a trie node per id, the number of nodes) when the trace passes check_trace's checks at block B and
    capacity (largest: the largest request's blocks), else None. Prefix-chained ids are their own nodes."""
    if mooncake_block_size_error(B) is not None or B > MAX_BLOCK_TOKENS:
        return None
    S, m = mooncake_blocks_per_id(B), mooncake_ids_per_block(B)
    if ids and max(ids) > _INT64_MAX // S - 1:  # a key id · S + j must fit int64 (ids are >= 0)
        return None
    for r, prompt in enumerate(prompts):
        if offsets[r + 1] - offsets[r] < -(-(prompt // B) * B // MOONCAKE_BLOCK_TOKENS):
            return None  # a full block without its hash id
    if capacity is not None and capacity < max(largest, 1):
        return None
    distinct = _chained_ids(ids, offsets)
    if distinct is not None:
        return ids, distinct
    if m > 1:
        return None  # a block of several ids is keyed by its last: refused unless prefix-chained
    return _trie_labels(ids, offsets)


def _chained_ids(ids: list[int], offsets: list[int]) -> int | None:
    """The number of distinct ids when every id has one predecessor wherever it occurs (the id before it in its
    request, or none: -1, below every id), i.e. when inputs.traces.first_unchained_id is None; else None. One dict
    of predecessors, checked against every position."""
    if not ids:
        return 0
    before = [-1, *ids[:-1]]
    for r in range(len(offsets) - 1):
        if offsets[r] < offsets[r + 1]:
            before[offsets[r]] = -1
    one = dict(zip(ids, before, strict=True))
    return len(one) if list(map(one.__getitem__, ids)) == before else None


def _trie_labels(ids: list[int], offsets: list[int]) -> tuple[list[int], int]:
    """(a node of the trie of id sequences per position, the number of nodes): equal exactly where the whole id
    sequences up to the position are equal."""
    labels = [0] * len(ids)
    trie: dict[tuple[int, int], int] = {}
    for r in range(len(offsets) - 1):
        node = -1
        for i in range(offsets[r], offsets[r + 1]):
            node = labels[i] = trie.setdefault((node, ids[i]), len(trie))
    return labels, len(trie)


def _hits(order: list[int], prompts: list[int], labels: list[int], offsets: list[int], B: int) -> tuple[int, int]:
    """(hit blocks, cached blocks at the end) of the requests in `order`, one at a time; see the module docstring.
    A node's blocks: in `full` once all S are covered, else in `partial` (the most covered). Every full block a
    request computes is cached, a duplicate of cached content too (vLLM's cache_full_blocks): full - hit each."""
    S, m = mooncake_blocks_per_id(B), mooncake_ids_per_block(B)
    full: set[int] = set()
    partial: dict[int, int] = {}
    hit_blocks = cached = 0
    for r in order:
        prompt = prompts[r]
        blocks = prompt // B
        if not blocks:
            continue
        last = -(-blocks // S) - 1  # position of the node holding the last full block
        start = offsets[r] + m - 1  # a block of m ids is keyed by its last
        nodes = labels[start : start + m * last + 1 : m]
        k = _first_not_full(nodes, full)
        if k > last:
            hit = blocks
        else:
            node, before = nodes[k], partial.pop(nodes[k], 0)
            hit = min(blocks, k * S + before)
            if k < last:  # nodes k .. last - 1 are covered whole; the last one is new
                full.update(nodes[k:last])
                node, before = nodes[last], 0
            now = max(before, blocks - last * S)
            if now == S:
                full.add(node)
            else:
                partial[node] = now
        served = min(hit, (prompt - 1) // B)  # never the block of the prompt's last token
        hit_blocks += served
        cached += blocks - served
    return hit_blocks, cached


def _first_not_full(nodes: list[int], full: set[int]) -> int:
    """The first position of `nodes` not in `full` (len(nodes) if none): the full ones are a prefix."""
    if nodes[-1] in full:
        return len(nodes)
    low, high = 0, len(nodes) - 1  # nodes[:low] are full, nodes[high] is not
    while low < high:
        mid = (low + high) // 2
        if nodes[mid] in full:
            low = mid + 1
        else:
            high = mid
    return low
