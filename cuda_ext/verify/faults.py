"""Negative controls: real faults planted in one block pool, to show that verify's checks catch them.

Each fault wraps an operation of one `BlockPool` instance (nothing else changes, and no verdict is
touched): the pool then really does the wrong thing, the executor really computes with it, and the run
fails only if the token comparison, the content check or the pool's invariants notice.

    early-free   a release hands back every block of the sequence, also those another table still
                 reads (a fork sibling, a prefix-cache sharer): the next allocation reuses them while
                 their readers still attend over them
    skip-cow     an append into a partially filled block that other tables share writes it in place
                 instead of copying it first: siblings see each other's tokens
    stale-hash   an evicted cached block keeps its prefix-cache entry when it is handed out for new
                 content: a later prompt with the old prefix "hits" it and reads the new content
    no-rollback  a speculative commit keeps every reserved slot: the rejected drafts' (and lookahead) K/V
                 stays counted as committed, so the pool's length drifts from the scheduler's

`fired` counts how often the fault changed what the pool did, so a report can tell a fault that was
caught from one that never had a chance to act.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np

from ...core.pool.block_pool import BlockPool, ReleaseReason

INJECTIONS = ("early-free", "skip-cow", "stale-hash", "no-rollback")


class Fault:
    """A fault installed into one pool; `fired` counts its effects."""

    def __init__(self, name: str) -> None:
        if name not in INJECTIONS:
            raise ValueError(f"inject {name!r} is not a known fault; use one of {', '.join(INJECTIONS)}")
        self.name = name
        self.fired = 0

    def install(self, pool: BlockPool) -> None:
        installers: dict[str, Callable[[BlockPool], None]] = {
            "early-free": self._early_free, "skip-cow": self._skip_cow, "stale-hash": self._stale_hash,
            "no-rollback": self._no_rollback,
        }
        installers[self.name](pool)

    def _early_free(self, pool: BlockPool) -> None:
        release = pool.release
        store = pool.store

        def early_release(seq_id: Hashable, reason: ReleaseReason = ReleaseReason.FINISHED) -> None:
            table = pool.block_table(seq_id)
            release(seq_id, reason)
            # the bug: "is this the last holder?" tested as ref <= 1 instead of ref == 0 after the decrement
            still_read = table[store.ref[table] == 1]
            if len(still_read):
                self.fired += len(still_read)
                store.ref[still_read] = 0
                store.drop(still_read)

        pool.release = early_release  # type: ignore[method-assign]  # the fault: this instance's method swapped

    def _skip_cow(self, pool: BlockPool) -> None:
        needs_copy = pool._needs_copy

        def never_copy(block_id: int) -> bool:
            if needs_copy(block_id):
                self.fired += 1
            return False

        pool._needs_copy = never_copy  # type: ignore[method-assign]  # the fault: this instance's method swapped

    def _stale_hash(self, pool: BlockPool) -> None:
        index = pool.store.index

        def keep_entries(block_ids: np.ndarray) -> None:
            self.fired += len(block_ids)

        index.delete = keep_entries  # type: ignore[method-assign]  # the fault: this instance's method swapped

    def _no_rollback(self, pool: BlockPool) -> None:
        commit = pool.commit

        def commit_all(seq_id: Hashable, num_accepted: int, block_keys=None) -> int:
            reservation = pool.reservation(seq_id)
            if reservation is not None and num_accepted < reservation.num_slots:
                self.fired += 1
                num_accepted = reservation.num_slots
            return commit(seq_id, num_accepted, block_keys)

        pool.commit = commit_all  # type: ignore[method-assign]  # the fault: this instance's method swapped
