"""An independent step-by-step model of vLLM v1's scheduler and KV cache manager, for tests that compare sim to it.

Written from vLLM's source (vllm/v1/core/sched/scheduler.py `schedule`, kv_cache_manager.py `allocate_slots` /
`get_computed_blocks`, kv_cache_coordinator.py, single_type_kv_cache_manager.py, block_pool.py), read as stored in
LucasWilkinson/vllm@50e9ec0 (the generic `remove_skipped_blocks` over `get_num_skipped_tokens`) and ROCm/vllm@55970f1
(v0.10's per-type managers); the rules below are the ones both agree on. mamba_cache_mode align (MambaManager,
HybridKVCacheCoordinator, Scheduler._mamba_block_aligned_split) read in the vLLM copy stored as
jiayingsong2023/litevLLM@4e14d4b (vllm/core/single_type_kv_cache_manager.py, kv_cache_coordinator.py) and the split
as upstream's newer form (on the request's tokens, resumed requests included). Left out: speculative decoding, async
scheduling, KV connectors, partial-block hits (fine-grained hash lookup), sparse retention masks, admission caps,
priorities, encoder tokens, mamba_cache_mode all. Nothing here is read from kvcalc.

Pool (block_pool.py): block 0 is the null block; the free queue starts as ids 1..N-1 in order; a hand-out pops the
head and drops its hash (an eviction when it had one); `free_blocks(seq)` decrements each and appends those reaching 0
to the tail, in `seq`'s order; `touch` takes a cached free block out of the queue. A full block is cached under
(group, chain key); a key may name several blocks (vLLM keeps both of two requests that computed the same block) and
a look-up takes the first cached.

Per KV cache group g (one manager each, block size B_g): `get_num_skipped_tokens(c)` is 0 (full), max(0, c - W + 1)
(sliding W), c // C * C (chunked C), c - 1 (state; its block is max_model_len tokens under mamba_cache_mode none, so
one page a request). `remove_skipped_blocks(c)` nulls and frees the table's entries before skipped // B_g, walking
back from the last one until a null entry. `allocate_slots(req, new, hit)`: remove_skipped_blocks(computed + hit) in
every group, then need = Σ_g blocks to allocate (a running request: cdiv(n, B_g) - len(table); an admitted one:
max(cdiv(n, B_g) - max(skipped_blocks, hit blocks), 0) + its hit blocks that sit in the free queue), None when need >
free; else touch the hit blocks, top every table up to cdiv(n, B_g), and cache the full blocks of the first
min(computed + new, num_tokens) tokens (groups in order). A finished or preempted request frees each group's table
(groups in order), last entry first.

Hits (get_computed_blocks, a request with no computed tokens): at most num_tokens - 1 tokens; the full groups' longest
run of leading blocks cached in every full group (L); then the other type with max_length L: sliding, from the right
the first ceil((W - 1) / B) contiguous blocks cached in every sliding group (or the leading run when none is long
enough); chunked, every block before L // C * C free of charge and the blocks after it while cached; a state group
under mode none none, under align the last block before L whose state is cached in every state group (vllm_pool.Group
has align's table).

Scheduler (FCFS, recompute): running requests in order, each min(num_tokens - computed, budget) tokens (under align
cut by `aligned`; a running request left with 0 is passed over, a waiting one stops admission); when
allocate_slots fails the last running request is preempted (freed, computed 0, to the front of the waiting queue) and
the allocation retried, until it fits or the request itself was preempted (then the loop stops). Only when nobody was
preempted, waiting requests from the head while the budget lasts and fewer than max_seqs run: hit, then
min(num_tokens - hit, budget) tokens, stop at the first that does not fit. After the step every request that reached
its num_tokens samples one token; one at its output length finishes (freed) in scheduled order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_pool import NULL, Group, Pool, cdiv


@dataclass
class Req:
    rid: int
    arrival: float
    prompt: int
    output: int
    ids: tuple[int, ...] = ()  # Mooncake-style hash ids, one per 512 prompt tokens (prefix-chained)
    computed: int = 0
    generated: int = 0
    preemptions: int = 0
    hits: list[int] = field(default_factory=list)
    first_token_s: float = -1.0  # the end of the step that sampled its first token (once: a recomputed request's
    finish_s: float = -1.0  # first token stays), and of the one that sampled its last

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated


class VllmEngine:
    """The scheduler + KV cache manager over `groups` (kinds in vLLM's group order), a pool of `num_blocks` ids
    (the null block included), one step a `step_s`. Two switches leave vLLM for kvcalc's known choices (each shown
    by a strict xfail in tests/core/sim/test_sim_vllm_model_cases.py), so that a comparison can look past them:
    `hash_outputs=False` keys only prompt blocks (a block holding a sampled token is never cached), and
    `one_block_per_hash=True` leaves a block whose hash another block already caches hash-less."""

    def __init__(self, reqs: list[Req], groups: list[Group], num_blocks: int, block: int, *, budget: int,
                 max_seqs: int, max_model_len: int, caching: bool, step_s: float = 1.0,
                 hash_outputs: bool = True, one_block_per_hash: bool = False, state_mode: str = "none") -> None:
        self.reqs, self.groups, self.B = reqs, groups, block
        self.pool = Pool(num_blocks, one_block_per_hash)
        self.align = state_mode == "align" and any(g.kind == "state" for g in groups)
        for g in groups:
            g.align = g.kind == "state" and self.align
            g.block = g.block or (max_model_len if g.kind == "state" and not g.align else block)
        self.budget, self.max_seqs, self.max_len, self.caching = budget, max_seqs, max_model_len, caching
        self.step_s, self.hash_outputs = step_s, hash_outputs
        self.now, self.next_arrival = 0.0, 0
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.steps: list[dict] = []
        self.finished: list[int] = []

    # ---- the KV cache manager -----------------------------------------------------------------------------
    def keys(self, r: Req) -> list:
        """Chain keys of the request's full blocks: a prompt block by the ids through its last token, a block
        holding an output token by (request, index) (a sampled token: nobody else's), or nothing (not hashed)."""
        out = []
        for j in range(r.num_tokens // self.B):
            end = (j + 1) * self.B
            if end <= r.prompt:
                out.append((r.ids[: (end - 1) // 512 + 1], j))
            elif self.hash_outputs:
                out.append(("out", r.rid, j))
            else:
                break
        return out

    def longest_hit(self, r: Req) -> tuple[int, list[list[int]]]:
        if not self.caching:
            return 0, [[] for _ in self.groups]
        keys, B = self.keys(r), self.B
        max_blocks = min((r.num_tokens - 1) // B, len(keys))
        fulls = [i for i, g in enumerate(self.groups) if g.kind == "full"]
        others = [i for i, g in enumerate(self.groups) if g.kind != "full"]
        found = lambda gs, j: [self.pool.lookup((i, keys[j])) for i in gs]  # noqa: E731
        hit = {i: [] for i in range(len(self.groups))}
        length = max_blocks
        if fulls:
            length = 0
            while length < max_blocks and None not in (b := found(fulls, length)):
                for i, blk in zip(fulls, b, strict=True):
                    hit[i].append(blk)
                length += 1
        if others:
            kind = self.groups[others[0]].kind
            assert all(self.groups[i].kind == kind for i in others), "one kind besides full"
            length = self._other_hit(kind, others, keys, length, hit, found)
        for i in hit:
            del hit[i][length:]
        return length * B, [hit[i] for i in range(len(self.groups))]

    def _other_hit(self, kind: str, gs: list[int], keys: list, max_blocks: int, hit: dict, found) -> int:
        g0 = self.groups[gs[0]]
        for i in gs:
            hit[i] = [NULL] * max_blocks
        if kind == "state":  # align: the last block before the full hit whose state is cached in every group
            for j in range(max_blocks - 1, -1, -1) if self.align else ():
                if None not in (b := found(gs, j)):
                    for i, blk in zip(gs, b, strict=True):
                        hit[i][j] = blk
                    return j + 1
            return 0
        if kind == "chunked":
            start = max_blocks * self.B // g0.window * g0.window // self.B
            n = start
            while n < max_blocks and None not in (b := found(gs, n)):
                for i, blk in zip(gs, b, strict=True):
                    hit[i][n] = blk
                n += 1
            return n
        need, run = cdiv(g0.window - 1, self.B), 0
        for j in range(max_blocks - 1, -1, -1):
            b = found(gs, j)
            if None in b:
                run = 0
                continue
            for i, blk in zip(gs, b, strict=True):
                hit[i][j] = blk
            run += 1
            if run >= need:
                return j + run
        return run

    def allocate_slots(self, r: Req, new: int, hit: tuple[int, list[list[int]]] | None = None) -> bool:
        hit_tokens, hit_blocks = hit if hit is not None else (0, [[] for _ in self.groups])
        computed = r.computed + hit_tokens
        for g in self.groups:
            g.remove_skipped(self.pool, r.rid, computed)
        n = min(computed + new, self.max_len)
        need = sum(g.need(self.pool, r.rid, n, h, computed) for g, h in zip(self.groups, hit_blocks, strict=True))
        if need > len(self.pool.free):
            return False
        for g, h in zip(self.groups, hit_blocks, strict=True):
            g.add_hit(self.pool, r.rid, h, computed)
        for g in self.groups:
            g.grow(self.pool, r.rid, n)
        if self.caching:
            keys = self.keys(r)
            for gid, g in enumerate(self.groups):
                g.cache(self.pool, r.rid, gid, keys, min(computed + new, r.num_tokens))
        return True

    def free(self, r: Req) -> None:
        for g in self.groups:
            g.free(self.pool, r.rid)

    # ---- the scheduler ------------------------------------------------------------------------------------
    def schedule(self) -> tuple[list[tuple[int, int, int]], list[int]]:
        budget, out, preempted = self.budget, [], []
        i = 0
        while i < len(self.running) and budget > 0:
            r = self.running[i]
            new = self.aligned(r, r.computed, min(r.num_tokens - r.computed, budget))
            if not new:  # align: under a block of prefill left in the budget, not scheduled this step
                i += 1
                continue
            while not self.allocate_slots(r, new):
                victim = self.running.pop()
                self.free(victim)
                victim.computed, victim.preemptions = 0, victim.preemptions + 1
                self.waiting.insert(0, victim)
                preempted.append(victim.rid)
                if victim is r:
                    break
            if preempted and preempted[-1] == r.rid:
                break
            out.append((r.rid, r.computed, new))
            budget -= new
            i += 1
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            r = self.waiting[0]
            hit = self.longest_hit(r)
            new = self.aligned(r, hit[0], min(r.num_tokens - hit[0], budget))
            if not new or not self.allocate_slots(r, new, hit):
                break
            self.waiting.pop(0)
            r.computed = hit[0]
            r.hits.append(hit[0])
            self.running.append(r)
            out.append((r.rid, r.computed, new))
            budget -= new
        return out, preempted

    def aligned(self, r: Req, computed: int, new: int) -> int:
        """The scheduler's _mamba_block_aligned_split (mamba_cache_mode align): a prefill chunk is a whole number of
        blocks, or ends at the last block boundary of the request's tokens, or is its tail past that."""
        if not self.align or computed >= max(r.prompt, r.num_tokens - 1):
            return new
        last = r.num_tokens - r.num_tokens % self.B
        if computed + new < last:
            return new // self.B * self.B
        if computed < last < computed + new:
            return last - computed
        return new

    def step(self) -> None:
        while self.next_arrival < len(self.reqs) and self.reqs[self.next_arrival].arrival <= self.now:
            self.waiting.append(self.reqs[self.next_arrival])
            self.next_arrival += 1
        if not self.running and not self.waiting:
            self.now = self.reqs[self.next_arrival].arrival
            return
        out, preempted = self.schedule()
        assert out, "a step with nothing scheduled"
        self.steps.append(dict(t=self.now, scheduled=out, preempted=preempted, groups=self.group_blocks(),
                               running=len(self.running), waiting=len(self.waiting)))
        done = []
        for rid, start, new in out:
            r = self.reqs[rid]
            r.computed = start + new
            if r.computed == r.num_tokens:
                r.generated += 1
                if r.first_token_s < 0:
                    r.first_token_s = self.now + self.step_s
                if r.generated >= r.output:
                    r.finish_s = self.now + self.step_s
                    done.append(r)
        for r in done:
            self.free(r)
            self.running.remove(r)
            self.finished.append(r.rid)
        self.now += self.step_s

    def run(self, max_steps: int = 100_000) -> VllmEngine:
        while len(self.finished) < len(self.reqs):
            self.step()
            assert len(self.steps) < max_steps, "no progress"
        assert all(not t for g in self.groups for t in g.tables.values()) and sum(self.pool.ref) == 0
        return self

    def group_blocks(self) -> list[int]:
        """Distinct blocks each group's tables hold."""
        return [len({b for t in g.tables.values() for b in t if b != NULL}) for g in self.groups]
