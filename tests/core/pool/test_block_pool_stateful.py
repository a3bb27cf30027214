"""The block pool under random operation sequences, with a shadow KV store as the content oracle.

The shadow store plays the GPU: every token id is written into the physical slot its block table names,
copy-on-write copies are performed as reported, and every live sequence is read back through its block
table after each step. Counts alone miss premature reuse and skipped copies; this catches them (the
planted-bug tests at the end prove it). Speculative steps write their drafts into the reserved slots the
same way; a sequence reads back its committed tokens, and while a reservation is open its drafts after
them.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvcalc.core.pool.block_pool import BlockPool, PoolExhaustedError, ReleaseReason


def block_keys(tokens: list[int], block_size: int, first: int, last: int) -> list[tuple[int, ...]]:
    """Content keys (tuples of token ids) of full blocks first..last-1."""
    return [tuple(tokens[i * block_size : (i + 1) * block_size]) for i in range(first, last)]


class ShadowStore:
    """Token ids in physical slots [num_blocks, block_size]; -1 = never written."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.slots = np.full((pool.num_blocks, pool.block_size), -1, dtype=np.int64)
        self.tokens: dict[object, list[int]] = {}  # committed tokens
        self.drafts: dict[object, list[int]] = {}  # the slots of an open reservation

    def _write(self, seq: object, start: int) -> None:
        toks = self.tokens[seq] + self.drafts.get(seq, [])
        pos = np.arange(start, len(toks))
        table = self.pool.block_table(seq)
        B = self.pool.block_size
        self.slots[table[pos // B], pos % B] = toks[start:]

    def allocate(self, seq: object, tokens: list[int], extra: object = None, cache: bool = True) -> int:
        keys = block_keys(tokens, self.pool.block_size, 0, len(tokens) // self.pool.block_size) if cache else None
        hit = self.pool.allocate(seq, len(tokens), keys, extra)
        self.tokens[seq] = list(tokens)
        self._write(seq, hit)  # hit tokens are already in their (revived) blocks: not rewritten
        return hit

    def append(self, seq: object, new_tokens: list[int]) -> list[tuple[int, int]]:
        B = self.pool.block_size
        old = self.tokens[seq]
        toks = old + list(new_tokens)
        keys = block_keys(toks, B, len(old) // B, len(toks) // B)
        copies = self.pool.append(seq, len(new_tokens), keys)
        for src, dst in copies:  # what the copy kernel would do, before anyone writes dst
            self.slots[dst] = self.slots[src]
        self.tokens[seq] = toks
        self._write(seq, len(old))
        return copies

    def fork(self, parent: object, child: object) -> None:
        self.pool.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])

    def reserve(self, seq: object, drafts: list[int]) -> list[tuple[int, int]]:
        """A speculative step's writes: the drafted tokens go into the reserved slots (never hashed)."""
        copies = self.pool.reserve(seq, len(drafts))
        for src, dst in copies:
            self.slots[dst] = self.slots[src]
        self.drafts[seq] = list(drafts)
        self._write(seq, len(self.tokens[seq]))
        return copies

    def commit(self, seq: object, num_accepted: int) -> int:
        """Verification accepted the first `num_accepted` drafts: they join the committed tokens, and the
        blocks they complete are registered under their content."""
        B = self.pool.block_size
        old = self.tokens[seq]
        toks = old + self.drafts.pop(seq)[:num_accepted]
        rolled_back = self.pool.commit(seq, num_accepted, block_keys(toks, B, len(old) // B, len(toks) // B))
        self.tokens[seq] = toks
        return rolled_back

    def release(self, seq: object, reason: ReleaseReason = ReleaseReason.FINISHED) -> None:
        self.pool.release(seq, reason)
        del self.tokens[seq]
        self.drafts.pop(seq, None)

    def read(self, seq: object) -> list[int]:
        table = self.pool.block_table(seq)
        pos = np.arange(self.pool.num_tokens(seq))
        B = self.pool.block_size
        return self.slots[table[pos // B], pos % B].tolist()

    def check(self) -> None:
        for seq, toks in self.tokens.items():
            assert self.read(seq) == toks + self.drafts.get(seq, []), f"sequence {seq!r} reads back wrong content"


# Prompts that share prefixes of every length, so that hits, partial hits and misses all happen.
_BASES = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 9, 9, 9, 9], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7]]
PROMPTS = [base[:cut] + tail for base in _BASES for cut in (1, 3, 4, 6, 8, 9) for tail in ([], [0], [2, 3])]


class PoolMachine(RuleBasedStateMachine):
    """allocate (with prefix hits), append (decode / chunks, CoW), fork, release by every reason,
    deferred-free steps, eviction (the pool is tiny); speculative reserve / commit under both rollback
    policies, release (preemption included) while reserved."""

    def __init__(self) -> None:
        super().__init__()
        self.next_id = 0
        self.readers: list[tuple[list[int], list[tuple[int, int]]]] = []  # released inside a step

    @initialize(num_blocks=st.integers(4, 14), block_size=st.integers(1, 4), rollback=st.sampled_from(["keep", "free"]))
    def setup(self, num_blocks: int, block_size: int, rollback: str) -> None:
        self.pool = BlockPool(num_blocks, block_size, rollback_policy=rollback)
        self.store = ShadowStore(self.pool)

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _pick(self, pick: int) -> int | None:
        live = sorted(self.store.tokens)
        return live[pick % len(live)] if live else None

    # Few, flat draws per rule: hypothesis' own drawing dominates the run time of this machine.
    @rule(prompt=st.integers(0, len(PROMPTS) - 1), lora=st.booleans())
    def allocate(self, prompt: int, lora: bool) -> None:
        tokens = PROMPTS[prompt]
        extra = "lora-a" if lora else None
        B = self.pool.block_size
        keys = block_keys(tokens, B, 0, len(tokens) // B)
        before = self.pool.usage()
        if self.pool.can_allocate(len(tokens), keys, extra):
            hit = self.store.allocate(self._new_id(), tokens, extra)
            assert hit % B == 0 and hit <= len(tokens) - 1
        else:
            with pytest.raises(PoolExhaustedError):
                self.pool.allocate(self._new_id(), len(tokens), keys, extra)
            assert self.pool.usage() == before  # a failed allocation changes nothing

    @rule(pick=st.integers(0, 63), num_new=st.integers(1, 6), salt=st.integers(0, 3))
    def append(self, pick: int, num_new: int, salt: int) -> None:
        seq = self._pick(pick)
        if seq is None:
            return
        new = [(salt + i * (salt + 1)) % 4 for i in range(num_new)]
        if self.pool.reservation(seq) is not None:  # a speculative step is open: settle it first
            assert not self.pool.can_append(seq, num_new)
            with pytest.raises(ValueError, match="open reservation"):
                self.store.append(seq, new)
            return
        if self.pool.can_append(seq, num_new):
            copies = self.store.append(seq, new)
            assert len(copies) <= 1
        else:
            with pytest.raises(PoolExhaustedError):
                self.pool.append(seq, num_new)

    @rule(pick=st.integers(0, 63))
    def fork(self, pick: int) -> None:
        parent = self._pick(pick)
        if parent is None:
            return
        if self.pool.reservation(parent) is not None:
            with pytest.raises(ValueError, match="open reservation"):
                self.store.fork(parent, self._new_id())
            return
        self.store.fork(parent, self._new_id())

    @rule(pick=st.integers(0, 63), num_slots=st.integers(0, 6), salt=st.integers(0, 3))
    def reserve(self, pick: int, num_slots: int, salt: int) -> None:
        """A speculative step: drafts (and lookahead) past the committed tokens."""
        seq = self._pick(pick)
        if seq is None:
            return
        drafts = [(salt * 3 + i) % 5 for i in range(num_slots)]
        if self.pool.reservation(seq) is not None:
            with pytest.raises(ValueError, match="open reservation"):
                self.store.reserve(seq, drafts)
            return
        before = self._snapshot()
        if self.pool.can_reserve(seq, num_slots):
            copies = self.store.reserve(seq, drafts)
            assert len(copies) <= 1
            assert self.pool.committed_tokens(seq) + num_slots == self.pool.num_tokens(seq)
        else:
            with pytest.raises(PoolExhaustedError):
                self.store.reserve(seq, drafts)
            assert self._snapshot() == before  # a failed reserve changes nothing

    @rule(pick=st.integers(0, 63), accept=st.integers(0, 6))
    def commit(self, pick: int, accept: int) -> None:
        """Verification accepted `accept` (at most all) of the reserved slots; the rest roll back."""
        reserved = sorted(self.store.drafts)
        if not reserved:
            seq = self._pick(pick)
            if seq is not None:
                with pytest.raises(ValueError, match="no open reservation"):
                    self.pool.commit(seq, 0)
            return
        seq = reserved[pick % len(reserved)]
        res = self.pool.reservation(seq)
        assert res is not None
        num_accepted = min(accept, res.num_slots)
        held_before = len(self.pool.block_table(seq)) + len(self.pool.kept_blocks(seq))
        assert self.store.commit(seq, num_accepted) == res.num_slots - num_accepted
        with pytest.raises(ValueError, match="no open reservation"):  # consumed exactly once
            self.pool.commit(seq, 0)
        B, committed = self.pool.block_size, res.committed + num_accepted
        held = len(self.pool.block_table(seq)) + len(self.pool.kept_blocks(seq))
        if self.pool.spec.policy == "keep":
            assert held == held_before  # no block freed; the rolled-back slots are written again next step
        else:
            assert held == -(-committed // B)  # every block wholly past the committed length freed

    @rule(pick=st.integers(0, 63), num_slots=st.integers(1, 9), accept=st.integers(0, 9))
    def speculative_step(self, pick: int, num_slots: int, accept: int) -> None:
        """reserve + commit in one go, as a scheduler's step does (rollbacks pile up kept blocks)."""
        seq = self._pick(pick)
        if seq is None or self.pool.reservation(seq) is not None or not self.pool.can_reserve(seq, num_slots):
            return
        self.store.reserve(seq, [(accept + 2 * i) % 5 for i in range(num_slots)])
        self.store.commit(seq, min(accept, num_slots))

    @rule(pick=st.integers(0, 63), reason=st.sampled_from(list(ReleaseReason)))
    def release(self, pick: int, reason: ReleaseReason) -> None:
        seq = self._pick(pick)
        if seq is None:
            return
        if self.pool._in_step:  # a running step may still read this sequence's blocks
            table = self.pool.block_table(seq).tolist()
            self.readers.append((self.store.read(seq), [(b, int(self.pool.store.version[b])) for b in table]))
        # every block only this sequence holds comes back: committed, reserved (an open reservation, even
        # when preempted) and kept
        held = [*self.pool.block_table(seq).tolist(), *self.pool.kept_blocks(seq)]
        own = [b for b in held if self.pool.store.ref[b] == 1]
        self.store.release(seq, reason)
        assert all(self.pool.store.ref[b] == 0 for b in own)
        with pytest.raises(ValueError, match="double free"):
            self.pool.release(seq, reason)

    @rule()
    def step_boundary(self) -> None:
        """Open a step (releases are deferred) or close it (deferred blocks become free)."""
        if self.pool._in_step:
            self.pool.end_step()
            self.readers.clear()
        else:
            self.pool.begin_step()

    def _snapshot(self) -> tuple:
        pool = self.pool
        tables = {s: (pool.block_table(s).tolist(), pool.num_tokens(s), pool.kept_blocks(s)) for s in self.store.tokens}
        return pool.usage(), pool.speculative_usage(), pool.free_queue_order(), tables

    @invariant()
    def pool_is_consistent(self) -> None:
        if hasattr(self, "pool"):
            self.pool.check_invariants()
            self.store.check()
            for content, refs in self.readers:  # deferred free: nothing a step may read was reused
                version = self.pool.store.version
                assert all(self.pool.is_current(self.pool.block_ref(b)) and v == version[b] for b, v in refs)
                B = self.pool.block_size
                assert [int(self.store.slots[refs[p // B][0], p % B]) for p in range(len(content))] == content

    def teardown(self) -> None:
        if not hasattr(self, "pool"):
            return
        if self.pool._in_step:
            self.pool.end_step()
        for seq in list(self.store.tokens):
            self.store.release(seq, ReleaseReason.CANCELLED)
        self.pool.check_invariants()
        # after every request has ended the pool is whole again
        usage = self.pool.usage()
        assert usage.free_blocks == self.pool.num_blocks and usage.used_blocks == 0


PoolMachine.TestCase.settings = settings(
    max_examples=2000, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestPoolMachine = PoolMachine.TestCase


# ---- differential: prefix caching changes where tokens live, never what a sequence reads ------------
@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["alloc", "append", "fork", "release"]), st.integers(0, len(PROMPTS) - 1)),
        max_size=30,
    )
)
def test_prefix_caching_on_and_off_give_identical_content(ops: list[tuple[str, int]]) -> None:
    stores = [ShadowStore(BlockPool(64, 2, enable_prefix_caching=on)) for on in (True, False)]
    for next_id, (op, arg) in enumerate(ops):
        live = sorted(stores[0].tokens)
        for store in stores:
            if op == "alloc":
                store.allocate(next_id, PROMPTS[arg])
            elif op == "append" and live:
                store.append(live[arg % len(live)], [arg % 4, 3])
            elif op == "fork" and live:
                store.fork(live[arg % len(live)], next_id)
            elif op == "release" and live:
                store.release(live[arg % len(live)])
            store.pool.check_invariants()
            store.check()
        assert {s: stores[0].read(s) for s in stores[0].tokens} == {s: stores[1].read(s) for s in stores[1].tokens}
    assert stores[1].pool.stats().hit_tokens == 0


# ---- planted bugs: the content check catches what a buggy pool does ------------------------------------
class ForgetsForkReferences(BlockPool):
    """Planted bug: fork does not count the child's references, so the parent's release frees blocks early."""

    def fork(self, parent_id: object, child_id: object) -> None:
        super().fork(parent_id, child_id)
        self.store.ref[self.block_table(child_id)] -= 1


class SkipsCopyOnWrite(BlockPool):
    """Planted bug: writes into a shared, partially filled block without copying it."""

    def _needs_copy(self, block_id: int) -> bool:
        return False


def test_content_check_catches_an_early_free() -> None:
    store = ShadowStore(ForgetsForkReferences(4, 4))
    store.allocate("a", [1, 2, 3, 4, 5, 6])
    store.fork("a", "b")
    store.release("a")  # the buggy pool frees blocks "b" still holds
    store.check()  # nothing overwritten yet: counts alone look plausible to a reader
    # ... and hands them out again: the free queue holds 2, 3 (never used), then the table freed tail first, 1, 0;
    # "c"'s 16 tokens take all four
    store.allocate("c", [9] * 16)
    with pytest.raises(AssertionError, match="sequence 'b' reads back wrong content"):
        store.check()


def test_content_check_catches_a_skipped_copy_on_write() -> None:
    store = ShadowStore(SkipsCopyOnWrite(4, 4))
    store.allocate("a", [1, 2, 3, 4, 5, 6])
    store.fork("a", "b")
    store.append("b", [7])  # should copy block 1 first; the bug writes slot 2 of the shared block
    store.append("a", [8])  # ... where "a" now writes its own token 7
    with pytest.raises(AssertionError, match="reads back wrong content"):
        store.check()


def test_the_correct_pool_passes_the_same_probes() -> None:
    store = ShadowStore(BlockPool(4, 4))
    store.allocate("a", [1, 2, 3, 4, 5, 6])
    store.fork("a", "b")
    store.append("b", [7])
    store.append("a", [8])
    store.release("a")
    store.allocate("c", [9, 9, 9, 9, 9, 9])
    store.check()
    store.pool.check_invariants()
