"""Speculative slots in the block pool: exact block ids, fills and free-queue order through reserve and
commit under both rollback policies; the rules of core/pool/speculative checked one by one; planted bugs
(drafts hashed before commit, no rollback) caught by the invariants and the shadow content check."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvcalc.core.errors import ParameterError
from kvcalc.core.pool.append import register_completed
from kvcalc.core.pool.block_pool import BlockPool, PoolExhaustedError, ReleaseReason
from kvcalc.core.pool.speculative import SpeculativeUsage

from .test_block_pool_stateful import ShadowStore, block_keys

POLICIES = ["keep", "free"]


def fills(pool: BlockPool, blocks: list[int]) -> list[int]:
    return [int(pool.store.fill[b]) for b in blocks]


def snapshot(pool: BlockPool) -> tuple:
    """Everything a pool operation may change (the store's arrays, the tables, the speculative state)."""
    store = pool.store
    arrays = tuple(a.tobytes() for a in (store.state, store.ref, store.version, store.fill, store.block_slot))
    tables = {s: (t.blocks.tolist(), t.num_tokens, t.num_hashed) for s, t in pool.seqs.items()}
    spec = (dict(pool.spec.reservations), {s: k.tolist() for s, k in pool.spec.kept.items()})
    return arrays, tables, spec, pool.usage(), pool.free_queue_order(), pool.speculative_stats()


# ---- one step, block by block ------------------------------------------------------------------------
def test_keep_policy_step_by_step() -> None:
    """vLLM v1: the rolled-back slots stay the sequence's; the next step writes them again; no block freed."""
    pool = BlockPool(num_blocks=8, block_size=4, rollback_policy="keep")
    pool.allocate("a", 6)  # ceil(6/4) = 2 blocks: 0 (full), 1 (2 of 4)
    assert pool.block_table("a").tolist() == [0, 1]

    # reserve 5: slots 6..10; block 1 fills up (6, 7), block 2 is taken for 8..10
    assert pool.reserve("a", 5) == []
    assert pool.block_table("a").tolist() == [0, 1, 2] and fills(pool, [0, 1, 2]) == [4, 4, 3]
    assert (pool.num_tokens("a"), pool.committed_tokens("a")) == (11, 6)
    assert pool.speculative_usage() == SpeculativeUsage(open_reservations=1, reserved_slots=5,
                                                        speculative_blocks=1, kept_blocks=0)
    pool.check_invariants()

    # commit 2 (slots 6, 7): 3 rolled back; block 2 holds no committed token and is kept, not freed
    assert pool.commit("a", 2) == 3
    assert pool.block_table("a").tolist() == [0, 1] and pool.kept_blocks("a") == [2]
    assert fills(pool, [0, 1, 2]) == [4, 4, 0] and pool.usage().used_blocks == 3
    assert pool.free_queue_order() == [3, 4, 5, 6, 7]
    # allocated − committed = 3 blocks · 4 − 8 = 4 <= k + B − 1 = 5 + 3
    assert pool.speculative_usage().speculative_blocks == 1
    pool.check_invariants()

    # the next step reserves 5 again (slots 8..12): block 2 is written again first, then block 3
    pool.reserve("a", 5)
    assert pool.block_table("a").tolist() == [0, 1, 2, 3] and fills(pool, [2, 3]) == [4, 1]
    assert pool.kept_blocks("a") == [] and pool.speculative_stats().rewritten_blocks == 1
    assert pool.commit("a", 5) == 0
    assert pool.block_table("a").tolist() == [0, 1, 2, 3] and pool.num_tokens("a") == 13
    pool.check_invariants()
    pool.release("a")
    assert pool.usage().free_blocks == 8
    pool.check_invariants()


def test_free_policy_step_by_step() -> None:
    """SGLang: blocks wholly past the committed length go back to the free queue at once."""
    pool = BlockPool(num_blocks=8, block_size=4, rollback_policy="free")
    pool.allocate("a", 6)
    pool.reserve("a", 5)
    assert pool.block_table("a").tolist() == [0, 1, 2]
    assert pool.commit("a", 2) == 3
    assert pool.block_table("a").tolist() == [0, 1] and pool.kept_blocks("a") == []
    assert pool.free_queue_order() == [3, 4, 5, 6, 7, 2]  # block 2 back at the free queue's tail
    assert pool.usage().used_blocks == 2 and pool.speculative_stats().freed_blocks == 1
    pool.check_invariants()
    # commit 0 inside the partially filled block: nothing to free, the fill drops back
    pool.reserve("a", 2)  # slots 8, 9 -> a new block: the queue's head, 3
    assert pool.block_table("a").tolist() == [0, 1, 3]
    assert pool.commit("a", 0) == 2 and pool.block_table("a").tolist() == [0, 1]
    pool.check_invariants()


@pytest.mark.parametrize("policy", POLICIES)
def test_slack_after_commit_is_bounded_as_stated(policy: str) -> None:
    """After a commit: free holds B · ceil(C/B) − C <= B − 1 slots past the committed length C; keep at
    most k_max + B − 1 (k_max the largest reservation while it holds kept blocks), and no fewer blocks."""
    B = 4
    pool = BlockPool(num_blocks=16, block_size=B, rollback_policy=policy)
    pool.allocate("a", 4)
    slack = []
    for k, j in [(5, 0), (9, 0), (2, 0), (2, 1)]:
        pool.reserve("a", k)
        pool.commit("a", j)
        held = len(pool.block_table("a")) + len(pool.kept_blocks("a"))
        slack.append(B * held - pool.num_tokens("a"))
        pool.check_invariants()
    if policy == "free":
        # committed 4, 4, 4, 5: slack 0, 0, 0, 3
        assert slack == [0, 0, 0, 3]
    else:
        # keep: (5, 0) holds ceil(9/4) = 3 blocks -> 12 − 4 = 8 = 5 + 3; (9, 0) 4 blocks -> 12 = 9 + 3;
        # (2, 0) rewrites one kept block and keeps all 4: 12 > 2 + 3 — the bound is k_max's, 9 + 3;
        # (2, 1): committed 5, still 4 blocks -> 11
        assert slack == [8, 12, 12, 11]


# ---- check, then change; consumed exactly once -------------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES)
def test_a_failed_reserve_changes_nothing(policy: str) -> None:
    pool = BlockPool(num_blocks=3, block_size=4, rollback_policy=policy)
    pool.allocate("a", 7)  # 2 blocks; 1 free
    pool.reserve("a", 4)  # slots 7..10: block 1's last slot and a third block
    pool.commit("a", 0)
    before = snapshot(pool)
    assert not pool.can_reserve("a", 10)  # 7 + 10 = 17 slots: 5 blocks, 3 in the pool
    with pytest.raises(PoolExhaustedError):
        pool.reserve("a", 10)
    assert snapshot(pool) == before
    assert pool.can_reserve("a", 5)  # 12 slots: 3 blocks, through the kept one under keep
    pool.check_invariants()


def test_a_reservation_is_consumed_exactly_once() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    pool.allocate("a", 3)
    with pytest.raises(ValueError, match="no open reservation"):
        pool.commit("a", 0)
    pool.reserve("a", 3)
    with pytest.raises(ValueError, match="open reservation"):
        pool.reserve("a", 1)
    with pytest.raises(ValueError, match=r"outside 0\.\.3"):
        pool.commit("a", 4)
    assert pool.reservation("a") is not None  # a refused commit leaves it open
    pool.commit("a", 3)
    with pytest.raises(ValueError, match="no open reservation: a reservation is committed once"):
        pool.commit("a", 3)
    with pytest.raises(ValueError, match="negative"):
        pool.reserve("a", -1)
    pool.check_invariants()


def test_a_reserved_sequence_is_not_appended_to_nor_forked() -> None:
    pool = BlockPool(num_blocks=8, block_size=4)
    pool.allocate("a", 3)
    pool.allocate("b", 3)
    pool.reserve("a", 2)
    assert not pool.can_append("a", 1)
    for refused in (lambda: pool.append("a", 1), lambda: pool.fork("a", "c"), lambda: pool.fork_many(["a"], ["c"])):
        with pytest.raises(ValueError, match="open reservation"):
            refused()
    with pytest.raises(ValueError, match="append_many takes no sequence with speculative slots"):
        pool.append_many(["b", "a"], 1)
    assert not pool.has_seq("c")
    pool.check_invariants()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("reason", list(ReleaseReason))
def test_release_while_reserved_returns_every_block(policy: str, reason: ReleaseReason) -> None:
    """Cancel, finish, timeout and preemption with an open reservation (and kept blocks): the pool is whole."""
    pool = BlockPool(num_blocks=8, block_size=2, rollback_policy=policy)
    pool.allocate("a", 3)
    pool.reserve("a", 4)
    pool.commit("a", 0)  # keep: 2 kept blocks; free: none
    pool.reserve("a", 6)  # slots 3..8: 5 blocks in the table
    assert len(pool.block_table("a")) == 5
    pool.release("a", reason)
    assert pool.usage().free_blocks == 8 and pool.usage().logical_blocks == 0
    assert pool.speculative_usage() == SpeculativeUsage(0, 0, 0, 0)
    pool.check_invariants()
    with pytest.raises(ValueError, match="double free"):
        pool.release("a", reason)


@pytest.mark.parametrize("policy", POLICIES)
def test_preempting_inside_a_step_defers_every_block(policy: str) -> None:
    """Released inside a step, every block of a reserved sequence waits until the step ends, then is free."""
    pool = BlockPool(num_blocks=8, block_size=2, rollback_policy=policy)
    pool.allocate("a", 3)
    pool.reserve("a", 4)
    pool.commit("a", 1)
    pool.reserve("a", 3)
    with pool.step():
        pool.release("a", ReleaseReason.PREEMPTED)
        assert pool.usage().used_blocks == 0 and pool.usage().free_blocks < 8
        pool.check_invariants()
    assert pool.usage().free_blocks == 8
    pool.check_invariants()


def test_release_many_with_kept_blocks_drops_them_as_one_at_a_time() -> None:
    def run(many: bool) -> list[int]:
        pool = BlockPool(num_blocks=12, block_size=2)
        for seq in "abc":
            pool.allocate(seq, 3)
        pool.reserve("b", 5)
        pool.commit("b", 0)  # b keeps blocks past its table
        pool.reserve("c", 2)  # c has an open reservation
        if many:
            pool.release_many(["c", "a", "b"])
        else:
            for seq in "cab":
                pool.release(seq)
        pool.check_invariants()
        return pool.free_queue_order()

    assert run(True) == run(False)


# ---- copy-on-write, fork, append after a rollback -----------------------------------------------------
def test_reserve_copies_a_shared_partial_block_first() -> None:
    store = ShadowStore(BlockPool(num_blocks=8, block_size=4))
    store.allocate("a", [1, 2, 3, 4, 5, 6])
    store.fork("a", "b")
    # b's drafts go into block 1, which a holds too: copied to block 2 first
    assert store.reserve("b", [7, 8, 9]) == [(1, 2)]
    store.check()
    store.commit("b", 0)
    assert store.pool.block_table("b").tolist() == [0, 2]  # the copy stays b's
    store.append("a", [10])  # a writes its own block 1 in place
    store.check()
    store.pool.check_invariants()


def test_a_fork_between_steps_does_not_share_kept_blocks() -> None:
    store = ShadowStore(BlockPool(num_blocks=8, block_size=2))
    store.allocate("a", [1, 2, 3, 4])
    store.reserve("a", [5, 6, 7])
    store.commit("a", 0)
    assert store.pool.kept_blocks("a") == [2, 3]
    store.fork("a", "b")
    assert store.pool.kept_blocks("b") == [] and store.pool.block_table("b").tolist() == [0, 1]
    store.append("b", [8])  # a fresh block: a's kept blocks stay a's
    assert store.pool.block_table("b").tolist() == [0, 1, 4]
    store.append("a", [9, 9, 9])  # a writes through its kept blocks, takes nothing
    assert store.pool.block_table("a").tolist() == [0, 1, 2, 3] and store.pool.usage().used_blocks == 5
    store.check()
    store.pool.check_invariants()


# ---- hashing: only committed full blocks ----------------------------------------------------------------
def test_drafts_are_never_hashed_and_committed_blocks_are() -> None:
    B = 2
    store = ShadowStore(BlockPool(num_blocks=12, block_size=B))
    store.allocate("a", [1, 2, 3])
    store.reserve("a", [4, 5, 6])  # blocks 1 ([3, 4]) and 2 ([5, 6]) full of drafts
    assert store.pool.store.index.num_live == 1  # only [1, 2], hashed at allocate
    store.commit("a", 1)  # 4 accepted: block 1 = [3, 4] is full of committed tokens and registered
    assert store.pool.store.index.num_live == 2
    # a prompt with the accepted content hits; one with the rejected drafts does not
    assert store.allocate("b", [1, 2, 3, 4, 0]) == 4
    assert store.allocate("c", [1, 2, 3, 4, 5, 6, 0]) == 4
    store.check()
    store.pool.check_invariants()


class HashesDrafts(BlockPool):
    """Planted bug: registers the blocks the drafts fill at reserve, before verification."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.draft_keys: list[tuple[int, ...]] = []

    def reserve(self, seq_id: object, num_slots: int) -> list[tuple[int, int]]:
        copies = super().reserve(seq_id, num_slots)
        register_completed(self.prefix, self.seqs[seq_id], self.prefix.key_array(self.draft_keys))
        return copies


class NoRollback(BlockPool):
    """Planted bug: commit keeps every reserved slot, accepted or not."""

    def commit(self, seq_id: object, num_accepted: int, block_keys: object = None) -> int:
        super().commit(seq_id, self.spec.reservations[seq_id].num_slots)
        return 0


def test_invariants_catch_drafts_hashed_before_commit() -> None:
    pool = HashesDrafts(num_blocks=8, block_size=2)
    store = ShadowStore(pool)
    store.allocate("a", [1, 2])
    pool.draft_keys = block_keys([1, 2, 3, 4], 2, 1, 2)  # the block of drafts [3, 4]
    store.reserve("a", [3, 4])  # the buggy pool hashes their block now, before verification
    with pytest.raises(AssertionError, match="a hash covers a position at or past the committed length"):
        pool.check_invariants()
    store.commit("a", 0)  # both rejected: the hashed block holds no committed token
    with pytest.raises(AssertionError, match="a hashed block is not full"):
        pool.check_invariants()


def test_content_check_catches_drafts_hashed_before_commit() -> None:
    pool = HashesDrafts(num_blocks=8, block_size=2)
    store = ShadowStore(pool)
    store.allocate("a", [1, 2])
    pool.draft_keys = block_keys([1, 2, 3, 4], 2, 1, 2)
    store.reserve("a", [3, 4])
    store.commit("a", 0)
    pool.draft_keys = []
    store.reserve("a", [7, 7])  # the next step writes the kept block again: [7, 7]
    store.commit("a", 2)
    # a prompt [1, 2, 3, 4, 0] now "hits" the stale entry of [3, 4], whose slots hold [7, 7]
    store.allocate("b", [1, 2, 3, 4, 0])
    with pytest.raises(AssertionError, match="sequence 'b' reads back wrong content"):
        store.check()


@pytest.mark.parametrize("policy", POLICIES)
def test_content_check_catches_no_rollback(policy: str) -> None:
    store = ShadowStore(NoRollback(num_blocks=8, block_size=2, rollback_policy=policy))
    store.allocate("a", [1, 2, 3])
    store.reserve("a", [4, 5, 6])
    store.commit("a", 1)  # 5 and 6 rejected, but the buggy pool keeps them as committed tokens
    with pytest.raises(AssertionError, match="sequence 'a' reads back wrong content"):
        store.check()


@pytest.mark.parametrize("policy", POLICIES)
def test_the_correct_pool_passes_the_same_probes(policy: str) -> None:
    store = ShadowStore(BlockPool(num_blocks=8, block_size=2, rollback_policy=policy))
    store.allocate("a", [1, 2])
    store.reserve("a", [3, 4])
    store.commit("a", 0)
    store.reserve("a", [7, 7])
    store.commit("a", 2)
    store.allocate("b", [1, 2, 3, 4, 0])
    store.reserve("b", [4, 5, 6])
    store.commit("b", 1)
    store.check()
    store.pool.check_invariants()


def test_an_unknown_rollback_policy_is_refused_by_name() -> None:
    with pytest.raises(ParameterError, match="rollback_policy 'drop' is not a rollback policy") as info:
        BlockPool(4, 4, rollback_policy="drop")
    assert info.value.param == "rollback_policy"


# ---- both policies give every sequence the same content --------------------------------------------
@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 7), st.integers(0, 7)), min_size=1, max_size=25),
    block_size=st.integers(1, 4),
)
@example(steps=[(i % 3, 7, 7) for i in range(25)], block_size=1)  # the most blocks the steps can hold
# this one exhausted the 64-block pool the test once had, on a fresh machine
@example(steps=[(0, 1, 1), (0, 1, 1), (0, 4, 4), *[(0, 7, 7)] * 3, (0, 7, 0), (1, 7, 0), *[(2, 7, 7)] * 2, (2, 7, 0)],
         block_size=1)
def test_keep_and_free_read_back_the_same_tokens(steps: list[tuple[int, int, int]], block_size: int) -> None:
    """Where the rolled-back slots go never changes what a sequence reads: both policies against a plain
    list of committed tokens, and free never holds more blocks than keep."""
    # Never exhausted: at most 3 + 25 x 7 = 178 committed tokens, and per sequence a reservation of 7 plus,
    # under keep, kept slots of at most 7 + B - 1 <= 10: 178 + 3 x 17 = 229 blocks of one token < 256.
    num_blocks = 256
    stores = [ShadowStore(BlockPool(num_blocks, block_size, rollback_policy=p)) for p in POLICIES]
    reference = {seq: [seq + 1] for seq in range(3)}
    for store in stores:
        for seq, tokens in reference.items():
            store.allocate(seq, tokens)
    for seq, num_slots, accept in steps:
        drafts = [(seq + 3 * i + num_slots) % 7 for i in range(num_slots)]
        j = min(accept, num_slots)
        for store in stores:
            store.reserve(seq, drafts)
            store.check()
            store.commit(seq, j)
            store.pool.check_invariants()
        reference[seq] = reference[seq] + drafts[:j]
        assert all(store.tokens == reference for store in stores)
        for store in stores:
            store.check()
        keep, free = (s.pool.usage().used_blocks for s in stores)
        assert free <= keep
        assert free == sum(-(-len(t) // block_size) for t in reference.values())
    for store in stores:
        for seq in reference:
            store.release(seq)
        assert store.pool.usage().free_blocks == num_blocks
        assert np.all(store.pool.store.ref == 0)
