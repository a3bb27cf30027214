"""vLLM v1's BlockPool and single-type KV cache managers, as plain Python: the memory half of tests/vllm_model.py
(its docstring gives the rules and where they were read). Nothing here is read from kvcalc."""

from __future__ import annotations

from dataclasses import dataclass, field

NULL = 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Pool:
    """vLLM's BlockPool with its FreeKVCacheBlockQueue (a dict keeps the queue's order)."""

    def __init__(self, num_blocks: int, one_block_per_hash: bool = False) -> None:
        self.one_block_per_hash = one_block_per_hash  # kvcalc's choice, not vLLM's (see VllmEngine)
        self.free: dict[int, None] = dict.fromkeys(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.hash_of: dict[int, tuple] = {}
        self.cached: dict[tuple, dict[int, None]] = {}
        self.evictions = 0

    def get_new_blocks(self, n: int) -> list[int]:
        assert n <= len(self.free), f"{n} blocks asked, {len(self.free)} free"
        out = []
        for _ in range(n):
            b = next(iter(self.free))
            del self.free[b]
            key = self.hash_of.pop(b, None)
            if key is not None:
                del self.cached[key][b]
                if not self.cached[key]:
                    del self.cached[key]
                self.evictions += 1
            self.ref[b] = 1
            out.append(b)
        return out

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if b != NULL:
                if self.ref[b] == 0:
                    del self.free[b]
                self.ref[b] += 1

    def free_blocks(self, blocks: list[int]) -> None:
        for b in blocks:
            if b != NULL:
                self.ref[b] -= 1
                assert self.ref[b] >= 0
                if self.ref[b] == 0:
                    self.free[b] = None

    def lookup(self, key: tuple) -> int | None:
        blocks = self.cached.get(key)
        return next(iter(blocks)) if blocks else None

    def cache(self, block: int, key: tuple) -> None:
        if block != NULL and block not in self.hash_of and not (self.one_block_per_hash and key in self.cached):
            self.hash_of[block] = key
            self.cached.setdefault(key, {})[block] = None


@dataclass
class Group:
    """One KV cache group's manager: kind full / sliding / chunked / state, `window` W or C, tables per request.
    `align` (a state group under mamba_cache_mode align; block B): the request's running state lives in the block of
    its last token, a step that enters a new block takes one block there (nulls in between) and keeps the previous
    one (the state it copies from, `last_state`) until the next step's remove_skipped; full blocks are cached as
    any group's (a block holds the state at its end boundary), null entries skipped."""

    kind: str
    window: int = 0
    block: int = 0  # B_g; 0: the pool's
    align: bool = False
    tables: dict[int, list[int]] = field(default_factory=dict)
    num_cached: dict[int, int] = field(default_factory=dict)
    last_state: dict[int, int] = field(default_factory=dict)  # align: MambaManager.last_state_block_idx
    allocated: set[int] = field(default_factory=set)  # align: MambaManager._allocated_block_reqs

    def skipped(self, c: int) -> int:
        if self.kind == "sliding":
            return max(0, c - self.window + 1)
        if self.kind == "chunked":
            return c // self.window * self.window
        if self.kind == "state":
            return max(0, c - 1)
        return 0

    def remove_skipped(self, pool: Pool, rid: int, c: int) -> None:
        table = self.tables.get(rid)
        if not table:
            return
        freed = []
        for i in range(min(self.skipped(c) // self.block, len(table)) - 1, -1, -1):
            if table[i] == NULL:
                break
            freed.append(table[i])
            table[i] = NULL
        last = self.last_state.get(rid)
        if self.align and last is not None and last < cdiv(c, self.block) - 1 and table[last] != NULL:
            freed.append(table[last])
            table[last] = NULL
        pool.free_blocks(freed)

    def need(self, pool: Pool, rid: int, n: int, hit: list[int], computed: int) -> int:
        required = cdiv(n, self.block)
        if self.align:  # one block at most: the state of the step's last token (first prefill: hit blocks aside)
            new = min(max(required - len(hit) - len(self.tables.get(rid, ())), 0), 1)
            return new + sum(1 for b in hit if b != NULL and pool.ref[b] == 0)
        if rid in self.num_cached:  # running
            return max(required - len(self.tables[rid]), 0)
        skipped = self.skipped(computed) // self.block
        new = max(required - max(skipped, len(hit)), 0)
        return new + sum(1 for b in hit[skipped:] if b != NULL and pool.ref[b] == 0)

    def add_hit(self, pool: Pool, rid: int, hit: list[int], computed: int) -> None:
        if rid in self.num_cached:
            return
        skipped = self.skipped(computed) // self.block
        kept = hit[skipped:]
        pool.touch(kept)
        self.tables[rid] = [NULL] * skipped + kept if skipped else list(kept)
        self.num_cached[rid] = len(self.tables[rid])

    def grow(self, pool: Pool, rid: int, n: int) -> None:
        table = self.tables.setdefault(rid, [])
        self.num_cached.setdefault(rid, 0)
        if not self.align:
            table += pool.get_new_blocks(max(cdiv(n, self.block) - len(table), 0))
            return
        required = cdiv(n, self.block)
        if required == len(table):
            return
        if rid in self.allocated or table:  # the state this step starts from: a running one's, or a hit's
            self.last_state[rid] = len(table) - 1
        table += [NULL] * (required - 1 - len(table))
        table += pool.get_new_blocks(1)
        self.allocated.add(rid)

    def cache(self, pool: Pool, rid: int, gid: int, keys: list, num_tokens: int) -> None:
        if self.kind == "state" and not self.align:
            return
        full, table = num_tokens // self.block, self.tables[rid]
        for i in range(self.num_cached[rid], min(full, len(keys))):
            pool.cache(table[i], (gid, keys[i]))
        self.num_cached[rid] = max(full, self.num_cached[rid])

    def free(self, pool: Pool, rid: int) -> None:
        pool.free_blocks(list(reversed(self.tables.pop(rid, []))))
        self.num_cached.pop(rid, None)
        self.last_state.pop(rid, None)
        self.allocated.discard(rid)
