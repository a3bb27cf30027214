"""The top lower tier of `kvcalc sim` (the host, or the disk without one) as vLLM's offloading connector keeps its CPU
blocks (vllm/v1/kv_offload/cpu/manager.py with the LRU policy, kv_connector/v1/offloading/scheduler.py): an LRU of
entries (one KV cache group's block of one position, keyed `position key · C + c`: tiers_lru), weighed in bytes.

    store     prepare_store: entries already held are left as they are; room for the new ones is made by evicting
              the least recently used entries that no load is reading (ref_cnt > 0), that no store of this step is
              still writing (ref_cnt −1 until complete_store: a step's stores complete when it ends) and that this
              call stores (`protected`); if that cannot make room nothing is evicted and the store fails (None)
    touch     a request's touch makes its entries the most recent, group by group (the last group most recent),
              each group's from its last position to its first (the first most recent: the LRU policy's touch
              walks the keys reversed); a store that wrote anything touches its request, and so does every look-up
    evict     oldest first, in bytes: the fewest oldest entries that make room

A touch is O(1) here: entry e's recency is the latest of its own stamp (its insertion) and the last touch of each
live request that covers it (`cover`: the requests whose key list holds e's position key, from the first position
each group's touch starts at, `lo`); an entry at the old end is checked against those before it is evicted and,
touched since, moved to where it belongs (the order is kept in buckets by event, read oldest event first; a store's
bucket whose request touched since moves whole). A request that ends leaves its last touch on its entries
(`retire`). So the order is exactly the one eager touches give (tests/core/sim/test_sim_tiers_connector.py checks it
against such a model), without walking every key of every request at every stored block.

Stamps: touch or store event E gives group c's entry at position p the stamp (E · C + c) · P + (P − 1 − p), P a bound
on any request's positions: later events are more recent, then later groups, then earlier positions.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Sequence

_consume = deque[object](maxlen=0).extend  # runs an iterator to its end in C
OUTPUT_KEYS = 1 << 64  # a block holding sampled tokens: key OUTPUT_KEYS + rid · P + position (never a prompt key)


class ConnectorLru:
    """Entries with their stamps (module docstring); `stamp` doubles as the tier's membership. `shared`: the position
    keys more than one request's prompt holds (None: any may be); a key no other request holds is touched by the
    request that stored it alone (`meta`: its position and that request), so only shared keys need `cover`."""

    def __init__(self, units: Sequence[int], capacity_bytes: int, positions: int, windowed: Sequence[bool] = (),
                 shared: set[int] | None = None, requests: int = 1 << 32) -> None:
        self.units = tuple(int(u) for u in units)
        self.C, self.P, self.R = len(self.units), max(int(positions), 1), max(int(requests), 1)
        self.span = self.C * self.P  # stamps per event
        self.windowed = tuple(windowed) or (False,) * self.C  # a group whose touches start past a request's hit
        self.shared = shared
        self.capacity = capacity_bytes
        self.stamp: dict[int, int] = {}
        self.meta: dict[int, int] = {}  # entry -> position · R + the request that stored it
        self.buckets: dict[int, list[tuple[int, int]]] = {}  # event -> (stamp, entry) stamped by it, unsorted
        self.events: list[int] = []  # heap of the buckets' events
        self.front: list[tuple[int, int]] = []  # the oldest bucket, sorted, read from `at`
        self.front_event = -1
        self.front_owner = -1  # the request whose event the front is
        self.at = 0
        self.bytes = 0
        self.event = 0
        self.pinned: dict[int, int] = {}  # entry -> loads reading it
        self.pending: set[int] = set()  # stored this step (not evictable until the step ends)
        self.pending_bytes = 0
        self.cover: dict[int, list[int]] = {}  # shared position key -> live requests whose touch covers it
        self.covered: dict[int, list[tuple[int, int]]] = {}  # live request -> its shared (position, key)s
        self.touched: dict[int, int] = {}  # live request -> its last touch event
        self.lo: dict[int, tuple[int, ...]] = {}  # request -> per group, the first position its touch covers
        self.retired: dict[int, int] = {}  # shared key -> the last touch of an ended request (unwindowed groups)
        self.owner: dict[int, int] = {}  # event -> the request whose store or touch it was (its bucket moves with it)
        self.last_of: dict[int, int] = {}  # ended request -> its last touch event

    def __len__(self) -> int:
        return len(self.stamp)

    def weigh(self, entries: Sequence[int]) -> int:
        units, C = self.units, self.C
        return len(entries) * units[0] if C == 1 else sum(units[e % C] for e in entries)

    def _stamp(self, event: int, c: int, p: int) -> int:
        return (event * self.C + c) * self.P + (self.P - 1 - p)

    def _place(self, s: int, e: int) -> None:
        """Put (s, e) in the order."""
        event = s // self.span
        if event == self.front_event:
            bisect.insort(self.front, (s, e), lo=self.at)
            return
        bucket = self.buckets.get(event)
        if bucket is None:
            self.buckets[event] = [(s, e)]
            heapq.heappush(self.events, event)
        else:
            bucket.append((s, e))

    # ---- requests and their touches -------------------------------------------------------------------------
    def register(self, rid: int, keys: list[int], lo: tuple[int, ...], shared_at: Sequence[int] | None = None) -> None:
        """A request's first look-up: its touches cover `keys` (its prompt's) from lo[c] on in group c; `shared_at`,
        the positions of its keys in `shared` when the caller has them (else found here)."""
        self.lo[rid] = lo
        shared = self.shared
        if shared is None:
            mine = list(enumerate(keys))
        elif shared_at is not None:
            mine = [(p, keys[p]) for p in shared_at]
        else:
            mine = [(p, k) for p, k in enumerate(keys) if k in shared]
        self.covered[rid] = mine
        cover = self.cover
        get = cover.get
        for _, k in mine:
            held = get(k)
            if held is None:
                cover[k] = [rid]
            else:
                held.append(rid)

    def touch(self, rid: int) -> int:
        """The request's entries become the most recent (O(1): read back when an entry is evicted)."""
        self.event += 1
        self.touched[rid] = self.event
        self.owner[self.event] = rid
        return self.event

    def retire(self, rid: int) -> None:
        """A request ended: its last touch stays on the entries it covers (kept per shared key for the groups its
        touches cover whole, written on a windowed group's shared entries now; its other entries read it from
        `last_of`), and it covers nothing more."""
        event = self.touched.pop(rid, None)
        mine = self.covered.pop(rid)
        cover, retired = self.cover, self.retired
        for _, k in mine:
            held = cover[k]
            if len(held) == 1:
                del cover[k]
            else:
                held.remove(rid)
        if event is None:
            return
        self.last_of[rid] = event
        get = retired.get
        for _, k in mine:
            if get(k, -1) < event:
                retired[k] = event
        if any(self.windowed):
            self._retire_windowed(mine, event, self.lo[rid])

    def _retire_windowed(self, mine: list[tuple[int, int]], event: int, lo: tuple[int, ...]) -> None:
        C, stamp = self.C, self.stamp
        for c in range(C):
            if not self.windowed[c]:
                continue
            for p, k in mine:
                e = k * C + c
                s = stamp.get(e)
                if s is not None and p >= lo[c]:
                    t = self._stamp(event, c, p)
                    if t > s:
                        stamp[e] = t
                        self._place(t, e)

    def _true(self, e: int, s: int) -> int:
        """Entry e's recency: its stamp s or a later touch of a request that covers it."""
        k, c = divmod(e, self.C)
        p, r = divmod(self.meta[e], self.R)
        best, lo = s, self.lo
        if k < OUTPUT_KEYS and (self.shared is None or k in self.shared):
            if not self.windowed[c] and (event := self.retired.get(k)) is not None:
                best = max(best, self._stamp(event, c, p))
            for r in self.cover.get(k, ()):
                if (event := self.touched.get(r)) is not None and p >= lo[r][c]:
                    best = max(best, self._stamp(event, c, p))
        elif (event := self.touched.get(r, self.last_of.get(r))) is not None and p >= lo[r][c]:
            best = max(best, self._stamp(event, c, p))
        return best

    # ---- stores, evictions, loads --------------------------------------------------------------------------
    def store(self, entries: list[int], positions: list[int], rid: int) -> list[int] | None:
        """prepare_store of `entries` (at `positions`) for request `rid`, then its touch: the evicted entries, oldest
        first (None: no room, nothing changed; [] with nothing new: no touch either)."""
        stamp = self.stamp
        new = [i for i, e in enumerate(entries) if e not in stamp]
        if not new:
            return []
        fresh = [entries[i] for i in new]
        size = self.weigh(fresh)
        evicted = self.make_room(size, entries)
        if evicted is None:
            return None
        self.event += 1  # the insertion (prepare_store), then the touch: an entry the touch leaves keeps its place
        inserted = self.event
        event = self.touch(rid)
        C, P, R, lo = self.C, self.P, self.R, self.lo[rid]
        base = event * C * P + P - 1
        at = [positions[i] for i in new]
        self.meta.update(zip(fresh, [p * R + rid for p in at], strict=True))
        self.owner[inserted] = rid
        heapq.heappush(self.events, event)
        if not any(self.windowed):
            stamps = ([base - p for p in at] if C == 1 else
                      [base + e % C * P - p for e, p in zip(fresh, at, strict=True)])
            stamp.update(zip(fresh, stamps, strict=True))
            self.buckets[event] = list(zip(stamps, fresh, strict=True))
        else:
            bucket = self.buckets[event] = []
            for i, e, p in zip(new, fresh, at, strict=True):
                s = base + e % C * P - p if p >= lo[e % C] else inserted * self.span + i
                stamp[e] = s
                if s >= event * self.span:
                    bucket.append((s, e))
                else:
                    self._place(s, e)
        self.bytes += size
        self.pending.update(fresh)
        self.pending_bytes += size
        return evicted

    def make_room(self, new_bytes: int, entries: list[int]) -> list[int] | None:
        """Evict the oldest entries not pinned, pending or in `entries` until `new_bytes` more fit (None, nothing
        evicted: they cannot)."""
        need = self.bytes + new_bytes - self.capacity
        if need <= 0:
            return []
        pending, pinned, stamp = self.pending, self.pinned, self.stamp
        protected = set(entries)
        bound = self.bytes - self.pending_bytes - self.weigh(list(pinned)) - self.weigh(entries)  # a lower bound
        if bound < need:  # the evictable bytes exactly: held ones counted once
            kept = [e for e in protected if e in stamp and e not in pending and e not in pinned]
            pinned_bytes = self.weigh([e for e in pinned if e not in pending])
            if self.bytes - self.pending_bytes - pinned_bytes - self.weigh(kept) < need:
                return None
        return self._evict(need, protected)

    def _evict(self, need: int, protected: set[int]) -> list[int]:
        """make_room's scan, oldest first. Every entry of a bucket was stamped by its event's request (each event is
        one request's store or touch), and a bucket whose request touched since moves whole (`_next_front`): so
        only an entry of a key other prompts hold can have been touched later, and only those are read back."""
        out: list[int] = []
        skipped: list[tuple[int, int]] = []
        units, C, stamp, meta, shared = self.units, self.C, self.stamp, self.meta, self.shared
        pending, pinned = self.pending, self.pinned
        if self.front_owner >= 0 and self._last(self.front_owner) > self.front_event:
            self._requeue_front()  # its request touched since the front was read
        front, at = self.front, self.at
        slow = 0  # entries before this one in the front are not taken in bulk
        while need > 0:
            if at == len(front):
                front = self.front = self._next_front()
                at = slow = 0
                continue
            if C == 1 and at >= slow and len(front) - at > 1:  # one size: the next ceil(need / unit) entries
                chunk = front[at : at + -(-need // units[0])]
                live = [e for s, e in chunk if stamp.get(e) == s]
                if [e for e in live if e in protected or e in pending or e in pinned
                        or (e < OUTPUT_KEYS and (shared is None or e in shared))]:
                    slow = at + len(chunk)  # one of them is not plain: one by one
                else:
                    at += len(chunk)
                    _consume(map(stamp.__delitem__, live))
                    _consume(map(meta.__delitem__, live))
                    need -= len(live) * units[0]
                    self.bytes -= len(live) * units[0]
                    out += live
                    continue
            s, e = front[at]
            at += 1
            if stamp.get(e) != s:
                continue
            k, c = divmod(e, C)
            if k < OUTPUT_KEYS and (shared is None or k in shared):
                t = self._true(e, s)
                if t > s:  # touched since by another request: back where it belongs
                    stamp[e] = t
                    self.at = at
                    self._place(t, e)
                    front = self.front
                    continue
            if e in pending or e in pinned or e in protected:
                skipped.append((s, e))
            else:
                del stamp[e], meta[e]
                need -= units[c]
                self.bytes -= units[c]
                out.append(e)
        self.at = at
        for s, e in skipped:
            self._place(s, e)
        return out

    def _last(self, rid: int) -> int:
        return self.touched.get(rid, self.last_of.get(rid, -1))

    def _requeue_front(self) -> None:
        """The rest of the front goes back to its bucket (with its request), to be moved whole."""
        event, rest = self.front_event, self.front[self.at :]
        self.buckets[event] = rest
        heapq.heappush(self.events, event)
        self.front, self.at, self.front_event, self.front_owner = [], 0, -1, -1

    def _next_front(self) -> list[tuple[int, int]]:
        """The oldest bucket, sorted. A bucket whose request has touched since moves whole first (its entries'
        stamps shift by the events between: the same group and position; a windowed group's entries its touches
        do not cover stay)."""
        while True:
            event = self.front_event = heapq.heappop(self.events)
            bucket = self.buckets.pop(event)
            rid = self.front_owner = self.owner.get(event, -1)
            last = -1 if rid < 0 else self._last(rid)
            if last <= event:
                return sorted(bucket)
            stamp, delta = self.stamp, (last - event) * self.span
            if any(self.windowed):
                C, R, lo, meta = self.C, self.R, self.lo[rid], self.meta
                moved = [(s + delta, e) for s, e in bucket if stamp.get(e) == s and meta[e] // R >= lo[e % C]]
                stay = [(s, e) for s, e in bucket if stamp.get(e) == s and meta[e] // R < lo[e % C]]
            else:
                moved, stay = [(s + delta, e) for s, e in bucket if stamp.get(e) == s], []
            stamp.update([(e, s) for s, e in moved])
            there = self.buckets.get(last)
            if there is None:
                self.buckets[last] = moved
                heapq.heappush(self.events, last)
            else:
                there += moved
            if stay:
                self.front_owner = -1  # not covered by its touches: nothing moves them
                return sorted(stay)

    def end_step(self) -> None:
        """The step's stores completed (complete_store): their entries may be evicted from now on."""
        if self.pending:
            self.pending = set()
            self.pending_bytes = 0

    def pin(self, entries: list[int]) -> None:
        for e in entries:
            self.pinned[e] = self.pinned.get(e, 0) + 1

    def unpin(self, entries: list[int]) -> None:
        for e in entries:
            n = self.pinned[e] - 1
            if n:
                self.pinned[e] = n
            else:
                del self.pinned[e]

    def order(self) -> list[int]:
        """Every entry, least recent first, by its true recency (for tests and checks: O(n log n))."""
        return sorted(self.stamp, key=lambda e: self._true(e, self.stamp[e]))
