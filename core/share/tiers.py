"""A GPU → host → disk prefix-cache hierarchy over a trace, from the same stack distances as the curve.

The rule modelled is an **exclusive** hierarchy with demotion on eviction: a block lives in one tier at a
time; the GPU cache evicts its least recently used blocks to the host (a host write), the host evicts to
disk (a disk write), disk evicts for good. A hit in a lower tier is read back (a read of that tier) and
promoted: the request's blocks all end up on top of the GPU cache. Then tier t holds exactly the blocks at
depths (K[t-1], K[t]] of the one unbounded LRU stack, K = G, G + H, G + H + Z (capacities in blocks) — the
partitioned-LRU view of an exclusive hierarchy — so one pass of stack distances gives every tier.

Per request, with depths before it:
  hits in tier t      its hit-eligible blocks at depths (K[t-1], K[t]] (a hit needs the whole chain, so
                      the GPU part comes first, then host, then disk)
  reads of tier t     = its hits there (loaded into the GPU)
  writes into tier t  blocks in tier t after the request that were not in it before (set difference)
The writes are counted from the stack: the request's m blocks go to depths 1..m; a block not in it at
depth d <= K that k of the request's blocks sat above moves to d - k + m.

`inclusive` models the other rule (vLLM's CPU offloading connector and LMCache): every tier is its own LRU
over every access, a block computed on the GPU is written through to the lower tiers that lack it, and tier
t holds the top K'[t] blocks of the stack with K' = G, H, Z (each capacity on its own, not summed). Hits
come from the fastest tier that has the block; writes into tier t are the request's blocks it did not hold.

Bytes are blocks times the cached block's bytes per KV cache group (cache_bytes); GB/s are taken over the
trace's own time axis, each request's transfers at its arrival, in bins of `bin_s` seconds. Writes move every
group's block of a position (a Mamba hybrid's cached block carries its saved state: every block can be a hit's
boundary). A read loads what vLLM allocates for the request's hit of n blocks (single_type_kv_cache_manager's
get_num_skipped_tokens: the blocks before are null entries): per group the hit's blocks from
GroupBytes.first_needed(n) on that sit in the tier — a full group every one, a sliding group the window's last
ceil((W − 1) / B), a chunked group the current chunk's, a state group the one state at the hit's boundary, read
from the tier holding the hit's last block (CachedBlockBytes.read_bytes, the rule sim's tiers read through too).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ParameterError
from ..units import parse_bytes
from .cache_bytes import CachedBlockBytes
from .capacity import CapacityValue, parse_capacities
from .stack_distance import StackDistances
from .tier_links import DEFAULT_DISK_BANDWIDTH, DEFAULT_HOST_BANDWIDTH

TIER_NAMES = ("gpu", "host", "disk")
MODES = ("exclusive", "inclusive")
DEFAULT_BIN_S = 1.0


def parse_bandwidth(text: str | None, default: float, param: str) -> float:
    """A tier's link in bytes/s as typed (25GB/s, 25e9), or `default` when not given; share's and sim's
    --host-bw and --disk-bw both read it here."""
    if text is None:
        return default
    try:
        return float(parse_bytes(text.strip().removesuffix("/s")))
    except ValueError:
        raise ParameterError(f"{param} {text!r} is not a bandwidth: write bytes per second, e.g. 25GB/s or 25e9",
                             param) from None


def parse_tier_size(text: str | None, param: str) -> CapacityValue:
    """One tier's size as typed (tokens such as 3M, or bytes such as 40GiB); 0 when not given."""
    if text is None:
        return CapacityValue(0, "tokens", "0")
    try:
        values = parse_capacities(text)
    except ParameterError as e:
        raise ParameterError(str(e).replace("capacity", param, 1), param) from None
    if len(values) != 1:
        raise ParameterError(f"{param} {text!r} gives {len(values)} sizes: give one, e.g. {param} 40GiB", param)
    return values[0]


@dataclass(frozen=True)
class TierResult:
    """One tier over the whole trace (blocks; bytes from `block_bytes`)."""

    name: str
    capacity_blocks: int
    bandwidth_bytes_per_s: float | None  # None for the GPU tier
    hit_blocks: int
    hit_requests: int  # requests with at least one hit block served from this tier
    read_blocks: int
    write_blocks: int
    peak_read_bytes_per_s: float
    peak_write_bytes_per_s: float
    block_bytes: int
    read_bytes_by_group: dict[str, int] | None = None  # what the reads load per group (module docstring)

    @property
    def read_bytes(self) -> int:
        return sum((self.read_bytes_by_group or {}).values())

    @property
    def write_bytes(self) -> int:
        return self.write_blocks * self.block_bytes


@dataclass(frozen=True)
class HierarchyResult:
    mode: str
    block_size: int
    requests: int
    prompt_tokens: int
    duration_s: float
    bin_s: float
    tiers: tuple[TierResult, ...]
    dropped_blocks: int  # blocks evicted from the last tier

    @property
    def hit_blocks(self) -> int:
        return sum(t.hit_blocks for t in self.tiers)

    @property
    def hit_tokens(self) -> int:
        return self.hit_blocks * self.block_size


def _overlap(lo1: np.ndarray, hi1: np.ndarray, lo2: np.ndarray | int, hi2: np.ndarray | int) -> np.ndarray:
    """Integers in [lo1, hi1] ∩ [lo2, hi2], elementwise."""
    return np.maximum(np.minimum(hi1, hi2) - np.maximum(lo1, lo2) + 1, 0)


def _request_blocks_moving(d: StackDistances, lo: int, hi: int) -> np.ndarray:
    """int64 [R]: the request's own blocks that land at depths (lo, hi] and were not at depths (lo, hi] before."""
    m = d.touched_blocks
    top = np.minimum(m, hi)
    landing = np.maximum(top - lo, 0)  # blocks j in [lo, top): depth j + 1 in (lo, hi]
    # of those, blocks already at depths (lo, hi]: segment block j has old depth depth0 + j - first
    first, depth0 = d.seg_first, d.seg_depth
    j_lo = np.maximum(first, lo)
    j_hi = np.minimum(first + d.seg_blocks - 1, hi - 1)
    # old depth in (lo, hi]  <=>  j in [lo + 1 - depth0 + first, hi - depth0 + first]
    stayed = _overlap(j_lo, j_hi, lo + 1 - depth0 + first, hi - depth0 + first)
    return landing - np.bincount(d.seg_request, weights=stayed, minlength=d.requests).astype(np.int64)


def _others_moving(d: StackDistances, above: int, lo: int, hi: int | None) -> np.ndarray:
    """int64 [R]: blocks outside the request at depths <= `above` before it that land at depths (lo, hi]."""
    m = d.touched_blocks
    outside = np.minimum(above, d.stack_blocks) - d.blocks_within(above)  # ranks 1 .. outside keep their order
    hi_rank = None if hi is None else hi - m
    return _overlap(np.ones_like(m), outside, lo - m + 1, np.iinfo(np.int64).max // 2 if hi_rank is None else hi_rank)


def _rate_peak(times_s: np.ndarray, num_bytes: np.ndarray, bin_s: float) -> float:
    if not len(times_s) or not num_bytes.any():
        return 0.0
    bins = np.floor((times_s - times_s.min()) / bin_s).astype(np.int64)
    return float(np.bincount(bins, weights=num_bytes.astype(np.float64)).max() / bin_s)


def _check_capacities(capacities_blocks: tuple[int, int, int]) -> None:
    for name, c in zip(("gpu_cache", "host_cache", "disk_cache"), capacities_blocks, strict=True):
        if c < 0:
            raise ParameterError(f"{name} {c} must be at least 0 blocks", name)


def _bounds(capacities_blocks: tuple[int, int, int], mode: str) -> list[int]:
    """Depth limits of the tiers: a block at depth (bounds[t], bounds[t + 1]] is served from tier t."""
    g, h, z = capacities_blocks
    if mode == "exclusive":
        return [0, g, g + h, g + h + z]
    return [0, g, max(g, h), max(g, h, z)]  # inclusive: a tier smaller than the one above it adds nothing


def tier_hit_blocks(d: StackDistances, capacities_blocks: tuple[int, int, int], mode: str = "exclusive",
                    ) -> list[np.ndarray]:
    """int64 [R] per tier (gpu, host, disk): each request's hit blocks served from that tier."""
    within = [d.hit_blocks(k) for k in _bounds(capacities_blocks, mode)[1:]]
    return [within[0], within[1] - within[0], within[2] - within[1]]


def simulate_tiers(
    d: StackDistances, capacities_blocks: tuple[int, int, int], block_bytes: CachedBlockBytes | None,
    bandwidths_bytes_per_s: tuple[float, float] = (DEFAULT_HOST_BANDWIDTH, DEFAULT_DISK_BANDWIDTH),
    mode: str = "exclusive", bin_s: float = DEFAULT_BIN_S,
) -> HierarchyResult:
    """GPU, host and disk caches of `capacities_blocks` over the trace of `d` (module docstring)."""
    _check_capacities(capacities_blocks)
    if mode not in MODES:
        raise ParameterError(f"tier_mode {mode!r} is not one of {', '.join(MODES)}", "tier_mode")
    if not bin_s > 0:
        raise ParameterError(f"bin_s {bin_s:g} must be positive", "bin_s")
    sizes = capacities_blocks  # as given, for the report; the arithmetic below sees them clamped to the trace
    capacities_blocks = (d.clamp(sizes[0]), d.clamp(sizes[1]), d.clamp(sizes[2]))
    bounds = _bounds(capacities_blocks, mode)
    per_block = 0 if block_bytes is None else block_bytes.bytes_per_block
    tier_hits = tier_hit_blocks(d, capacities_blocks, mode)
    hit = tier_hits[0] + tier_hits[1] + tier_hits[2]  # the GPU part of a hit comes first, then host, then disk
    tiers = []
    for t, name in enumerate(TIER_NAMES):
        lo, hi = bounds[t], bounds[t + 1]
        hits = tier_hits[t]
        if mode == "exclusive":
            writes = _request_blocks_moving(d, lo, hi) + (_others_moving(d, lo, lo, hi) if t else 0)
        else:  # write-through: each request block that tier t did not hold
            writes = d.touched_blocks - d.blocks_within(capacities_blocks[t]) if capacities_blocks[t] else 0 * hits
        reads = hits if t else 0 * hits
        first = sum(tier_hits[:t], np.zeros(d.requests, np.int64))  # the hit's blocks [first, first + reads)
        by_group = {} if block_bytes is None else block_bytes.read_bytes(first, first + reads, hit)
        read_bytes = sum(by_group.values(), np.zeros(d.requests, np.int64))
        bandwidth = None if t == 0 else bandwidths_bytes_per_s[t - 1]
        tiers.append(TierResult(
            name, sizes[t], bandwidth, int(hits.sum()), int(np.count_nonzero(hits)), int(reads.sum()),
            int(np.asarray(writes).sum()), _rate_peak(d.arrival_s, read_bytes, bin_s),
            _rate_peak(d.arrival_s, np.asarray(writes) * per_block, bin_s), per_block,
            {label: int(b.sum()) for label, b in by_group.items()},
        ))
    # a block leaves the hierarchy when it falls past the last depth any tier holds (inclusive: the largest tier's)
    last = bounds[3]
    dropped_total = int((_others_moving(d, last, last, None) + _request_dropped(d, last)).sum())
    duration = float(d.arrival_s.max() - d.arrival_s.min()) if d.requests else 0.0
    return HierarchyResult(mode, d.block_size, d.requests, int(d.prompt_tokens.sum()), duration, bin_s,
                           tuple(tiers), dropped_total)


def _request_dropped(d: StackDistances, last: int) -> np.ndarray:
    """The request's own blocks that were in the hierarchy (depth <= last) and land past it (j >= last)."""
    first, depth0 = d.seg_first, d.seg_depth
    j_lo = np.maximum(first, last)
    j_hi = first + d.seg_blocks - 1
    dropped = _overlap(j_lo, j_hi, np.iinfo(np.int64).min // 2, last - depth0 + first)
    return np.bincount(d.seg_request, weights=dropped, minlength=d.requests).astype(np.int64)
