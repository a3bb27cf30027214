"""Host and disk prefix-cache tiers below the GPU pool in `kvcalc sim`: what they hold, the links, and the
per-request rule that loads a lower-tier prefix or recomputes it.

The host is vLLM's offloading connector's CPU tier (OffloadingConnector with its CPU backend and LRU policy), which
is **inclusive**: it is written through, not by the GPU pool's evictions. A tier entry is one KV cache group's block
of one position, as the connector keys its CPU blocks by (block hash, group) (tiers_groups, tiers_host):

    GPU      the pool's prefix cache (core/pool): cached blocks on its LRU free queue, evicted oldest first
    host     every full block a request computes, each group's on its own, stored when its step is scheduled
             (tiers_store: prompt and output blocks, not a group's null blocks), so blocks still on the GPU are
             there too; an LRU of its own (tiers_host: a store or a look-up touches the request's entries, a store
             evicts the least recently used entries no load is reading; no room: the store fails)
    disk     below a host, the entries the host evicts (a victim tier: vLLM's connector has none; kvcalc's
             choice), evicted oldest first and dropped; without a host the disk takes the host's place

A tier of N blocks holds N · bytes_per_block bytes (every group's block of N positions), filled entry by entry.
A request admitted with a GPU hit of g blocks looks further along its prompt's blocks (never the last prompt
token's; vLLM's look-up, which touches its entries): a hit of h = g + k blocks needs, per group, its blocks from
tiers_groups.lookup_first(h) on in a tier — full every block g..h − 1, sliding W the last cdiv(W, B), a state
group the one at h − 1, chunked the current chunk's. A block the GPU caches is not a hit there unless the tier
holds it too (the connector looks up the CPU from the GPU hit on). Loading k takes

    wait(k) = max over tiers t with n_t(k) > 0 of  max(now, link_t free) + n_t(k) / bw_t − now

(n_t(k): the bytes read from tier t; each tier's link is a FIFO: a load waits for the loads queued before it;
host and disk links run in parallel), and the rest of the prompt is then computed: prefill(g + k) = the
step-time model's time for one prefill step of the tokens after (g + k) · B cached ones
(core/share/load_or_recompute.prefill_s). The request loads the k, among those every group can serve, that
minimises wait(k) + prefill(g + k): Mooncake's load-or-recompute rule, per request, with the queue on the link
counted (vLLM loads its whole hit; a fast host link makes the rule load it too). Loaded entries stay in their tier,
the host's pinned until the load lands; the request then stores from the load's end on. Writes are counted but do
not queue on the links (PCIe is full duplex and a store is asynchronous): only reads delay a request.

Bytes are per GPU, paged as the pool pages them (core/share/cache_bytes, as share's tiers); bandwidths per GPU.
A load reads what vLLM allocates for a hit of g + k blocks: per group the blocks from GroupBytes.first_needed(g +
k) on (those before are null entries): full all k, sliding the window's last min(k, ceil((W − 1) / B)), chunked
the current chunk's, a state group the one state at the hit's boundary (block g + k − 1's), as share's tiers.
A state group's block exists only where a state was saved (in mamba_cache_mode align where a step ended on a
block boundary), so a load ends only there. A load an idle pool cannot admit (its tokens are allocated as a
prefill chunk) is cut to the longest it can (`shrink`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from ..share.cache_bytes import CachedBlockBytes
from ..share.load_or_recompute import prefill_s
from .steptime import StepTimeModel
from .tiers_groups import ABSENT, DISK, HOST, find, position_tiers, read_counts, touch_window, valid_loads
from .tiers_host import OUTPUT_KEYS, ConnectorLru
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
    write_blocks: list[int]  # entries written into host, disk: group blocks (one per group a position)
    write_bytes: list[int]  # their bytes
    dropped_blocks: int = 0  # group blocks evicted from the disk (or from the host with no disk tier)
    store_failures: int = 0  # stores of a request's step the host had no room for (offered again next step)
    link_busy_s: tuple[float, float] = (0.0, 0.0)
    read_state_pages: list[int] | None = None  # host, disk: state pages loaded (align; None: not counted)
    read_group_bytes: tuple[dict[str, int], dict[str, int]] = ({}, {})  # host, disk: bytes read per group label
    unresolved_blocks: int = 0  # no longer arises (the tiers store what requests compute): always 0

    @classmethod
    def empty(cls, n: int) -> TierTotals:
        z = np.zeros(n, np.int64)
        return cls(z, z.copy(), z.copy(), z.copy(), np.full(n, np.nan), np.zeros(n), [0, 0], [0, 0], [0, 0],
                   read_group_bytes=({}, {}))


class TierCache:
    """The host and disk tiers of group blocks, the two links and the rule (module docstring)."""

    def __init__(self, tiers: SimTiers, steptime: StepTimeModel, block_size: int, keys: list,
                 positions: int, state_pages: bool = False) -> None:
        self.tiers, self.steptime, self.block_size = tiers, steptime, block_size
        self.classes = tiers.block_bytes.groups  # a tier entry is one of these groups' block of a position
        units = [g.bytes_per_block for g in self.classes]
        self.capacity_bytes = (tiers.host_blocks * tiers.bytes_per_block, tiers.disk_blocks * tiers.bytes_per_block)
        self.top = HOST if tiers.host_blocks else DISK if tiers.disk_blocks else ABSENT
        windowed = [touch_window(g, block_size) < 1 << 62 for g in self.classes]
        shared: set[int] = set()
        self.shared_mask = np.zeros(0, bool)
        self.offsets = np.zeros(len(keys) + 1, np.int64)
        if self.top != ABSENT:  # (the GPU-only rung stores nothing)
            flat = np.concatenate([np.asarray(k, np.int64) for k in keys]) if keys else np.zeros(0, np.int64)
            values, inverse, counts = np.unique(flat, return_inverse=True, return_counts=True)
            self.shared_mask = counts[inverse] > 1  # per prompt block: a key more than one prompt holds (or one twice)
            self.offsets[1:] = np.cumsum([len(k) for k in keys])
            shared = set(values[counts > 1].tolist())
        top = ConnectorLru(units, self.capacity_bytes[max(self.top, 0)], positions, windowed, shared, len(keys))
        self.host = top  # the write-through tier (the disk's place without a host)
        self.lru: tuple[Any, Any] = (top, Lru(units)) if self.top == HOST else (Lru(units), top)
        self.below = self.top == HOST and tiers.disk_blocks > 0  # the disk takes the host's evictions
        self.link_free_s = [0.0, 0.0]
        self.busy_s = [0.0, 0.0]
        self.landing: dict[int, float] = {}  # position key -> when its load ends (its GPU block holds no KV before)
        self.keys = keys  # per request, its prompt's position keys (np.ndarray)
        self.key_lists: dict[int, list[int]] = {}  # those of the requests looked up, as lists
        self.state_pages = state_pages  # mamba_cache_mode align: a state group's block only where a step ended
        n = len(keys)
        self.stored = np.zeros(n, np.int64)  # vLLM's next_stored_block_idx: positions offered to the tier so far
        self.totals = TierTotals.empty(n)
        if state_pages:
            self.totals.read_state_pages = [0, 0]
        self.admitted = np.zeros(n, bool)

    def key_list(self, rid: int) -> list[int]:
        """The request's prompt keys, as a list."""
        keys = self.key_lists.get(rid)
        if keys is None:
            keys = self.key_lists[rid] = self.keys[rid].tolist()
        return keys

    def keys_to(self, rid: int, n: int) -> list[int]:
        """Its keys of positions 0..n − 1: past its prompt's, those of its blocks holding sampled tokens (a request
        preempted by recompute looks its own output blocks up, as vLLM's connector does: tiers_store)."""
        keys = self.key_list(rid)
        if n <= len(keys):
            return keys
        return keys + [OUTPUT_KEYS + rid * self.host.P + p for p in range(len(keys), n)]

    # ---- the rule ------------------------------------------------------------------------------------------
    def plan(self, rid: int, gpu_blocks: int, num_tokens: int, now_s: float) -> LoadPlan:
        """Load or recompute the lower-tier blocks after a GPU hit of `gpu_blocks`: vLLM's look-up
        (get_num_new_matched_tokens), which touches the request's entries."""
        B = self.block_size
        eligible = (num_tokens - 1) // B
        keys = self.keys_to(rid, eligible)
        eligible = min(eligible, len(keys))
        ready = now_s
        if self.landing:  # GPU hits whose own load has not ended yet
            ready = max([now_s, *(self.landing.get(k, now_s) for k in keys[:gpu_blocks])])
        found = find((self.lru[HOST].stamp, self.lru[DISK].stamp), keys[gpu_blocks:eligible], self.classes)
        valid = valid_loads(found, self.classes, gpu_blocks, B)
        self._look_up(rid, gpu_blocks + int(np.flatnonzero(valid)[-1]))
        if not found.shape[1]:
            return LoadPlan(gpu_blocks, (), 0, ready)
        k = self._best_load(found, gpu_blocks, num_tokens, now_s, valid)
        lower = ((found == HOST) | (found == DISK)).any(axis=0)
        return LoadPlan(gpu_blocks, tuple(position_tiers(found, self.classes, gpu_blocks, B, k).tolist()),
                        int(lower[k:].sum()), max(ready, self._ends(found[:, :k], gpu_blocks, now_s)), found[:, :k],
                        ready)

    def _look_up(self, rid: int, hit_blocks: int) -> None:
        """vLLM's look-up touches the request's entries; the first one fixes where a windowed group's touches start
        (num_hit_blocks less the window's blocks, a state group's one block)."""
        if self.top == ABSENT:
            return
        if rid not in self.host.lo:  # (kept after it ends: a request is looked up again only if preempted)
            B = self.block_size
            lo = tuple(max(hit_blocks - touch_window(g, B), 0) for g in self.classes)
            at = np.flatnonzero(self.shared_mask[self.offsets[rid] : self.offsets[rid + 1]]).tolist()
            self.host.register(rid, self.key_list(rid), lo, at)
        self.host.touch(rid)

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

    def commit(self, rid: int, plan: LoadPlan, now_s: float) -> float:
        """The admission happened: queue the loads (their entries stay, pinned until they land: the tiers are
        inclusive); a request that loads stores from the end of its load on. Returns when it may compute."""
        loaded, g = plan.load_blocks, plan.gpu_blocks
        keys = self.keys_to(rid, g + loaded)
        if loaded:
            self._read(plan, now_s)
            self.host.pin(self._read_entries(keys, plan))
            self.stored[rid] = g + loaded  # update_state_after_alloc: next_stored_block_idx
        ready = max(plan.ready_s, now_s)
        if loaded and ready > now_s:
            self.landing.update(dict.fromkeys(keys[g : g + loaded], ready))
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

    def _read_entries(self, keys: list[int], plan: LoadPlan) -> list[int]:
        """The top tier's entries a load reads (each group's from first_needed on)."""
        assert plan.found is not None
        C, B, g, k = len(self.classes), self.block_size, plan.gpu_blocks, plan.load_blocks
        out = []
        for c, group in enumerate(self.classes):
            start = max(int(group.first_needed(np.int64(g + k), B)) - g, 0)
            out += [keys[g + i] * C + c for i in range(start, k) if plan.found[c, i] == self.top]
        return out

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

    def landed(self, rid: int, plan: LoadPlan) -> None:
        """A load ended: its blocks hold their KV, its entries may be evicted again."""
        keys = self.keys_to(rid, plan.gpu_blocks + plan.load_blocks)
        g = plan.gpu_blocks  # the request holds these blocks until now: no other load can have them
        _consume(map(self.landing.pop, keys[g : g + plan.load_blocks], repeat(None)))
        self.host.unpin(self._read_entries(keys, plan))

    def ended(self, rid: int, tokens: int) -> None:
        """A request left with `tokens` computed: its last touch stays on its entries."""
        if rid in self.host.covered:
            self.host.retire(rid)
            self.key_lists.pop(rid, None)

    def finish(self) -> TierTotals:
        host, disk = self.lru
        assert host.bytes <= self.capacity_bytes[HOST] and disk.bytes <= self.capacity_bytes[DISK], (
            "a tier over its size")
        assert host.bytes == host.weigh(list(host.stamp)) and disk.bytes == disk.weigh(list(disk.stamp))
        assert not self.host.pinned, "a load never landed"
        self.totals.link_busy_s = (self.busy_s[HOST], self.busy_s[DISK])
        return self.totals
