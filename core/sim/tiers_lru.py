"""One lower tier of `kvcalc sim` (host or disk) as an LRU of entries weighed in bytes (core/sim/tiers.py).

An entry is one KV cache group's block of one prompt position, keyed `position key · C + c` (C groups, c the
group's index in the tier's CachedBlockBytes: tiers_groups), as vLLM's offloading connector keys its CPU blocks
by (block hash, group). `units[c]` is group c's bytes a block; `bytes` the tier's fill, which its capacity bounds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import compress
from operator import eq

_consume = deque[object](maxlen=0).extend  # runs an iterator to its end in C


class Lru:
    """Keys in recency order: `stamp` maps each key to its last insertion's number; `keys`/`stamps` list every
    insertion in order from `head`, stale ones (re-inserted or discarded keys) skipped when popped. Lists, a
    dict and map/filter keep the per-block work in C (a run demotes millions of blocks; an OrderedDict's
    update costs ~7x a dict's)."""

    def __init__(self, units: Sequence[int] = (1,)) -> None:
        self.stamp: dict[int, int] = {}
        self.keys: list[int] = []
        self.stamps: list[int] = []
        self.head = 0
        self.next = 0  # the next insertion's number (numbers never repeat)
        self.units = tuple(int(u) for u in units)
        self.bytes = 0  # the entries' bytes: sum of units[key % C]

    def __len__(self) -> int:
        return len(self.stamp)

    def weigh(self, keys: Sequence[int]) -> int:
        """The bytes of these entries."""
        units = self.units
        if len(units) == 1:
            return len(keys) * units[0]
        C = len(units)
        return sum(units[k % C] for k in keys)

    def add(self, keys: list[int]) -> None:
        """Keys not held, as the most recent, the last one most."""
        stamps = range(self.next, self.next + len(keys))
        self.next += len(keys)
        self.stamp.update(zip(keys, stamps, strict=True))
        self.keys += keys
        self.stamps += stamps
        self.bytes += self.weigh(keys)

    def touch(self, key: int) -> None:
        """A held key becomes the most recent."""
        self.stamp[key] = self.next
        self.keys.append(key)
        self.stamps.append(self.next)
        self.next += 1

    def discard(self, keys: Iterable[int]) -> None:
        stamp = self.stamp
        if stamp:
            live = list(dict.fromkeys(filter(stamp.__contains__, keys)))
            _consume(map(stamp.__delitem__, live))
            self.bytes -= self.weigh(live)

    def pop_oldest(self, n: int) -> list[int]:
        """Remove and return the n least recently added keys, oldest first."""
        out: list[int] = []
        stamp = self.stamp
        while len(out) < n:
            end = self.head + n - len(out)
            window = self.keys[self.head : end]
            live = list(map(eq, map(stamp.get, window), self.stamps[self.head : end]))
            out += window if all(live) else compress(window, live)
            self.head = end
        _consume(map(stamp.__delitem__, out))
        self.bytes -= self.weigh(out)
        if self.head > 65536 and 2 * self.head > len(self.keys):  # drop what was popped
            del self.keys[: self.head]
            del self.stamps[: self.head]
            self.head = 0
        return out

    def pop_over(self, capacity_bytes: int) -> list[int]:
        """Pop the oldest entries until the rest fit in `capacity_bytes`: the fewest that do, oldest first (a
        batch of ceil(excess / largest unit) never pops one too many)."""
        out: list[int] = []
        biggest = max(self.units)
        while self.bytes > capacity_bytes:
            out += self.pop_oldest(-(-(self.bytes - capacity_bytes) // biggest))
        return out
