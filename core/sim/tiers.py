"""Host and disk prefix-cache tiers below the GPU pool in `kvcalc sim`: what they hold, the links, and the
per-request rule that loads a lower-tier prefix or recomputes it.

The hierarchy is **exclusive**, as `kvcalc share --tier-mode exclusive` models it (core/share/tiers.py):
a block lives in one tier at a time.

    GPU      the pool's prefix cache (core/pool): cached blocks on its LRU free queue, evicted oldest first
    host     an LRU of blocks: a block the GPU pool evicts is written here (most recently used end)
    disk     an LRU of blocks: a block the host evicts is written here; a block the disk evicts is dropped

A request admitted with a GPU hit of g blocks looks further along its prompt's blocks: blocks g, g + 1, …
that sit in the host or on disk (up to the first block in neither, and never the last prompt token's
block) can be loaded instead of computed. Loading k of those h blocks takes

    wait(k) = max over tiers t with n_t(k) > 0 of  max(now, link_t free) + n_t(k) · bytes_per_block / bw_t − now

(each tier's link is a FIFO: a load waits for the loads queued before it; host and disk links run in
parallel), and the rest of the prompt is then computed: prefill(g + k) = the step-time model's time for
one prefill step of the tokens after (g + k) · B cached ones (core/share/load_or_recompute.prefill_s). The
request loads the k in 0..h that minimises wait(k) + prefill(g + k): Mooncake's load-or-recompute rule,
per request, with the queue on the link counted. Loaded blocks leave their tier (promotion: exclusive) and
land in the GPU pool when the load ends; blocks the request computes itself are dropped from the lower
tiers too (the GPU copy is the one copy). Writes (demotions) are counted but do not queue on the links:
PCIe is full duplex and a write-back is asynchronous; only reads delay a request.

Bytes per block are every KV cache group's, per GPU (core/share/cache_bytes, as share's tiers); bandwidths per
GPU. A position is demoted when the first of its groups' blocks is evicted, written with every group's bytes.
A load reads what vLLM allocates for a hit of g + k blocks: per group the blocks from GroupBytes.first_needed(g +
k) on (those before are null entries): full all k, sliding the window's last min(k, ceil((W − 1) / B)), chunked
the current chunk's, a state group the one state at the hit's boundary (block g + k − 1's), as share's tiers.
In mamba_cache_mode align (`state_pages`) a state is saved only where a step ended on a block boundary: a
lower-tier position holds one only if the GPU block it evicted was a state page, and a load must end there.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import compress, repeat
from operator import eq

import numpy as np

from ..share.cache_bytes import CachedBlockBytes
from ..share.load_or_recompute import prefill_s
from .steptime import StepTimeModel

HOST, DISK = 0, 1
_consume = deque[object](maxlen=0).extend  # runs an iterator to its end in C
LOWER_TIERS = ("host", "disk")


@dataclass(frozen=True)
class SimTiers:
    """The lower tiers of one sim run: capacities in blocks (per GPU, as the bytes), links in bytes/s per GPU."""

    host_blocks: int
    disk_blocks: int
    host_bytes_per_s: float
    disk_bytes_per_s: float
    block_bytes: CachedBlockBytes
    host_text: str = ""  # the sizes as typed, for reports
    disk_text: str = ""

    @property
    def bytes_per_block(self) -> int:
        return self.block_bytes.bytes_per_block

    @property
    def capacities(self) -> tuple[int, int]:
        return self.host_blocks, self.disk_blocks

    @property
    def bandwidths(self) -> tuple[float, float]:
        return self.host_bytes_per_s, self.disk_bytes_per_s

    def only(self, host: bool, disk: bool) -> SimTiers:
        """The same links with the host and/or the disk tier emptied (the comparison's rungs)."""
        return SimTiers(self.host_blocks if host else 0, self.disk_blocks if disk else 0, self.host_bytes_per_s,
                        self.disk_bytes_per_s, self.block_bytes, self.host_text if host else "0",
                        self.disk_text if disk else "0")


@dataclass(frozen=True)
class LoadPlan:
    """What one admission would do: keep `gpu_blocks` GPU hits, load `tier_of` blocks after them (HOST or DISK
    each), recompute the `skipped` lower-tier blocks after those, start computing when `ready_s` comes."""

    gpu_blocks: int
    tier_of: tuple[int, ...]
    skipped: int
    ready_s: float

    @property
    def load_blocks(self) -> int:
        return len(self.tier_of)


@dataclass
class TierTotals:
    """Counters of one run; per request [N], each request's first admission (the hit rate under load)."""

    gpu_hit_blocks: np.ndarray
    host_hit_blocks: np.ndarray
    disk_hit_blocks: np.ndarray
    recomputed_blocks: np.ndarray  # blocks in a lower tier that the rule chose to recompute
    admit_s: np.ndarray  # when it was admitted (NaN: never)
    wait_s: np.ndarray  # from admission to the end of its loads (0 without loads)
    read_blocks: list[int]  # host, disk: every load of every admission
    write_blocks: list[int]  # demotions written into host, disk
    dropped_blocks: int = 0  # evicted from the disk (or from the host with no disk tier)
    link_busy_s: tuple[float, float] = (0.0, 0.0)
    read_state_pages: list[int] | None = None  # host, disk: state pages loaded (align; None: not counted)
    read_group_bytes: tuple[dict[str, int], dict[str, int]] = ({}, {})  # host, disk: bytes read per group label

    @classmethod
    def empty(cls, n: int) -> TierTotals:
        z = np.zeros(n, np.int64)
        return cls(z, z.copy(), z.copy(), z.copy(), np.full(n, np.nan), np.zeros(n), [0, 0], [0, 0],
                   read_group_bytes=({}, {}))


class Lru:
    """Keys in recency order: `stamp` maps each key to its last insertion's number; `keys`/`stamps` list every
    insertion in order from `head`, stale ones (re-inserted or discarded keys) skipped when popped. Lists, a
    dict and map/filter keep the per-block work in C (a run demotes millions of blocks; an OrderedDict's
    update costs ~7x a dict's)."""

    def __init__(self) -> None:
        self.stamp: dict[int, int] = {}
        self.keys: list[int] = []
        self.stamps: list[int] = []
        self.head = 0
        self.next = 0  # the next insertion's number (numbers never repeat)

    def __len__(self) -> int:
        return len(self.stamp)

    def add(self, keys: list[int]) -> None:
        """Keys not held, as the most recent, the last one most."""
        stamps = range(self.next, self.next + len(keys))
        self.next += len(keys)
        self.stamp.update(zip(keys, stamps, strict=True))
        self.keys += keys
        self.stamps += stamps

    def touch(self, key: int) -> None:
        self.stamp[key] = self.next
        self.keys.append(key)
        self.stamps.append(self.next)
        self.next += 1

    def discard(self, keys: Iterable[int]) -> None:
        stamp = self.stamp
        if stamp:
            _consume(map(stamp.__delitem__, dict.fromkeys(filter(stamp.__contains__, keys))))

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
        if self.head > 65536 and 2 * self.head > len(self.keys):  # drop what was popped
            del self.keys[: self.head]
            del self.stamps[: self.head]
            self.head = 0
        return out


class TierCache:
    """The host and disk LRUs of block keys, the two links and the rule (module docstring)."""

    def __init__(self, tiers: SimTiers, steptime: StepTimeModel, block_size: int, num_requests: int,
                 state_pages: bool = False) -> None:
        self.tiers, self.steptime, self.block_size = tiers, steptime, block_size
        # align: the keys whose lower-tier copy holds a state (module docstring); None: every block holds all
        self.stateful: set[int] | None = set() if state_pages else None
        self.lru = (Lru(), Lru())
        self.link_free_s = [0.0, 0.0]
        self.busy_s = [0.0, 0.0]
        self.landing: dict[int, float] = {}  # key -> when its load ends (its GPU block holds no KV before)
        self.totals = TierTotals.empty(num_requests)
        if state_pages:
            self.totals.read_state_pages = [0, 0]
        self.admitted = np.zeros(num_requests, bool)
        self.demoted = 0  # GPU evictions seen (a check against the pool's own eviction count)

    # ---- what the GPU pool evicts ------------------------------------------------------------------------
    def demote(self, keys: np.ndarray, states: np.ndarray | None = None) -> None:
        """Blocks the GPU pool evicted, oldest first: written to the host (then overflow to disk, then out);
        `states` (align): which of them are state pages."""
        self.demoted += len(keys)
        top = HOST if self.tiers.host_blocks else DISK if self.tiers.disk_blocks else -1
        if top < 0:
            self.totals.dropped_blocks += len(keys)
            return
        if self.stateful is not None and states is not None:
            self.stateful.update(keys[states].tolist())  # a position whose other blocks come later keeps it
        lru = self.lru[top]
        batch = dict.fromkeys(keys.tolist())  # distinct keys, oldest eviction first
        for key in list(filter(lru.stamp.__contains__, batch)):  # a hybrid position whose other group's block
            lru.touch(key)  # went first: written already
            del batch[key]
        if top == HOST:
            self.lru[DISK].discard(batch)
        lru.add(list(batch))
        self.totals.write_blocks[top] += len(batch)
        self._overflow()

    def _overflow(self) -> None:
        host, disk = self.lru
        capacity_host, capacity_disk = self.tiers.capacities
        if len(host) > capacity_host:
            moved = host.pop_oldest(len(host) - capacity_host)
            if capacity_disk:
                disk.add(moved)
                self.totals.write_blocks[DISK] += len(moved)
            else:
                self._drop(moved)
        if len(disk) > capacity_disk:
            self._drop(disk.pop_oldest(len(disk) - capacity_disk))

    def _drop(self, keys: list[int]) -> None:
        self.totals.dropped_blocks += len(keys)
        if self.stateful is not None:
            self.stateful.difference_update(keys)

    # ---- the rule ------------------------------------------------------------------------------------------
    def plan(self, keys: np.ndarray, gpu_blocks: int, num_tokens: int, now_s: float) -> LoadPlan:
        """Load or recompute the lower-tier blocks after a GPU hit of `gpu_blocks` (a pure look-up)."""
        B = self.block_size
        eligible = min((num_tokens - 1) // B, len(keys))
        host, disk = self.lru[HOST].stamp, self.lru[DISK].stamp
        found: list[int] = []
        for key in keys[gpu_blocks:eligible].tolist():
            tier = HOST if key in host else DISK if key in disk else -1
            if tier < 0:
                break
            found.append(tier)
        ready = now_s
        if self.landing:  # GPU hits whose own load has not ended yet
            ready = max([now_s, *(self.landing.get(k, now_s) for k in keys[:gpu_blocks].tolist())])
        if not found:
            return LoadPlan(gpu_blocks, (), 0, ready)
        ends = None  # align: a load ends where a state was saved
        if self.stateful is not None:
            ends = np.array([key in self.stateful for key in keys[gpu_blocks : gpu_blocks + len(found)].tolist()])
        k = self._best_load(np.array(found), gpu_blocks, num_tokens, now_s, ends)
        return LoadPlan(gpu_blocks, tuple(found[:k]), len(found) - k,
                        max(ready, self._ends(found[:k], gpu_blocks, now_s)))

    def _ends(self, tier_of: list[int], gpu_blocks: int, now_s: float) -> float:
        """When a load of these blocks (tier per block, after `gpu_blocks` GPU hits) would end, queued behind the
        loads on each link."""
        end = now_s
        for t, num_bytes in enumerate(self._load_bytes(np.array(tier_of), gpu_blocks, np.array([len(tier_of)]))):
            if num_bytes[0]:
                end = max(end, max(now_s, self.link_free_s[t]) + num_bytes[0] / self.tiers.bandwidths[t])
        return end

    def _group_reads(self, found: np.ndarray, gpu_blocks: int, ks: np.ndarray) -> list[tuple[str, np.ndarray]]:
        """Per group and tier (label, int64 [2, len(ks)]): the bytes a load of the first k of `found`'s blocks (tier
        per block) reads, for each k in `ks`: the hit is gpu_blocks + k blocks, and the group reads its blocks
        from GroupBytes.first_needed(hit) on (module docstring; share's tiers use the same rule)."""
        cum = np.zeros((2, len(found) + 1), np.int64)
        cum[HOST, 1:] = np.cumsum(found == HOST)
        cum[DISK, 1:] = np.cumsum(found == DISK)
        out = []
        for g in self.tiers.block_bytes.groups:
            start = np.clip(g.first_needed(gpu_blocks + ks, self.block_size) - gpu_blocks, 0, ks)
            out.append((g.label, (cum[:, ks] - cum[:, start]) * g.bytes_per_block))
        return out

    def _load_bytes(self, found: np.ndarray, gpu_blocks: int, ks: np.ndarray) -> np.ndarray:
        """int64 [2, len(ks)]: _group_reads summed over the groups (host, disk)."""
        return sum((r for _, r in self._group_reads(found, gpu_blocks, ks)), np.zeros((2, len(ks)), np.int64))

    def _best_load(self, found: np.ndarray, gpu_blocks: int, num_tokens: int, now_s: float,
                   ends: np.ndarray | None = None) -> int:
        """The k in 0..len(found) with the least wait(k) + prefill(gpu_blocks + k) (the first on ties); `ends`
        (align): where a load may end (k = 0, or block k − 1 holds a state)."""
        B = self.block_size
        k = np.arange(len(found) + 1)
        num_bytes = self._load_bytes(found, gpu_blocks, k)
        wait = np.zeros(len(k))
        for t in (HOST, DISK):
            start = max(now_s, self.link_free_s[t]) - now_s
            wait = np.maximum(wait, np.where(num_bytes[t] > 0, start + num_bytes[t] / self.tiers.bandwidths[t], 0.0))
        cached = (gpu_blocks + k) * B
        compute = prefill_s(self.steptime, cached, num_tokens - cached)
        cost = wait + compute
        if ends is not None:
            cost[1:][~ends] = np.inf
        return int(np.argmin(cost))

    def commit(self, rid: int, keys: np.ndarray, plan: LoadPlan, now_s: float) -> float:
        """The admission happened: queue the loads, promote the loaded blocks, drop the lower copies of blocks
        the request computes; returns when it may compute."""
        loaded, g = plan.load_blocks, plan.gpu_blocks
        reads = self._group_reads(np.array(plan.tier_of), g, np.array([loaded])) if loaded else []
        for t in (HOST, DISK):
            n = plan.tier_of.count(t)
            if n:
                by_group = self.totals.read_group_bytes[t]
                for label, r in reads:
                    by_group[label] = by_group.get(label, 0) + int(r[t, 0])
                seconds = sum(int(r[t, 0]) for _, r in reads) / self.tiers.bandwidths[t]
                self.link_free_s[t] = max(now_s, self.link_free_s[t]) + seconds
                self.busy_s[t] += seconds
                self.totals.read_blocks[t] += n
        if self.totals.read_state_pages is not None and loaded:
            self.totals.read_state_pages[plan.tier_of[-1]] += 1
        rest = keys[g:].tolist()  # loaded or computed here: the GPU copy becomes the one copy
        for lru in self.lru:
            lru.discard(rest)
        if self.stateful is not None:
            self.stateful.difference_update(rest)
        ready = max(plan.ready_s, now_s)
        if loaded and ready > now_s:
            self.landing.update(dict.fromkeys(keys[g : g + loaded].tolist(), ready))
        if not self.admitted[rid]:
            self.admitted[rid] = True
            tot = self.totals
            tot.gpu_hit_blocks[rid] = g
            tot.host_hit_blocks[rid] = plan.tier_of.count(HOST)
            tot.disk_hit_blocks[rid] = plan.tier_of.count(DISK)
            tot.recomputed_blocks[rid] = plan.skipped
            tot.admit_s[rid] = now_s
            tot.wait_s[rid] = ready - now_s
        return ready

    def landed(self, keys: np.ndarray, plan: LoadPlan) -> None:
        """A load ended: its blocks hold their KV."""
        g = plan.gpu_blocks  # the request holds these blocks until now: no other load can have them
        _consume(map(self.landing.pop, keys[g : g + plan.load_blocks].tolist(), repeat(None)))

    def finish(self) -> TierTotals:
        host, disk = self.lru
        assert not host.stamp.keys() & disk.stamp.keys(), "a block in both the host and the disk tier"
        assert len(host) <= self.tiers.host_blocks and len(disk) <= self.tiers.disk_blocks, "a tier over its size"
        self.totals.link_busy_s = (self.busy_s[HOST], self.busy_s[DISK])
        return self.totals
