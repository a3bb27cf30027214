"""The hybrid pool (one store, a table per layer group) under random operations, with a shadow as the oracle.

As test_block_pool_stateful.py, the shadow plays the GPU, here for every group at once:

* attention groups (full, sliding, chunked): the token id of each position goes into the physical slot
  that the group's table names; after every operation each live sequence reads back, through each table,
  every position the group must still hold — the whole sequence (full), the last W positions (sliding),
  the current chunk (chunked). A block freed too early and reused, or a copy-on-write skipped, shows here.
* state groups: a page holds ONE value, the recurrent state after the last token written into it (a
  signature of the whole history). A sequence's running state must be the signature of its tokens (drafts
  included while reserved), and every page the prefix cache can hit (hashed) must hold the state of exactly
  its boundary — a state written over rejected drafts must never be reachable by hash (vLLM #48375).

After every operation: check_invariants() (counts, refs, each group's rule), the read-back, the hashed pages.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcalc.core.pool.block_pool import NULL_BLOCK, PoolExhaustedError, ReleaseReason
from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid import HybridPool

B = 4
GROUPS = (PoolGroup("full"), PoolGroup("sliding", 6), PoolGroup("chunked", 8), PoolGroup("state"))


def step(state: int, token: int) -> int:
    """One recurrent update: the new state from the old one and a token (an exact function of the history)."""
    return hash((state, token))


def true_state(tokens: list[int]) -> int:
    state = 0
    for t in tokens:
        state = step(state, t)
    return state


def keys_of(tokens: list[int], first: int, last: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i * B : (i + 1) * B]) for i in range(first, last)]


class HybridShadow:
    """The GPU of every group: token slots (attention) and one state value per page (see the module)."""

    def __init__(self, pool: HybridPool) -> None:
        self.pool = pool
        self.slots = np.full((pool.num_blocks, B), -1, dtype=np.int64)
        self.state: dict[int, int] = {}  # state page -> the state value written last into it
        self.running: dict[int, int] = {}  # sequence -> its running state (drafts included, never restored)
        self.tainted: set[int] = set()  # sequences whose running state went over rejected drafts
        self.hashed: dict[tuple[int, int], list[int]] = {}  # (state page, version) -> the history it stands for
        self.tokens: dict[int, list[int]] = {}
        self.drafts: dict[int, list[int]] = {}

    def _write(self, seq: int, start: int) -> None:
        toks = self.tokens[seq] + self.drafts.get(seq, [])
        for group, table in zip(self.pool.groups, self.pool.block_tables(seq), strict=True):
            if group.kind == "state":
                continue
            for pos in range(start, len(toks)):
                block = int(table[pos // B])
                assert block != NULL_BLOCK, f"{group.name}: position {pos} being written has no block"
                self.slots[block, pos % B] = toks[pos]
        # the state runs once over the new tokens; each page holds the value after its last written token
        state_tables = [t for g, t in zip(self.pool.groups, self.pool.block_tables(seq), strict=True)
                        if g.kind == "state"]
        for pos in range(start, len(toks)):
            self.running[seq] = step(self.running[seq], toks[pos])
            for table in state_tables:
                if table[pos // B] != NULL_BLOCK:  # a page the group keeps (none and align keep the last ones)
                    self.state[int(table[pos // B])] = self.running[seq]

    def copy(self, copies: list[tuple[int, int]]) -> None:
        for src, dst in copies:
            self.slots[dst] = self.slots[src]
            if src in self.state:
                self.state[dst] = self.state[src]

    def record_hashed(self) -> None:
        """The history each hashed state page of a live, untainted sequence stands for (its boundary)."""
        pool = self.pool
        for seq, toks in self.tokens.items():
            for group, table in zip(pool.groups, pool.block_tables(seq), strict=True):
                if group.kind != "state":
                    continue
                for i, block in enumerate(table.tolist()):
                    if block != NULL_BLOCK and pool.store.block_slot[block] >= 0:
                        self.hashed.setdefault((block, int(pool.store.version[block])), toks[: (i + 1) * B])

    def allocate(self, seq: int, tokens: list[int]) -> int:
        hit = self.pool.allocate(seq, len(tokens), keys_of(tokens, 0, len(tokens) // B))
        self.tokens[seq] = list(tokens)
        self.running[seq] = 0
        if hit:  # the state restored from the page saved at the hit's boundary
            table = next(t for g, t in zip(self.pool.groups, self.pool.block_tables(seq), strict=True)
                         if g.kind == "state") if any(g.kind == "state" for g in self.pool.groups) else None
            self.running[seq] = true_state(tokens[:hit]) if table is None else self.state[int(table[hit // B - 1])]
        self._write(seq, hit)
        return hit

    def append(self, seq: int, new: list[int]) -> None:
        old = self.tokens[seq]
        toks = old + new
        self.copy(self.pool.append(seq, len(new), keys_of(toks, len(old) // B, len(toks) // B)))
        self.tokens[seq] = toks
        self._write(seq, len(old))

    def fork(self, parent: int, child: int) -> None:
        self.pool.fork(parent, child)
        self.tokens[child] = list(self.tokens[parent])
        self.running[child] = self.running[parent]
        if parent in self.tainted:
            self.tainted.add(child)

    def release(self, seq: int, reason: ReleaseReason) -> None:
        self.pool.release(seq, reason)
        for table in (self.tokens, self.drafts, self.running):
            table.pop(seq, None)
        self.tainted.discard(seq)

    def reserve(self, seq: int, drafts: list[int]) -> None:
        self.copy(self.pool.reserve(seq, len(drafts)))
        self.drafts[seq] = list(drafts)
        self._write(seq, len(self.tokens[seq]))

    def commit(self, seq: int, accepted: int) -> None:
        old, drafts = self.tokens[seq], self.drafts.pop(seq)
        toks = old + drafts[:accepted]
        self.pool.commit(seq, accepted, keys_of(toks, len(old) // B, len(toks) // B))
        self.tokens[seq] = toks
        if accepted < len(drafts):  # the state went over rejected drafts and is not restored
            self.tainted.add(seq)

    def check(self) -> None:
        pool = self.pool
        for seq, committed in self.tokens.items():
            toks = committed + self.drafts.get(seq, [])
            n = len(toks)
            for group, table in zip(pool.groups, pool.block_tables(seq), strict=True):
                assert len(table) == -(-n // B)
                if group.kind == "state":
                    last = int(table[(n - 1) // B])
                    assert last != NULL_BLOCK, f"sequence {seq}: the running state page was freed"
                    if seq not in self.tainted:
                        assert self.state.get(last) == self.running[seq] == true_state(toks), (
                            f"sequence {seq}: its state page holds another history")
                    continue
                # what the group's layers read for the next token (position n); positions of a reservation
                # are all written
                low = {"full": 0, "sliding": max(0, len(committed) - group.window + 1) if group.window else 0,
                       "chunked": len(committed) // group.window * group.window if group.window else 0}[group.kind]
                for pos in range(low, n):
                    block = int(table[pos // B])
                    assert block != NULL_BLOCK, f"{group.name}: position {pos} of sequence {seq} was freed"
                    assert self.slots[block, pos % B] == toks[pos], f"{group.name}: sequence {seq} reads a wrong token"
        # every state page the prefix cache can hit holds the state of exactly its boundary (vLLM #48375)
        store = pool.store
        for (block, version), history in self.hashed.items():
            if store.block_slot[block] >= 0 and int(store.version[block]) == version:
                assert self.state[block] == true_state(history), f"hashed state page {block} holds another state"


class HybridPoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.next_id = 0

    @initialize(mode=st.sampled_from(["none", "align", "all"]), blocks=st.integers(24, 64),
                policy=st.sampled_from(["keep", "free"]))
    def setup(self, mode: str, blocks: int, policy: str) -> None:
        self.pool = HybridPool(blocks, B, GROUPS, state_mode=mode, rollback_policy=policy)
        self.shadow = HybridShadow(self.pool)

    def _live(self) -> list[int]:
        return sorted(self.shadow.tokens)

    def _record_hashed(self) -> None:
        self.shadow.record_hashed()

    @rule(length=st.integers(1, 14), alphabet=st.integers(1, 3), data=st.data())
    def allocate(self, length: int, alphabet: int, data) -> None:
        tokens = data.draw(st.lists(st.integers(0, alphabet - 1), min_size=length, max_size=length))
        if not self.pool.can_allocate(len(tokens), keys_of(tokens, 0, len(tokens) // B)):
            with pytest.raises(PoolExhaustedError):
                self.pool.allocate(-1, len(tokens), keys_of(tokens, 0, len(tokens) // B))
            return
        seq, self.next_id = self.next_id, self.next_id + 1
        hit = self.shadow.allocate(seq, tokens)
        assert hit % B == 0 and hit < max(len(tokens), 1)
        self._record_hashed()

    @precondition(lambda self: bool(self.shadow.tokens))
    @rule(data=st.data(), count=st.integers(1, 6))
    def append(self, data, count: int) -> None:
        seq = data.draw(st.sampled_from(self._live()))
        if seq in self.shadow.drafts:
            return
        new = data.draw(st.lists(st.integers(0, 2), min_size=count, max_size=count))
        if not self.pool.can_append(seq, count):
            with pytest.raises(PoolExhaustedError):
                self.pool.append(seq, count)
            return
        self.shadow.append(seq, new)
        self._record_hashed()

    @precondition(lambda self: bool(self.shadow.tokens))
    @rule(data=st.data())
    def fork(self, data) -> None:
        parent = data.draw(st.sampled_from(self._live()))
        if parent in self.shadow.drafts:
            return
        child, self.next_id = self.next_id, self.next_id + 1
        self.shadow.fork(parent, child)

    @precondition(lambda self: bool(self.shadow.tokens))
    @rule(data=st.data(), reason=st.sampled_from(list(ReleaseReason)))
    def release(self, data, reason: ReleaseReason) -> None:
        seq = data.draw(st.sampled_from(self._live()))
        self.shadow.release(seq, reason)
        with pytest.raises(ValueError, match="not live"):
            self.pool.release(seq, reason)

    @precondition(lambda self: bool(self.shadow.tokens))
    @rule(data=st.data(), k=st.integers(1, 5))
    def speculate(self, data, k: int) -> None:
        seq = data.draw(st.sampled_from(self._live()))
        if seq in self.shadow.drafts:
            accepted = data.draw(st.integers(0, len(self.shadow.drafts[seq])))
            self.shadow.commit(seq, accepted)
            self._record_hashed()
            return
        if not self.pool.can_reserve(seq, k):
            return
        self.shadow.reserve(seq, data.draw(st.lists(st.integers(0, 2), min_size=k, max_size=k)))

    @invariant()
    def holds(self) -> None:
        if hasattr(self, "pool"):
            self.pool.check_invariants()
            self.shadow.check()

    def teardown(self) -> None:
        if hasattr(self, "pool"):
            for seq in self._live():
                self.pool.release(seq)
            self.pool.check_invariants()
            assert self.pool.num_used == 0 and self.pool.num_free_blocks == self.pool.num_blocks


TestHybridPool = HybridPoolMachine.TestCase
TestHybridPool.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])


def test_sliding_group_frees_outside_the_window():
    # B 4, W 6: after 20 tokens the next token (position 20) reads 15..20: blocks 0..2 (positions 0..11) are
    # wholly outside and freed; block 3 (12..15) holds position 15 and stays
    pool = HybridPool(16, B, (PoolGroup("full"), PoolGroup("sliding", 6)))
    pool.allocate("a", 20)
    pool.append("a", 1)
    full, sliding = pool.block_tables("a")
    assert len(full) == 6 and (full >= 0).all()
    assert sliding[:3].tolist() == [NULL_BLOCK] * 3 and (sliding[3:] >= 0).all()
    assert pool.num_used == 6 + 3  # full 6 blocks, sliding blocks 3, 4, 5
    pool.check_invariants()


@given(n=st.integers(1, 200), window=st.integers(1, 40), mode=st.sampled_from(["none", "align", "all"]))
@settings(max_examples=80, deadline=None)
def test_decoding_holds_the_closed_form(n: int, window: int, mode: str):
    # a sequence decoded one token at a time from 1 token holds, in each group, PoolGroup.held_blocks(n): the
    # pool's own counts against the closed form of groups.py
    groups = (PoolGroup("full"), PoolGroup("sliding", window), PoolGroup("chunked", window), PoolGroup("state"))
    pool = HybridPool(4 * (n // B + 2) + 8, B, groups, state_mode=mode)
    pool.allocate("s", 1)
    for _ in range(n - 1):
        pool.append("s", 1)
    usage = pool.group_usage()
    assert [u.held_blocks for u in usage] == [g.held_blocks(n, B, mode) for g in groups]
    # sliding by hand: ceil(n / B) − floor(max(n − W, 0) / B); state: the running page, and while the step that
    # crossed into it runs, the page it resumed from (none: 2 when n mod B = 1); align: it and the last saved
    # one (2 once past the first block); all: ceil(n / B)
    assert usage[1].held_blocks == -(-n // B) - max(n - window, 0) // B
    assert usage[3].held_blocks == {"none": 2 if n > 1 and n % B == 1 else 1, "align": min(2, -(-n // B)),
                                    "all": -(-n // B)}[mode]
    pool.check_invariants()


@given(prompts=st.lists(st.integers(1, 40), min_size=1, max_size=6), steps=st.integers(1, 30),
       mode=st.sampled_from(["none", "align", "all"]))
@settings(max_examples=60, deadline=None)
def test_append_many_is_append_one_at_a_time(prompts: list[int], steps: int, mode: str):
    # a decode step for every sequence in one call per group (sim's path) holds, group by group, what one append
    # per sequence holds; the invariants hold after every step
    def run(many: bool) -> list[list[int]]:
        pool = HybridPool(600, B, GROUPS, state_mode=mode)
        for i, n in enumerate(prompts):
            pool.allocate(i, n)
        ids = list(range(len(prompts)))
        held = []
        for _ in range(steps):
            if many:
                pool.append_many(ids, 1)
            else:
                for i in ids:
                    pool.append(i, 1)
            pool.check_invariants()
            held.append([u.held_blocks for u in pool.group_usage()] + [pool.num_used])
        return held

    assert run(True) == run(False)


def test_a_sliding_groups_skipped_hits_are_not_evicted_by_another_group():
    # B 4, W 2: "a" (12 tokens, 3 keyed blocks) leaves 3 full + 3 sliding blocks cached. "b" (16 tokens, the same
    # first 12) hits 3 blocks in both groups; the sliding group keeps only block 2 ((12 − 2 + 1) // 4 = 2) but its
    # chain is verified through blocks 0 and 1, which must survive the full group's fresh block. In a pool of 6
    # every block is one of the cached 6: the full group's fresh block could only come from evicting them, so b
    # does not fit; in a pool of 8 it does (2 plain free blocks), with the hit of 12 tokens in both groups.
    keys = [(i,) for i in range(4)]
    for blocks, fits in ((6, False), (8, True)):
        pool = HybridPool(blocks, B, (PoolGroup("full"), PoolGroup("sliding", 2)))
        pool.allocate("a", 12, keys[:3])
        pool.release("a")
        assert pool.can_allocate(16, keys) is fits
        if fits:
            assert pool.allocate("b", 16, keys) == 12
            full, sliding = pool.block_tables("b")
            assert sliding[:2].tolist() == [NULL_BLOCK, NULL_BLOCK] and full[:3].tolist() != [NULL_BLOCK] * 3
        else:
            with pytest.raises(PoolExhaustedError):
                pool.allocate("b", 16, keys)
        pool.check_invariants()
