"""The `paged` memory policy on a hybrid pool: every KV cache group of the model paged as vLLM v1 pages it
(core/pool/hybrid.py), the recurrent state included, taken per running request from the same blocks.

A model with one group of full-attention layers runs on `PagedPolicy` (paged.py), which is this with one
group; a model with sliding-window, chunked or recurrent layers runs here. The differences:

* every growth goes to the pool at once: each group first frees what its layers no longer read (a block
  that left the window, an old chunk, a replaced state page), then the sum over groups of the new blocks
  must fit (vLLM's remove_skipped_blocks, then allocate_slots), request by request in running order: a step's
  growth is taken in one pass only where the blocks free before it cover it all, else one request at a time
  (`_grow_in_order`), so a later request's frees never pay for an earlier one's growth;
* runs of decode steps are done at once without forks or speculative slots: without prefix caching every used
  block is in one table and what each group holds is a closed form of the lengths (`decode_run`, `run_memory`,
  `advance_run`; past finishes when nobody waits: fastforward_groups); with it, on a pool without state groups,
  a run is planned from counts and applied where blocks change (core/pool/hybrid_runs.py; group_prefix_runs: a
  run stops at the first finish, and while a request waits only as long as its refusal provably stands); the
  engine accounts them step by step in step order, so every figure is the one stepping gives, bit for bit;
* the memory parts are the pool's own (state pages count as used blocks), and `group_blocks` says how many
  blocks each group holds, for the report.
"""

from __future__ import annotations

import numpy as np

from ..blocks import BLOCK_TABLE_ENTRY_BYTES
from ..model.vllm_memory import DEFAULT_MAX_NUM_BATCHED_TOKENS
from ..pool.block_pool import ReleaseReason
from ..pool.groups import PoolGroup, peak_blocks, pool_groups
from ..pool.hybrid import HybridPool
from ..pool.hybrid_ordered import append_ordered, held_blocks, label, need_ordered, ordered, skip_ordered
from ..pool.hybrid_runs import DecodeRun, apply, runs_apply
from .group_prefix_runs import PrefixRuns
from .group_runs import RunForm, check_run, covered, run_form

__all__ = ["GroupedPagedPolicy", "pool_groups"]


class GroupedPagedPolicy(PrefixRuns):
    """Paging over a HybridPool of `groups` (see the module docstring)."""

    name = "paged"
    exact_block_tables = False
    releases_in_segment = False

    def __init__(self, num_blocks: int, block_size: int, groups: tuple[PoolGroup, ...], state_mode: str,
                 num_requests: int, prompt_keys: list | np.ndarray | None = None,
                 max_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS, page_bytes: int = 0) -> None:
        self.block_size = block_size
        self.page_bytes = page_bytes  # bytes of one block id (KVLayout.page_bytes); 0: unknown, swaps count tokens
        self.capacity_slots = num_blocks * block_size
        self.groups = groups
        self.pool = HybridPool(num_blocks, block_size, groups, enable_prefix_caching=prompt_keys is not None,
                               state_mode=state_mode)
        self.prompt_keys = prompt_keys
        self.max_batched_tokens = max_batched_tokens
        self.copies: list[tuple[int, int]] = []

    # ---- admission ---------------------------------------------------------------------------------
    def peak_blocks(self, total_tokens: int) -> int:
        return peak_blocks(self.groups, total_tokens, self.block_size, self.pool.state_mode, self.max_batched_tokens)

    def never_fits(self, rid: int, total_tokens: int) -> bool:
        return self.peak_blocks(max(total_tokens - 1, 1)) > self.pool.num_blocks

    def _keys(self, rid: int, num_tokens: int) -> np.ndarray | list | None:
        if self.prompt_keys is None:
            return None
        return self.prompt_keys[rid][: num_tokens // self.block_size]

    def hit_tokens(self, rid: int, num_tokens: int) -> int:
        keys = self._keys(rid, num_tokens)
        self._looked = (rid, num_tokens)  # the prompt an admission looked up (a refused one's: _refused)
        return 0 if keys is None else self.pool.hit_tokens(num_tokens, keys)

    def can_admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        if self._private:  # no keys: each group's blocks from its first read one (allocate_private)
            need = self.pool.allocate_private_need(total_tokens, start_tokens if from_swap else 0)
            return need <= self.pool.num_free_blocks
        if from_swap:
            fits = self.pool.can_allocate(total_tokens, computed_tokens=start_tokens)
        else:
            fits = self.pool.can_allocate(total_tokens, self._keys(rid, total_tokens))
        if not fits:  # what a run while it waits must not change (_prefix_run): valid while the pool is unchanged
            self._refused = (self.pool.pools[0]._epoch, rid, start_tokens, total_tokens, from_swap, self._looked)
        return fits

    def admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        if not self.can_admit(rid, start_tokens, total_tokens, from_swap):
            return False
        if self._private:
            assert from_swap or not start_tokens, f"request {rid}: no prefix keys, {start_tokens} tokens cached"
            self.pool.allocate_private(rid, total_tokens, start_tokens if from_swap else 0)
            return True
        if from_swap:
            self.pool.allocate(rid, total_tokens, computed_tokens=start_tokens)
            return True
        hit = self.pool.allocate(rid, total_tokens, self._keys(rid, total_tokens))
        assert hit == start_tokens, f"request {rid}: pool hit {hit}, probe said {start_tokens}"
        label(self.pool, rid)  # the blocks a later prompt may hit, with their groups (held_blocks)
        return True

    # ---- growth --------------------------------------------------------------------------------------
    def grow_many(self, rids: np.ndarray, totals: np.ndarray, new_blocks: int | None = None,
                  check: bool = True) -> bool:
        pool = self.pool
        ids, targets = rids.tolist(), totals.tolist()
        if ids and self._private:
            seqs = pool.pools[0].seqs  # (a private pool's groups count tokens alike)
            if all(r in seqs for r in ids):
                uniform = {t - seqs[r].num_tokens for r, t in zip(ids, targets, strict=True)}
                add = uniform.pop() if len(uniform) == 1 else 0
                if add > 0:  # a decode step (or one chunk each): every group at once
                    grown = pool.advance_private(ids, add, add, check, credit=not check or len(ids) == 1)
                    return self._grow_in_order(ids, targets) if grown is None else grown
        if ids and self.prompt_keys is None and not pool.store.counters["forks"]:
            distinct = {t - pool.num_tokens(r) for r, t in zip(ids, targets, strict=True)}
            add = distinct.pop() if len(distinct) == 1 else 0
            if add > 0:  # a decode step: one call per group
                if check and len(ids) > 1 and pool.append_many_need(ids, add) > pool.num_free_blocks:
                    return self._grow_in_order(ids, targets)  # (frees do not change a need: counted before them)
                pool.free_skipped_many(ids, one_drop=not self.exact_block_tables)  # verify counts skip_blocks
                if check and len(ids) == 1 and pool.append_many_need(ids, add) > pool.num_free_blocks:
                    return False
                if pool.store.counters["hit_blocks"] or any(p.spec.tracked for p in pool.pools):
                    pool.append_many(ids, add)
                else:
                    pool.grow_private_many(ids, add)  # the same tables, in one hand-out for all groups
                return True
        # every sequence's free_skipped, then appends, pair by pair in one pass (verify counts skip_blocks calls:
        # its exact policy takes the loop below, which the ordered pass equals — tests/core/pool/test_hybrid_ordered)
        if check and ordered(pool) and not self.exact_block_tables:
            adds = [t - s.num_tokens for s, t in zip(pool.pools[0]._tables(ids), targets, strict=True)]
            if len(ids) > 1 and need_ordered(pool, ids, adds) > pool.num_free_blocks:
                return self._grow_in_order(ids, targets)
            skip_ordered(pool, ids)
            if len(ids) == 1 and need_ordered(pool, ids, adds) > pool.num_free_blocks:
                return False
            keys = [self._completed_keys(rid, add) if add else None for rid, add in zip(ids, adds, strict=True)]
            self.copies += append_ordered(pool, ids, adds, keys)
            return True
        adds = [t - pool.num_tokens(r) for r, t in zip(ids, targets, strict=True)]
        if check and len(ids) > 1 and pool.append_need_many(ids, adds) > pool.num_free_blocks:
            return self._grow_in_order(ids, targets)
        for rid in ids:
            pool.free_skipped(rid)
        if check and len(ids) == 1 and pool.append_need(ids[0], adds[0]) > pool.num_free_blocks:
            return False
        append = pool.append_fitting if check else pool.append  # checked above: every group rule applied, all fit
        for rid, add in zip(ids, adds, strict=True):
            if add:
                self.copies += append(rid, add, self._completed_keys(rid, add))
        return True

    def _completed_keys(self, rid: int, add: int) -> np.ndarray | list | None:
        """The content keys of the prompt blocks that growing `rid` by `add` tokens completes (a later prefill
        chunk), so that they are cached as the first chunk's are; None past the prompt's keyed blocks."""
        if self.prompt_keys is None:
            return None
        keys, B, old = self.prompt_keys[rid], self.block_size, self.pool.num_tokens(rid)
        if old // B >= len(keys):
            return None
        return keys[old // B : min((old + add) // B, len(keys))]

    def grow(self, rid: int, total: int) -> bool:
        if total == self.pool.num_tokens(rid):  # grown already (a step that `_grow_in_order` stopped after it)
            return True
        return self.grow_many(np.array([rid]), np.array([total]))

    def _grow_in_order(self, ids: list[int], targets: list[int]) -> bool:
        """A step whose growth the free blocks do not cover before anything is freed: vLLM's order, request by
        request — each frees what its own groups let go (remove_skipped_blocks), then its growth must fit
        (allocate_slots), so a later request's frees never pay for an earlier one's growth. False where one does
        not fit: those before it grown, its own frees done (as vLLM leaves them before preempting from the back;
        the scheduler's one-by-one pass then finds them grown: `grow`)."""
        return all(self.grow(rid, total) for rid, total in zip(ids, targets, strict=True))

    def decode_steps_available(self, tokens: np.ndarray) -> tuple[int, np.ndarray | None]:
        return 0, None  # the engine asks `decode_run` instead (see the module docstring)

    def segment_integrals(self, *args):  # pragma: no cover - decode_steps_available is always 0
        raise AssertionError("a hybrid pool's runs of decode steps go through decode_run")

    def finish_segment(self, *args):  # pragma: no cover - releases_in_segment is False
        raise AssertionError("a hybrid pool's runs of decode steps go through decode_run")

    # ---- runs of decode steps in closed form -----------------------------------------------------------
    @property
    def runs_decode(self) -> bool:
        """Runs of decode steps can be done at once (`decode_run`): without prefix caching, forks or
        speculative slots, every used block is in exactly one table, so what each group holds is a function
        of the sequences' lengths alone; with prefix caching, on a pool whose steps hybrid_runs plans and applies
        (`prefix_runs`). `fast_runs = False` keeps every step (the reference in tests)."""
        return self.fast_runs and (self._private or self.prefix_runs)

    @property
    def prefix_runs(self) -> bool:
        """Runs with prefix caching (core/pool/hybrid_runs.py: planned from counts, applied where blocks change)."""
        return self.prompt_keys is not None and not self.exact_block_tables and runs_apply(self.pool)

    fast_runs = True

    @property
    def _private(self) -> bool:
        """The pool is private (HybridPool.private: which block ids a table holds matters to nobody) and no plan
        reads block tables: growth and runs go through advance_private."""
        return not self.exact_block_tables and self.prompt_keys is None and self.pool.private

    def _kinds(self) -> list[tuple[PoolGroup, int]]:
        """The distinct groups with how many tables each (Gemma-3: full ×1, sliding ×6)."""
        if self._kinds_memo is not None:
            return self._kinds_memo
        counts: dict[PoolGroup, int] = {}
        for g in self.groups:
            key = PoolGroup(g.kind, g.window)
            counts[key] = counts.get(key, 0) + 1
        self._kinds_memo = list(counts.items())
        return self._kinds_memo

    _kinds_memo: list[tuple[PoolGroup, int]] | None = None

    def decode_run(self, tokens: np.ndarray, k: int, waiting: bool) -> tuple[int, RunForm | DecodeRun | None]:
        """(how many of the next k decode steps of the running requests, holding `tokens` [n] (≥ 1 each),
        can be done at once, their memory per step: group_runs.run_form).

        A step fits iff the blocks held after it, summed over groups and requests, fit in the pool (the need of
        the growth is the held blocks less those held once the step has freed). A window that slides frees
        blocks, so with requests waiting the run stops before the pool holds fewer blocks than now (the head,
        refused now, could be admitted then). The pool itself is brought up to date after the run
        (`advance_run`): steps are kept only while its peak, Σ ceil((t + k) / B) − first(t), fits too."""
        if len(self.pool.pools[0].seqs) != len(tokens):  # a sequence outside the run holds blocks: step by step
            return 0, None
        if not self._private:
            return self._prefix_run(k, waiting)
        form = run_form(self, tokens, k)
        N = self.pool.num_blocks
        bad = (form.used > N) | (form.peak > N) | ~covered(self, tokens, k, form.used)
        if waiting:
            bad |= form.used < self.pool.num_used
        stop = np.flatnonzero(bad)
        return (int(stop[0]) if len(stop) else k), form

    def run_memory(self, form: RunForm | DecodeRun, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(parts [k, 6] int64, block-table bytes [k] int64, blocks per group [k, G] int64) of the first k
        steps of a run (`run_form`): what `parts` and `group_blocks` return after each of those steps."""
        B = self.block_size
        if isinstance(form, DecodeRun):  # the pool's usage after each step (parts' non-private form)
            return form.memory(k, self.capacity_slots)
        used = form.used[:k]
        state = np.array([g.kind == "state" for g, _ in self._kinds()])  # a state page: B useful slots, a state
        written = np.where(state[:, None], form.held[:, :k] * B, form.written[:, :k])
        useful = np.array([c for _, c in self._kinds()], dtype=np.int64) @ written
        parts = np.zeros((k, 6), dtype=np.int64)
        parts[:, 0] = useful
        parts[:, 1] = used * B - useful
        parts[:, 5] = self.capacity_slots - used * B
        return parts, used * BLOCK_TABLE_ENTRY_BYTES, form.held[self._kind_of_group(), :k].T

    def _kind_of_group(self) -> list[int]:
        """Each group's index in `_kinds` (memoised like it)."""
        if self._kind_memo is None:
            index = {group: i for i, (group, _) in enumerate(self._kinds())}
            self._kind_memo = [index[PoolGroup(g.kind, g.window)] for g in self.groups]
        return self._kind_memo

    _kind_memo: list[int] | None = None

    def advance_run(self, rids: np.ndarray, tokens: np.ndarray, k: int, form: RunForm | DecodeRun) -> None:
        """The pool after k decode steps of `decode_run` from `tokens`: every table as stepping leaves it
        (HybridPool.advance_private, one token at a time), then checked against the closed form of the last step."""
        if isinstance(form, DecodeRun):
            assert k == form.k, f"a prefix-cached run planned for {form.k} steps, taken for {k}"
            apply(self.pool, rids.tolist(), form)
            return
        self.pool.advance_private(rids.tolist(), k, 1, check=False)
        check_run(self, form, k)

    @property
    def aligned_prefill_block(self) -> int:
        """B when the scheduler must end prefill chunks on block boundaries (vLLM's block-aligned split): mode
        align with prefix caching, where the pool saves a state only where a step ends; else 0. Plans that carry
        block tables (verify's executor) schedule their own chunks."""
        align = self.pool.state_mode == "align" and any(g.kind == "state" for g in self.groups)
        return self.block_size if align and self.prompt_keys is not None and not self.exact_block_tables else 0

    # ---- swaps, release, forks ---------------------------------------------------------------------------
    def swap_bytes(self, rid: int) -> int | None:
        """Bytes a swap of the live request `rid` moves each way (None without `page_bytes`): every group's pages
        that the pool holds for it (HybridPool.swap_bytes: a window, a chunk, the state pages), less a block it
        still holds only because its next step has not freed it yet (left the window, an older state page:
        `first_block_before_growth`), which the swap-in does not take again. So out and in are the same bytes:
        those of the blocks from first(c) to ceil(c / B) in each group, c the tokens written."""
        if not self.page_bytes:
            return None
        pool, B, mode = self.pool, self.block_size, self.pool.state_mode
        tokens = pool.num_tokens(rid)
        reads = [-(-tokens // g.tokens_per_block(B)) - g.first_block_before_growth(tokens, g.tokens_per_block(B), mode)
                 for g in self.groups]  # each group at its own tokens per block (mixed: group_blocks)
        stale = sum(max(h - r, 0) for h, r in zip(pool.held_blocks(rid), reads, strict=True))
        return sum(pool.swap_bytes(rid, self.page_bytes)) - stale * self.page_bytes

    def release(self, rid: int, reason: ReleaseReason | str) -> None:
        if self._private:
            self.pool.release_private(rid, ReleaseReason(reason))
        else:
            self.pool.release(rid, ReleaseReason(reason))

    def fork(self, parent: int, child: int) -> None:
        self.pool.fork(parent, child)

    def block_table(self, rid: int) -> np.ndarray:
        raise AssertionError("a hybrid pool has one block table per group: plans do not carry them yet")

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    def sync(self) -> None:
        """Nothing is owed: every growth went to the pool at once."""

    # ---- memory ------------------------------------------------------------------------------------------
    def parts(self, tokens: np.ndarray, head_rid: int | None) -> tuple[np.ndarray, int]:
        """(slots per MEMORY_PARTS [6], block-table bytes): the pool's own accounting (a state page's
        slots count as used and useful: a whole state; tail fragmentation is the attention blocks' unused slots)."""
        if self._private:  # the store's running totals: no block is cached, shared or of another size
            store, pools = self.pool.store, self.pool.pools
            used = store.num_used * self.block_size
            useful = store.useful_tokens + self.pool.state_slack()
            return (np.array([useful, used - useful, 0, 0, 0, self.capacity_slots - used],
                             dtype=np.int64), sum(p.logical_blocks for p in pools) * BLOCK_TABLE_ENTRY_BYTES)
        usage = self.pool.usage()
        slots = usage.block_size  # a block's slots: the block size, or the lcm of the groups' (group_blocks, mixed)
        used, cached = usage.used_blocks * slots, usage.cached_free_blocks * slots
        parts: np.ndarray = np.array([usage.useful_tokens, usage.tail_fragmentation_slots, 0, 0, cached,
                                      usage.num_blocks * slots - used - cached], dtype=np.int64)
        if slots != self.block_size:  # the same shares, in the slots of `block_size` a block (capacity_slots)
            parts = parts * (self.block_size / slots)
        return parts, usage.logical_blocks * BLOCK_TABLE_ENTRY_BYTES

    def group_blocks(self) -> list[int]:
        """Blocks each group's tables hold now (a block is in one group only; in a private pool, in one table)."""
        if self._private:
            return [p.logical_blocks for p in self.pool.pools]
        return held_blocks(self.pool)  # pool.group_usage()'s held blocks, in one pass

    def check_whole(self) -> None:
        self.pool.check_invariants()
        assert not self.pool.seq_ids, f"{len(self.pool.seq_ids)} sequences still hold blocks after the run"
        assert self.pool.num_used == 0 and self.pool.num_free_blocks == self.pool.num_blocks, "pool not whole"
