"""The contiguous reference of every request a run compares, each decoded alone over its own contiguous KV cache,
computed once per (prompt, sampling) and shared by the scenarios that send the same prompt.

    generate_alone_together(weights, jobs) -> [Generation]     jobs: (prompt, new tokens, sampling)
    References(weights).prefetch(jobs); .get(prompt, new, sampling) -> Generation
    references(weights, requests, seed) -> (Generation per row, its expected length, end-of-sequence or None)

Alone, together: every job has its own cache (`contiguous.ContiguousKVCache`) and its queries attend over
that cache only (`contiguous.attend_alone`, the function `contiguous_forward` uses); what the jobs share is the
row-wise work of one forward pass — embedding, norms, RoPE and the GEMMs, whose output row t depends on input
row t alone. So all prompts are prefilled in one pass, then every job still decoding takes one decode step per
pass: a real model's decode step reads all its weights for one row (SmolLM2: 540 MB of fp32 per token), and
batching the rows makes the reference about twenty times cheaper with the same tokens
(tests/cuda_ext/verify/test_references.py compares it with `reference_generate`, job by job). A row's logits
may differ from the one-row pass's in the last bits (a GEMM's blocking depends on its row count), as the paged
path's do; the fp32 tolerance (verdict.fp32_logit_tolerance) covers both.

A decoding of n tokens is the first n of a longer one (each token depends on its prefix alone; a seeded draw
on (seed, position)), so one decoding per (prompt, sampling), as long as the longest asked for, serves all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .contiguous import ContiguousKVCache, Generation, allocate_contiguous_kv, attend_alone
from .layers import forward_hidden, lm_logits
from .sampling import SamplingParams, sample_token
from .scenarios import Requests, sampling_of_row
from .weights import ModelWeights

Job = tuple[tuple[int, ...], int, SamplingParams]  # (prompt, tokens to decode, sampling)


def forward_alone_together(weights: ModelWeights, caches: Sequence[ContiguousKVCache],
                           token_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Appends token_ids[j] to caches[j] for every j in one pass -> logits [J, vocab] float32 of each job's last
    new token (row j predicts the token after it)."""
    device = weights.device
    lengths = [len(t) for t in token_ids]
    ids = torch.as_tensor([t for chunk in token_ids for t in chunk], dtype=torch.int64, device=device)
    positions = torch.cat([torch.arange(c.num_tokens, c.num_tokens + n, dtype=torch.int64, device=device)
                           for c, n in zip(caches, lengths, strict=True)])
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([attend_alone(cache, layer, q[a:b], k[a:b], v[a:b], positions[a:b])
                          for cache, a, b in zip(caches, bounds, bounds[1:], strict=False)])

    hidden = forward_hidden(weights, ids, positions, attend)  # [N, hidden]
    for cache, n in zip(caches, lengths, strict=True):
        cache.num_tokens += n
    last = torch.as_tensor(bounds[1:], dtype=torch.int64, device=device) - 1
    return lm_logits(weights, hidden[last])


def generate_alone_together(weights: ModelWeights, jobs: Sequence[Job]) -> list[Generation]:
    """`reference_generate(weights, prompt, new, sampling)` of every job: the prompts prefilled in one pass,
    then one decode pass per step over the jobs still decoding (see the module docstring)."""
    for prompt, new, _ in jobs:
        if not prompt or new < 1:
            raise ValueError(f"need a non-empty prompt and new tokens >= 1, got {len(prompt)} and {new}")
    caches = [allocate_contiguous_kv(weights.config, len(p) + n, weights.dtype, weights.device) for p, n, _ in jobs]
    outputs: list[list[int]] = [[] for _ in jobs]
    rows: list[list[torch.Tensor]] = [[] for _ in jobs]
    active = list(range(len(jobs)))
    logits = forward_alone_together(weights, caches, [p for p, _, _ in jobs]) if jobs else torch.zeros(0)
    while active:
        for j, row in zip(active, logits, strict=True):
            outputs[j].append(sample_token(row, jobs[j][2], caches[j].num_tokens))
            rows[j].append(row)
        active = [j for j in active if len(outputs[j]) < jobs[j][1]]
        if active:
            logits = forward_alone_together(weights, [caches[j] for j in active], [outputs[j][-1:] for j in active])
    return [Generation(tuple(p), tuple(out), torch.stack(r)) for (p, _, _), out, r in zip(jobs, outputs, rows,
                                                                                        strict=True)]


GenerateMany = Callable[[Any, Sequence[Job]], list[Generation]]  # (weights, jobs) -> a Generation per job


class References:
    """Decodings per (prompt, sampling) for one model's weights, each as long as the longest asked for.
    `generate` decodes a list of jobs (the hybrid model passes its own reference, hybrid_suite.py)."""

    def __init__(self, weights: Any, generate: GenerateMany = generate_alone_together) -> None:
        self.weights, self.generate = weights, generate
        self._done: dict[tuple[tuple[int, ...], SamplingParams], Generation] = {}

    def prefetch(self, jobs: Sequence[Job]) -> None:
        """Decode, together, every job not already decoded at least that long."""
        longest: dict[tuple[tuple[int, ...], SamplingParams], int] = {}
        for prompt, new, sampling in jobs:
            key = (tuple(prompt), sampling)
            longest[key] = max(longest.get(key, 0), new)
        todo = [(p, n, s) for (p, s), n in longest.items()
                if (p, s) not in self._done or len(self._done[(p, s)].output_ids) < n]
        if not todo:
            return
        for (prompt, _, sampling), generation in zip(todo, self.generate(self.weights, todo), strict=True):
            self._done[(prompt, sampling)] = generation

    def get(self, prompt: tuple[int, ...], new: int, sampling: SamplingParams) -> Generation:
        self.prefetch([(prompt, new, sampling)])
        g = self._done[(tuple(prompt), sampling)]
        return Generation(g.prompt_ids, g.output_ids[:new], g.logits[:new])


_SHARED: list[References] = []  # the last model's references (one model at a time)


def shared_references(weights: Any, generate: GenerateMany = generate_alone_together) -> References:
    """The References of these weights, kept while the same weights object is used."""
    if not _SHARED or _SHARED[0].weights is not weights or _SHARED[0].generate is not generate:
        _SHARED[:] = [References(weights, generate)]
    return _SHARED[0]


def jobs_of(requests: Requests, seed: int) -> list[Job]:
    """One job per row of `requests` (parallel samples are rows): its prompt, its length (to its
    cancellation point), its sampling."""
    rows = [i for i, n in enumerate(requests.num_samples) for _ in range(n)]
    return [(requests.prompts[i], requests.cancel_after.get(row, requests.max_new_tokens[i]),
             sampling_of_row(requests, row, seed)) for row, i in enumerate(rows)]


def truncate(tokens: tuple[int, ...], eos: int | None) -> int:
    """How many tokens a decoding that stops at `eos` keeps (the end-of-sequence token included)."""
    return tokens.index(eos) + 1 if eos is not None and eos in tokens else len(tokens)


def references(weights: ModelWeights, requests: Requests, seed: int) -> tuple[list[Generation], list[int], int | None]:
    """(reference Generation per row, its expected length, the end-of-sequence token or None)."""
    shared, jobs = shared_references(weights), jobs_of(requests, seed)
    shared.prefetch(jobs)
    generations = [shared.get(*job) for job in jobs]
    eos = requests.eos_token
    if requests.eos_from_reference:  # a token the longest decoding produces half-way: some requests stop at it
        longest = max(generations, key=lambda g: len(g.output_ids))
        eos = longest.output_ids[len(longest.output_ids) // 2]
    return generations, [truncate(g.output_ids, eos) for g in generations], eos
