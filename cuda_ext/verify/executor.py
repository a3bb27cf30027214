"""The model runner behind the scheduler: a `StepPlan` in, a real forward pass, sampled tokens out.

One `execute(plan)` does what the plan's docstring (core/sim/plan.py) orders, on the paged KV cache:

    swap-outs    the preempted-by-swap requests' blocks copied to the host (before anything is written:
                 the pool may already have handed those ids to another request in this plan)
    swap-ins     host copies written back into the new block ids
    CoW copies   block src -> dst in every layer
    forward      a PagedBatch from the plan's token ids, block tables and slots -> paged_forward
    sampling     every request whose chunk reaches its known tokens samples the token at that position;
                 a fork child samples its own first token from its parent's logits
    outcome      the tokens, and the requests that stopped at an end-of-sequence token

Alongside, a shadow of the cache (`ShadowKV`) follows every write, copy and swap, and each scheduled
request's context is read back through its block table as the forward pass will read it; what is found wrong is
kept in `content_errors`. The executor keeps, per request, the tokens it sampled and the logits each was
drawn from, for the comparison with the contiguous reference.

The clock: each step reports `step_s` (a constant), so the scheduler's decisions, which depend on time
only through arrivals, are the same on every machine and every run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ...core.sim.plan import BlockLayout, StepOutcome, StepPlan
from .paged import PagedKVCache, SwappedBlocks, copy_blocks, paged_forward, swap_in, swap_out
from .paged_batch import PagedBatch
from .sampling import SamplingParams, sample_token
from .shadow import ShadowKV, prefix_ids
from .weights import ModelWeights

STEP_S = 1e-3  # the simulated duration of every step


@dataclass
class RequestState:
    """What the executor knows of one request: its prompt, what it sampled, and from which logits."""

    prompt: tuple[int, ...]
    sampling: SamplingParams
    output: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # row i [vocab] float32: output[i]'s distribution
    ident: list[int] = field(default_factory=list)  # prefix id of every known token (see shadow)

    def __post_init__(self) -> None:
        if not self.ident:
            self.ident = prefix_ids(self.prompt).tolist()

    @property
    def tokens(self) -> list[int]:
        return [*self.prompt, *self.output]

    def add(self, token: int, row: torch.Tensor) -> None:
        self.output.append(token)
        self.logits.append(row)
        self.ident.append(hash((self.ident[-1], token)))


class ModelExecutor:
    """Runs plans through the paged model over `kv` (see the module docstring). Request ids are rows of
    `prompts` and `sampling`; a driver that picks tokens itself (beam search) adds, forks and extends
    requests with `add_request`, `fork_request` and `append_token`, and schedules them with `samples` off."""

    def __init__(
        self,
        weights: ModelWeights,
        kv: PagedKVCache,
        prompts: Sequence[Sequence[int]],
        sampling: Sequence[SamplingParams],
        *,
        attention_backend: str = "torch-reference",
        eos_token_id: int | None = None,
        step_s: float = STEP_S,
    ) -> None:
        if len(prompts) != len(sampling):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling)} sampling parameters")
        self.weights, self.kv = weights, kv
        self.attention_backend = attention_backend
        self.eos_token_id = eos_token_id
        self.step_s = step_s
        self.requests = {rid: RequestState(tuple(p), s)
                         for rid, (p, s) in enumerate(zip(prompts, sampling, strict=True))}
        self.last_logits: dict[int, torch.Tensor] = {}  # request id -> logits [vocab] of its last new token
        self.shadow = ShadowKV(kv.num_blocks, kv.block_size)
        self.host: dict[int, tuple[SwappedBlocks, tuple[np.ndarray, np.ndarray]]] = {}
        # steps, eos, preemptions, swaps, prefill_chunks (a chunk that stops short of the request's known
        # tokens), mixed_steps (prefill and decode in one batch), cancelled_blocks_reused (blocks of a cancelled
        # request in the very next plan's tables)
        self.counts: Counter[str] = Counter()
        self._tables: dict[int, set[int]] = {}  # request id -> its blocks in the last plan it ran in
        self.content_errors: list[str] = []
        self.first_start: dict[int, int] = {}  # request id -> computed tokens when first scheduled (its hit)
        self._read: list[tuple[int, np.ndarray, np.ndarray, torch.Tensor]] = []  # see remember_reads

    # ---- the step ------------------------------------------------------------------------------------
    def execute(self, plan: StepPlan) -> StepOutcome:
        logits = self.forward(plan)
        self.last_logits = dict(zip(plan.request_ids.tolist(), logits, strict=True))
        return StepOutcome(self.step_s, *self._sample(plan, logits))

    def forward(self, plan: StepPlan, *, all_logits: bool = False) -> torch.Tensor:
        """Everything of a step but sampling -> logits on the CPU: [S, vocab] of each request's last new token,
        or [N, vocab] of every new token with `all_logits` (a driver that verifies drafts)."""
        assert plan.blocks is not None and plan.token_ids is not None, (
            "a model runner needs plans with token ids and exact block tables (an ExactPagedPolicy)"
        )
        events = plan.events
        self._count(plan)
        for p in events.preempted:
            if p.mode == "swap":
                assert p.block_ids is not None and p.request_id not in self.host, f"swap-out of {p}"
                self.host[p.request_id] = (swap_out(self.kv, p.block_ids), self.shadow.save(p.block_ids))
        for s in events.swapped_in:
            assert s.block_ids is not None, f"swap-in of {s}"
            swapped, shadow = self.host.pop(s.request_id)
            swap_in(self.kv, swapped, s.block_ids)
            self.shadow.restore(shadow, s.block_ids)
        copies = list(plan.blocks.cow_copies)
        copy_blocks(self.kv, copies)
        self.shadow.copy_blocks(copies)
        for rid, _ in events.released:
            self.host.pop(rid, None)

        batch, idents = self._batch(plan)
        # every layer writes the step's new K/V before any query reads (a prefix-cache hit may be on blocks
        # that another request of the same step fills), so the contexts are checked after the writes
        self.shadow.write(plan.blocks.slot_mapping, idents, batch.positions.cpu().numpy())
        self._check_contexts(plan)
        logits = paged_forward(self.weights, self.kv, batch, attention_backend=self.attention_backend,
                               return_all_logits=all_logits)
        self.counts["steps"] += 1
        return logits.detach().cpu()

    # ---- requests whose tokens a driver picks -------------------------------------------------------
    def add_request(self, rid: int, prompt: Sequence[int], sampling: SamplingParams) -> None:
        assert rid not in self.requests, f"request {rid} exists"
        self.requests[rid] = RequestState(tuple(prompt), sampling)

    def fork_request(self, parent: int, child: int) -> None:
        """The child continues from everything the parent holds (its tokens, logits and prefix ids)."""
        assert child not in self.requests, f"request {child} exists"
        p = self.requests[parent]
        self.requests[child] = RequestState(p.prompt, p.sampling, list(p.output), list(p.logits), list(p.ident))

    def append_token(self, rid: int, token: int, row: torch.Tensor) -> None:
        self.requests[rid].add(token, row)

    def _count(self, plan: StepPlan) -> None:
        """The events that show what a run exercised (see `counts`)."""
        counts, events = self.counts, plan.events
        counts["preemptions"] += len(events.preempted)
        counts["swaps"] += sum(p.mode == "swap" for p in events.preempted)
        ends = plan.num_computed_tokens + plan.num_new_tokens
        counts["prefill_chunks"] += sum(end < len(self.requests[rid].tokens)
                                        for rid, end in zip(plan.request_ids.tolist(), ends.tolist(), strict=True))
        new = plan.num_new_tokens
        counts["mixed_steps"] += bool((new > 1).any() and (new == 1).any())
        B = self.kv.block_size
        for rid, start, end in zip(plan.request_ids.tolist(), plan.num_computed_tokens.tolist(), ends.tolist(),
                                   strict=True):
            prompt = len(self.requests[rid].prompt)
            if rid not in self.first_start:
                self.first_start[rid] = start
                # a whole-block prompt cached in full: the hit stops one block short, at the last token's block
                counts["capped_hits"] += bool(start and prompt % B == 0 and start == prompt - B)
            # a prefill chunk that stops inside a full prompt block (one with a content key)
            counts["mid_block_chunks"] += bool(end % B and end < prompt // B * B)
        tables = {rid: set(t.tolist()) for rid, t in zip(plan.request_ids.tolist(), _exact(plan).block_tables,
                                                          strict=True)}
        cancelled = [rid for rid, reason in events.released if reason == "cancelled"]
        freed = set().union(*(self._tables.pop(rid, set()) for rid in cancelled))
        if freed:  # handed to another request in the very next plan (not merely still held by a sharer)
            taken = set().union(*(t - self._tables.get(rid, set()) for rid, t in tables.items()))
            counts["cancelled_blocks_reused"] += len(freed & taken)
        for rid, _ in events.released:
            self._tables.pop(rid, None)
        self._tables.update(tables)

    def _batch(self, plan: StepPlan) -> tuple[PagedBatch, np.ndarray]:
        """The plan as a PagedBatch, after checking its token ids against what this executor knows; also
        the prefix id of every new token (for the shadow)."""
        device = self.kv.k[0].device
        blocks, plan_tokens = _exact(plan), plan.token_ids
        assert plan_tokens is not None, "a model runner needs plans with token ids"
        tables = blocks.block_tables
        max_blocks = max(len(t) for t in tables)
        padded = np.full((len(tables), max_blocks), -1, dtype=np.int32)
        idents: list[int] = []
        positions: list[int] = []
        starts = [0]
        for i, rid in enumerate(plan.request_ids.tolist()):
            req, table = self.requests[rid], tables[i]
            start, new = int(plan.num_computed_tokens[i]), int(plan.num_new_tokens[i])
            known = req.tokens
            assert tuple(plan_tokens[i]) == tuple(known[start : start + new]), (
                f"request {rid}: the plan's tokens at {start}..{start + new - 1} are not the request's"
            )
            padded[i, : len(table)] = table
            idents.extend(req.ident[start : start + new])
            positions.extend(range(start, start + new))
            starts.append(starts[-1] + new)
        token_ids = [t for chunk in plan_tokens for t in chunk]
        batch = PagedBatch(
            token_ids=torch.tensor(token_ids, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            slot_mapping=torch.as_tensor(blocks.slot_mapping, dtype=torch.int64).to(device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.as_tensor((plan.num_computed_tokens + plan.num_new_tokens), dtype=torch.int32).to(device),
            block_tables=torch.from_numpy(padded).to(device),
        )
        return batch, np.asarray(idents, dtype=np.int64)

    # ---- a reader one step late (an asynchronous executor, as on a GPU stream) ----------------------
    def _context(self, table: np.ndarray, length: int) -> torch.Tensor:
        """The K and V of positions 0..length-1 through `table`, every layer: [2, layers, length, Hkv, D]."""
        B = self.kv.block_size
        positions = np.arange(length)
        slots = torch.as_tensor(table[positions // B] * B + positions % B, device=self.kv.k[0].device)
        return torch.stack([torch.stack([c.flatten(0, 1)[slots] for c in caches]) for caches in (self.kv.k, self.kv.v)])

    def remember_reads(self, plan: StepPlan) -> None:
        """Keep what this step read (each request's context after its writes) for `late_read`."""
        self._read = []
        for rid, table, end in zip(plan.request_ids.tolist(), _exact(plan).block_tables,
                                   (plan.num_computed_tokens + plan.num_new_tokens).tolist(), strict=True):
            ident = np.asarray(self.requests[rid].ident[:end], dtype=np.int64)
            self._read.append((rid, np.array(table), ident, self._context(table, end).clone()))

    def late_read(self, step: int) -> None:
        """Read the remembered step's contexts again, now, after the next step's copies, swaps and writes (a
        GPU runs a step's attention after the host has planned the next): every slot must hold what it held."""
        for rid, table, ident, kv in self._read:
            self.counts["late_reads"] += 1
            wrong = self.shadow.first_wrong(table, ident)
            if wrong is None and torch.equal(self._context(table, len(ident)), kv):
                continue
            where = f"position {wrong} (block {int(table[wrong // self.kv.block_size])})" if wrong is not None else (
                "a slot's K/V")
            self.content_errors.append(f"step {step}: request {rid} read one step late: {where} was overwritten")
        self._read = []

    def _check_contexts(self, plan: StepPlan) -> None:
        for rid, table, start in zip(plan.request_ids.tolist(), _exact(plan).block_tables,
                                     plan.num_computed_tokens.tolist(), strict=True):
            wrong = self.shadow.first_wrong(table, np.asarray(self.requests[rid].ident[:start], dtype=np.int64))
            if wrong is not None:
                block = int(table[wrong // self.kv.block_size])
                self.content_errors.append(
                    f"step {plan.step}: request {rid} position {wrong} (block {block}) holds another token's K/V"
                )

    def _sample(self, plan: StepPlan, logits: torch.Tensor) -> tuple[dict[int, int], frozenset[int]]:
        """logits [S, vocab] float32 on the CPU -> (request id -> sampled token, requests that hit EOS)."""
        tokens: dict[int, int] = {}
        rows: dict[int, torch.Tensor] = {}
        seq_lens = (plan.num_computed_tokens + plan.num_new_tokens).tolist()
        for i, rid in enumerate(plan.request_ids.tolist()):
            if plan.samples[i]:
                rows[rid] = logits[i]
                tokens[rid] = self._draw(rid, logits[i], seq_lens[i])
        for parent, child in plan.events.forks:
            assert parent in rows, f"fork {parent} -> {child}: the parent did not sample in this step"
            assert not self.requests[child].output, f"fork child {child} already has tokens"
            tokens[child] = self._draw(child, rows[parent], len(self.requests[parent].prompt))
        finished = frozenset(r for r, t in tokens.items() if t == self.eos_token_id)
        self.counts["eos"] += len(finished)
        return tokens, finished

    def _draw(self, rid: int, row: torch.Tensor, position: int) -> int:
        req = self.requests[rid]
        assert position == len(req.prompt) + len(req.output), (
            f"request {rid} samples position {position}, but holds {len(req.prompt)} + {len(req.output)} tokens"
        )
        token = sample_token(row, req.sampling, position)
        req.add(token, row)
        return token


def _exact(plan: StepPlan) -> BlockLayout:
    """The plan's exact block tables (`forward` checked that a model runner's plans carry them)."""
    assert plan.blocks is not None, "a model runner needs plans with exact block tables (an ExactPagedPolicy)"
    return plan.blocks
