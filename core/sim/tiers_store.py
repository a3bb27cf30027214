"""What `kvcalc sim`'s top lower tier stores and when, as vLLM's offloading connector does
(kv_connector/v1/offloading/scheduler.py _get_reqs_to_store, read at the HMA version): every step, for each scheduled
request (the newly admitted first, in admission order, then the running ones in batch order), each KV cache group's
blocks from the request's next_stored_block_idx up to the full blocks of min(computed + scheduled, num_tokens) tokens
whose GPU block is not null, prompt and output blocks alike, go to the CPU tier (ConnectorLru.store: those it holds
are skipped; when it cannot make room the store fails and the same blocks are offered again next step).

    null blocks   a group's blocks before the first one a hit of the step's start needs (GroupBytes.first_needed:
                  a sliding window's blocks before the window, a chunked group's before the chunk, a state group's
                  before the hit's state); blocks computed in the step all hold KV, except a Mamba group's under
                  mamba_cache_mode align, whose block holds a state only where a step ends on its boundary
    a load        sets next_stored_block_idx to the load's end (its blocks are the tier's already), tiers.commit
    a recompute   keeps it (blocks under it are not stored again: vLLM keeps the request's offload state)

A block holding sampled tokens has a key of its own (tiers_host.OUTPUT_KEYS + request · P + position): no other
request's prompt holds it. sim runs decode steps in runs (fastforward) without a plan per step; the stores of a run
are made afterwards in its step order (every request in it decodes one token a step, so block j of a request that
started the run with c tokens fills at step (j + 1) · B − c), each step's after a look-up of the request waiting at
the head of the queue (vLLM looks it up every step it cannot admit it), each step's stores completing at its end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .tiers_groups import ABSENT, DISK
from .tiers_host import OUTPUT_KEYS

if TYPE_CHECKING:
    from .scheduler import Scheduler
    from .tiers import TierCache


def store_blocks(cache: TierCache, rid: int, start: int, end: int) -> None:
    """Request `rid`'s step from `start` to `end` computed tokens: its blocks offered to the top tier."""
    B = cache.block_size
    lo, hi = int(cache.stored[rid]), end // B
    if hi <= lo:
        return
    keys = cache.key_list(rid)
    n, C, host = len(keys), len(cache.classes), cache.host
    first = start // B
    entries: list[int] = []
    positions: list[int] = []
    if C == 1 and cache.classes[0].kind == "full":  # every block of a plain model's one group holds KV
        entries = keys[lo:hi] if hi <= n else (
            keys[lo:n] + [OUTPUT_KEYS + rid * host.P + p for p in range(max(lo, n), hi)])
        positions = list(range(lo, hi))
    for c, group in enumerate(cache.classes if not positions else ()):
        hit_from = int(group.first_needed(np.int64(first), B))  # before: null entries of the hit
        state = cache.state_pages and group.kind == "state"
        for p in range(lo, hi):
            if p < first:
                if p < hit_from:
                    continue
            elif state and not (p == hi - 1 and end % B == 0):
                continue
            k = keys[p] if p < n else OUTPUT_KEYS + rid * host.P + p
            entries.append(k * C + c)
            positions.append(p)
    size, held = host.bytes, len(host)
    evicted = host.store(entries, positions, rid)
    if evicted is None:
        cache.totals.store_failures += 1
        return
    cache.stored[rid] = hi
    tot, top = cache.totals, cache.top
    tot.write_blocks[top] += len(host) - held + len(evicted)
    tot.write_bytes[top] += host.bytes - size + host.weigh(evicted)
    if evicted:
        _demote(cache, evicted)


def _demote(cache: TierCache, evicted: list[int]) -> None:
    """The host's evictions, oldest first, go to the disk (its most recent end; one it holds is touched), and the
    disk's oldest out past its size; without a disk below they are dropped."""
    tot = cache.totals
    if not cache.below:
        tot.dropped_blocks += len(evicted)
        return
    disk = cache.lru[DISK]
    new = []
    for e in evicted:
        if e in disk.stamp:
            disk.touch(e)
        else:
            new.append(e)
    disk.add(new)
    tot.write_blocks[DISK] += len(new)
    tot.write_bytes[DISK] += disk.weigh(new)
    tot.dropped_blocks += len(disk.pop_over(cache.capacity_bytes[DISK]))


class StoreSync:
    """The stores of every step or run of steps, read off the scheduler after it (module docstring)."""

    def __init__(self, cache: TierCache, scheduler: Scheduler) -> None:
        self.cache, self.s = cache, scheduler
        self.synced = np.zeros(len(cache.stored), np.int64)  # computed tokens when last stored
        self.admitted: list[int] = []  # admitted since the last sync, in order
        self.ending: list[int] = []  # ended since the last sync
        self.on = cache.top != ABSENT

    def admit(self, rid: int, start: int) -> None:
        self.admitted.append(rid)
        self.synced[rid] = start

    def preempted(self, rid: int) -> None:
        """Preempted by recompute: its blocks are gone from the GPU (next_stored_block_idx stays)."""
        self.synced[rid] = 0

    def after(self, run0: list[int], steps: int, head: int | None) -> None:
        """`steps` steps were taken by the requests running before them (`run0`) and those admitted since."""
        if self.on and steps == 1:
            self._step(run0)
        elif self.on and steps > 1:
            self._run(run0, head)
        self.admitted = []
        ending, self.ending = self.ending, []
        for rid in ending:
            self.cache.ended(rid, int(self.s.computed[rid]))

    def _step(self, run0: list[int]) -> None:
        computed, synced, cache = self.s.computed, self.synced, self.cache
        new = self.admitted
        seen = set(new)
        for rid in new + [r for r in run0 if r not in seen]:
            c0, c1 = int(synced[rid]), int(computed[rid])
            if c1 > c0:
                store_blocks(cache, rid, c0, c1)
                synced[rid] = c1
        cache.host.end_step()

    def _run(self, run0: list[int], head: int | None) -> None:
        """A run of decode steps: each request one token a step until it left; stores in step order."""
        B, cache, computed, synced = self.cache.block_size, self.cache, self.s.computed, self.synced
        events: list[tuple[int, int, int, int]] = []
        for i, rid in enumerate(run0):
            c0, c1 = int(synced[rid]), int(computed[rid])
            first = int(cache.stored[rid])
            if c1 // B > first:  # block j fills at step (j + 1) · B − c0 (one filled before: at the first)
                steps = {max((j + 1) * B - c0, 1) for j in range(first, c1 // B)}
                events += [(t, i, rid, c0) for t in steps]
            synced[rid] = c1
        events.sort()
        host = cache.host
        looks = head is not None and head in host.lo  # the head, looked up every step
        last = 0
        for t, _, rid, c0 in events:
            if t != last:
                if last:
                    host.end_step()
                if looks:
                    host.touch(head)  # type: ignore[arg-type]  # looks: head is not None
                last = t
            store_blocks(cache, rid, c0 + t - 1, c0 + t)
        host.end_step()
