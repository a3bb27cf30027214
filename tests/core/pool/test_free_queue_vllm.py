"""kvcalc's block pool hands out and evicts free blocks in vLLM v1's order, checked against an independent model.

`VllmPool` below is written from vLLM v1's rules (vllm/v1/core/block_pool.py, single_type_kv_cache_manager.py),
not from kvcalc's code: ONE free queue (FreeKVCacheBlockQueue), every block in id order at start; a block whose
last reference goes is appended at the tail, hashed or not, a request's table in reverse (free: "tail blocks are
freed first"); a hand-out pops the head (get_new_blocks) and evicts the popped block's hash if it has one
(_maybe_evict_cached_block); a cache hit on a free block unlinks it from wherever it is (touch). Hits: the longest
chain of cached full blocks, never the block of the last prompt token (it is recomputed for the logits).

A hash may be cached by several blocks (BlockHashToBlockMap: a dict of blocks per hash; a look-up takes the earliest
inserted one still cached, an eviction drops only the evicted block). One choice is kvcalc's, not about order, and the
model makes it too: an allocation that does not fit changes nothing.
No null block here (vLLM's BlockPool takes block 0 for it; S's task counts it in the pool's size).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.block_pool import BlockPool, PoolExhaustedError


class VllmPool:
    """vLLM v1's block pool, as plain Python (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.B = block_size
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # head first
        self.ref = [0] * num_blocks
        self.hash: list[tuple | None] = [None] * num_blocks
        self.cached: dict[tuple, dict[int, None]] = {}  # chain hash -> its blocks, earliest inserted first
        self.tables: dict[str, list[int]] = {}
        self.evictions = 0

    def _pop(self) -> int:
        block, _ = self.free.popitem(last=False)  # the head
        if self.hash[block] is not None:  # evict
            blocks = self.cached[self.hash[block]]
            del blocks[block]
            if not blocks:
                del self.cached[self.hash[block]]
            self.hash[block] = None
            self.evictions += 1
        return block

    def allocate(self, seq: str, n: int, keys: list[int]) -> int | None:
        chain = [tuple(keys[: i + 1]) for i in range(len(keys))]
        hits: list[int] = []
        for h in chain[: (n - 1) // self.B]:
            if h not in self.cached:
                break
            hits.append(next(iter(self.cached[h])))
        new = -(-n // self.B) - len(hits)
        if new + sum(self.ref[b] == 0 for b in hits) > len(self.free):
            return None
        for b in hits:  # touch
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1
        table = hits + [self._pop() for _ in range(new)]
        for b in table[len(hits) :]:
            self.ref[b] = 1
        for i in range(len(hits), min(len(chain), n // self.B)):  # register the full blocks with a key
            self.cached.setdefault(chain[i], {})[table[i]] = None
            self.hash[table[i]] = chain[i]
        self.tables[seq] = table
        self.tokens = {**getattr(self, "tokens", {}), seq: n}
        return len(hits) * self.B

    def append(self, seq: str, m: int) -> bool:
        table, n = self.tables[seq], self.tokens[seq]
        new = -(-(n + m) // self.B) - len(table)
        if new > len(self.free):
            return False
        for _ in range(new):
            block = self._pop()
            self.ref[block] = 1
            table.append(block)
        self.tokens[seq] = n + m
        return True

    def release(self, seq: str) -> None:
        for block in reversed(self.tables.pop(seq)):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                self.free[block] = None  # the tail, hashed or not


op = st.tuples(st.sampled_from(["alloc", "append", "release"]), st.integers(0, 4), st.integers(1, 40),
               st.integers(0, 3))


@settings(max_examples=300, deadline=None)
@given(num_blocks=st.integers(4, 24), block_size=st.sampled_from([2, 4]), ops=st.lists(op, max_size=40))
def test_the_pool_hands_out_and_evicts_as_vllm(num_blocks: int, block_size: int, ops: list) -> None:
    pool, model = BlockPool(num_blocks, block_size), VllmPool(num_blocks, block_size)
    for kind, s, n, prefix in ops:
        seq = f"s{s}"
        if kind == "alloc" and seq not in model.tables:
            keys = [prefix] * (n // block_size)  # a few distinct chains: prefixes 0..3 repeated, so hits happen
            want = model.allocate(seq, n, keys)
            try:
                got: int | None = pool.allocate(seq, n, np.array(keys, dtype=np.int64))
            except PoolExhaustedError:
                got = None
            assert got == want
        elif kind == "append" and seq in model.tables:
            ok = model.append(seq, n)
            assert pool.can_append(seq, n) == ok
            if ok:
                pool.append(seq, n)
        elif kind == "release" and seq in model.tables:
            model.release(seq)
            pool.release(seq)
        assert pool.free_queue_order() == list(model.free)
        assert {s: pool.block_table(s).tolist() for s in model.tables} == model.tables
        assert pool.stats().evictions == model.evictions
        assert int(np.count_nonzero(pool.store.hashed)) == sum(map(len, model.cached.values()))
        pool.check_invariants()


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(6, 30), block_size=st.sampled_from([2, 4]),
       requests=st.lists(st.tuples(st.integers(1, 30), st.integers(0, 12), st.integers(0, 3)), max_size=30))
def test_serve_is_vllm_one_request_at_a_time(num_blocks: int, block_size: int, requests: list) -> None:
    """A replay's fused serve (allocate, append the output, release) against the model's three calls."""
    pool, model = BlockPool(num_blocks, block_size), VllmPool(num_blocks, block_size)
    for n, out, prefix in requests:
        keys = [prefix] * (n // block_size)
        if -(-(n + out) // block_size) > num_blocks:
            continue
        hit = model.allocate("r", n, keys)
        assert hit is not None and model.append("r", out)
        model.release("r")
        assert pool.serve(n, np.array(keys, dtype=np.int64), out)[0] == hit
        assert pool.free_queue_order() == list(model.free)
        assert pool.stats().evictions == model.evictions
    pool.check_invariants()


def test_a_freed_cached_block_is_evicted_before_a_later_freed_plain_one() -> None:
    # 6 blocks of 4 tokens. "a": 8 tokens, keys [1, 1] -> blocks 0, 1, both full and registered. "b": 3 tokens,
    # no key -> block 2. Release a: its table reversed to the tail (1, 0), both cached; release b: 2, plain.
    # Queue: 3, 4, 5 (never used), 1, 0, 2. "c" of 20 tokens (5 blocks, no key) takes 3, 4, 5, 1, 0: vLLM evicts
    # the cached 1 and 0 (freed before the plain 2), where a plain-first pool would take 2 and evict only one
    pool, model = BlockPool(6, 4), VllmPool(6, 4)
    pool.allocate("a", 8, np.array([1, 1]))
    pool.allocate("b", 3)
    pool.release("a")
    pool.release("b")
    assert pool.free_queue_order() == [3, 4, 5, 1, 0, 2]
    pool.allocate("c", 20)
    assert pool.block_table("c").tolist() == [3, 4, 5, 1, 0]
    assert pool.stats().evictions == 2 and pool.free_queue_order() == [2]
    model.allocate("a", 8, [1, 1])
    model.allocate("b", 3, [])
    model.release("a")
    model.release("b")
    model.allocate("c", 20, [])
    assert model.tables["c"] == [3, 4, 5, 1, 0] and model.evictions == 2


queue_op = st.tuples(st.sampled_from(["free", "free", "revive", "pop", "pop", "pop_one", "uncache"]),
                     st.integers(0, 40), st.booleans())


@settings(max_examples=300, deadline=None)
@given(num_blocks=st.integers(1, 12), ops=st.lists(queue_op, max_size=80))
def test_the_queue_itself_is_an_ordered_dict(num_blocks: int, ops: list) -> None:
    """FreeBlockQueue's lazily deleted array (stamps written late, tombstones, compactions, the clean prefix a pop
    slices) against an OrderedDict: hand-outs from the head, frees at the tail, revivals and uncaching in place."""
    from kvcalc.core.pool.free_queue import FREE_CACHED, USED, FreeBlockQueue

    state = np.zeros(num_blocks, dtype=np.int8)
    queue, model = FreeBlockQueue(num_blocks, state), OrderedDict.fromkeys(range(num_blocks), False)
    used: list[int] = []
    for kind, k, cached in ops:
        if kind == "free" and used:  # a few blocks back, in this order, hashed or not
            blocks, used = used[: k % 4 + 1], used[k % 4 + 1 :]
            mask = np.array([cached ^ (i % 2 == 1) for i in range(len(blocks))])
            queue.push(np.array(blocks), mask, int(mask.sum()))
            model.update((b, bool(c)) for b, c in zip(blocks, mask, strict=True))
        elif kind == "revive" and any(model.values()):
            block = [b for b, c in model.items() if c][k % sum(model.values())]
            queue.revive(np.array([block]))
            del model[block]
            used.append(block)
        elif kind == "uncache" and any(model.values()):
            block = [b for b, c in model.items() if c][k % sum(model.values())]
            queue.uncache(np.array([block]))
            model[block] = False  # stays where it is
        elif kind == "pop" and model:
            n = k % len(model) + 1
            blocks, evicted = queue.pop(n)
            want = [model.popitem(last=False) for _ in range(n)]
            assert blocks.tolist() == [b for b, _ in want] and evicted.tolist() == [b for b, c in want if c]
            used += blocks.tolist()
        elif kind == "pop_one" and model:
            head, head_cached = next(iter(model.items()))
            block = queue.pop_plain_one()
            assert block == (-1 if head_cached else head)
            if block >= 0:
                del model[block]
                used.append(block)
        assert queue.order() == list(model) and len(queue) == len(model)
        assert queue.num_cached == sum(model.values()) and set(np.flatnonzero(state == USED)) == set(used)
        assert queue.cached_order().tolist() == [b for b, c in model.items() if c]
        assert state[[b for b, c in model.items() if c]].tolist() == [FREE_CACHED] * sum(model.values())
        queue.check()


class VllmGroups:
    """vLLM v1 with G full-attention KV cache groups on one block pool (kv_cache_coordinator): a hit is the shortest
    of the groups' chains; every group's hits are touched, then each group (in order) takes its new blocks off the
    one free queue's head; a request's blocks are freed group by group, each table tail first."""

    def __init__(self, num_blocks: int, block_size: int, groups: int) -> None:
        self.pool, self.G = VllmPool(num_blocks, block_size), groups
        self.tables: dict[str, list[list[int]]] = {}

    def allocate(self, seq: str, n: int, keys: list[int]) -> int | None:
        pool, B = self.pool, self.pool.B
        chains = [[(g, *keys[: i + 1]) for i in range(len(keys))] for g in range(self.G)]
        hit = min(next((i for i, h in enumerate(c[: (n - 1) // B]) if h not in pool.cached), (n - 1) // B)
                  for c in chains)
        hit = min(hit, len(keys))
        hits = [[next(iter(pool.cached[h])) for h in c[:hit]] for c in chains]
        new = -(-n // B) - hit
        if self.G * new + sum(pool.ref[b] == 0 for h in hits for b in h) > len(pool.free):
            return None
        for b in (b for h in hits for b in h):  # touch
            if pool.ref[b] == 0:
                del pool.free[b]
            pool.ref[b] += 1
        tables = [h + [pool._pop() for _ in range(new)] for h in hits]
        for g, table in enumerate(tables):
            for b in table[hit:]:
                pool.ref[b] = 1
            for i in range(hit, min(len(keys), n // B)):  # every full block, a duplicate too
                pool.cached.setdefault(chains[g][i], {})[table[i]] = None
                pool.hash[table[i]] = chains[g][i]
        self.tables[seq] = tables
        return hit * B

    def release(self, seq: str) -> None:
        for table in self.tables.pop(seq):
            for block in reversed(table):
                self.pool.ref[block] -= 1
                if self.pool.ref[block] == 0:
                    self.pool.free[block] = None


@settings(max_examples=200, deadline=None)
@given(num_blocks=st.integers(6, 30), groups=st.integers(1, 3), ops=st.lists(op, max_size=30))
def test_a_hybrid_pool_of_full_groups_hands_out_and_evicts_as_vllm(num_blocks: int, groups: int, ops: list) -> None:
    from kvcalc.core.pool.groups import PoolGroup
    from kvcalc.core.pool.hybrid import HybridPool

    B = 4
    pool = HybridPool(num_blocks, B, tuple(PoolGroup("full") for _ in range(groups)))
    model = VllmGroups(num_blocks, B, groups)
    for kind, s, n, prefix in ops:
        seq = f"s{s}"
        if kind == "alloc" and seq not in model.tables:
            keys = [prefix] * (n // B)
            want = model.allocate(seq, n, keys)
            assert pool.can_allocate(n, np.array(keys, dtype=np.int64)) == (want is not None)
            if want is not None:
                assert pool.allocate(seq, n, np.array(keys, dtype=np.int64)) == want
        elif kind == "release" and seq in model.tables:
            model.release(seq)
            pool.release(seq)
        assert pool.store.queue.order() == list(model.pool.free)
        assert {s: [t.tolist() for t in pool.block_tables(s)] for s in model.tables} == model.tables
        assert pool.stats().evictions == model.pool.evictions
    pool.check_invariants()
