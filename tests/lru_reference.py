"""An independent LRU prefix cache over block keys (a plain OrderedDict), the reference the capacity curve and
the large-block tests are checked against. (On pytest's path through `pythonpath = ["tests"]`.)"""

from __future__ import annotations

from collections import OrderedDict

# A trace worked by hand at block 512 (prompt tokens, Mooncake hash ids): 5 hit blocks unbounded; hits at a
# capacity of C blocks are 0, 1, 2, 4, 5, 5 for C = 0..5 (tests/core/share/test_capacity.py works them out).
HAND = [(1536, [1, 2, 3]), (1537, [1, 2, 3, 4]), (1024, [5, 6]), (2048, [1, 2, 7, 8])]


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
