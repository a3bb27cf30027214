"""The prefix cache as one sim run used it: what admissions looked up and found, and what preemption by
recompute threw away and computed again. The scheduler tells it of every admission, preemption and end.

    admission (not a swap-in)  looked up: the request's tokens so far (prompt + generated, vLLM's
                               request.num_tokens); hit: the tokens it starts with (the pool's prefix hit; in a
                               run with host/disk tiers, the GPU hit plus the blocks it loads)
    hit rate                   Σ hits / Σ looked up over admissions (vLLM's prefix-cache hit rate, counted
                               per admission; vLLM counts a look-up whose allocation then fails, too)
    readmissions               the same, only for admissions of requests preempted by recompute before
    dropped                    Σ over preemptions by recompute of the KV tokens the request held
    recomputed                 of the dropped tokens, those computed again (a prefix hit at readmission
                               serves the rest): an admission that starts at s after a preemption, where the
                               request had once held h tokens, recomputes the tokens of [s, min(h, c)) by the
                               time it holds c (its end or its next preemption)

A hybrid pool's KV cache groups (full, sliding, chunked, state) are looked up too: each group's own longest hit,
what it alone could serve (`group_hit_tokens`; a group of several block tables — Gemma-3's six sliding ones —
serves the least of theirs, each table's blocks being evicted on their own); the admission's hit is what every
group serves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

GroupProbe = Callable[[int, int], list[int]]


@dataclass(frozen=True)
class PrefixCacheTotals:
    """One run's counts (module docstring); `group_hit_tokens` per KV cache group of a hybrid pool, else None."""

    enabled: bool  # the policy looks prefixes up (the paged policy with prefix caching on and prefix ids)
    admissions: int
    prompt_tokens: int
    hit_tokens: int
    readmissions: int
    readmitted_prompt_tokens: int
    readmitted_hit_tokens: int
    dropped_tokens: int
    recomputed_tokens: int
    group_hit_tokens: list[int] | None = None

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict:
        readmitted = self.readmitted_prompt_tokens
        doc: dict[str, Any] = {
            "enabled": self.enabled, "admissions": self.admissions, "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens, "hit_rate": self.hit_rate,
            "readmissions": self.readmissions, "readmitted_prompt_tokens": readmitted,
            "readmitted_hit_tokens": self.readmitted_hit_tokens,
            "readmitted_hit_rate": self.readmitted_hit_tokens / readmitted if readmitted else 0.0,
            "dropped_tokens": self.dropped_tokens, "recomputed_tokens": self.recomputed_tokens,
        }
        if self.group_hit_tokens is not None:
            doc["group_hit_tokens"] = list(self.group_hit_tokens)
        return doc


class PrefixCounts:
    """The counters while a run goes (module docstring). `group_probe(rid, num_tokens)`: each group's own longest
    hit, asked before the admission changes the pool (None: a single group, or no prefix caching)."""

    def __init__(self, num_requests: int, enabled: bool, group_probe: GroupProbe | None = None,
                 num_groups: int = 0) -> None:
        self.enabled, self.group_probe = enabled, group_probe
        self.admissions = self.prompt_tokens = self.hit_tokens = 0
        self.readmissions = self.readmitted_prompt_tokens = self.readmitted_hit_tokens = 0
        self.dropped_tokens = self.recomputed_tokens = 0
        self.start = np.zeros(num_requests, np.int64)  # the tokens each request's current admission started with
        self.held: dict[int, int] = {}  # request preempted by recompute -> the most tokens it ever held
        self.group_hits = [0] * num_groups if group_probe is not None else None

    def probe(self, rid: int, num_tokens: int) -> list[int] | None:
        """Each group's own hit for an admission about to happen (None without a group probe)."""
        return None if self.group_probe is None else self.group_probe(rid, num_tokens)

    def admitted(self, rid: int, num_tokens: int, hit: int, group_hits: list[int] | None) -> None:
        """A request admitted from the queue (not a swap-in) with `hit` of its `num_tokens` tokens held."""
        self.admissions += 1
        self.prompt_tokens += num_tokens
        self.hit_tokens += hit
        self.start[rid] = hit
        if rid in self.held:
            self.readmissions += 1
            self.readmitted_prompt_tokens += num_tokens
            self.readmitted_hit_tokens += hit
        if group_hits is not None and self.group_hits is not None:
            self.group_hits = [a + b for a, b in zip(self.group_hits, group_hits, strict=True)]

    def preempted(self, rid: int, tokens: int) -> None:
        """Preemption by recompute of a request that held `tokens`."""
        self.dropped_tokens += tokens
        self._recomputed(rid, tokens)
        self.held[rid] = max(self.held.get(rid, 0), tokens)

    def ended(self, rid: int, tokens: int) -> None:
        """A running request ended (finished, cancelled, timed out) holding `tokens`."""
        if rid in self.held:
            self._recomputed(rid, tokens)
            del self.held[rid]

    def _recomputed(self, rid: int, tokens: int) -> None:
        self.recomputed_tokens += max(0, min(tokens, self.held.get(rid, 0)) - int(self.start[rid]))

    def totals(self) -> PrefixCacheTotals:
        return PrefixCacheTotals(self.enabled, self.admissions, self.prompt_tokens, self.hit_tokens,
                                 self.readmissions, self.readmitted_prompt_tokens, self.readmitted_hit_tokens,
                                 self.dropped_tokens, self.recomputed_tokens, self.group_hits)


def prefix_counts(policy: Any, num_requests: int) -> PrefixCounts:
    """The counters for a run on `policy`: a hybrid paged pool with prefix keys is probed per group (a run of equal
    pool groups, one per block table, is one KV cache group: kv_groups' pages_per_block tables of one layer type)."""
    keys = getattr(policy, "prompt_keys", None)
    pool = getattr(policy, "pool", None)
    group_hit_tokens = getattr(pool, "group_hit_tokens", None)
    if keys is None or group_hit_tokens is None:
        return PrefixCounts(num_requests, keys is not None)
    B, tables = int(policy.block_size), policy.groups
    spans: list[list[int]] = []  # [first table, end) of each group
    for i, table in enumerate(tables):
        if spans and tables[spans[-1][0]] == table:
            spans[-1][1] = i + 1
        else:
            spans.append([i, i + 1])

    def probe(rid: int, num_tokens: int) -> list[int]:
        own = group_hit_tokens(num_tokens, keys[rid][: num_tokens // B])
        return [min(own[a:b]) for a, b in spans]

    return PrefixCounts(num_requests, True, probe, len(spans))
