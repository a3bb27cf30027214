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
  blocks each group holds, for the report;
* without prefix caching (a private pool) a decode step that fits is decided and kept as counts, and the pool
  settled only when something else reads or changes it (group_counts: the `pool` property settles first).
"""

from __future__ import annotations

import numpy as np

from ..model.vllm_memory import DEFAULT_MAX_NUM_BATCHED_TOKENS
from ..pool.block_pool import ReleaseReason
from ..pool.groups import PoolGroup, peak_blocks, pool_groups
from ..pool.hybrid import HybridPool
from ..pool.hybrid_apply import apply
from ..pool.hybrid_ordered import append_ordered, fitting_run, label, need_ordered, ordered, skip_ordered
from ..pool.hybrid_runs import DecodeRun, runs_apply
from ..pool.register_full import register_full_groups
from .group_counts import CountedPolicy
from .group_prefix_runs import PrefixRuns
from .group_runs import RunForm, RunMemory, check_run, covered, run_form
from .output_keys import register_released

__all__ = ["GroupedPagedPolicy", "pool_groups"]


class GroupedPagedPolicy(PrefixRuns, CountedPolicy, RunMemory):
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
        self._pool = HybridPool(num_blocks, block_size, groups, enable_prefix_caching=prompt_keys is not None,
                               state_mode=state_mode)
        self.prompt_keys = prompt_keys
        self.max_batched_tokens = max_batched_tokens
        self.copies: list[tuple[int, int]] = []

    # ---- admission ---------------------------------------------------------------------------------
    def peak_blocks(self, total_tokens: int) -> int:
        return peak_blocks(self.groups, total_tokens, self.block_size, self._pool.state_mode, self.max_batched_tokens)

    def never_fits(self, rid: int, total_tokens: int) -> bool:
        return self.peak_blocks(max(total_tokens - 1, 1)) > self._pool.num_blocks

    def _keys(self, rid: int, num_tokens: int) -> np.ndarray | list | None:
        if self.prompt_keys is None:
            return None
        return self.prompt_keys[rid][: num_tokens // self.block_size]

    def hit_tokens(self, rid: int, num_tokens: int) -> int:
        keys = self._keys(rid, num_tokens)
        self._looked = (rid, num_tokens)  # the prompt an admission looked up (a refused one's: _refused)
        return 0 if keys is None else self._pool.hit_tokens(num_tokens, keys)

    def can_admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        if self._private:  # no keys: each group's blocks from its first read one (allocate_private)
            computed = start_tokens if from_swap else 0
            if self._need_memo[:2] != (total_tokens, computed):  # asked again by `admit` after can_admit_head
                self._need_memo = (total_tokens, computed, self._pool.allocate_private_need(total_tokens, computed))
            return self._need_memo[2] <= self._free_blocks()
        if from_swap:
            fits = self._pool.can_allocate(total_tokens, computed_tokens=start_tokens)
        else:
            fits = self._pool.can_allocate(total_tokens, self._keys(rid, total_tokens))
        if not fits:  # what a run while it waits must not change (_prefix_run): valid while the pool is unchanged
            self._refused = (self._pool.pools[0]._epoch, rid, start_tokens, total_tokens, from_swap, self._looked)
        return fits

    def admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        if not self.can_admit(rid, start_tokens, total_tokens, from_swap):
            return False
        if self._private:
            assert from_swap or not start_tokens, f"request {rid}: no prefix keys, {start_tokens} tokens cached"
            counts = self._counts_now()
            if counts is not None:  # the pool hears of it when it settles, if ever (group_counts)
                counts.admit(rid, total_tokens, start_tokens if from_swap else 0)
            else:
                self._pool.allocate_private(rid, total_tokens, start_tokens if from_swap else 0)
            return True
        if from_swap:
            self._pool.allocate(rid, total_tokens, computed_tokens=start_tokens)
            return True
        hit = self._pool.allocate(rid, total_tokens, self._keys(rid, total_tokens))
        assert hit == start_tokens, f"request {rid}: pool hit {hit}, probe said {start_tokens}"
        label(self._pool, rid)  # the blocks a later prompt may hit, with their groups (held_blocks)
        return True

    # ---- growth --------------------------------------------------------------------------------------
    def grow_many(self, rids: np.ndarray, totals: np.ndarray, new_blocks: int | None = None,
                  check: bool = True) -> bool:
        counts = self._counts_now()
        if counts is None:
            return self._grow_many(rids, totals, check)
        ids, targets, tokens = rids.tolist(), totals.tolist(), counts.tokens
        if ids and all(r in tokens and t - tokens[r] == 1 for r, t in zip(ids, targets, strict=True)) and counts.step(
                ids, self._pool.num_blocks - counts.used, credit=not check or len(ids) == 1):
            return True  # a decode step that fits: in the counts (group_counts)
        counts.settle()
        self._paused = True  # the pool's own growth, and any request by request after it (_grow_in_order)
        try:
            return self._grow_many(rids, totals, check)
        finally:
            self._paused = False
            counts.resync()

    def _grow_many(self, rids: np.ndarray, totals: np.ndarray, check: bool) -> bool:
        """grow_many on the pool itself."""
        pool = self._pool
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
            olds = [s.num_tokens for s in pool.pools[0]._tables(ids)]
            adds = [t - old for old, t in zip(olds, targets, strict=True)]
            if len(ids) > 1 and need_ordered(pool, ids, adds) > pool.num_free_blocks:
                return self._grow_in_order(ids, targets)
            skip_ordered(pool, ids)
            if len(ids) == 1 and need_ordered(pool, ids, adds) > pool.num_free_blocks:
                return False
            keys = self._completed_keys(ids, olds, adds)
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
                self.copies += append(rid, add, self._completed_keys([rid], [pool.num_tokens(rid)], [add])[0])
        return True

    def _completed_keys(self, ids: list[int], olds: list[int], adds: list[int]) -> list:
        """The content keys of the prompt blocks that growing each request from `olds` by `adds` tokens completes (a
        later prefill chunk), so that they are cached as the first chunk's are; None past the prompt's keyed blocks
        or where it adds none."""
        prompt_keys, B, out = self.prompt_keys, self.block_size, []
        for rid, old, add in zip(ids, olds, adds, strict=True):
            keys = None if prompt_keys is None else prompt_keys[rid]
            out.append(keys[old // B : min((old + add) // B, len(keys))] if add and keys is not None and old // B < len(
                keys) else None)
        return out

    def grow(self, rid: int, total: int) -> bool:
        counts = self._counts_now()
        held = counts.tokens[rid] if counts is not None else self._pool.num_tokens(rid)
        if total == held:  # grown already (a step that `_grow_in_order` stopped after it)
            return True
        return self.grow_many(np.array([rid]), np.array([total]))

    def _grow_in_order(self, ids: list[int], targets: list[int]) -> bool:
        """A step whose growth the free blocks do not cover before anything is freed: vLLM's order, request by
        request — each frees what its own groups let go (remove_skipped_blocks), then its growth must fit
        (allocate_slots), so a later request's frees never pay for an earlier one's growth. False where one does
        not fit: those before it grown, its own frees done (as vLLM leaves them before preempting from the back;
        the scheduler's one-by-one pass then finds them grown: `grow`). With prefix caching on an ordered pool, the
        requests whose growth the blocks free before their own frees cover go in one pass, as a whole step's does."""
        pool = self._pool
        if self.prompt_keys is None or self.exact_block_tables or not ordered(pool):
            return all(self.grow(rid, total) for rid, total in zip(ids, targets, strict=True))
        todo = [(rid, total) for rid, total in zip(ids, targets, strict=True) if total != pool.num_tokens(rid)]
        rids, totals = [rid for rid, _ in todo], [total for _, total in todo]  # (a request at its total: no-op)
        i = 0
        while i < len(rids):
            k = fitting_run(pool, rids[i:], totals[i:], pool.num_free_blocks)
            if k < 2:
                k = 1
                if not self.grow(rids[i], totals[i]):
                    return False
            elif not self._grow_many(np.array(rids[i : i + k]), np.array(totals[i : i + k]), True):
                return False  # pragma: no cover - it fits before its frees
            i += k
        return True

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
        return self.prompt_keys is not None and not self.exact_block_tables and runs_apply(self._pool)

    fast_runs = True

    @property
    def _private(self) -> bool:
        """The pool is private (HybridPool.private: which block ids a table holds matters to nobody) and no plan
        reads block tables: growth and runs go through advance_private. Asked at every step: remembered while the
        pool's fork count stays the same (this policy opens no speculative slot and its pool's layout is fixed, so
        a fork is the one thing that ends privacy)."""
        forks = self._pool.store.counters["forks"]
        if self._private_memo is None or self._private_memo[0] != forks:
            private = not self.exact_block_tables and self.prompt_keys is None and self._pool.private
            self._private_memo = (forks, private)
        return self._private_memo[1]

    _private_memo: tuple[int, bool] | None = None
    _need_memo: tuple[int, int, int] = (-1, -1, 0)  # can_admit's last (tokens, computed, blocks it takes): pure

    def decode_run(self, tokens: np.ndarray, k: int, waiting: bool) -> tuple[int, RunForm | DecodeRun | None]:
        """(how many of the next k decode steps of the running requests, holding `tokens` [n] (≥ 1 each),
        can be done at once, their memory per step: group_runs.run_form).

        A step fits iff the blocks held after it, summed over groups and requests, fit in the pool (the need of
        the growth is the held blocks less those held once the step has freed). A window that slides frees
        blocks, so with requests waiting the run stops before the pool holds fewer blocks than now (the head,
        refused now, could be admitted then). The pool itself is brought up to date after the run
        (`advance_run`): steps are kept only while its peak, Σ ceil((t + k) / B) − first(t), fits too."""
        if self.num_seqs() != len(tokens):  # a sequence outside the run holds blocks: step by step
            return 0, None
        if not self._private:
            return self._prefix_run(k, waiting)
        form = run_form(self, tokens, k)
        N, used = self._pool.num_blocks, self.num_used()
        bad = (form.used > N) | (form.peak > N) | ~covered(self, tokens, k, form.used, num_used=used)
        if waiting:
            bad |= form.used < used
        stop = np.flatnonzero(bad)
        return (int(stop[0]) if len(stop) else k), form

    def advance_run(self, rids: np.ndarray, tokens: np.ndarray, k: int, form: RunForm | DecodeRun) -> None:
        """The pool after k decode steps of `decode_run` from `tokens`: every table as stepping leaves it
        (HybridPool.advance_private, one token at a time), then checked against the closed form of the last step."""
        if isinstance(form, DecodeRun):
            assert k == form.k, f"a prefix-cached run planned for {form.k} steps, taken for {k}"
            apply(self._pool, rids.tolist(), form)
            return
        self.advance_private(rids.tolist(), k)
        check_run(self, form, k)

    @property
    def aligned_prefill_block(self) -> int:
        """B when the scheduler must end prefill chunks on block boundaries (vLLM's block-aligned split): mode
        align (vLLM's only with prefix caching), where the pool saves a state only where a step ends, with or without
        prompt keys, as vLLM splits; else 0. Plans that carry block tables (verify's executor) schedule their own."""
        align = self._pool.state_mode == "align" and any(g.kind == "state" for g in self.groups)
        return self.block_size if align and not self.exact_block_tables else 0

    # ---- swaps, release, forks ---------------------------------------------------------------------------
    def swap_bytes(self, rid: int) -> int | None:
        """Bytes a swap of the live request `rid` moves each way (None without `page_bytes`): every group's pages
        that the pool holds for it (HybridPool.swap_bytes: a window, a chunk, the state pages), less a block it
        still holds only because its next step has not freed it yet (left the window, an older state page:
        `first_block_before_growth`), which the swap-in does not take again. So out and in are the same bytes:
        those of the blocks from first(c) to ceil(c / B) in each group, c the tokens written."""
        if not self.page_bytes:
            return None
        self.sync()
        pool, B, mode = self._pool, self.block_size, self._pool.state_mode
        tokens = pool.num_tokens(rid)
        reads = [-(-tokens // g.tokens_per_block(B)) - g.first_block_before_growth(tokens, g.tokens_per_block(B), mode)
                 for g in self.groups]  # each group at its own tokens per block (mixed: group_blocks)
        stale = sum(max(h - r, 0) for h, r in zip(pool.held_blocks(rid), reads, strict=True))
        return sum(pool.swap_bytes(rid, self.page_bytes)) - stale * self.page_bytes

    def release(self, rid: int, reason: ReleaseReason | str) -> None:
        reason = ReleaseReason(reason)
        if self._private:
            counts = self._counts_now()
            if counts is None or counts.released(rid):  # (an admission the pool never heard of: nothing to free)
                self._pool.release_private(rid, reason)
        else:
            if self.prompt_keys is not None:  # its full blocks holding sampled tokens cached, as vLLM's (output_keys)
                register_released(register_full_groups, self._pool, self.prompt_keys, rid, self._pool.num_tokens(rid),
                                  self.block_size, reason)
            self._pool.release(rid, reason)

    def fork(self, parent: int, child: int) -> None:
        self.sync()
        self._counts = None  # a fork ends the pool's privacy
        self._pool.fork(parent, child)

    def block_table(self, rid: int) -> np.ndarray:
        raise AssertionError("a hybrid pool has one block table per group: plans do not carry them yet")

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    def check_whole(self) -> None:
        self.sync()
        self._pool.check_invariants()
        assert not self._pool.seq_ids, f"{len(self._pool.seq_ids)} sequences still hold blocks after the run"
        assert self._pool.num_used == 0 and self._pool.num_free_blocks == self._pool.num_blocks, "pool not whole"
