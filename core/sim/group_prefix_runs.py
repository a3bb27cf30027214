"""Runs of decode steps on a hybrid pool with prefix caching, the policy's side (GroupedPagedPolicy.decode_run; the
pool's side is core/pool/hybrid_runs.py): a run only when no running sequence has prompt blocks to complete, and,
while a request waits, only while its refusal stands — the policy keeps the last refusal, with the pool's epoch
then, and the prompt that admission looked up."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ..pool.hybrid_ordered import held_blocks
from ..pool.hybrid_runs import DecodeRun, Waiting, evictable, need_floor, plan

if TYPE_CHECKING:
    import numpy as np

    from ..pool.hybrid import HybridPool


class PrefixRuns:
    """GroupedPagedPolicy's prefix-cached runs (a base class: the policy's attributes below are its own)."""

    pool: HybridPool
    block_size: int
    prompt_keys: list | np.ndarray | None
    _looked: tuple[int, int] | None = None  # (request, prompt tokens) of the last hit look-up of an admission
    # the last refusal: (the pool's epoch then, request, start and end of its first chunk, a swap-in, its _looked)
    _refused: tuple[int, int, int, int, bool, tuple[int, int] | None] | None = None
    max_batched_tokens: int

    def _keys(self, rid: int, num_tokens: int) -> np.ndarray | list | None: ...

    def _prefix_run(self, k: int, waiting: bool) -> tuple[int, DecodeRun | None]:
        """decode_run with prefix caching: the steps stepping takes as plain decode steps (hybrid_runs.plan: the
        growth fits; with a request waiting, no eviction of a block its look-up found and no more free blocks than now,
        so its refusal stands),
        none when a sequence would complete a keyed prompt block (a prefill's tail)."""
        seqs, keys, B = self.pool.pools[0].seqs, self.prompt_keys, self.block_size
        assert keys is not None, "a prefix-cached run has keys"
        if any(t.num_tokens // B < len(keys[cast(int, rid)]) for rid, t in seqs.items()):  # keys to complete
            return 0, None
        waiting_head = None
        if waiting:  # the head was refused just now (FastForward._segment_length): keep its refusal standing
            waiting_head = self._waiting()
            if waiting_head is None:
                return 0, None
        run = plan(self.pool, list(seqs), k, held_blocks(self.pool), waiting_head)
        return run.k, run

    def _waiting(self) -> Waiting | None:
        """What keeps the refused head refused (hybrid_runs.Waiting: its need's floor, and unless that exceeds the free
        blocks, what its look-up found; a swap-in looks up nothing); None when the last refusal is not of the pool
        as it is (then no run while it waits)."""
        refused, pool = self._refused, self.pool
        if refused is None or refused[0] != pool.pools[0]._epoch:
            return None
        _, rid, start, total, from_swap, looked = refused
        need = pool._allocate_plan(total, None if from_swap else self._keys(rid, total), None,
                                   start if from_swap else 0)[2]  # the refusal's (its plan is kept)
        if from_swap:  # no look-up: the need stays
            return Waiting(len(pool.store.queue), need)  # any hand-out up to the queue's end (hybrid_runs.evictable)
        if looked is None or looked[0] != rid:
            return None
        # the step's budget: the chunk's, where it stops short of the prompt; else the scheduler's, every running
        # request decoding (FastForward._segment_length asks with it)
        cut = total < looked[1]
        floor = need_floor(pool, need, cut, total - start if cut else self.max_batched_tokens - len(pool.pools[0].seqs))
        if pool.num_free_blocks < floor:
            return Waiting(0, floor)
        return Waiting(evictable(pool, looked[1], self._keys(rid, looked[1])), floor)
