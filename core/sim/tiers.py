"""Host and disk prefix-cache tiers below the GPU pool in `kvcalc sim`: what they hold, the links, and the
per-request rule that loads a lower-tier prefix or recomputes it.

The hierarchy is **exclusive**, as `kvcalc share --tier-mode exclusive` models it (core/share/tiers.py):
a block lives in one tier at a time. A tier entry is one KV cache group's block of one prompt position, as
vLLM's offloading connector keys its CPU blocks by (block hash, group) (tiers_groups, tiers_lru):

    GPU      the pool's prefix cache (core/pool): cached blocks on its LRU free queue, evicted oldest first
    host     an LRU of group blocks: a block the GPU pool evicts is written here (most recently used end) with
             its own group's bytes only (a sliding group's blocks leave the GPU long before the full group's)
    disk     an LRU of group blocks: a block the host evicts is written here; a block the disk evicts is dropped

A tier of N blocks holds N · bytes_per_block bytes (every group's block of N positions), filled entry by entry.
A request admitted with a GPU hit of g blocks looks further along its prompt's blocks (never the last prompt
token's): a hit of h = g + k blocks needs, per group, only its blocks from tiers_groups.lookup_first(h) on
— full every block g..h − 1, sliding W the last cdiv(W, B), a state group the one at h − 1, chunked the
current chunk's. A group's block the GPU has not evicted yet past g (the hit cut short by another group) counts
as in the top lower tier, read over its link, as vLLM's write-through CPU copy (tiers_groups). Loading k takes

    wait(k) = max over tiers t with n_t(k) > 0 of  max(now, link_t free) + n_t(k) / bw_t − now

(n_t(k): the bytes read from tier t; each tier's link is a FIFO: a load waits for the loads queued before it;
host and disk links run in parallel), and the rest of the prompt is then computed: prefill(g + k) = the
step-time model's time for one prefill step of the tokens after (g + k) · B cached ones
(core/share/load_or_recompute.prefill_s). The request loads the k, among those every group can serve, that
minimises wait(k) + prefill(g + k): Mooncake's load-or-recompute rule, per request, with the queue on the link
counted. Loaded blocks leave their tier (promotion: exclusive) and land in the GPU pool when the load ends;
blocks the request computes itself are dropped from the lower tiers too (the GPU copy is the one copy); a
group's blocks before the first it reads stay. Writes (demotions) are counted but do not queue on the links:
PCIe is full duplex and a write-back is asynchronous; only reads delay a request.

Bytes are per GPU, paged as the pool pages them (core/share/cache_bytes, as share's tiers); bandwidths per GPU.
A load reads what vLLM allocates for a hit of g + k blocks: per group the blocks from GroupBytes.first_needed(g +
k) on (those before are null entries): full all k, sliding the window's last min(k, ceil((W − 1) / B)), chunked
the current chunk's, a state group the one state at the hit's boundary (block g + k − 1's), as share's tiers.
A state group's block exists only where a state was saved (in mamba_cache_mode align where a step ended on a
block boundary: found only once the GPU evicted it), so a load ends only there. A load an idle pool cannot admit
(its tokens are allocated as a prefill chunk) is cut to the longest it can (`shrink`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from ..share.cache_bytes import CachedBlockBytes
from ..share.load_or_recompute import prefill_s
from .steptime import StepTimeModel
from .tiers_groups import ABSENT, DISK, HOST, find, position_tiers, read_counts, valid_loads
from .tiers_lru import Lru

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
    tier_of: tuple[int, ...]  # per loaded position: HOST or DISK (tiers_groups.position_tiers)
    skipped: int
    ready_s: float
    found: np.ndarray | None = None  # int8 [groups, load_blocks]: where each group's block of them is
    gpu_ready_s: float = 0.0  # when its GPU hits' own loads (another request's) end

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
    write_blocks: list[int]  # demotions written into host, disk: group blocks (one per group a position)
    write_bytes: list[int]  # their bytes
    dropped_blocks: int = 0  # group blocks evicted from the disk (or from the host with no disk tier)
    link_busy_s: tuple[float, float] = (0.0, 0.0)
    read_state_pages: list[int] | None = None  # host, disk: state pages loaded (align; None: not counted)
    read_group_bytes: tuple[dict[str, int], dict[str, int]] = ({}, {})  # host, disk: bytes read per group label
    unresolved_blocks: int = 0  # evicted blocks whose KV cache group could not be told (counted as full)

    @classmethod
    def empty(cls, n: int) -> TierTotals:
        z = np.zeros(n, np.int64)
        return cls(z, z.copy(), z.copy(), z.copy(), np.full(n, np.nan), np.zeros(n), [0, 0], [0, 0], [0, 0],
                   read_group_bytes=({}, {}))


class TierCache:
    """The host and disk LRUs of group blocks, the two links and the rule (module docstring)."""

    def __init__(self, tiers: SimTiers, steptime: StepTimeModel, block_size: int, num_requests: int,
                 state_pages: bool = False) -> None:
        self.tiers, self.steptime, self.block_size = tiers, steptime, block_size
        self.classes = tiers.block_bytes.groups  # a tier entry is one of these groups' block of a position
        units = [g.bytes_per_block for g in self.classes]
        self.lru = (Lru(units), Lru(units))
        self.capacity_bytes = (tiers.host_blocks * tiers.bytes_per_block, tiers.disk_blocks * tiers.bytes_per_block)
        self.link_free_s = [0.0, 0.0]
        self.busy_s = [0.0, 0.0]
        self.landing: dict[int, float] = {}  # position key -> when its load ends (its GPU block holds no KV before)
        # entries a request computed or loaded that the GPU has not evicted since: cached there (a state page in
        # align is saved only where a step ends, so those are left out: found only once demoted)
        self.gpu: set[int] = set()
        self.computed = [c for c, g in enumerate(self.classes) if not (state_pages and g.kind == "state")]
        self.totals = TierTotals.empty(num_requests)
        if state_pages:
            self.totals.read_state_pages = [0, 0]
        self.admitted = np.zeros(num_requests, bool)
        self.demoted = 0  # GPU evictions seen (a check against the pool's own eviction count)
        self.unresolved = [0]  # evicted blocks whose group could not be told (tiers_run.group_of_evicted)

    def _entries(self, keys: list[int], start: int = 0) -> list[int]:
        """Every group's entry of positions keys[start:]."""
        C = len(self.classes)
        return keys[start:] if C == 1 else [k * C + c for k in keys[start:] for c in range(C)]

    # ---- what the GPU pool evicts ------------------------------------------------------------------------
    def demote(self, keys: np.ndarray, classes: np.ndarray | None = None) -> None:
        """Blocks the GPU pool evicted, oldest first (`keys` their positions, `classes` their groups: None, a
        plain pool's block holds every group): written to the host (then overflow to disk, then out)."""
        self.demoted += len(keys)
        C = len(self.classes)
        if classes is None:
            entries = self._entries(keys.tolist())
        else:
            entries = [k * C + c for k, c in zip(keys.tolist(), classes.tolist(), strict=True)]
        self.gpu.difference_update(entries)
        top = HOST if self.tiers.host_blocks else DISK if self.tiers.disk_blocks else -1
        if top < 0:
            self.totals.dropped_blocks += len(entries)
            return
        lru = self.lru[top]
        batch = dict.fromkeys(entries)  # distinct entries, oldest eviction first
        for key in list(filter(lru.stamp.__contains__, batch)):  # written already (a plain pool's block of a
            lru.touch(key)  # position evicted again before its entry left)
            del batch[key]
        if top == HOST:
            self.lru[DISK].discard(batch)
        new = list(batch)
        lru.add(new)
        self.totals.write_blocks[top] += len(new)
        self.totals.write_bytes[top] += lru.weigh(new)
        self._overflow()

    def _overflow(self) -> None:
        host, disk = self.lru
        capacity_host, capacity_disk = self.capacity_bytes
        moved = host.pop_over(capacity_host)
        if moved and capacity_disk:
            disk.add(moved)
            self.totals.write_blocks[DISK] += len(moved)
            self.totals.write_bytes[DISK] += disk.weigh(moved)
        elif moved:
            self.totals.dropped_blocks += len(moved)
        self.totals.dropped_blocks += len(disk.pop_over(capacity_disk))

    # ---- the rule ------------------------------------------------------------------------------------------
    def plan(self, keys: np.ndarray, gpu_blocks: int, num_tokens: int, now_s: float, on_gpu: int = 0) -> LoadPlan:
        """Load or recompute the lower-tier blocks after a GPU hit of `gpu_blocks` (a pure look-up); `on_gpu`:
        the full groups' blocks past the hit that the GPU still caches (counted in the top tier: tiers_groups)."""
        B = self.block_size
        eligible = min((num_tokens - 1) // B, len(keys))
        ready = now_s
        if self.landing:  # GPU hits whose own load has not ended yet
            ready = max([now_s, *(self.landing.get(k, now_s) for k in keys[:gpu_blocks].tolist())])
        top = HOST if self.tiers.host_blocks else DISK if self.tiers.disk_blocks else ABSENT
        found = find((self.lru[HOST].stamp, self.lru[DISK].stamp, self.gpu), keys[gpu_blocks:eligible].tolist(),
                     self.classes, max(on_gpu, 0), top)
        if not found.shape[1]:
            return LoadPlan(gpu_blocks, (), 0, ready)
        valid = valid_loads(found, self.classes, gpu_blocks, B)
        k = self._best_load(found, gpu_blocks, num_tokens, now_s, valid)
        lower = ((found == HOST) | (found == DISK)).any(axis=0)
        return LoadPlan(gpu_blocks, tuple(position_tiers(found, self.classes, gpu_blocks, B, k).tolist()),
                        int(lower[k:].sum()), max(ready, self._ends(found[:, :k], gpu_blocks, now_s)), found[:, :k],
                        ready)

    def shrink(self, plan: LoadPlan, fits: Callable[[int], bool], now_s: float) -> LoadPlan:
        """The plan with the longest valid load of at most its own that `fits` (k = 0 always does): a load larger
        than the pool can ever admit (the loaded tokens are allocated as a prefill chunk is) is cut to one that
        it can."""
        assert plan.found is not None
        g, B = plan.gpu_blocks, self.block_size
        valid = np.flatnonzero(valid_loads(plan.found, self.classes, g, B)).tolist()
        lo, hi = 0, len(valid) - 1  # valid[lo] = 0 fits; the need grows with k: the largest that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(valid[mid]) else (lo, mid - 1)
        k = valid[lo]
        found = plan.found[:, :k]
        ready = max(plan.gpu_ready_s, self._ends(found, g, now_s))
        tiers = tuple(position_tiers(found, self.classes, g, B, k).tolist())
        return LoadPlan(g, tiers, plan.skipped + plan.load_blocks - k, ready, found, plan.gpu_ready_s)

    def _load_bytes(self, found: np.ndarray, gpu_blocks: int, ks: np.ndarray) -> np.ndarray:
        """int64 [C, 2, len(ks)]: the bytes each group's blocks a load of the first k positions reads from the host
        and the disk, for each k in `ks` (tiers_groups.read_counts)."""
        units = np.array([g.bytes_per_block for g in self.classes], dtype=np.int64)
        return read_counts(found, self.classes, gpu_blocks, self.block_size, ks) * units[:, None, None]

    def _ends(self, found: np.ndarray, gpu_blocks: int, now_s: float) -> float:
        """When a load of `found`'s positions would end, queued behind the loads on each link."""
        end = now_s
        for t, num_bytes in enumerate(self._load_bytes(found, gpu_blocks, np.array([found.shape[1]])).sum(axis=0)):
            if num_bytes[0]:
                end = max(end, max(now_s, self.link_free_s[t]) + num_bytes[0] / self.tiers.bandwidths[t])
        return end

    def _best_load(self, found: np.ndarray, gpu_blocks: int, num_tokens: int, now_s: float,
                   valid: np.ndarray) -> int:
        """The k in 0..K with the least wait(k) + prefill(gpu_blocks + k) (the first on ties) among the `valid`."""
        B = self.block_size
        k = np.arange(found.shape[1] + 1)
        num_bytes = self._load_bytes(found, gpu_blocks, k).sum(axis=0)
        wait = np.zeros(len(k))
        for t in (HOST, DISK):
            start = max(now_s, self.link_free_s[t]) - now_s
            wait = np.maximum(wait, np.where(num_bytes[t] > 0, start + num_bytes[t] / self.tiers.bandwidths[t], 0.0))
        cached = (gpu_blocks + k) * B
        cost = wait + prefill_s(self.steptime, cached, num_tokens - cached)
        cost[~valid] = np.inf
        return int(np.argmin(cost))

    def commit(self, rid: int, keys: np.ndarray, plan: LoadPlan, now_s: float) -> float:
        """The admission happened: queue the loads, promote the loaded blocks, drop the lower copies of blocks
        the request computes; returns when it may compute."""
        loaded, g = plan.load_blocks, plan.gpu_blocks
        if loaded:
            self._read(plan, now_s)
        self._promote(keys.tolist(), g, loaded)
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

    def _read(self, plan: LoadPlan, now_s: float) -> None:
        """Queue a load's reads on the links; count them per group and tier."""
        assert plan.found is not None
        reads = self._load_bytes(plan.found, plan.gpu_blocks, np.array([plan.load_blocks]))[:, :, 0]
        for t in (HOST, DISK):
            if reads[:, t].any():
                by_group = self.totals.read_group_bytes[t]
                for g, r in zip(self.classes, reads[:, t].tolist(), strict=True):
                    by_group[g.label] = by_group.get(g.label, 0) + r
                seconds = int(reads[:, t].sum()) / self.tiers.bandwidths[t]
                self.link_free_s[t] = max(now_s, self.link_free_s[t]) + seconds
                self.busy_s[t] += seconds
            self.totals.read_blocks[t] += plan.tier_of.count(t)
        if self.totals.read_state_pages is not None:
            states = [c for c, g in enumerate(self.classes) if g.kind == "state"]
            tiers = plan.found[states, plan.load_blocks - 1]
            if len(tiers) and (tiers >= 0).all():
                self.totals.read_state_pages[int(tiers.max())] += 1

    def _promote(self, keys: list[int], g: int, loaded: int) -> None:
        """The GPU copy becomes the one copy of what the request loads or computes: each group's entries from its
        first block read on (from g without a load: the request computes every group's blocks from there)."""
        C, B = len(self.classes), self.block_size
        gone: list[int] = []
        for c, group in enumerate(self.classes):
            start = g if not loaded else max(g, int(group.first_needed(np.int64(g + loaded), B)))
            entries = [k * C + c for k in keys[start:]] if C > 1 else keys[start:]
            gone += entries
            if c in self.computed and C > 1:
                self.gpu.update(entries)
        for lru in self.lru:
            lru.discard(gone)

    def forget(self, keys: np.ndarray, computed_blocks: int) -> None:
        """A request preempted by recompute after `computed_blocks` of its prompt: the GPU holds none of its later
        blocks (another request's copy of them is forgotten too: a load then reads it, never a block not there)."""
        C = len(self.classes)
        if C > 1:
            later = keys[computed_blocks:].tolist()
            self.gpu.difference_update([k * C + c for k in later for c in self.computed])

    def landed(self, keys: np.ndarray, plan: LoadPlan) -> None:
        """A load ended: its blocks hold their KV."""
        g = plan.gpu_blocks  # the request holds these blocks until now: no other load can have them
        _consume(map(self.landing.pop, keys[g : g + plan.load_blocks].tolist(), repeat(None)))

    def finish(self) -> TierTotals:
        host, disk = self.lru
        assert not host.stamp.keys() & disk.stamp.keys(), "a block in both the host and the disk tier"
        assert host.bytes <= self.capacity_bytes[HOST] and disk.bytes <= self.capacity_bytes[DISK], (
            "a tier over its size")
        assert host.bytes == host.weigh(list(host.stamp)) and disk.bytes == disk.weigh(list(disk.stamp))
        self.totals.link_busy_s = (self.busy_s[HOST], self.busy_s[DISK])
        self.totals.unresolved_blocks = self.unresolved[0]
        return self.totals
