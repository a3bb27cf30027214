"""Exact small scenarios for the block pool: ids, ref counts, free-queue order and versions per step."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hash_index_batches import batch, check_batch_insert, spread
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool import prefix_lookup
from kvcalc.core.pool import store as store_module
from kvcalc.core.pool.block_pool import BlockPool, PoolExhaustedError, PoolStats, ReleaseReason
from kvcalc.core.pool.free_queue import FREE_CACHED, FreeBlockQueue
from kvcalc.core.pool.hash_index import HashIndex
from kvcalc.core.pool.prefix_cache import chain_hashes, chain_hashes_batch

_MASK64 = 2**64 - 1
_CHAIN_P = 0x9E3779B97F4A7C15  # the recurrence's multiplier (prefix_cache)


def splitmix64(value: int) -> int:
    """The splitmix64 finaliser on one Python int (an int64 key is taken modulo 2^64, as numpy's cast does)."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def chain_hashes_reference(parent_hash: int, keys: list[int]) -> list[int]:
    """h(i) = h(i-1)·P + mix(keys[i]) mod 2^64 one block at a time with Python ints, no numpy."""
    out, h = [], parent_hash
    for key in keys:
        h = (h * _CHAIN_P + splitmix64(key & _MASK64)) & _MASK64
        out.append(h)
    return out

def refs(pool: BlockPool, blocks: list[int]) -> list[int]:
    return [int(pool.store.ref[b]) for b in blocks]


def versions(pool: BlockPool, blocks: list[int]) -> list[int]:
    return [int(pool.store.version[b]) for b in blocks]


def test_fork_cow_release_revive_evict_step_by_step() -> None:
    pool = BlockPool(num_blocks=6, block_size=4)
    assert pool.free_queue_order() == [0, 1, 2, 3, 4, 5]

    # "a": 6 tokens -> ceil(6/4) = 2 blocks, the first two free ones; block 0 is full and keyed
    assert pool.allocate("a", 6, [(1, 2, 3, 4)]) == 0
    assert pool.block_table("a").tolist() == [0, 1]
    assert refs(pool, [0, 1]) == [1, 1] and versions(pool, [0, 1]) == [1, 1]
    assert pool.free_queue_order() == [2, 3, 4, 5]
    pool.check_invariants()

    # fork: "b" shares both blocks, nothing is copied yet
    pool.fork("a", "b")
    assert pool.block_table("b").tolist() == [0, 1] and refs(pool, [0, 1]) == [2, 2]

    # "b" writes token 7 into block 1 (6 % 4 = 2 slots used, ref 2) -> copy-on-write into block 2
    assert pool.append("b", 1) == [(1, 2)]
    assert pool.block_table("b").tolist() == [0, 2]
    assert refs(pool, [0, 1, 2]) == [2, 1, 1] and int(pool.store.version[2]) == 1
    assert pool.free_queue_order() == [3, 4, 5]

    # "a" now owns block 1 alone: 2 tokens fill it in place (6 + 2 = 8), no copy; block 1 becomes keyed
    assert pool.append("a", 2, [(5, 6, 7, 8)]) == []
    # one more token needs a third block: the next free one, 3
    assert pool.append("a", 1) == []
    assert pool.block_table("a").tolist() == [0, 1, 3]
    usage = pool.usage()
    # used blocks 0,1,2,3; logical 3 (a) + 2 (b) = 5; written slots 4 + 4 + 3 + 1 = 12 of 4·4 = 16
    assert (usage.used_blocks, usage.logical_blocks, usage.useful_tokens) == (4, 5, 12)
    assert usage.tail_fragmentation_slots == 16 - 12 and usage.shared_saved_blocks == 5 - 4
    assert usage.block_table_bytes == 5 * 4 and usage.dense_block_table_bytes == 2 * 3 * 4
    pool.check_invariants()

    # release "a": its table [0, 1, 3] reversed to the free queue's tail (vLLM's one FreeKVCacheBlockQueue):
    # 3: 1->0 (unkeyed: hash-less), 1: 1->0 (keyed: a cache entry), 0: 2->1 (still b's). Queue: 4, 5 (never used),
    # then 3, 1 in free order, hashed or not
    pool.release("a")
    assert refs(pool, [0, 1, 3]) == [1, 0, 0]
    assert pool.free_queue_order() == [4, 5, 3, 1]
    # release "b": [0, 2] reversed: 2 -> 0 (plain), then 0 -> 0 (keyed), both at the tail
    pool.release("b", ReleaseReason.CANCELLED)
    assert pool.free_queue_order() == [4, 5, 3, 1, 2, 0]
    assert pool.usage().cached_free_blocks == 2
    pool.check_invariants()

    # "c" = the same 8 first tokens + 1: blocks 0 and 1 are revived (touched: out of the queue, versions unchanged:
    # same content), and one fresh block is popped from the head: 4 (never used), whose version goes 0 -> 1
    assert pool.hit_tokens(9, [(1, 2, 3, 4), (5, 6, 7, 8)]) == 8  # a look-up changes nothing
    assert pool.free_queue_order() == [4, 5, 3, 1, 2, 0]
    assert pool.allocate("c", 9, [(1, 2, 3, 4), (5, 6, 7, 8)]) == 8
    assert pool.block_table("c").tolist() == [0, 1, 4]
    assert versions(pool, [0, 1, 4]) == [1, 1, 1]
    assert pool.free_queue_order() == [5, 3, 2]
    pool.release("c", ReleaseReason.PREEMPTED)
    # tail first: 4 (plain), then 1 before 0 (the later block is evicted first)
    assert pool.free_queue_order() == [5, 3, 2, 4, 1, 0]

    # "d" needs 5 blocks: the queue's first 5, 5, 3, 2, 4 (hash-less) and 1, evicted (version 1 -> 2)
    pool.allocate("d", 20)
    assert pool.block_table("d").tolist() == [5, 3, 2, 4, 1]
    assert int(pool.store.version[1]) == 2 and not pool.store.hashed[1]
    assert pool.stats().evictions == 1 and pool.free_queue_order() == [0]
    pool.release("d", ReleaseReason.TIMED_OUT)
    # "c" again: only block 0 survives in the cache -> 4 hit tokens
    assert pool.allocate("e", 9, [(1, 2, 3, 4), (5, 6, 7, 8)]) == 4
    pool.release("e")
    pool.check_invariants()
    stats = pool.stats()
    assert (stats.cow_copies, stats.forks, stats.hit_blocks, stats.hit_tokens) == (1, 1, 3, 12)
    assert (stats.released_finished, stats.released_cancelled, stats.released_preempted) == (2, 1, 1)
    assert pool.usage().free_blocks == 6


def test_hit_never_covers_the_last_prompt_token() -> None:
    pool = BlockPool(8, 4)
    keys = [(1, 2, 3, 4), (5, 6, 7, 8)]
    pool.allocate("a", 8, keys)
    # 8 tokens = 2 full blocks, but the 8th token must be recomputed: at most (8 - 1) // 4 = 1 block hits
    assert pool.allocate("b", 8, keys) == 4
    assert pool.block_table("b")[0] == pool.block_table("a")[0]
    assert pool.block_table("b")[1] != pool.block_table("a")[1]
    pool.check_invariants()


def test_extra_keys_never_share() -> None:
    pool = BlockPool(8, 2)
    pool.allocate("base", 5, [(1, 2), (3, 4)])
    assert pool.allocate("lora", 5, [(1, 2), (3, 4)], extra_key="adapter-1") == 0
    assert pool.allocate("base2", 5, [(1, 2), (3, 4)]) == 4
    pool.check_invariants()


def test_a_hash_collision_never_serves_wrong_content(monkeypatch: pytest.MonkeyPatch) -> None:
    # every chain hashes to the same values: lookups find a candidate, verification must reject it
    monkeypatch.setattr(prefix_lookup, "chain_hashes", lambda parent, keys: np.arange(len(keys), dtype=np.uint64))
    pool = BlockPool(8, 2)
    pool.allocate("a", 5, [(1, 2), (3, 4)])
    assert pool.allocate("b", 5, [(9, 9), (3, 4)]) == 0  # block 0 differs: nothing may hit
    assert pool.allocate("c", 5, [(1, 2), (3, 4)]) == 4  # real equal content still hits
    pool.check_invariants()


def test_double_free_and_bad_calls_raise() -> None:
    pool = BlockPool(4, 4)
    pool.allocate("a", 3)
    pool.release("a")
    with pytest.raises(ValueError, match="double free"):
        pool.release("a")
    pool.allocate("b", 1)
    with pytest.raises(ValueError, match="already has a block table"):
        pool.allocate("b", 1)
    with pytest.raises(ValueError, match="full blocks"):
        pool.allocate("c", 5, [(1, 2, 3, 4), (5, 6, 7, 8)])  # 5 tokens hold 1 full block, not 2
    with pytest.raises(ValueError, match="negative"):
        pool.append("b", -1)
    with pytest.raises(ValueError, match="not live"):
        pool.fork("zzz", "y")
    with pytest.raises(ValueError, match="do not mix"):
        pool.allocate("d", 4, np.array([7]))


def test_a_pool_past_int32_is_refused_by_name_not_by_numpy() -> None:
    # block ids and fills are int32: 2^31 would have been an OverflowError deep inside the first allocation
    BlockPool(1, 2**31 - 1).allocate("a", 2**31 - 1)
    with pytest.raises(ValueError, match=r"block_size 2147483648") as caught:
        BlockPool(1, 2**31)
    assert caught.value.params == ("num_blocks", "block_size")
    with pytest.raises(ValueError, match=r"num_blocks 1\.000e\+400"):  # as typed, not 401 digits
        BlockPool(10**400, 16)


def test_a_failed_allocation_changes_nothing() -> None:
    pool = BlockPool(3, 4)
    pool.allocate("a", 8)
    before = (pool.usage(), pool.free_queue_order(), pool.store.version.copy())
    assert not pool.can_allocate(5)  # ceil(5/4) = 2 blocks > 1 free
    with pytest.raises(PoolExhaustedError):
        pool.allocate("b", 5)
    assert not pool.can_append("a", 5)  # 8 + 5 = 13 tokens -> 4 blocks, 2 more needed, 1 free
    with pytest.raises(PoolExhaustedError):
        pool.append("a", 5)
    assert (pool.usage(), pool.free_queue_order()) == before[:2] and np.array_equal(pool.store.version, before[2])
    assert not pool.has_seq("b")
    pool.check_invariants()


def test_cow_needs_a_free_block() -> None:
    pool = BlockPool(2, 4)
    pool.allocate("a", 6)  # blocks 0, 1; no block left
    pool.fork("a", "b")
    assert not pool.can_append("b", 1)  # writing the shared partial block 1 needs a copy, and a free block
    pool.release("a")
    assert pool.can_append("b", 1) and pool.append("b", 1) == []  # "b" is alone now: written in place


def test_deferred_free_keeps_blocks_until_the_step_ends() -> None:
    pool = BlockPool(2, 4)
    pool.allocate("a", 8)
    ref = pool.block_ref(0)
    with pool.step():
        pool.release("a")
        usage = pool.usage()
        assert (usage.used_blocks, usage.free_blocks, usage.pending_free_blocks) == (0, 0, 2)
        assert not pool.can_allocate(1)  # a running step may still read blocks 0 and 1
        pool.check_invariants()
    assert pool.usage().free_blocks == 2
    # the table [0, 1] went back tail first: the queue is 1, 0, so block 1 is handed out first, then 0
    assert pool.free_queue_order() == [1, 0]
    pool.allocate("b", 1)
    assert pool.block_table("b").tolist() == [1] and pool.is_current(ref)
    pool.allocate("c", 1)
    assert pool.block_table("c").tolist() == [0] and not pool.is_current(ref)
    pool.check_invariants()


def test_a_stale_reference_is_detected() -> None:
    pool = BlockPool(1, 4)
    pool.allocate("a", 2)
    ref = pool.block_ref(0)
    assert pool.is_current(ref)
    pool.release("a")
    pool.allocate("b", 2)  # block 0 handed out again for new content
    assert not pool.is_current(ref) and pool.block_ref(0).version == ref.version + 1


def test_usage_fragmentation_and_block_tables() -> None:
    pool = BlockPool(64, 16)
    for i, n in enumerate([37, 91, 128, 201, 511]):  # DESIGN.md's worked example: 968 tokens
        pool.allocate(i, n)
    usage = pool.usage()
    # pages of 16: 3 + 6 + 8 + 13 + 32 = 62 blocks = 992 slots; 992 - 968 = 24 unwritten
    assert (usage.used_blocks, usage.useful_tokens, usage.tail_fragmentation_slots) == (62, 968, 24)
    assert usage.block_table_bytes == 62 * 4 and usage.dense_block_table_bytes == 5 * 32 * 4


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**64 - 1), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40))
def test_vectorised_chain_hash_equals_the_recurrence(parent: int, keys: list[int]) -> None:
    got = chain_hashes(parent, np.array(keys, dtype=np.int64)).tolist()
    assert got == chain_hashes_reference(parent, keys)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "del"]), st.lists(st.integers(0, 40), min_size=1, max_size=12)),
                max_size=60))
def test_hash_index_matches_a_dict(ops: list[tuple[str, list[int]]]) -> None:
    """Batches of inserts (with duplicates inside a batch) and deletes, against a dict."""
    hash_of = np.zeros(1000, dtype=np.uint64)
    home_of = np.zeros(1000, dtype=np.int64)
    slot_of = np.full(1000, -1, dtype=np.int32)
    index, ref = HashIndex(24, hash_of, home_of, slot_of), {}

    def homes(ks: list[int]) -> np.ndarray:
        # key k plays the block at chain position k % 3 whose line its own hash picks: crowded lines
        return index.home_slots(np.array([spread(k) for k in ks], dtype=np.uint64), np.array(ks) % 3)

    next_block = 0
    for op, ks in ops:
        if op == "put" and len(ref) + len(ks) <= 24:
            blocks, hashes = batch(next_block, ks)
            next_block += len(ks)
            hash_of[blocks] = hashes
            home_of[blocks] = homes(ks)
            inserted = index.insert(hashes, blocks, home_of[blocks])
            # absent before: exactly one of its equal hashes in the batch goes in; present: none
            check_batch_insert(ref, ks, blocks, inserted.tolist())
        elif op == "del":
            for k in set(ks) & set(ref):
                b = ref.pop(k)
                found, slots = index.find(hash_of[[b]], home_of[[b]])
                assert int(found[0]) == b and int(slots[0]) == slot_of[b]
                index.delete(np.array([b]))
        everything = list(range(41))
        found, _ = index.find(np.array([spread(k) for k in everything], dtype=np.uint64), homes(everything))
        assert found.tolist() == [ref.get(k, -1) for k in everything]
        index.check()
    assert sorted(index.items()[1].tolist()) == sorted(ref.values())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["free", "revive", "pop"]), st.integers(0, 7)), max_size=300))
def test_free_queue_is_an_lru_like_an_ordered_dict(ops: list[tuple[str, int]]) -> None:
    """Hashed blocks only (no plain stack): order must equal an OrderedDict LRU through compactions."""
    state = np.zeros(8, dtype=np.int8)
    queue = FreeBlockQueue(8, state)
    queue.pop(8)  # everything in use
    ref: OrderedDict[int, None] = OrderedDict()
    for op, b in ops:
        if op == "free" and state[b] != FREE_CACHED:
            queue.push_cached(np.array([b]))
            ref[b] = None
        elif op == "revive" and state[b] == FREE_CACHED:
            queue.revive(np.array([b]))
            del ref[b]
        elif op == "pop" and ref:
            n = 1 + b % len(ref)
            _, evicted = queue.pop(n)
            assert evicted.tolist() == [ref.popitem(last=False)[0] for _ in range(n)]
        assert queue.order() == list(ref)
        queue.check()


def test_failed_release_and_append_change_nothing():
    """Check, then change: a bad reason or too many block keys raise before the pool is touched."""
    pool = BlockPool(num_blocks=4, block_size=4, enable_prefix_caching=True)
    pool.allocate("a", 3)  # 3 tokens in block 0
    before = (pool.usage(), pool.stats(), pool.block_table("a").tolist(), pool.num_tokens("a"))
    with pytest.raises(ValueError, match="release reason"):
        pool.release("a", "vanished")
    # appending 2 tokens completes 1 block (3 + 2 = 5 tokens: block 0 full), so 2 keys are one too many
    with pytest.raises(ValueError, match="2 block keys for 1 completed blocks"):
        pool.append("a", 2, block_keys=[(1, 2, 3, 4), (5, 6, 7, 8)])
    assert (pool.usage(), pool.stats(), pool.block_table("a").tolist(), pool.num_tokens("a")) == before
    pool.check_invariants()
    pool.release("a")
    pool.check_invariants()


# ---- the fused whole-request path (serve, batch hashing) vs allocate / append / release ---------------
def pool_state(pool: BlockPool) -> dict:
    """Everything a pool holds, for exact comparisons: per-block arrays (content fields where they mean
    something: hashed blocks), the index table itself, free-queue order, counters."""
    store = pool.store
    hashed = store.hashed
    return {
        "state": store.state.tolist(), "ref": store.ref.tolist(), "version": store.version.tolist(),
        "fill": store.fill.tolist(), "slot": store.block_slot.tolist(),
        "hash": store.block_hash[: pool.num_blocks][hashed].tolist(), "key": store.key[hashed].tolist(),
        "parent": list(zip(store.klass[hashed].tolist(), store.parent_klass[hashed].tolist(), strict=True)),
        "index": store.index.vals.tolist(), "queue": pool.free_queue_order(), "stats": pool.stats(),
        "usage": pool.usage(),
    }


def prompt_keys(raw: list[tuple[int, int, int, int, int]], block_size: int) -> list[np.ndarray]:
    """Keys of each request: a prefix of an earlier request's keys (shared content), then keys of its own
    from a small alphabet (equal keys after different prefixes: equal content, different chains), covering
    all of its full blocks or all but a few."""
    out: list[np.ndarray] = []
    for n, (tokens, _, share_from, share_len, uncovered) in enumerate(raw):
        full = tokens // block_size
        shared = out[share_from % len(out)][:share_len].tolist() if out else []
        own = [(7 * n + j) % 5 for j in range(full)]
        out.append(np.array((shared + own)[: max(full - uncovered, 0)], dtype=np.int64))
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 70), st.integers(0, 20), st.integers(0, 30), st.integers(0, 18),
                       st.sampled_from([0, 0, 0, 1, 3])), min_size=1, max_size=45),
    st.sampled_from([1, 2, 4]),
    st.one_of(st.none(), st.integers(0, 12)),
    st.integers(0, 40),
    st.sampled_from([None, "model-b"]),
)
def test_serve_with_batch_hashing_equals_allocate_append_release(
    raw: list, block_size: int, extra_capacity: int | None, holder_tokens: int, extra_key: str | None
) -> None:
    """The replay's fast path (one `serve` per request, keys hashed for all requests at once, index
    look-ups shared by 32 prompts) against the general path (allocate, append, release, each prompt hashed
    on its own), with a live sequence holding some cached blocks (hits on used blocks) and a capacity from
    the smallest possible (an eviction on nearly every request) to none (no eviction): identical pools
    after every request, down to the index table's slots."""
    keys = prompt_keys(raw, block_size)
    largest = max(-(-(t + o) // block_size) for t, o, *_ in raw)
    holder = -(-holder_tokens // block_size)
    num_blocks = holder + largest + (extra_capacity if extra_capacity is not None else sum(len(k) for k in keys))
    num_blocks = max(num_blocks, 1)
    fast, general = BlockPool(num_blocks, block_size), BlockPool(num_blocks, block_size)
    holder_keys = keys[0][: holder_tokens // block_size]
    for pool in (fast, general):
        pool.allocate("holder", holder_tokens, holder_keys.copy(), extra_key)
    offsets = np.concatenate(([0], np.cumsum([len(k) for k in keys])))
    batch = fast.hash_prompts(np.concatenate(keys), offsets, extra_key)
    for i, (tokens, output, *_) in enumerate(raw):
        hit_tokens, used = fast.serve(tokens, batch.prompt(i), output, extra_key)
        assert general.allocate(i, tokens, keys[i], extra_key) == hit_tokens
        general.append(i, output)
        assert general.num_used == used
        general.release(i)
        fast.check_invariants()
        assert pool_state(fast) == pool_state(general)
    for pool in (fast, general):
        pool.release("holder")
    assert pool_state(fast) == pool_state(general)


@pytest.mark.parametrize(("limit", "widened_midway"), [(0, False), (7, False), (40, True)])
def test_versions_widen_to_int64_before_they_could_pass_int32(limit: int, widened_midway: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Versions are int32 until the blocks handed out in all could take one past the limit (2^31 - 1, here
    lowered): then int64, with the same values. The same run — hits, evictions, copy-on-write, decode
    blocks, several extra keys — gives the same pool whatever the limit."""
    def run() -> tuple[dict, list]:
        pool, seen = BlockPool(30, 2), []  # 30 blocks: 42 hit blocks and 11 evictions in this run (below)
        for i in range(16):
            keys = np.array([1, 2, 5, 100 + i], dtype=np.int64)
            seen.append(pool.allocate(i, 9, keys, extra_key=i % 2))
            pool.fork(i, "child")
            pool.append("child", 3)  # copy-on-write of the shared last block, then a fresh one
            for _ in range(3):
                pool.append(i, 1)  # one token at a time: take_one's scalar hand-out
            pool.release_many([i, "child"])
            seen.append(pool.store.version.dtype.name)
            pool.check_invariants()
        return pool_state(pool), seen

    baseline, seen = run()
    stats = baseline["stats"]
    # Request i: 9 tokens = 4 full blocks K1, K2, K3, A (keys 1, 2, 5, 100 + i; chains per extra key i % 2) and P
    # (1 token); the child's 3 tokens copy P into C and take N; i's 3 single tokens fill P and take M. Hand-outs
    # K1 K2 K3 A P C N M; release i then the child, tails first: M, P, N, C free, then A, K3, K2, K1 (the child
    # held them too) — 8 entries at the free queue's tail, 5 of them (M P N C A) never touched again, and the
    # K's hit by request i + 2 (the same extra key; one request's 8 hand-outs in between cannot reach them).
    # Requests 0, 1: no hit, 8 hand-outs each; 2..15: 3 hits, 5 hand-outs -> 16 + 14 * 5 = 86 allocated, 42 hit.
    # The 30 never-used blocks last through request 4 (30 - 8 - 8 - 5 - 5 = 4 left, then M0); from request 5 on
    # each request pops one old request's 5 entries, evicting its A (A0 .. A10): 11 evictions.
    assert set(seen[1::2]) == {"int32"} and (stats.allocated_blocks, stats.hit_blocks, stats.evictions) == (86, 42, 11)
    monkeypatch.setattr(store_module, "VERSION_INT32_MAX", limit)
    widened, seen_widened = run()
    assert widened == baseline and seen_widened[::2] == seen[::2]
    assert seen_widened[-1] == "int64" and ("int32" in seen_widened) == widened_midway


def test_serve_checks_then_changes() -> None:
    pool = BlockPool(6, 4)
    pool.allocate("live", 9)  # 3 blocks
    before = pool_state(pool)
    with pytest.raises(PoolExhaustedError):
        pool.serve(8, None, 5)  # ceil(13 / 4) = 4 blocks, 3 free
    with pytest.raises(ValueError, match="negative"):
        pool.serve(8, None, -1)
    with pool.step(), pytest.raises(ValueError, match="outside a step"):
        pool.serve(4, None, 0)
    assert pool_state(pool) == before
    # 12 tokens: 3 full blocks with keys, then 0 output tokens; the last one is never a hit
    assert pool.serve(12, [(1,), (2,), (3,)], 0) == (0, 3 + 3)
    assert pool.serve(12, [(1,), (2,), (3,)], 0) == (8, 3 + 3)  # 2 blocks hit, 1 fresh
    pool.check_invariants()


def test_hashed_keys_belong_to_their_pool() -> None:
    a, b = BlockPool(8, 2), BlockPool(8, 2)
    batch = a.hash_prompts(np.array([1, 2, 3], dtype=np.int64), np.array([0, 2, 3]))
    assert len(batch) == 2 and len(batch.prompt(0)) == 2
    with pytest.raises(ValueError, match="another pool"):
        b.allocate("x", 4, batch.prompt(0))
    with pytest.raises(ValueError, match="extra key"):
        a.allocate("x", 4, batch.prompt(0), extra_key="lora")
    with pytest.raises(ValueError, match="offsets"):
        a.hash_prompts(np.array([1, 2, 3], dtype=np.int64), np.array([0, 2]))
    assert a.allocate("x", 4, batch.prompt(0)) == 0 and a.allocate("y", 4, batch.prompt(0)) == 2
    with pytest.raises(ValueError, match="a prompt's"):
        a.append("x", 4, batch.prompt(1))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**64 - 1), st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20), max_size=8))
def test_batch_chain_hashes_equal_one_prompt_at_a_time(parent: int, prompts: list[list[int]]) -> None:
    keys = np.array([k for p in prompts for k in p], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum([len(p) for p in prompts]))).astype(np.int64)
    got = chain_hashes_batch(parent, keys, offsets).tolist()
    assert got == [h for p in prompts for h in chain_hashes_reference(parent, p)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "del"]), st.lists(st.integers(0, 60), min_size=1, max_size=20)),
                max_size=40))
def test_hash_index_with_every_key_on_one_probe_run(ops: list[tuple[str, list[int]]]) -> None:
    """The crowded case: all keys share a home slot, so a batch's absent keys all claim one free slot and
    all but one go on along the run (the shared-run placement), between tombstones; against a dict."""
    hash_of = np.zeros(4000, dtype=np.uint64)
    home_of = np.zeros(4000, dtype=np.int32)
    slot_of = np.full(4000, -1, dtype=np.int32)
    index, ref, next_block = HashIndex(40, hash_of, home_of, slot_of), {}, 0
    for op, ks in ops:
        if op == "put" and len(ref) + len(ks) <= 40:
            blocks = np.arange(next_block, next_block + len(ks))
            next_block += len(ks)
            hash_of[blocks] = [spread(k) for k in ks]
            home_of[blocks] = 5
            inserted = index.insert(hash_of[blocks], blocks, home_of[blocks].astype(np.int64))
            triples = list(zip(ks, blocks.tolist(), inserted.tolist(), strict=True))
            for k in set(ks):
                winners = [b for kk, b, ok in triples if kk == k and ok]
                assert len(winners) == (k not in ref)  # absent: one of its equal copies goes in; present: none
                if winners:
                    ref[k] = winners[0]
        elif op == "del":
            gone = sorted(set(ks) & set(ref))
            index.delete(np.array([ref.pop(k) for k in gone], dtype=np.intp))
        index.check()
        probe = list(range(61))
        found, _ = index.find(np.array([spread(k) for k in probe], dtype=np.uint64), np.full(61, 5, dtype=np.int64))
        assert found.tolist() == [ref.get(k, -1) for k in probe]


def test_every_release_reason_has_its_counter() -> None:
    assert {r.counter for r in ReleaseReason} <= set(PoolStats.counter_names())
    pool = BlockPool(8, 4)
    for i, reason in enumerate(ReleaseReason):
        pool.allocate(i, 3)
        pool.release(i, reason.value)  # the plain string works as the member
    stats = pool.stats()
    assert (stats.released_finished, stats.released_cancelled, stats.released_timed_out,
            stats.released_preempted) == (1, 1, 1, 1)
