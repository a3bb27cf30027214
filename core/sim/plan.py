"""The scheduler's decision for one engine step (`StepPlan`), what an executor reports back (`StepOutcome`),
and the `Executor` interface between them — the split vLLM has between its scheduler and its model runner.

    scheduler --StepPlan--> executor --StepOutcome--> scheduler
                            (the step-time model in `kvcalc sim`; a model runner that runs a real forward pass)

Neither the scheduler nor the block pool knows which executor runs. A request's tokens in one step, vLLM
style (positions count from 0; the KV of every computed position is in the request's blocks):

    |<------------------------------ num_tokens = prompt + generated ------------------------------>|
    |<- prefix-cache hit ->|<- computed in earlier steps -->|<-- scheduled now --->|< remaining >|
    |<---------------- num_computed_tokens ----------------->|<-- num_new_tokens -->|
                                                             ^ first new position = num_computed_tokens

    slot of position p = block_table[p // block_size] · block_size + p % block_size

A decode step is one new token at position num_tokens − 1; a prefill chunk is several. A request
`samples` (produces a token from the logits of its last new position) when its chunk reaches num_tokens;
a chunk that stops short (chunked prefill) samples nothing. Hits are full blocks, never the block of the
last prompt token, so a prefill always computes at least one token.

An executor performs, in this order: `preempted` swap-outs (copy their `block_ids` to the host; the pool
may already have handed those ids to another request in this plan), `swapped_in` (host copies back into
the new `block_ids`), `cow_copies` (block src -> dst), then the forward pass that writes every new token's
K/V into its slot and reads each request's context through its block table. `released` lists requests
that left since the previous plan (their state may be dropped). Block-level fields (`block_tables`,
`slot_mapping`, the block ids of swaps, `cow_copies`) are filled when the memory policy keeps exact block
tables (`MemoryPolicy.exact_block_tables`); the step-time model needs only token counts, so `kvcalc sim`
leaves them empty (None / ()), and its fast-forward, which does runs of decode steps in closed form,
builds no plan at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Preemption:
    """A running request pushed back to the waiting queue: `mode` "recompute" (its KV is dropped, to be
    computed again) or "swap" (its `num_tokens` tokens of KV go to the host, from `block_ids`)."""

    request_id: int
    mode: str
    num_tokens: int
    block_ids: tuple[int, ...] | None = None
    num_bytes: int | None = None  # a swap's bytes when the pool knows them (hybrid: its groups' pages, state too)


@dataclass(frozen=True)
class SwapIn:
    """A swapped-out request re-admitted: its `num_tokens` tokens of KV come back into `block_ids`."""

    request_id: int
    num_tokens: int
    block_ids: tuple[int, ...] | None = None
    num_bytes: int | None = None  # the bytes its swap-out moved, when the pool knew them (Preemption.num_bytes)


@dataclass(frozen=True)
class StepEvents:
    """What changed besides the scheduled tokens (kept apart so that a plain step builds one small object).

    preempted   requests pushed back to the queue while this step was scheduled
    swapped_in  swapped-out requests admitted again in this step
    forks       (parent, child): at the end of this step the child shares every block of the parent, which
                has just sampled its first token; the child samples its own first token from the same
                logits (parallel sampling, n > 1)
    released    (request id, reason) since the previous plan: finished, cancelled, timed_out
    """

    preempted: tuple[Preemption, ...] = ()
    swapped_in: tuple[SwapIn, ...] = ()
    forks: tuple[tuple[int, int], ...] = ()
    released: tuple[tuple[int, str], ...] = ()


NO_EVENTS = StepEvents()


@dataclass(frozen=True)
class BlockLayout:
    """Where the step's tokens live: per scheduled request its block table after this step's growth, the
    slot of every new token (request by request, position by position), and the copies to do first."""

    block_tables: tuple[np.ndarray, ...]  # per request: int64 [ceil((num_computed + num_new) / block_size)]
    slot_mapping: np.ndarray  # int64 [Σ num_new_tokens]
    cow_copies: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class StepPlan:
    """One engine step as the scheduler decided it (see the module docstring for the token regions).

    request_ids          int64 [m]   scheduled requests: the first `num_running` were running before this
                                     step (admission order); the others are admitted in it (new, or back
                                     after a preemption)
    num_computed_tokens  int64 [m]   KV tokens each holds before this step: for an admitted request its
                                     prefix-cache hit, or the tokens it swaps back in
    num_new_tokens       int64 [m]   tokens each computes this step (>= 1)
    samples              bool  [m]   whether each samples a token at the end of the step
    token_ids            per request, the ids of its new tokens (None when the workload has only lengths)
    num_draft_tokens     int64 [m]   speculative decoding: of each request's new tokens, how many are drafts
                                     to verify (its last K); None without speculation
    """

    step: int
    start_s: float
    request_ids: np.ndarray
    num_computed_tokens: np.ndarray
    num_new_tokens: np.ndarray
    samples: np.ndarray
    num_running: int
    events: StepEvents = NO_EVENTS
    token_ids: tuple[tuple[int, ...], ...] | None = None
    blocks: BlockLayout | None = None
    num_draft_tokens: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens computed in this step (the token budget it used)."""
        return int(self.num_new_tokens.sum())

    @property
    def admitted(self) -> np.ndarray:
        return self.request_ids[self.num_running :]

    @property
    def prefix_hit_tokens(self) -> dict[int, int]:
        """Admitted request -> its prefix-cache hit tokens (a swap-in has none: its KV comes from the host)."""
        swapped = {s.request_id for s in self.events.swapped_in}
        hits = self.num_computed_tokens[self.num_running :].tolist()
        return {rid: hit for rid, hit in zip(self.admitted.tolist(), hits, strict=True) if rid not in swapped}


@dataclass(frozen=True)
class StepOutcome:
    """What an executor reports for one plan.

    duration_s   how long the step took (simulated or measured); the scheduler's clock advances by it
    token_ids    request id -> the token it sampled, for every sampling request and every fork child of the
                 plan (a tuple of the tokens it emitted for a request that verified drafts); None when the
                 executor produces no tokens (the step-time model)
    finished     requests that stopped at this step's token (end of sequence), before their output length
    num_accepted speculative decoding: request id -> how many of its drafts verification accepted (the
                 longest accepted prefix, 0..drafts), for every request with drafts in the plan
    """

    duration_s: float
    token_ids: Mapping[int, int | tuple[int, ...]] | None = None
    finished: frozenset[int] = frozenset()
    num_accepted: Mapping[int, int] | None = None


class Executor(Protocol):
    """Runs a plan: the step-time model (`kvcalc sim`) or a model runner (a real forward pass)."""

    def execute(self, plan: StepPlan) -> StepOutcome: ...
