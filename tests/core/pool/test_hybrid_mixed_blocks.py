"""A hybrid pool whose groups' blocks hold different tokens (vLLM's unified page sizes; core/pool/group_blocks.py).

Real models: Gemma-4-31B and MiMo-V2-Flash page their full layers at 32 tokens and their sliding ones at 16 (a
page of either type is the same bytes), Gemma-4-E4B the other way round. One physical block is one page in every
group; a group's table counts its own blocks; prefix keys come per hash block b (the gcd); a hit is a multiple of
L = lcm of the blocks (vLLM's HybridKVCacheCoordinator).

The random machine plays the GPU as test_hybrid_pool_stateful does: each group writes position p into its table's
block p // B_g, and every position a group must still hold reads back; every block the prefix cache can hit holds
exactly its tokens. check_invariants() after every operation.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from real_configs import write_config

from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.kv_groups import kv_layout
from kvcalc.core.pool.block_pool import NULL_BLOCK, PoolExhaustedError, ReleaseReason
from kvcalc.core.pool.groups import PoolGroup, peak_blocks, pool_groups
from kvcalc.core.pool.hybrid import HybridPool

b = 4  # the hash block: keys come one per 4 tokens
FULL_COARSE = (PoolGroup("full", block_tokens=8), PoolGroup("sliding", 6, block_tokens=4),
               PoolGroup("sliding", 6, block_tokens=4))  # Gemma-4-31B's shape
SLIDING_COARSE = (PoolGroup("sliding", 10, block_tokens=8), PoolGroup("full", block_tokens=4))  # Gemma-4-E4B's
CHUNKED_COARSE = (PoolGroup("full", block_tokens=4), PoolGroup("chunked", 8, block_tokens=8))


def keys_of(tokens: list[int], first: int, last: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i * b : (i + 1) * b]) for i in range(first, last)]


def needed_from(group: PoolGroup, committed: int) -> int:
    """The first position a group's layers read for the next token."""
    if group.kind == "sliding":
        return max(0, committed - group.window + 1)  # type: ignore[operator]
    if group.kind == "chunked":
        return committed // group.window * group.window  # type: ignore[operator]
    return 0


class MixedShadow:
    """The GPU: slot (block, p mod B_g) of a group holds token p; what each group must hold reads back."""

    def __init__(self, pool: HybridPool) -> None:
        self.pool = pool
        self.sizes = [g.tokens_per_block(b) for g in pool.groups]
        self.slots = np.full((pool.num_blocks, max(self.sizes)), -1, dtype=np.int64)
        self.tokens: dict[int, list[int]] = {}
        self.drafts: dict[int, list[int]] = {}
        self.hashed: dict[tuple[int, int], list[int]] = {}

    def write(self, seq: int, start: int) -> None:
        toks = self.tokens[seq] + self.drafts.get(seq, [])
        for size, table in zip(self.sizes, self.pool.block_tables(seq), strict=True):
            for pos in range(start, len(toks)):
                block = int(table[pos // size])
                assert block != NULL_BLOCK, f"position {pos} being written has no block"
                self.slots[block, pos % size] = toks[pos]

    def copy(self, copies: list[tuple[int, int]]) -> None:
        for src, dst in copies:
            self.slots[dst] = self.slots[src]

    def record_hashed(self) -> None:
        store = self.pool.store
        for seq, toks in self.tokens.items():
            for size, table in zip(self.sizes, self.pool.block_tables(seq), strict=True):
                for i, block in enumerate(table.tolist()):
                    if block != NULL_BLOCK and store.block_slot[block] >= 0:
                        self.hashed.setdefault((block, int(store.version[block])), toks[i * size : (i + 1) * size])

    def check(self) -> None:
        pool = self.pool
        for seq, committed in self.tokens.items():
            toks = committed + self.drafts.get(seq, [])
            for group, size, table in zip(pool.groups, self.sizes, pool.block_tables(seq), strict=True):
                assert len(table) == -(-len(toks) // size), "a table's length is not its own blocks"
                for pos in range(needed_from(group, len(committed)), len(toks)):
                    block = int(table[pos // size])
                    assert block != NULL_BLOCK, f"{group.name}: position {pos} of sequence {seq} was freed"
                    assert self.slots[block, pos % size] == toks[pos], f"{group.name}: {seq} reads a wrong token"
        store = pool.store
        for (block, version), history in self.hashed.items():
            if store.block_slot[block] >= 0 and int(store.version[block]) == version:
                assert self.slots[block, : len(history)].tolist() == history, f"hashed block {block} holds other tokens"


class MixedMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.next_id = 0

    @initialize(groups=st.sampled_from([FULL_COARSE, SLIDING_COARSE, CHUNKED_COARSE]), blocks=st.integers(20, 60),
                policy=st.sampled_from(["keep", "free"]))
    def setup(self, groups: tuple[PoolGroup, ...], blocks: int, policy: str) -> None:
        self.pool = HybridPool(blocks, b, groups, rollback_policy=policy)
        self.shadow = MixedShadow(self.pool)
        self.align = 8  # lcm(8, 4)

    def _live(self) -> list[int]:
        return sorted(self.shadow.tokens)

    @rule(length=st.integers(1, 30), alphabet=st.integers(1, 2), data=st.data())
    def allocate(self, length: int, alphabet: int, data) -> None:
        tokens = data.draw(st.lists(st.integers(0, alphabet - 1), min_size=length, max_size=length))
        keys = keys_of(tokens, 0, length // b)
        if not self.pool.can_allocate(length, keys):
            with pytest.raises(PoolExhaustedError):
                self.pool.allocate(-1, length, keys)
            return
        expected, own = self.pool.hit_tokens(length, keys), self.pool.group_hit_tokens(length, keys)
        seq, self.next_id = self.next_id, self.next_id + 1
        hit = self.pool.allocate(seq, length, keys)
        # the hit is what the look-up said, a multiple of the lcm of the blocks (8), within every group's own
        assert hit == expected and hit % self.align == 0 and hit <= min(own) and hit <= length
        self.shadow.tokens[seq] = list(tokens)
        self.shadow.write(seq, hit)
        self.shadow.record_hashed()

    @precondition(lambda self: bool(self.shadow.tokens))
    @rule(data=st.data(), count=st.integers(1, 9))
    def append(self, data, count: int) -> None:
        seq = data.draw(st.sampled_from(self._live()))
        if seq in self.shadow.drafts:
            return
        if not self.pool.can_append(seq, count):
            with pytest.raises(PoolExhaustedError):
                self.pool.append(seq, count)
            return
        old = self.shadow.tokens[seq]
        toks = old + data.draw(st.lists(st.integers(0, 1), min_size=count, max_size=count))
        self.shadow.copy(self.pool.append(seq, count, keys_of(toks, len(old) // b, len(toks) // b)))
        self.shadow.tokens[seq] = toks
        self.shadow.write(seq, len(old))
        self.shadow.record_hashed()

    @precondition(lambda self: bool(self.shadow.tokens))
    @rule(data=st.data())
    def fork(self, data) -> None:
        parent = data.draw(st.sampled_from(self._live()))
        if parent in self.shadow.drafts:
            return
        child, self.next_id = self.next_id, self.next_id + 1
        self.pool.fork(parent, child)
        self.shadow.tokens[child] = list(self.shadow.tokens[parent])

    @precondition(lambda self: bool(self.shadow.tokens))
    @rule(data=st.data(), reason=st.sampled_from(list(ReleaseReason)))
    def release(self, data, reason: ReleaseReason) -> None:
        seq = data.draw(st.sampled_from(self._live()))
        self.pool.release(seq, reason)
        self.shadow.tokens.pop(seq)
        self.shadow.drafts.pop(seq, None)

    @precondition(lambda self: bool(self.shadow.tokens))
    @rule(data=st.data(), k=st.integers(1, 6))
    def speculate(self, data, k: int) -> None:
        seq = data.draw(st.sampled_from(self._live()))
        shadow = self.shadow
        if seq in shadow.drafts:
            accepted = data.draw(st.integers(0, len(shadow.drafts[seq])))
            old, drafts = shadow.tokens[seq], shadow.drafts.pop(seq)
            toks = old + drafts[:accepted]
            assert self.pool.commit(seq, accepted, keys_of(toks, len(old) // b, len(toks) // b)) == (
                len(drafts) - accepted)
            shadow.tokens[seq] = toks
            shadow.record_hashed()
            return
        if self.pool.can_reserve(seq, k):
            shadow.copy(self.pool.reserve(seq, k))
            shadow.drafts[seq] = data.draw(st.lists(st.integers(0, 1), min_size=k, max_size=k))
            shadow.write(seq, len(shadow.tokens[seq]))

    @invariant()
    def holds(self) -> None:
        if hasattr(self, "pool"):
            self.pool.check_invariants()
            self.shadow.check()
            for seq in self._live():
                assert self.pool.num_tokens(seq) == len(self.shadow.tokens[seq]) + len(self.shadow.drafts.get(seq, []))

    def teardown(self) -> None:
        if hasattr(self, "pool"):
            for seq in self._live():
                self.pool.release(seq)
            self.pool.check_invariants()
            assert self.pool.num_used == 0 and self.pool.num_free_blocks == self.pool.num_blocks


TestMixedBlocks = MixedMachine.TestCase
TestMixedBlocks.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])


# 40 GiB of KV, bf16, block 16, vLLM layout; a sequence of n = 32,769 tokens (32,768 written) holds per table:
# full ceil(n / B_g), sliding ceil(n / B_g) − floor((32,768 − W + 1) / B_g), each at its own B_g.
CONCURRENCY = [
    # Gemma-4-31B: an id 2,621,440 B -> 40 GiB / 2.5 MiB = 16,384 ids. full (32): ceil(32,769 / 32) = 1,025;
    # sliding (16, W 1,024): 2,049 − floor(31,745 / 16) = 2,049 − 1,984 = 65, 5 tables: 325 -> 1,350 -> 12
    ("GEMMA4_31B", 16_384, 1_350, 12),
    # Gemma-4-E4B: an id 262,144 B -> 163,840 ids. full (16): 2,049; sliding (32, W 512): ceil(32,769 / 32) = 1,025
    # − floor(32,257 / 32) = 1,008 -> 17, 5 tables: 85 -> 2,134 -> floor(163,840 / 2,134) = 76
    ("GEMMA4_E4B", 163_840, 2_134, 76),
    # MiMo-V2-Flash: an id 737,280 B -> floor(42,949,672,960 / 737,280) = 58,254 ids. full (32): 1,025; sliding
    # (16, W 128): 2,049 − floor(32,641 / 16) = 2,049 − 2,040 = 9, 5 tables: 45 -> 1,070 -> floor(58,254 / 1,070) = 54
    ("MIMO_V2_FLASH", 58_254, 1_070, 54),
]


@pytest.mark.parametrize(("config", "ids", "held", "concurrency"), CONCURRENCY)
def test_concurrency_of_32k_contexts_in_40_gib(tmp_path, config, ids, held, concurrency):
    from kvcalc.core.model.kv_groups import plan_blocks

    layout = kv_layout(load_config(write_config(tmp_path, config)), 16, 16)
    assert plan_blocks(layout, 40 * 2**30) == ids
    groups = pool_groups(layout)
    assert groups is not None
    pool = HybridPool(ids, layout.block_size, groups, state_mode="none")
    count = 0
    while pool.can_allocate(32_769, computed_tokens=32_768):
        pool.allocate(count, 32_769, computed_tokens=32_768)
        count += 1
        assert pool.num_used == count * held
    assert count == concurrency == ids // held
    pool.check_invariants()
    # the admission bound the scheduler uses is the same closed form at the same block sizes: a sequence decoding
    # its token 32,769 holds at most what peak_blocks says with one-token chunks
    assert peak_blocks(groups, 32_769, 16, "none", 1) >= held


def test_a_hit_is_aligned_to_the_lcm_of_the_blocks_by_hand():
    # Gemma-4-31B's shape at b 16: full 32 tokens a block, sliding (W 64) 16. A 100-token prompt: full 4 blocks
    # (32 · 3 = 96, then 4 tokens), sliding 7 (16 · 6 = 96, then 4). Released, its blocks stay cached. The same 100
    # tokens again: the full group's chain hits 3 blocks = 96 tokens, a multiple of lcm(32, 16) = 32; the sliding
    # group needs its blocks from (96 − 63) // 16 = 2 to 5, cached -> hit 96. A prompt sharing only 90 tokens
    # (its hash blocks 0..4 = 80 tokens equal): full hits 2 blocks = 64 -> 64, sliding from (64 − 63) // 16 = 0.
    groups = (PoolGroup("full", block_tokens=32), PoolGroup("sliding", 64, block_tokens=16))
    pool = HybridPool(64, 16, groups)
    keys = np.arange(6, dtype=np.int64)  # one key per 16 tokens: the 6 whole hash blocks of 100 tokens
    pool.allocate("a", 100, keys)
    assert [len(t) for t in pool.block_tables("a")] == [4, 7] and pool.num_used == 11
    pool.release("a")
    pool.check_invariants()
    assert pool.hit_tokens(100, keys) == 96 and pool.group_hit_tokens(100, keys) == [96, 96]
    other = np.array([0, 1, 2, 3, 4, 99], dtype=np.int64)
    assert pool.hit_tokens(100, other) == 64 and pool.group_hit_tokens(100, other) == [64, 64]
    assert pool.allocate("b", 100, keys) == 96
    # "b" holds the full group's 3 cached blocks + 1 fresh, the sliding group's blocks 2..5 cached + block 6
    # fresh (blocks 0, 1 are outside the window of the token at 96: NULL) -> 4 + 5 = 9 ids
    assert pool.num_used == 9 and pool.block_tables("b")[1][:2].tolist() == [NULL_BLOCK, NULL_BLOCK]
    assert pool.stats().hit_tokens == 96 and pool.stats().prompt_tokens == 200
    pool.check_invariants()


def test_a_coarse_block_completed_across_appends_is_keyed_by_all_its_hash_blocks():
    # full 32, sliding 16: a 20-token prompt (hash block 0 whole), then 12 tokens (hash block 1 completes, and
    # with it the full group's block 0, keyed by hash blocks 0 and 1 together), then released: a new prompt with
    # the same 2 hash blocks + 8 tokens hits 32 (the full block and the sliding blocks 0, 1: W 64 reads all)
    groups = (PoolGroup("full", block_tokens=32), PoolGroup("sliding", 64, block_tokens=16))
    pool = HybridPool(16, 16, groups)
    pool.allocate("a", 20, [("k", 0)])
    pool.append("a", 12, [("k", 1)])
    pool.check_invariants()
    pool.release("a")
    assert pool.hit_tokens(40, [("k", 0), ("k", 1)]) == 32
    assert pool.hit_tokens(40, [("k", 0), ("k", 2)]) == 0  # the second hash block differs: no whole full block


def test_mixed_block_sizes_must_be_whole_hash_blocks():
    with pytest.raises(ValueError, match="multiple of the pool's block size 16"):
        HybridPool(8, 16, (PoolGroup("full", block_tokens=24), PoolGroup("sliding", 64)))


@pytest.mark.parametrize("config", ["GEMMA4_31B", "GEMMA4_E4B"])
def test_sim_runs_a_mixed_layout_to_the_end(tmp_path, config):
    from kvcalc.core.sim.options import SimOptions
    from kvcalc.core.sim.record import COMPLETED
    from kvcalc.core.sim.run import run_policy
    from kvcalc.core.sim.setup import build

    # 12 requests of 3,000 + 40 tokens at rate inf on an H100: every request completes and the pool is whole at the
    # end (run_policy checks); the groups' blocks add up to the pool's used slots at every moment
    setup = build(SimOptions(config=write_config(tmp_path, config), gpu="H100-SXM", requests=12, rate="inf",
                             weights_bytes="60GiB", prompt_dist="uniform:low=3000,high=3000",
                             output_dist="uniform:low=40,high=40"))
    assert setup.sim.groups is not None and any(g.block_tokens == 32 for g in setup.sim.groups)
    record = run_policy(setup.workload, "paged", setup.sim, record_timeline=True)
    assert (record.status == COMPLETED).all() and record.peak_running >= 2
    # used slots (useful + tail) in slots of 16 a block: each group's block is one id of 16 slots
    used_slot_s = record.memory_slot_s[0] + record.memory_slot_s[1]
    assert float(record.group_block_s.sum()) * 16 == pytest.approx(used_slot_s, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5_000), window=st.integers(1, 3_000), coarse=st.sampled_from([1, 2, 4]))
@example(n=17, window=2, coarse=2)  # the token at 16 reads 15, 16: sliding block 0 stays, 2 held; full 1 (32)
@example(n=33, window=2, coarse=2)  # the token at 32 reads 31, 32: block 0 freed, 3 − 1 = 2 held; full 2
def test_decoding_holds_the_closed_form_at_each_groups_block(n: int, window: int, coarse: int):
    # a sequence decoding token n − 1 holds, per group at its own block B_g: full ceil(n / B_g); sliding
    # ceil(n / B_g) − floor((n − 1 − W + 1) / B_g) — the same closed form as one block size, group by group
    groups = (PoolGroup("full", block_tokens=16 * coarse), PoolGroup("sliding", window, block_tokens=16))
    pool = HybridPool(2 * (n // 16 + 2), 16, groups)
    pool.allocate("s", max(n - 1, 1))
    if n > 1:
        pool.append("s", 1)  # frees what the token at n − 1 does not read, then grows: the decode step's tables
    pool.check_invariants()
    held = pool.held_blocks("s")
    full, sliding = 16 * coarse, 16
    assert held[0] == -(-n // full)
    assert held[1] == -(-n // sliding) - max(0, n - 1 - window + 1) // sliding


def test_a_swap_moves_what_each_group_still_reads_at_its_own_block():
    # Gemma-4-E4B's shape: sliding (W 80) at 32 tokens a block, full at 16. 200 tokens written in one step: the full
    # table holds ceil(200 / 16) = 13 blocks, all read; the sliding one holds ceil(200 / 32) = 7 but the next token
    # (200) reads from (200 − 79) // 32 = 3 on: 4. A swap moves 13 + 4 = 17 pages (at one block size for all, the
    # sliding reads were ceil(200 / 16) − 121 // 16 = 6 and the swap 19 pages)
    from kvcalc.core.sim.paged_groups import GroupedPagedPolicy

    groups = (PoolGroup("sliding", 80, block_tokens=32), PoolGroup("full", block_tokens=16))
    policy = GroupedPagedPolicy(64, 16, groups, "none", 1, page_bytes=1_000)
    assert policy.admit(0, 0, 200)
    assert policy.pool.held_blocks(0) == [7, 13]
    assert policy.swap_bytes(0) == 17 * 1_000
