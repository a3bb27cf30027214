"""An independent LRU prefix cache over block keys (a plain OrderedDict), the reference the capacity curve and
the large-block tests are checked against. (On pytest's path through `pythonpath = ["tests"]`.)"""

from __future__ import annotations

from collections import OrderedDict


def lru_hit_blocks(requests: list[tuple[list[int], int]], capacity: int | None) -> int:
    """One LRU of `capacity` blocks: the longest cached prefix hits (at most the eligible blocks), then the
    request's blocks become most recent, block 0 on top, and the oldest are evicted."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for keys, eligible in requests:
        h = 0
        while h < eligible and keys[h] in cache:
            h += 1
        hits += h
        for k in reversed(keys):
            cache[k] = None
            cache.move_to_end(k)
        while capacity is not None and len(cache) > capacity:
            cache.popitem(last=False)
    return hits
