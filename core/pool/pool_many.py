"""Many sequences of a pool in one call: append, fork and release of many sequences (the same changes as one at
a time in that order, see batch), and `serve`, a request allocated, grown and released at once (see serve).
`ManySequences` is a base of `BlockPool` (core/pool/block_pool.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from .accounting import ReleaseReason
from .batch import append_many, fork_many, release_many
from .pool_tables import RELEASE_COUNTER, PoolTables
from .prefix_cache import HashedPrompts
from .serve import serve_request
from .store import BlockKeys


class ManySequences(PoolTables):
    """The batched calls of a pool (one call, many sequences) and `serve`."""

    def append_many(self, seq_ids: Sequence[Hashable], num_tokens: int) -> list[tuple[int, int]]:
        """`append(seq, num_tokens)` (no block keys) for each sequence, in order, in one call; returns every
        copy-on-write copy [(src, dst)] in that order. Check, then change, for all of them together."""
        seqs = self._live(seq_ids, "appended to")
        if num_tokens < 0:
            raise ValueError(f"cannot append a negative number of tokens ({num_tokens})")
        if self.spec.tracked and any(self.spec.tracks(s) for s in seq_ids):
            raise ValueError("append_many takes no sequence with speculative slots (reserved or kept): append "
                             "those one at a time")
        if num_tokens == 0 or not seqs:
            return []
        copies, new_blocks = append_many(self.store, seqs, num_tokens)
        self._epoch += 1
        self.logical_blocks += new_blocks
        self.logical_tokens += num_tokens * len(seqs)
        return copies

    def fork_many(self, parent_ids: Sequence[Hashable], child_ids: Sequence[Hashable]) -> None:
        """`fork(parent, child)` for each pair, in order, in one call (a parent may be forked several times)."""
        if len(parent_ids) != len(child_ids):
            raise ValueError(f"{len(parent_ids)} parents for {len(child_ids)} children: give one parent per child")
        parents = self._tables(parent_ids)  # a parent may come several times
        self.spec.refuse_reserved(parent_ids, "forked")
        if len(set(child_ids)) < len(child_ids) or any(c in self.seqs for c in child_ids):
            raise ValueError("every child needs a new id: one is live already or given twice")
        children = fork_many(self.store, parents)
        self._epoch += 1
        self.seqs.update(zip(child_ids, children, strict=True))
        self.logical_blocks += sum(c.num_blocks - c.num_skipped for c in children)
        self.logical_tokens += sum(c.num_tokens for c in children)
        self.store.counters["forks"] += len(children)

    def release_many(self, seq_ids: Sequence[Hashable], reason: ReleaseReason = ReleaseReason.FINISHED) -> None:
        """`release(seq, reason)` for each sequence, in order, in one call."""
        counter = RELEASE_COUNTER.get(reason) if isinstance(reason, str) else None
        if counter is None:
            raise ValueError(f"unknown release reason {reason!r}: use a ReleaseReason")
        seqs = self._live(seq_ids, "released (double free)")
        if self.spec.tracked and any(self.spec.tracks(s) for s in seq_ids):
            for seq_id in seq_ids:  # kept blocks drop before each table: one at a time keeps that order
                self.release(seq_id, reason)
            return
        self._epoch += 1
        for seq_id in seq_ids:
            del self.seqs[seq_id]
        release_many(self.store, seqs, defer=self._in_step)
        self.logical_blocks -= sum(s.num_blocks - s.num_skipped for s in seqs)
        self.logical_tokens -= sum(s.num_tokens for s in seqs)
        self.store.counters[counter] += len(seqs)

    def serve(
        self, num_tokens: int, block_keys: BlockKeys = None, num_output_tokens: int = 0, extra_key: Hashable = None
    ) -> tuple[int, int]:
        """allocate + append + release of one request; returns (hit tokens, blocks in use while it ran)."""
        if self._in_step:
            raise ValueError("serve runs a request start to finish: call it outside a step")
        if num_output_tokens < 0:
            raise ValueError(f"cannot append a negative number of tokens ({num_output_tokens})")
        result = serve_request(self.store, self.prefix, self._probe(num_tokens, block_keys, extra_key), num_tokens,
                               num_output_tokens)
        self._epoch += 1
        return result

    def hash_prompts(self, block_keys: np.ndarray, offsets: np.ndarray, extra_key: Hashable = None) -> HashedPrompts:
        """Many prompts' keys hashed at once, for `allocate`, `serve` or `hit_tokens` (see PrefixIndex)."""
        return self.prefix.hash_prompts(block_keys, offsets, extra_key)
