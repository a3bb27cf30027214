"""Beam search two ways: through the block pool and the model executor, and with contiguous caches per beam.

The scheduler has no notion of beams, so a small driver decodes groups of beams in lockstep (every live
beam of every group in one step) and does between steps what a beam engine asks of the pool:

    step 0   each prompt is prefilled as one beam; its `width` best first tokens start `width` beams
             (the prompt's blocks are forked, shared by every beam)
    step s   every beam decodes its last token; of all (beam, token) continuations the `width` best
             by total log-probability survive: a beam chosen k times forks k - 1 times, a beam never
             chosen is released (dropped); appending into a shared, partially filled block copies it
             (copy-on-write), which the executor performs

Beams are scored by the sum of their tokens' log-probabilities (float64 log-softmax of the float32
logits), candidates ordered by (score descending, beam order, token id) so that both paths break ties
alike. The reference does the same search with one contiguous KV cache per beam, cloned on a fork.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ...core.pool.block_pool import BlockPool, ReleaseReason
from ...core.sim.plan import BlockLayout, StepPlan
from .contiguous import ContiguousKVCache, allocate_contiguous_kv, contiguous_forward
from .executor import ModelExecutor
from .sampling import GREEDY
from .weights import ModelWeights


@dataclass(frozen=True)
class BeamResult:
    """The final beams of one prompt, best first."""

    tokens: tuple[tuple[int, ...], ...]
    scores: tuple[float, ...]
    logits: tuple[torch.Tensor, ...]  # per beam [num_tokens, vocab]: row i is what token i was chosen from


def select(scores: Sequence[float], rows: Sequence[torch.Tensor], width: int) -> list[tuple[int, int, float]]:
    """The `width` best continuations (parent beam index, token, new score) of beams with these scores
    and next-token logits rows [vocab], best first."""
    candidates = []
    for b, (score, row) in enumerate(zip(scores, rows, strict=True)):
        logp = torch.log_softmax(row.to(torch.float64), dim=0)
        top = torch.topk(logp, min(width, logp.shape[0]))
        candidates += [(score + float(v), b, int(t)) for v, t in zip(top.values, top.indices, strict=True)]
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    return [(b, t, s) for s, b, t in candidates[:width]]


@dataclass
class _RefBeam:
    cache: ContiguousKVCache
    tokens: list[int]
    rows: list[torch.Tensor]
    score: float
    next_row: torch.Tensor  # logits of the token after the last one


def _clone(cache: ContiguousKVCache) -> ContiguousKVCache:
    return ContiguousKVCache(tuple(t.clone() for t in cache.k), tuple(t.clone() for t in cache.v), cache.num_tokens)


def reference_beam_search(weights: ModelWeights, prompt: Sequence[int], width: int, num_tokens: int) -> BeamResult:
    """Beam search over contiguous caches, one per beam (no pool, no batching)."""
    cache = allocate_contiguous_kv(weights.config, len(prompt) + num_tokens, weights.dtype, weights.device)
    first = contiguous_forward(weights, cache, prompt)[-1].cpu()
    beams = [_RefBeam(cache, [], [], 0.0, first)]
    for step in range(num_tokens):
        chosen = select([b.score for b in beams], [b.next_row for b in beams], width)
        used: set[int] = set()
        survivors = []
        for parent, token, score in chosen:
            b = beams[parent]
            cache = b.cache if parent not in used else _clone(b.cache)
            used.add(parent)
            survivors.append(_RefBeam(cache, [*b.tokens, token], [*b.rows, b.next_row], score, b.next_row))
        # clones are taken above, before any beam's cache grows
        if step + 1 < num_tokens:
            for b in survivors:
                b.next_row = contiguous_forward(weights, b.cache, [b.tokens[-1]])[-1].cpu()
        beams = survivors
    return BeamResult(tuple(tuple(b.tokens) for b in beams), tuple(b.score for b in beams),
                      tuple(torch.stack(b.rows) for b in beams))


@dataclass
class BeamEvents:
    forks: int = 0
    dropped: int = 0


def paged_beam_search(
    executor: ModelExecutor, pool: BlockPool, prompts: Sequence[Sequence[int]], width: int, num_tokens: int,
) -> tuple[list[BeamResult], BeamEvents]:
    """Beam search of every prompt at once through `pool` and `executor` (see the module docstring); the
    pool is whole again afterwards."""
    B = pool.block_size
    events = BeamEvents()
    next_id = max(executor.requests, default=-1) + 1
    groups: list[list[int]] = []  # per prompt, its live beams' request ids in beam order
    scores: dict[int, float] = {}
    for prompt in prompts:
        pool.allocate(next_id, len(prompt))
        executor.add_request(next_id, prompt, GREEDY)
        groups.append([next_id])
        scores[next_id] = 0.0
        next_id += 1
    step = 0
    copies: list[tuple[int, int]] = []
    computed = {rid: 0 for g in groups for rid in g}
    for generated in range(num_tokens + 1):
        rids = [rid for g in groups for rid in g]
        tables = tuple(pool.block_table(r) for r in rids)
        token_ids, starts, news = [], [], []
        for rid in rids:
            known = executor.requests[rid].tokens
            start = computed[rid]
            token_ids.append(tuple(known[start:]))
            starts.append(start)
            news.append(len(known) - start)
        slots = np.concatenate([t[p // B] * B + p % B for t, p in zip(
            tables, (np.arange(a, a + n) for a, n in zip(starts, news, strict=True)), strict=True)])
        plan = StepPlan(step, 0.0, np.array(rids, np.int64), np.array(starts, np.int64), np.array(news, np.int64),
                        np.zeros(len(rids), bool), len(rids), token_ids=tuple(token_ids),
                        blocks=BlockLayout(tables, slots, tuple(copies)))
        with pool.step():
            executor.execute(plan)
            for rid, n in zip(rids, news, strict=True):
                computed[rid] += n
            step += 1
            if generated == num_tokens:
                break
            groups, next_id, copies = _advance(executor, pool, groups, scores, computed, width, next_id, events)
    results = []
    for g in groups:
        results.append(BeamResult(
            tuple(tuple(executor.requests[r].output) for r in g), tuple(scores[r] for r in g),
            tuple(torch.stack(executor.requests[r].logits) for r in g)))
        for rid in g:
            pool.release(rid, ReleaseReason.FINISHED)
    return results, events


def _advance(executor: ModelExecutor, pool: BlockPool, groups: list[list[int]], scores: dict[int, float],
             computed: dict[int, int], width: int, next_id: int,
             events: BeamEvents) -> tuple[list[list[int]], int, list[tuple[int, int]]]:
    """One selection for every group: forks, drops, then each survivor's token appended to the pool (its
    slot reserved for the next step). Returns the new groups, the next free id and the CoW copies."""
    rows = executor.last_logits
    new_groups, chosen_tokens = [], []
    for g in groups:
        chosen = select([scores[r] for r in g], [rows[r] for r in g], width)
        used: set[int] = set()
        beams = []
        for parent, token, score in chosen:
            rid = g[parent]
            if rid in used:  # a second continuation of the same beam: a fork, before anything is appended
                pool.fork(rid, next_id)
                executor.fork_request(rid, next_id)
                computed[next_id] = computed[rid]
                events.forks += 1
                rid, next_id = next_id, next_id + 1
            else:
                used.add(g[parent])
            beams.append(rid)
            chosen_tokens.append((rid, token, rows[g[parent]]))
            scores[rid] = score
        for rid in g:
            if rid not in used:
                pool.release(rid, ReleaseReason.FINISHED)
                del scores[rid], computed[rid]
                events.dropped += 1
        new_groups.append(beams)
    copies = []
    for rid, token, row in chosen_tokens:
        executor.append_token(rid, token, row)
        copies += pool.append(rid, 1)
    return new_groups, next_id, copies
