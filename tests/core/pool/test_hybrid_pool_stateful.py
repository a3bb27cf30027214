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
        # the state runs once over the new tokens; each page holds the value after its last written token (a page
        # an align jump resumed from is read, never written: its group's own table, without it)
        state_tables = [p.block_table(seq) for g, p in zip(self.pool.groups, self.pool.pools, strict=True)
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
        """The history each hashed block of a live, untainted sequence stands for: a state page its boundary's,
        an attention block (a chain's, or a window's or chunk's anchored to the full group) its B tokens."""
        pool = self.pool
        for seq, toks in self.tokens.items():
            for group, table in zip(pool.groups, pool.block_tables(seq), strict=True):
                for i, block in enumerate(table.tolist()):
                    if block != NULL_BLOCK and pool.store.block_slot[block] >= 0:
                        history = toks[: (i + 1) * B] if group.kind == "state" else ("kv", toks[i * B : (i + 1) * B])
                        self.hashed.setdefault((block, int(pool.store.version[block])), history)

    def allocate(self, seq: int, tokens: list[int]) -> int:
        hit = self.pool.allocate(seq, len(tokens), keys_of(tokens, 0, len(tokens) // B))
        self.tokens[seq] = list(tokens)
        self.running[seq] = 0
        if hit:  # the state restored from the page saved at the hit's boundary: its entry keeps the page's id while
            # the step runs, also where (align) the step jumps over pages and does not hold it (hybrid_batch._jump)
            table = next(p.seqs[seq].table for g, p in zip(self.pool.groups, self.pool.pools, strict=True)
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
                if isinstance(history, tuple):  # an attention block: its slots hold exactly its tokens
                    assert self.slots[block].tolist() == history[1], f"hashed block {block} holds other tokens"
                    continue
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
        # tokens computed before each sequence's last step (allocate: its hit); None once it speculated (its state
        # pages then follow the speculative rules: test_speculative)
        self.starts: dict[int, int | None] = {}

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
        keys = keys_of(tokens, 0, len(tokens) // B)
        own, expected = self.pool.group_hit_tokens(len(tokens), keys), self.pool.hit_tokens(len(tokens), keys)
        hit = self.shadow.allocate(seq, tokens)
        # the hit is what the look-up said, a whole number of blocks, never the last token, within every group's own
        assert hit == expected and hit % B == 0 and hit < max(len(tokens), 1) and hit <= min(own)
        self.starts[seq] = hit
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
            if self.starts.get(seq) is not None:  # the check freed what the next step no longer reads (as vLLM's
                self.starts[seq] = len(self.shadow.tokens[seq])  # remove_skipped_blocks, which runs even then)
            return
        if self.starts.get(seq) is not None:
            self.starts[seq] = len(self.shadow.tokens[seq])
        self.shadow.append(seq, new)
        self._record_hashed()

    @precondition(lambda self: bool(self.shadow.tokens))
    @rule(data=st.data(), count=st.integers(B + 1, 3 * B))
    def append_chunk(self, data, count: int) -> None:
        """A prefill chunk over several pages: under align a state group jumps over those it does not keep."""
        HybridPoolMachine.append(self, data, count)

    @precondition(lambda self: bool(self.shadow.tokens))
    @rule(data=st.data())
    def fork(self, data) -> None:
        parent = data.draw(st.sampled_from(self._live()))
        if parent in self.shadow.drafts:
            return
        child, self.next_id = self.next_id, self.next_id + 1
        self.shadow.fork(parent, child)
        if parent in self.starts:
            self.starts[child] = self.starts[parent]

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
        self.starts[seq] = None  # speculative slots: its state pages are speculative's (test_speculative)
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
            # what a swap would move: each table's held blocks, NULL entries not counted; over the live sequences
            # they are each group's logical-block counter (kept speculative blocks aside)
            held = [self.pool.held_blocks(seq) for seq in self._live()]
            for g, pool in enumerate(self.pool.pools):
                kept = sum(len(k) for k in pool.spec.kept.values())
                assert sum(h[g] for h in held) + kept == pool.logical_blocks
                assert all(h[g] == int((t >= 0).sum()) for h, t in
                           zip(held, (self.pool.block_tables(s)[g] for s in self._live()), strict=True))
            for seq in self._live():
                if (start := self.starts.get(seq)) is not None:
                    self._state_pages_as_vllm(seq, start, len(self.shadow.tokens[seq]))

    def _state_pages_as_vllm(self, seq: int, c: int, n: int) -> None:
        """The state group's pages after a step c -> n are vLLM's MambaManager's: none the one page (n − 1) // B;
        align the page resumed from, r = (c − 1) // B, and the step's last, l = (n − 1) // B (from c = 0, or when
        the step jumps over pages, l > r + 1, no r: the entries between are null); all every page from r to l
        (remove_skipped_blocks frees those before the last computed token's block, get_num_skipped_tokens = c − 1)."""
        r, last = (c - 1) // B, (n - 1) // B
        # align from c = 0 or over a jump: l, and where n ends mid-block past B the page of boundary n // B · B too
        # (the step is vLLM's two steps of its aligned split: the second holds that page and l); a jump to a boundary
        # holds r too (last_state_block_idx, freed at the next step's remove_skipped_blocks)
        saved = n // B - 1 if n % B and n > B else last
        jump = list(range(saved, last + 1)) if c == 0 or n % B else [r, last]
        expected = {"none": [last], "align": jump if c == 0 or last > r + 1 else sorted({r, last}),
                    "all": list(range(max(r, 0), last + 1))}[self.pool.state_mode]
        table = self.pool.block_tables(seq)[3]
        assert np.flatnonzero(table >= 0).tolist() == expected, (self.pool.state_mode, c, n, table)
        assert self.pool.state_mode != "align" or len(expected) <= 2

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
    # sliding by hand: ceil(n / B) − floor(max(n − W, 0) / B); state: none the one page, updated in place (vLLM's
    # Mamba block is max_model_len tokens then: one page a request at every step); align and all alike in decode
    # (vLLM's MambaManager: the last step, computed n − 1 -> n, first frees the pages before (n − 2) // B, the page
    # holding the state after token n − 2, get_num_skipped_tokens = computed − 1; then the step's page (n − 1) // B):
    # 2 pages on a step that crosses into a new page ((n − 1) % B == 0, n > 1), else 1
    assert usage[1].held_blocks == -(-n // B) - max(n - window, 0) // B
    crossed = n > 1 and (n - 1) % B == 0
    assert usage[3].held_blocks == {"none": 1, "align": 1 + crossed, "all": 1 + crossed}[mode]
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


def test_a_sliding_hit_needs_only_its_window_and_pins_it():
    # B 4: "a" (12 tokens, 3 keyed blocks) leaves full F0 F1 F2 and sliding S0 S1 S2 cached (6 blocks). "b" (16
    # tokens, the same first 12) hits 3 blocks. A sliding group reads, for the token at 12, positions 12 − W + 1..12:
    # W 2: from block (12 − 2 + 1) // 4 = 2, so only S2 must be cached (vLLM: ceil((W − 1) / B) = 1 block). In a pool
    #      of 6, b takes 2 fresh blocks (full 3, sliding 3) + revives F0 F1 F2 S2 = 6: it fits, the fresh ones evict
    #      S0 and S1 (2 evictions), never a pinned hit. b's blocks 3 then serve a 20-token prompt a hit of 16 although
    #      S0 and S1 are gone: the sliding group needs only block (16 − 1) // 4 = 3.
    # W 6: from block (12 − 6 + 1) // 4 = 1: S1 and S2; 2 fresh + 5 revived = 7 > 6 free blocks: no fit in 6;
    #      in a pool of 8 (2 plain + 6 cached) it fits, with the hit of 12.
    keys = [(i,) for i in range(5)]
    for window, blocks, fits in ((2, 6, True), (6, 6, False), (6, 8, True)):
        pool = HybridPool(blocks, B, (PoolGroup("full"), PoolGroup("sliding", window)))
        pool.allocate("a", 12, keys[:3])
        full_a = pool.block_tables("a")[0][:3].tolist()
        pool.release("a")
        assert pool.can_allocate(16, keys[:4]) is fits
        if not fits:
            with pytest.raises(PoolExhaustedError):
                pool.allocate("b", 16, keys[:4])
            pool.check_invariants()
            continue
        assert pool.allocate("b", 16, keys[:4]) == 12
        full, sliding = pool.block_tables("b")
        first = (12 - window + 1) // B
        assert full[:3].tolist() == full_a and sliding[:first].tolist() == [NULL_BLOCK] * first
        assert pool.stats().evictions == (2 if blocks == 6 else 0)
        pool.check_invariants()
        if window == 2:
            pool.release("b")
            assert pool.hit_tokens(20, keys[:5]) == 16
            assert pool.group_hit_tokens(20, keys[:5]) == [16, 16]


def test_align_hits_only_where_a_state_was_saved():
    # B 4, full + state (mode align). "a": 10 tokens, keys for its 2 full blocks, prefilled as vLLM's aligned split
    # cuts it: 0 -> 8 (its last page only, (8 − 1) // 4 = 1: the state at boundary 8; entry 0 null), then 8 -> 10
    # (resumes from page 1, its last page (10 − 1) // 4 = 2 holds the running state after token 9). Page 0
    # (boundary 4) is never saved.
    keys = [(i,) for i in range(5)]
    pool = HybridPool(32, B, (PoolGroup("full"), PoolGroup("state")), state_mode="align")
    pool.allocate("a", 8, keys[:2])
    assert pool.block_tables("a")[1][0] == NULL_BLOCK and pool.held_blocks("a") == [2, 1]
    pool.append("a", 2)
    state = pool.block_tables("a")[1]
    assert state[0] == NULL_BLOCK and pool.store.block_slot[state[1]] >= 0 and pool.store.block_slot[state[2]] < 0
    # a prompt of 14 tokens with a's first 8: the full chain serves 2 blocks, the page saved at 8 serves them: 8
    assert pool.hit_tokens(14, [*keys[:2], (9,)]) == 8
    # a's first 4 tokens then others: the full group serves 1 block, no state at boundary 4: no hit (as vLLM)
    assert pool.hit_tokens(10, [*keys[:1], (9,)]) == 0
    assert pool.group_hit_tokens(10, [*keys[:1], (9,)]) == [4, 0]
    # decoding one token at a time saves the state at every boundary it reaches: 12 (page 2) and 16 (page 3)
    for n in range(11, 18):
        pool.append("a", 1, keys[n // B - 1 : n // B] if n % B == 0 else None)
        pool.check_invariants()
    assert pool.hit_tokens(17, keys[:4]) == 16 and pool.hit_tokens(14, keys[:3]) == 12
    # page 1 (boundary 8) was freed when decoding passed 12 (align keeps the last two pages) but stays cached
    assert pool.hit_tokens(9, keys[:2]) == 8
    pool.release("a")
    assert pool.allocate("b", 17, keys[:4]) == 16
    assert pool.block_tables("b")[1].tolist()[:3] == [NULL_BLOCK] * 3  # resumes from page 3 only
    pool.check_invariants()
    # mode none saves no state: no hit ever; mode all: one at every boundary, the chain serves every block
    for mode, hit in (("none", 0), ("all", 4)):
        other = HybridPool(32, B, (PoolGroup("full"), PoolGroup("state")), state_mode=mode)
        other.allocate("a", 10, keys[:2])
        assert other.hit_tokens(10, [*keys[:1], (9,)]) == hit


def test_mode_all_hits_at_every_block_boundary_inside_a_step():
    # B 4, full + state. "a": 40 tokens in ONE step (keys for its 10 blocks), then released. vLLM's mode all keeps
    # a page per block, each the state at its boundary (the kernel writes one at every chunk boundary, and the
    # block is a multiple of the chunk): a prompt sharing a's first 28 tokens hits 7 blocks = 28. Under align the
    # same step saved only the page at 40 (where the step ended): that prompt hits nothing.
    keys = np.arange(10, dtype=np.int64)
    shared = np.array([0, 1, 2, 3, 4, 5, 6, 70, 80, 90, 100], dtype=np.int64)
    hits = {}
    for mode in ("align", "all"):
        pool = HybridPool(64, B, (PoolGroup("full"), PoolGroup("state")), state_mode=mode)
        pool.allocate("a", 40, keys)
        # all: 10 state pages held (one per block); align: pages 40 // 4 − 1 = 9 on (the one saved and the next)
        assert pool.held_blocks("a") == ([10, 10] if mode == "all" else [10, 1])
        pool.release("a")
        pool.check_invariants()
        hits[mode] = pool.hit_tokens(44, shared)
        assert pool.hit_tokens(44, np.arange(11)) == 40  # the whole prompt: both modes saved boundary 40
        assert pool.allocate("b", 44, shared) == hits[mode]
        pool.check_invariants()
    assert hits == {"align": 0, "all": 28}


def test_a_stale_anchored_block_gives_way_to_the_same_prefix_registered_again():
    # B 4, full + sliding W 2, 6 blocks. "a" (8 tokens, 2 keyed blocks: F0 F1 = ids 0 1, S0 S1 = 2 3) leaves them
    # cached, freed in the order F1 F0 S1 S0 (the full group releases first) after the never-used 4, 5. "x" (8
    # tokens, no keys) takes 4, 5 and evicts F1, F0: S0 and S1 stay cached but their anchors were handed out, so
    # they can never be verified again. x frees 5, 4, 0, 1 behind them, so "b" (a's 8 tokens again) pops S1, S0
    # first (vLLM's one free queue: the oldest freed), evicting the stale entries, for its full blocks, and 5, 4
    # for its sliding ones; it computes them afresh, so a later prompt with those 8 tokens hits 8 in both groups
    # (W 2: block 1 only).
    keys = [(1,), (2,)]
    pool = HybridPool(6, B, (PoolGroup("full"), PoolGroup("sliding", 2)))
    pool.allocate("a", 8, keys)
    stale = pool.block_tables("a")[1].tolist()
    pool.release("a")
    pool.allocate("x", 8)  # 2 blocks in each group: the never-used 4, 5, then F1 and F0 from the queue's head
    assert pool.stats().evictions == 2 and pool.num_free_blocks == 2
    pool.release("x")
    assert pool.hit_tokens(9, keys) == 0 and pool.group_hit_tokens(9, keys) == [0, 0]
    pool.allocate("b", 8, keys)
    pool.check_invariants()
    assert pool.stats().evictions == 2 + 2 and [t.tolist() for t in pool.block_tables("b")] == [stale[::-1], [5, 4]]
    pool.release("b")
    assert pool.hit_tokens(9, keys) == 8 and pool.group_hit_tokens(9, keys) == [8, 8]
    pool.check_invariants()


def test_swap_bytes_count_every_group_state_included():
    # B 4, full + sliding W 6 + state (align), a sequence decoded to 21 tokens (last written at 20): full
    # ceil(21 / 4) = 6 blocks; sliding from (20 − 6 + 1) // 4 = 3: blocks 3..5 = 3; state from the page resumed
    # from, (20 − 1) // 4 = 4, to the step's (21 − 1) // 4 = 5: pages 4 and 5 = 2. With 1,000-byte block ids a
    # swap moves 6,000 + 3,000 + 2,000 B each way — a per-token count (21 tokens of every layer) would leave the
    # state out and count the sliding layers' dropped tokens.
    pool = HybridPool(32, B, (PoolGroup("full"), PoolGroup("sliding", 6), PoolGroup("state")), state_mode="align")
    pool.allocate("s", 20)
    pool.append("s", 1)
    assert pool.held_blocks("s") == [6, 3, 2] == [u.held_blocks for u in pool.group_usage()]
    assert pool.swap_bytes("s", 1_000) == [6_000, 3_000, 2_000]
    with pytest.raises(ValueError, match="not live"):
        pool.held_blocks("t")


def test_blocks_after_recomputed_duplicates_chain_to_their_content():
    # B 4, full + state (align). "a" (16 tokens, keys k0..k3) leaves F0..F3 cached and a state at 16 (page 3).
    # "b" (21 tokens, keys k0 k1 k2 x y, prefilled 0 -> 20 -> 21 as vLLM's aligned split): the full group serves 3
    # blocks, but no state was saved at 12, 8 or 4, so b's hit is 0: it recomputes positions 0..11 into duplicates
    # of F0..F2 (cached behind them, as vLLM caches every full block it computes) and registers its block 3 (x) and
    # 4 (y), and its state at 20 (page 4, the first step's last page). Block 3 comes after F2's content (whichever
    # block holds it), so "c" (25 tokens, b's 5 keys) verifies it: c's chain is F0 F1 F2 (a's, the entries' blocks)
    # then b's 3, 4: 5 blocks, and b's state at 20 serves them: a hit of 20.
    k = [(i,) for i in range(4)]
    pool = HybridPool(64, B, (PoolGroup("full"), PoolGroup("state")), state_mode="align")
    pool.allocate("a", 16, k)
    cached = pool.block_tables("a")[0].tolist()
    pool.release("a")
    b_keys = [*k[:3], ("x",), ("y",)]
    assert pool.group_hit_tokens(21, b_keys) == [12, 0] and pool.allocate("b", 20, b_keys) == 0
    pool.append("b", 1)
    full_b = pool.block_tables("b")[0]
    store = pool.store
    assert np.array_equal(store.block_slot[full_b[:3]], store.block_slot[cached[:3]])  # duplicates: the same entries
    assert np.array_equal(store.index.head_of(full_b[:3]), cached[:3])  # which hold a's blocks, the earlier copies
    assert store.parent_klass[full_b[3]] == store.klass[cached[2]]
    pool.release("b")
    assert pool.allocate("c", 25, [*b_keys]) == 20
    assert pool.block_tables("c")[0][:3].tolist() == cached[:3]
    pool.check_invariants()


# weighted tables (core/pool/weighted.py): each group one table whose blocks cost `weight` units of the pool; the
# same machine and shadow, the pool counted in units (7 units a state page: a state evicted frees all 7 at once)
WEIGHTED = (PoolGroup("full", weight=2), PoolGroup("sliding", 6, weight=3), PoolGroup("chunked", 8),
            PoolGroup("state", weight=7))


class WeightedPoolMachine(HybridPoolMachine):
    @initialize(mode=st.sampled_from(["none", "align", "all"]), blocks=st.integers(40, 160),
                policy=st.sampled_from(["keep", "free"]))
    def setup(self, mode: str, blocks: int, policy: str) -> None:
        self.pool = HybridPool(blocks, B, WEIGHTED, state_mode=mode, rollback_policy=policy)
        self.shadow = HybridShadow(self.pool)
        self.shadow.slots = np.full((self.pool.store.num_blocks, B), -1, dtype=np.int64)  # ids, not units
        self.starts = {}

    @precondition(lambda self: bool(self.shadow.tokens))
    @rule(data=st.data(), count=st.integers(B + 1, 3 * B))
    def append_chunk(self, data, count: int) -> None:
        """A prefill chunk over several pages: a state group jumps over those it does not keep (state_jump)."""
        HybridPoolMachine.append(self, data, count)

    @invariant()
    def units_add_up(self) -> None:
        if hasattr(self, "pool"):  # used + free + pending units = the pool's units, no more handed out
            store = self.pool.store
            assert store.num_used + len(store.queue) + store.num_pending_blocks == self.pool.num_blocks
            assert self.pool.num_blocks == store.num_units and store.queue.plain_units >= 0


TestWeightedPool = WeightedPoolMachine.TestCase
TestWeightedPool.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
