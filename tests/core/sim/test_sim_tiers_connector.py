"""sim's host tier (core/sim/tiers_host.ConnectorLru, lazy touches) against an independent small model of vLLM's
offloading connector's CPU side (cpu/manager.py with the LRU policy, offloading/scheduler.py's touches), written
eagerly on an OrderedDict: prepare_store (held keys skipped; the least recently used evictable entries evicted, none
when there is no room: None), the touch of a request after a store that wrote anything and at every look-up (group by
group, each group's keys reversed, from the position the request's first hit fixes for a windowed group), loads
pinning entries, a step's stores not evictable until it ends. After every operation: the same entries, the same
evictions and the same LRU order."""

from __future__ import annotations

from collections import Counter, OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.sim.tiers_host import OUTPUT_KEYS, ConnectorLru


class Connector:
    """The model: every touch done at once on an OrderedDict (oldest first)."""

    def __init__(self, units, capacity, P):
        self.units, self.C, self.P, self.capacity = units, len(units), P, capacity
        self.od: OrderedDict[int, None] = OrderedDict()
        self.pinned: Counter[int] = Counter()
        self.pending: set[int] = set()
        self.keys: dict[int, list[int]] = {}  # request -> its prompt keys
        self.outputs: dict[int, int] = {}  # request -> its output blocks stored (their keys: OUTPUT_KEYS + r·P + p)
        self.lo: dict[int, tuple[int, ...]] = {}
        self.live: set[int] = set()

    def bytes(self):
        return sum(self.units[e % self.C] for e in self.od)

    def key(self, rid, p):
        keys = self.keys[rid]
        return keys[p] if p < len(keys) else OUTPUT_KEYS + rid * self.P + p

    def touch(self, rid):
        n = len(self.keys[rid]) + self.outputs[rid]
        for c in range(self.C):
            for p in reversed(range(self.lo[rid][c], n)):
                e = self.key(rid, p) * self.C + c
                if e in self.od:
                    self.od.move_to_end(e)

    def store(self, rid, entries, positions):
        new = [e for e in entries if e not in self.od]
        if not new:
            return []
        need = self.bytes() + sum(self.units[e % self.C] for e in new) - self.capacity
        out = []
        for e in self.od:
            if need <= 0:
                break
            if e in self.pinned or e in self.pending or e in entries:
                continue
            out.append(e)
            need -= self.units[e % self.C]
        if need > 0:
            return None
        for e in out:
            del self.od[e]
        for e in new:
            self.od[e] = None
        self.pending.update(new)
        top = max(positions) + 1 - len(self.keys[rid])
        self.outputs[rid] = max(self.outputs[rid], top)
        self.touch(rid)
        return out


def _prompts(draw, n):
    """Prompts of shared prefixes: request r's key at position p is its prefix's chain, then its own."""
    out = []
    for r in range(n):
        shared = draw(st.integers(0, 3))
        length = draw(st.integers(1, 6))
        out.append([1000 * (p + 1) + (0 if p < shared else 17 * (r + 1)) for p in range(length)])
    return out


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.data())
def test_host_tier_matches_the_connector_model(data):
    C = data.draw(st.integers(1, 2))
    units = (3, 5)[:C]
    windowed = (False, data.draw(st.booleans()))[:C]
    capacity = data.draw(st.integers(0, 40))
    P = 12
    n = data.draw(st.integers(1, 4))
    prompts = _prompts(data.draw, n)
    # keys more than one prompt holds are followed through `cover`; the others through the request that stored them
    counts = Counter(k for keys in prompts for k in keys)
    shared = data.draw(st.sampled_from([None, {k for k, m in counts.items() if m > 1}]))
    lru, ref = ConnectorLru(units, capacity, P, windowed, shared, n), Connector(units, capacity, P)
    stored = [0] * n
    for _ in range(data.draw(st.integers(1, 30))):
        rid = data.draw(st.integers(0, n - 1))
        op = data.draw(st.sampled_from(["look", "store", "end", "pin", "unpin", "step"]))
        if rid not in ref.lo and rid not in ref.live:
            if rid in ref.keys:
                continue  # ended
            hit = data.draw(st.integers(0, len(prompts[rid])))
            lo = tuple(max(hit - 2, 0) if w else 0 for w in windowed)  # a window of 2 blocks
            lru.register(rid, prompts[rid], lo)
            ref.keys[rid], ref.outputs[rid], ref.lo[rid] = prompts[rid], 0, lo
            ref.live.add(rid)
        if rid not in ref.live:
            continue
        if op == "look":
            lru.touch(rid)
            ref.touch(rid)
        elif op == "store":
            hi = min(stored[rid] + data.draw(st.integers(1, 4)), P - 1)
            positions = [p for c in range(C) for p in range(stored[rid], hi)]
            entries = [ref.key(rid, p) * C + c for c in range(C) for p in range(stored[rid], hi)]
            got, want = lru.store(entries, positions, rid), ref.store(rid, entries, positions)
            assert got == want
            if want is not None:
                stored[rid] = hi
        elif op == "end":
            lru.retire(rid)
            ref.live.discard(rid)
            del ref.lo[rid]
        elif op in ("pin", "unpin") and ref.od:
            e = data.draw(st.sampled_from(sorted(ref.od)))
            if op == "pin":
                lru.pin([e])
                ref.pinned[e] += 1
            elif ref.pinned[e]:
                lru.unpin([e])
                ref.pinned[e] -= 1
                if not ref.pinned[e]:
                    del ref.pinned[e]
        elif op == "step":
            lru.end_step()
            ref.pending = set()
        assert list(lru.order()) == list(ref.od)
        assert lru.bytes == ref.bytes()
