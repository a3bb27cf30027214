"""Runs of decode steps on a hybrid pool with prefix caching, the policy's side (GroupedPagedPolicy.decode_run; the
pool's side is core/pool/hybrid_runs.py): a run only when no running sequence has prompt blocks to complete, and,
while a request waits, only while its refusal stands — the policy keeps the last refusal, with the pool's epoch
then, and the prompt that admission looked up."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ..pool.hybrid_ordered import held_blocks
from ..pool.hybrid_runs import DecodeRun, evictable, plan

if TYPE_CHECKING:
    import numpy as np

    from ..pool.hybrid import HybridPool


class PrefixRuns:
    """GroupedPagedPolicy's prefix-cached runs (a base class: the policy's attributes below are its own)."""

    pool: HybridPool
    block_size: int
    prompt_keys: list | np.ndarray | None
    _looked: tuple[int, int] | None = None  # (request, prompt tokens) of the last hit look-up of an admission
    _refused: tuple[int, int, bool, tuple[int, int] | None] | None = None  # (epoch, request, swap-in, _looked)

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
        allowed = None
        if waiting:  # the head was refused just now (FastForward._segment_length): keep its refusal standing
            allowed = self._evictable()
            if allowed is None:
                return 0, None
        run = plan(self.pool, list(seqs), k, held_blocks(self.pool), allowed)
        return run.k, run

    def _evictable(self) -> int | None:
        """hybrid_runs.evictable for the refused head (a swap-in looks up nothing); None when the last refusal is
        not of the pool as it is (then no run while it waits)."""
        refused, pool = self._refused, self.pool
        if refused is None or refused[0] != pool.pools[0]._epoch:
            return None
        _, rid, from_swap, looked = refused
        if from_swap:
            return pool.store.queue.num_cached
        if looked is None or looked[0] != rid:
            return None
        return evictable(pool, looked[1], self._keys(rid, looked[1]))

