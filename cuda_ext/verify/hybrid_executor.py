"""The hybrid model decoded through the per-group pool and the scheduler: each layer group reads its K/V (or its
state) only through its own block table.

    HybridPool (core/pool/hybrid.py, through GroupedPagedPolicy)   one table per group per request
      group full     the full-attention layer's K/V, every token
      group sliding  the sliding layers' K/V, blocks wholly before n − W + 1 freed (NULL entries)
      group state    the recurrent layer's state pages: page j holds the state after the last written token
                     of block j (mode all keeps every page: a saved state at every block boundary, which a
                     prefix-cache hit restores; copy-on-write gives a fork its own copy)

`HybridStore` (hybrid_paged.py, with the policy and the pool groups) is one physical store: every array is indexed
by the pool's block id (ids are unique across groups), so a copy-on-write copy or a swap moves a block whatever
group it belongs to. Beside the arrays, a content check: each K/V slot and each state page carries the identity of
the prefix it was computed from (shadow.prefix_ids); before every forward pass each request's context is read back
through its tables — the window's slots, the state page it resumes from — and any slot that holds another prefix,
or a NULL entry inside the window, is recorded in `content_errors`.

A step (`execute(plan)`), in the plan's order: swap-outs (from the tables the policy kept when it released the
request), swap-ins (into the new tables, every group), copy-on-write copies, then per request its new tokens
through `hybrid_forward` with paged callbacks, sampling, fork children's first tokens.

Speculative decoding (a plan with drafts, core/sim/spec_run.py): the request's last token and K drafts go through
one paged pass with every position's logits; the longest prefix of drafts equal to the target's greedy tokens is
accepted, plus the target's next token. The pool rolls the rejected slots back at the commit, and their K/V is
overwritten by later steps; a recurrent state is not positional, so the executor keeps the state after every
position of the pass and writes the one after the last accepted position into that position's page (a "rewind").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from ...core.pool.block_pool import NULL_BLOCK
from ...core.sim.plan import StepOutcome, StepPlan
from .executor import STEP_S, RequestState
from .hybrid_model import HybridWeights, hybrid_forward, masked_attention, recurrence
from .hybrid_paged import GROUP_OF_KIND, STATE_MODE, HybridExactPolicy, HybridStore, hybrid_pool_groups
from .layers import lm_logits
from .sampling import SamplingParams, sample_token
from .shadow import prefix_ids

__all__ = ["STATE_MODE", "HybridExactPolicy", "HybridExecutor", "HybridStore", "hybrid_pool_groups"]


class HybridExecutor:
    """Runs the scheduler's plans for the hybrid model over `policy`'s HybridPool (see the module docstring).
    `fault`: a HybridFault whose executor-side part (stale-state) acts here."""

    def __init__(self, weights: HybridWeights, policy: HybridExactPolicy, prompts: Sequence[Sequence[int]],
                 sampling: Sequence[SamplingParams], eos_token_id: int | None = None, fault=None,
                 max_new_tokens: Sequence[int] | None = None, drafter=None) -> None:
        self.weights, self.policy, self.pool = weights, policy, policy.pool
        self.B = policy.block_size
        self.store = HybridStore(weights, self.pool.num_blocks, self.B)
        kinds = [g.kind for g in policy.groups]
        self.group_of_layer = {i: kinds.index(GROUP_OF_KIND[k]) for i, k in enumerate(weights.config.kinds)}
        self.state_group = kinds.index("state") if "state" in kinds else None
        self.requests = {rid: RequestState(tuple(p), s) for rid, (p, s) in enumerate(zip(prompts, sampling,
                                                                                          strict=True))}
        self.eos_token_id, self.fault = eos_token_id, fault
        self.host: dict[int, tuple[list[np.ndarray], list]] = {}
        self.counts: Counter[str] = Counter()
        self.content_errors: list[str] = []
        self.first_start: dict[int, int] = {}
        # speculative decoding: drafter(rid, output index, count) -> draft tokens; each row's output length
        self.drafter, self.max_new_tokens = drafter, max_new_tokens

    # ---- the step ------------------------------------------------------------------------------------
    def execute(self, plan: StepPlan) -> StepOutcome:
        assert plan.token_ids is not None and plan.blocks is not None, "plans need token ids and exact tables"
        self.counts["steps"] += 1
        ev = plan.events
        for p in ev.preempted:
            self.counts["preemptions"] += 1
            tables = self.policy.preempted_tables.pop(p.request_id)
            if p.mode == "swap":
                held = np.concatenate(tables)
                self.host[p.request_id] = (tables, self.store.save(held[held != NULL_BLOCK]))
        for s in ev.swapped_in:
            self._swap_in(s.request_id)
        for _, reason in ev.released:
            self.counts["cancellations"] += reason == "cancelled"
        self._copy_on_write(plan.blocks.cow_copies)
        hits = plan.prefix_hit_tokens
        self.counts["prefix_hit_tokens"] += sum(hits.values())
        tokens_out: dict[int, int | tuple[int, ...]] = {}  # a tuple: the tokens a verification emitted
        finished = set()
        rows: dict[int, torch.Tensor] = {}
        news = plan.num_new_tokens.tolist()
        self.counts["mixed_steps"] += min(news) == 1 and max(news) > 1
        drafts, token_ids = plan.num_draft_tokens, plan.token_ids
        assert token_ids is not None, "a model runner needs plans with token ids"
        accepted: dict[int, int] = {}
        for i, rid in enumerate(plan.request_ids.tolist()):
            c, n = int(plan.num_computed_tokens[i]), news[i]
            self.first_start.setdefault(rid, c)
            if drafts is not None and drafts[i]:
                tokens_out[rid], accepted[rid] = self._verify_drafts(rid, c, token_ids[i], int(drafts[i]))
                continue
            self.counts["prefill_chunks"] += not plan.samples[i]
            row = self._forward(rid, c, token_ids[i], restored=hits.get(rid, 0))[-1]
            if plan.samples[i]:
                rows[rid] = row
                tokens_out[rid] = self._sample(rid, row, c + n)
        for parent, child in ev.forks:
            self.counts["forks"] += 1
            tokens_out[child] = self._sample(child, rows[parent], len(self.requests[child].prompt))
        for rid, token in tokens_out.items():
            if self.eos_token_id is not None and token == self.eos_token_id:
                finished.add(rid)
                self.counts["eos"] += 1
        return StepOutcome(STEP_S, tokens_out, frozenset(finished), accepted if drafts is not None else None)

    def _verify_drafts(self, rid: int, c: int, last: Sequence[int], k: int) -> tuple[tuple[int, ...], int]:
        """Greedy verification of k drafts in one paged pass over [last token, drafts] -> (emitted tokens, j): the
        longest prefix j of drafts equal to the target's own tokens, then its next token. A rejected tail's state
        is rewound: the page of position c + j gets the state after c + j (the pass saved the one after c + k)."""
        assert self.max_new_tokens is not None, "a run with drafts gives the executor its output lengths"
        req = self.requests[rid]
        remaining = self.max_new_tokens[rid] - len(req.output)
        proposal = list(self.drafter(rid, len(req.output), k))
        logits, states = self._forward(rid, c, [*last, *proposal], restored=0, drafts=k, keep_states=True)
        emitted, j = [], 0
        while True:
            row = logits[j]
            emitted.append(self._sample(rid, row, c + j + 1))
            if len(emitted) == remaining or j == k or proposal[j] != emitted[-1]:
                break
            j += 1
        self.counts["rollbacks"] += k - j
        self.counts["accepted_drafts"] += j
        if j < k and self.state_group is not None and not (self.fault is not None and self.fault.skips_rewind()):
            self._rewind_state(rid, c + j, states)
        return tuple(emitted), j

    def _rewind_state(self, rid: int, position: int, states: dict[int, list]) -> None:
        assert self.state_group is not None, "only a model with recurrent layers rewinds a state"
        table, B = self.pool.block_tables(rid)[self.state_group], self.B
        page = int(table[position // B])
        for layer, per_token in states.items():
            self.store.state[layer][page] = per_token[position]
        self.store.state_tag[page], self.store.state_pos[page] = self._ident_at(rid, position), position
        self.counts["state_rewinds"] += 1

    def _sample(self, rid: int, row: torch.Tensor, position: int) -> int:
        req = self.requests[rid]
        token = sample_token(row, req.sampling, position)
        req.add(token, row)
        return token

    # ---- swaps and copies ------------------------------------------------------------------------------
    def _swap_in(self, rid: int) -> None:
        """The host copy back into the new tables: block j of a group from block j of the old table."""
        old_tables, saved = self.host.pop(rid)
        self.counts["swaps"] += 1
        row_of, r = {}, 0
        one = self.state_group if self.pool.state_mode == "none" else None  # its one page, wherever it stands
        for g, old in enumerate(old_tables):
            for j, b in enumerate(old.tolist()):
                if b != NULL_BLOCK:
                    row_of[g, -1 if g == one else j], r = r, r + 1
        dst, rows = [], []
        for g, new in enumerate(self.pool.block_tables(rid)):
            for j, b in enumerate(new.tolist()):
                key = (g, -1 if g == one else j)
                if b != NULL_BLOCK and key in row_of:
                    dst.append(b)
                    rows.append(row_of[key])
                    self.counts["swapped_state_pages"] += g == self.state_group
        if dst:
            self.store.load(np.array(dst), saved, np.array(rows))

    def _copy_on_write(self, copies: Sequence[tuple[int, int]]) -> None:
        if not copies:
            return
        state_blocks = set()
        if self.state_group is not None:
            for rid in self.pool.seq_ids:
                state_blocks.update(self.pool.block_tables(rid)[self.state_group].tolist())
        for src, dst in copies:
            self.store.copy(src, dst)
            self.counts["cow_copies"] += 1
            self.counts["state_copies"] += dst in state_blocks

    # ---- the forward pass --------------------------------------------------------------------------------
    def _ident_at(self, rid: int, position: int) -> int:
        req = self.requests[rid]
        return int(prefix_ids([*req.prompt, *req.output][: position + 1])[-1])

    def _forward(self, rid: int, c: int, new_tokens: Sequence[int], restored: int, drafts: int = 0,
                 keep_states: bool = False):
        """The request's new tokens at positions c.. through its tables -> logits [n, vocab] (every new token's:
        the drafts' last `drafts` are proposals, not yet the request's), and with `keep_states` the recurrent
        state after each position {layer: {position: state}}."""
        req, B, cfg, store = self.requests[rid], self.B, self.weights.config, self.store
        known = [*req.prompt, *req.output]
        n = len(new_tokens)
        assert tuple(known[c : c + n - drafts]) == tuple(new_tokens[: n - drafts]), f"request {rid}: plan tokens differ"
        ident = prefix_ids([*known[:c], *new_tokens])
        kept: dict[int, dict[int, torch.Tensor]] = {}
        tables, device = self.pool.block_tables(rid), self.weights.device
        positions = torch.arange(c, c + n, device=device)
        state_page = self._check_context(rid, c, tables, ident, restored)
        write = self._write_slots(rid, c, n, tables)
        saved_pages: list[tuple[int, int]] = []

        def slots(g: int, ps: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            blocks = tables[g][ps // B]  # a NULL entry (-1) aliases the last block, as a buggy kernel would read it
            return torch.as_tensor(blocks, device=device), torch.as_tensor(ps % B, device=device)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            g = self.group_of_layer[layer]
            window = cfg.window if cfg.kinds[layer] == "sliding" else None
            wb, wo = slots(g, np.arange(c, c + n))
            store.k[layer][wb, wo], store.v[layer][wb, wo] = k, v
            read = np.arange(0 if window is None else max(0, c - window + 1), c + n)
            rb, ro = slots(g, read)
            return masked_attention(q, store.k[layer][rb, ro], store.v[layer][rb, ro], positions,
                                    torch.as_tensor(read, device=device), window)

        def recur(layer: int, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            assert self.state_group is not None, "a recurrent layer is in the state group"
            table = tables[self.state_group]
            s = store.state[layer][state_page] if c else torch.zeros_like(x[0])
            out = []
            for t in range(n):
                s = recurrence(s, a[t], x[t])
                out.append(s)
                p = c + t
                if keep_states:
                    kept.setdefault(layer, {})[p] = s
                page = int(table[p // B])
                # the state after the last token of its block, or of the chunk: page p // B, where the table
                # holds one (mode align keeps only the last pages of a long chunk)
                if (p % B == B - 1 or t == n - 1) and page != NULL_BLOCK:
                    store.state[layer][page] = s
                    saved_pages.append((p, page))
            return torch.stack(out)

        hidden = hybrid_forward(self.weights, torch.as_tensor([*new_tokens], device=device), positions, attend, recur)
        for p, b, off in write:
            store.slot_tag[b, off] = ident[p]
        for p, b in saved_pages:
            store.state_tag[b], store.state_pos[b] = ident[p], p
        if restored:
            self.counts["state_restores"] += self.state_group is not None
        if keep_states:
            return lm_logits(self.weights.body, hidden), kept
        return lm_logits(self.weights.body, hidden[-1:] if not drafts else hidden)

    def _check_context(self, rid: int, c: int, tables: list[np.ndarray], ident: np.ndarray,
                       restored: int) -> int | None:
        """The content check of the context this step reads, as the tables give it: every group's slots before
        position c, and the state page the request resumes from (returned; None when there is none)."""
        B, store = self.B, self.store
        for g, group in enumerate(self.policy.groups):
            if group.kind == "state":
                continue
            lo = 0 if group.kind == "full" else max(0, c - self.weights.config.window + 1)
            self._check_slots(rid, g, tables[g], np.arange(lo, c), ident)
        if self.state_group is None or not c:
            return None
        page = (c - 1) // B
        if self.pool.state_mode == "none":  # its one page, moved in place to the table's end (pool/state_pages)
            page = len(tables[self.state_group]) - 1
        if self.fault is not None and restored:
            page = self.fault.restored_page(page, restored, B)
        state_page = int(tables[self.state_group][page])
        if state_page == NULL_BLOCK and self.pool.state_mode == "align":  # a step that jumps over pages does not
            state_page = int(self.pool.pools[self.state_group].seqs[rid].table[page])  # hold it: read it there
        if state_page == NULL_BLOCK or store.state_tag[state_page] != ident[c - 1]:
            self.content_errors.append(
                f"request {rid}: resumes at position {c} from state page {state_page} (logical {page}), which "
                f"holds the state after position {store.state_pos[state_page] if state_page >= 0 else None} "
                f"of {'this' if state_page >= 0 and store.state_tag[state_page] in ident else 'another'} prefix")
        return state_page

    def _write_slots(self, rid: int, c: int, n: int, tables: list[np.ndarray]) -> list[tuple[int, int, int]]:
        """(position, block, offset) of every K/V slot positions c..c+n-1 write, a NULL entry recorded."""
        B = self.B
        write = [(p, int(tables[g][p // B]), p % B) for g in range(len(tables)) for p in range(c, c + n)
                 if self.policy.groups[g].kind != "state"]
        for p, b, _ in write:
            if b == NULL_BLOCK:
                self.content_errors.append(f"request {rid}: writes position {p} into a NULL table entry")
        return write

    def _check_slots(self, rid: int, g: int, table: np.ndarray, ps: np.ndarray, ident: np.ndarray) -> None:
        if not len(ps):
            return
        blocks = table[ps // self.B]
        group = self.policy.groups[g].name
        if (blocks == NULL_BLOCK).any():
            p = int(ps[np.argmax(blocks == NULL_BLOCK)])
            self.content_errors.append(f"request {rid}: group {group}: position {p}, which the next token reads, "
                                       "is in a freed block (NULL table entry)")
            return
        bad = self.store.slot_tag[blocks, ps % self.B] != ident[ps]
        if bad.any():
            p = int(ps[np.argmax(bad)])
            self.content_errors.append(f"request {rid}: group {group}: the slot of position {p} (block "
                                       f"{int(table[p // self.B])}) holds another prefix's K/V")
