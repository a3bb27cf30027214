"""`kvcalc sim --host-cache … --disk-cache …`: the same workload with and without each tier, side by side,
and the prefix-cache hit rate under load beside the one-at-a-time replay's at the same sizes.

The rungs: GPU only (tiers of size 0: the plain run, bit for bit), GPU + host, then GPU + host + disk (the
run asked for, which `kvcalc sim` has just done); with `find_max_rate`, each rung's highest rate under the
SLO. The replay is `kvcalc share`'s stack distances (core/share/stack_distance): requests one at a time in arrival
order, each one's blocks cached as soon as it is served, nobody else holding blocks, with sim's tiers' rule: the
host written through (inclusive of the GPU: it holds the top max(G, H) of the LRU stack) and the disk the host's
victim (the next Z: the top max(G, H + Z) in all), `replay_hits`. Under load, running
requests hold blocks the cache cannot use, and a request's blocks are cached only as it computes them, so
the hit rate under load is lower; the gap is what concurrency costs the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..inputs.traces import Trace
from ..share.replay_groups import keys_lower_bound
from ..share.stack_distance import StackDistances, stack_distances
from .metrics import RunSummary, summarize
from .record import REJECTED, RunRecord
from .run import run_policy
from .search import RateSearch, max_rate
from .setup import SimJob
from .tiers import SimTiers, TierTotals


@dataclass(frozen=True, eq=False)
class TierRung:
    label: str
    tiers: SimTiers
    record: RunRecord
    summary: RunSummary
    search: RateSearch | None
    # one-at-a-time replay (share's): hits served by gpu, host, disk; None when the block does not tile the trace's
    # 512-token ids (a hybrid's forced block: the run keys it by its last id, share's replay only exactly)
    replay_hit_blocks: tuple[int, int, int] | None

    @property
    def totals(self) -> TierTotals:
        return self.record.tiers


@dataclass(frozen=True, eq=False)
class TierComparison:
    rungs: tuple[TierRung, ...]
    prompt_tokens: int  # of the requests not rejected at arrival: the hit rates' denominator
    block_size: int
    gpu_cache_blocks: int  # the GPU pool as the replay's cache: whole cached blocks (one per group)


def tier_rungs(tiers: SimTiers) -> list[tuple[str, SimTiers]]:
    """(label, tiers) from GPU only up to the tiers asked for (the last one)."""
    rungs = [("GPU only", tiers.only(False, False))]
    if tiers.host_blocks and tiers.disk_blocks:
        rungs.append(("GPU + host", tiers.only(True, False)))
    label = "GPU + host + disk" if tiers.host_blocks and tiers.disk_blocks else (
        "GPU + host" if tiers.host_blocks else "GPU + disk" if tiers.disk_blocks else "GPU, tiers of size 0")
    rungs.append((label, tiers))
    return rungs


def replay_trace(job: SimJob, record: RunRecord) -> Trace:
    """The workload's requests that the run did not reject at arrival (rejection depends only on the request,
    so every rung rejects the same ones), as a trace for share's replay."""
    w = job.workload
    assert w.hash_ids is not None and w.hash_offsets is not None, "check_tier_setup: tiers need prefix ids"
    keep = np.flatnonzero(record.status != REJECTED)
    ids = [w.hash_ids[w.hash_offsets[i] : w.hash_offsets[i + 1]] for i in keep.tolist()]
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in ids])]).astype(np.int64)
    return Trace("mooncake", w.description, w.arrival_s[keep], w.prompt_tokens[keep], w.output_tokens[keep],
                 np.concatenate(ids) if ids else w.hash_ids[:0], offsets)


def replay_hits(d: StackDistances, gpu: int, host: int, disk: int) -> tuple[int, int, int]:
    """Hit blocks served by the GPU, the host and the disk one request at a time: a block at LRU depth up to G is
    the GPU's, up to max(G, H) the host's (written through, it holds the GPU's blocks too), up to max(G, H + Z) the
    disk's (the host's victims)."""
    bounds = (gpu, max(gpu, host), max(gpu, host + disk if host else disk))
    within = [int(d.hit_blocks(k).sum()) for k in bounds]
    return within[0], within[1] - within[0], within[2] - within[1]


def gpu_cache_blocks(job: SimJob) -> int:
    """The pool's blocks as whole cached positions (a hybrid pool holds one block per group for each)."""
    groups = job.sim.groups
    return job.sim.capacity_blocks // (1 if groups is None else len(groups))


def compare_tiers(job: SimJob, records: dict[str, RunRecord], searches: dict[str, RateSearch],
                  progress: Callable[[int], None] | None = None) -> TierComparison:
    """Every rung of job.sim.tiers (the last is `records["paged"]`, with its search when there is one)."""
    tiers = job.sim.tiers
    assert tiers is not None, "compare_tiers needs a job with tiers"
    trace = replay_trace(job, records["paged"])
    distances = None if keys_lower_bound(job.sim.block_size) else stack_distances(trace, job.sim.block_size)
    gpu = gpu_cache_blocks(job)
    kv_per_token = job.plan.kv_bytes_per_token
    rungs = []
    for i, (label, rung_tiers) in enumerate(tier_rungs(tiers)):
        last = i == len(tier_rungs(tiers)) - 1
        sim = replace(job.sim, tiers=rung_tiers)
        record = records["paged"] if last else run_policy(job.workload, "paged", sim, progress=progress)
        search = None
        if job.find_max_rate:
            search = searches.get("paged") if last else max_rate(job.workload, "paged", sim, job.slo,
                                                               job.target_attainment, first=record)
        replay = None
        if distances is not None:
            replay = replay_hits(distances, gpu, rung_tiers.host_blocks, rung_tiers.disk_blocks)
        rungs.append(TierRung(label, rung_tiers, record, summarize(record, job.slo, kv_per_token), search, replay))
    return TierComparison(tuple(rungs), int(np.sum(trace.prompt_tokens)), job.sim.block_size, gpu)
