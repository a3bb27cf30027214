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
from collections.abc import Sequence

OUTPUT_KEYS = 1 << 64  # a block holding sampled tokens: key OUTPUT_KEYS + rid · P + position (never a prompt key)


class ConnectorLru:
    """Entries with their stamps (module docstring); `stamp` doubles as the tier's membership."""

    def __init__(self, units: Sequence[int], capacity_bytes: int, positions: int,
                 windowed: Sequence[bool] = ()) -> None:
        self.units = tuple(int(u) for u in units)
        self.C, self.P = len(self.units), max(int(positions), 1)
        self.span = self.C * self.P  # stamps per event
        self.windowed = tuple(windowed) or (False,) * self.C  # a group whose touches start past a request's hit
        self.capacity = capacity_bytes
        self.stamp: dict[int, int] = {}
        self.pos: dict[int, int] = {}
        self.buckets: dict[int, list[tuple[int, int]]] = {}  # event -> (stamp, entry) stamped by it, unsorted
        self.events: list[int] = []  # heap of the buckets' events
        self.front: list[tuple[int, int]] = []  # the oldest bucket, sorted, read from `at`
        self.front_event = -1
        self.at = 0
        self.bytes = 0
        self.event = 0
        self.pinned: dict[int, int] = {}  # entry -> loads reading it
        self.pending: set[int] = set()  # stored this step (not evictable until the step ends)
        self.pending_bytes = 0
        self.cover: dict[int, list[int]] = {}  # position key -> live requests whose touch covers it
        self.touched: dict[int, int] = {}  # live request -> its last touch event
        self.lo: dict[int, tuple[int, ...]] = {}  # live request -> per group, the first position its touch covers
        self.retired: dict[int, int] = {}  # position key -> the last touch of an ended request (unwindowed groups)
        self.owner: dict[int, int] = {}  # store event -> the request that stored (its bucket moves with its touches)
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
    def register(self, rid: int, keys: list[int], lo: tuple[int, ...]) -> None:
        """A request's first look-up: its touches cover `keys` (its prompt's) from lo[c] on in group c."""
        self.lo[rid] = lo
        cover = self.cover
        get = cover.get
        for k in keys:
            held = get(k)
            if held is None:
                cover[k] = [rid]
            else:
                held.append(rid)

    def touch(self, rid: int) -> int:
        """The request's entries become the most recent (O(1): read back when an entry is evicted)."""
        self.event += 1
        self.touched[rid] = self.event
        return self.event

    def retire(self, rid: int, keys: list[int], outputs: int) -> None:
        """A request ended: its last touch stays on the entries it covers (its prompt `keys` and its first `outputs`
        output blocks': kept per key for the groups its touches cover whole, written on a windowed group's
        entries now), and it covers nothing more."""
        event = self.touched.pop(rid, None)
        lo = self.lo[rid]
        cover, retired = self.cover, self.retired
        for k in keys:
            held = cover[k]
            if len(held) == 1:
                del cover[k]
            else:
                held.remove(rid)
        if event is None:
            return
        self.last_of[rid] = event
        n = len(keys)
        every = keys + [OUTPUT_KEYS + rid * self.P + p for p in range(n, n + outputs)]
        get = retired.get
        for k in every:
            if get(k, -1) < event:
                retired[k] = event
        if any(self.windowed):
            self._retire_windowed(every, event, lo)

    def _retire_windowed(self, keys: list[int], event: int, lo: tuple[int, ...]) -> None:
        C, stamp = self.C, self.stamp
        for c in range(C):
            if not self.windowed[c]:
                continue
            for p in range(lo[c], len(keys)):
                e = keys[p] * C + c
                s = stamp.get(e)
                if s is not None:
                    t = self._stamp(event, c, p)
                    if t > s:
                        stamp[e] = t
                        self._place(t, e)

    def _true(self, e: int, s: int) -> int:
        """Entry e's recency: its stamp s or a later touch of a request that covers it."""
        k, c = divmod(e, self.C)
        p = self.pos[e]
        best = s
        if not self.windowed[c]:
            event = self.retired.get(k)
            if event is not None:
                best = max(best, self._stamp(event, c, p))
        if k >= OUTPUT_KEYS:
            rids: Sequence[int] = ((k - OUTPUT_KEYS) // self.P,)
        else:
            rids = self.cover.get(k, ())
        for r in rids:
            event = self.touched.get(r)
            if event is not None and p >= self.lo[r][c]:
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
        C, P, lo = self.C, self.P, self.lo[rid]
        base = event * C * P + P - 1
        bucket = self.buckets[event] = []
        heapq.heappush(self.events, event)
        self.owner[event] = rid
        for i in new:
            e, p = entries[i], positions[i]
            s = base + (e % C) * P - p if p >= lo[e % C] else inserted * self.span + i
            stamp[e] = s
            self.pos[e] = p
            if s > inserted * self.span + self.span - 1:
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
        kept = [e for e in protected if e in stamp and e not in pending and e not in pinned]
        pinned_bytes = self.weigh([e for e in pinned if e not in pending])
        if self.bytes - self.pending_bytes - pinned_bytes - self.weigh(kept) < need:
            return None
        return self._evict(need, protected)

    def _evict(self, need: int, protected: set[int]) -> list[int]:
        """make_room's scan, oldest first: `_true` and `_pop_oldest` written out (the run's hottest loop)."""
        out: list[int] = []
        skipped: list[tuple[int, int]] = []
        units, C, P, stamp, pos = self.units, self.C, self.P, self.stamp, self.pos
        pending, pinned, windowed, lo = self.pending, self.pinned, self.windowed, self.lo
        retired, cover, touched = self.retired.get, self.cover.get, self.touched.get
        front, at = self.front, self.at
        while need > 0:
            if at == len(front):
                front = self.front = self._next_front()
                at = 0
            s, e = front[at]
            at += 1
            if stamp.get(e) != s:
                continue
            k, c = divmod(e, C)
            p = pos[e]
            rank = P - 1 - p
            best = s
            if not windowed[c] and (event := retired(k)) is not None:
                best = max(best, (event * C + c) * P + rank)
            for r in ((k - OUTPUT_KEYS) // P,) if k >= OUTPUT_KEYS else cover(k, ()):
                if (event := touched(r)) is not None and p >= lo[r][c]:
                    best = max(best, (event * C + c) * P + rank)
            if best > s:  # touched since it was stamped: back where it belongs
                stamp[e] = best
                self.at = at
                self._place(best, e)
                front = self.front
            elif e in pending or e in pinned or e in protected:
                skipped.append((s, e))
            else:
                del stamp[e], pos[e]
                need -= units[c]
                self.bytes -= units[c]
                out.append(e)
        self.at = at
        for s, e in skipped:
            self._place(s, e)
        return out

    def _next_front(self) -> list[tuple[int, int]]:
        """The oldest bucket, sorted. A store's bucket whose request has touched since moves whole first (its
        entries' stamps shift by the events between: the same group and position), so that an entry is seldom
        moved one by one."""
        while True:
            event = self.front_event = heapq.heappop(self.events)
            bucket = self.buckets.pop(event)
            rid = self.owner.pop(event, None)
            last = None if rid is None else self.touched.get(rid, self.last_of.get(rid))
            if rid is None or last is None or last <= event:
                return sorted(bucket)
            stamp, delta = self.stamp, (last - event) * self.span
            if any(self.windowed):
                C, lo, pos = self.C, self.lo[rid], self.pos
                moved = [(s + delta, e) for s, e in bucket if stamp.get(e) == s and pos[e] >= lo[e % C]]
                stay = [(s, e) for s, e in bucket if stamp.get(e) == s and pos[e] < lo[e % C]]
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
