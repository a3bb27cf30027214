"""Memory policies of the allocation ablation: where a running request's KV lives.

    paged           the real block pool (core.block_pool), block size B, prefix caching from Mooncake
                    hash_ids; blocks are taken when a request crosses a block boundary, so it can run
                    out mid-decode (then the scheduler preempts).
    reserve-max     one contiguous region of the model's max length, reserved at admission;
    reserve-pow2    ... of the next power of two of the request's true length (prompt + output);
    reserve-oracle  ... of exactly its true length (an oracle that knows the output length).
                    Reservations come from a first-fit allocator (core.sim_alloc), so external
                    fragmentation shows up; a reservation never grows, so these never preempt.

The scheduler talks to a policy only through the methods below ("check, then change": `can_admit` is
pure; `admit`, `grow_many` and `grow` change nothing when they return False). Every release goes through
the pool's (or allocator's) one release path, with its reason.

Memory is accounted in token slots of the pool, split into the parts of `MEMORY_PARTS` (they sum to the
pool's capacity); block-table bytes are reported beside them. The scheduler samples them every step,
and for a fast-forwarded run of decode steps `segment_parts` returns the same per-step values in bulk.
"""

from __future__ import annotations

import numpy as np

from kvcalc.core.block_pool import BlockPool, ReleaseReason
from kvcalc.core.sim_alloc import FirstFitAllocator
from kvcalc.core.sim_hardware import BLOCK_TABLE_ENTRY_BYTES

POLICIES = ("paged", "reserve-max", "reserve-pow2", "reserve-oracle")
MEMORY_PARTS = ("useful", "tail_fragmentation", "reservation_waste", "external_fragmentation", "cached_free", "free")
UNLIMITED_STEPS = 1 << 62


def _ceil_div(a: np.ndarray | int, b: int) -> np.ndarray | int:
    return -(-a // b)


class PagedPolicy:
    """Paging on the real BlockPool.

    Admission allocates through the pool (prefix-cache hits included) and every release goes through
    the pool's one release path. Decode growth is batched: when a request crosses into a new block the
    policy records the block as owed (`owed_blocks`) and subtracts all owed blocks from the pool's free
    count in every check, so decisions are exactly those of taking the block at once; the owed blocks
    are taken from the pool in one `append` per request before anything whose outcome depends on which
    blocks are free — that request's release, and, with prefix caching on, any allocation or cache
    look-up (the LRU eviction order then matches block-at-once taking). Without this, a decode step
    would cost one pool call per boundary crossing: 256 k calls for the Azure conversation trace.
    """

    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, num_requests: int, prompt_keys: list | None = None) -> None:
        self.block_size = block_size
        self.capacity_slots = num_blocks * block_size
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching=prompt_keys is not None)
        self.prompt_keys = prompt_keys  # per request: int64 content keys of its prompt's full blocks, or None
        self.pool_tokens = np.zeros(num_requests, dtype=np.int64)  # tokens the pool has been told of
        self.held_tokens = np.zeros(num_requests, dtype=np.int64)  # tokens with room reserved for them
        self.held_blocks = np.zeros(num_requests, dtype=np.int64)  # = ceil(held_tokens / B) while live
        self.owed_blocks = 0  # Σ over live requests of held_blocks − the blocks the pool has given them
        self.owing: set[int] = set()

    # ---- free blocks, counting what is owed ---------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.pool.num_free_blocks - self.owed_blocks

    def _settle(self, rid: int) -> None:
        """Take the blocks `rid` owes from the pool (one append of every token since the last one)."""
        old, total = int(self.pool_tokens[rid]), int(self.held_tokens[rid])
        if old == total:
            self.owing.discard(rid)
            return
        before = self.pool.num_free_blocks
        keys = self._keys(rid)
        block_keys = None
        if keys is not None and old // self.block_size < len(keys):
            block_keys = keys[old // self.block_size : min(total // self.block_size, len(keys))]
        copies = self.pool.append(rid, total - old, block_keys)
        assert not copies, f"request {rid}: a private tail block needed copy-on-write {copies}"
        self.owed_blocks -= before - self.pool.num_free_blocks
        self.pool_tokens[rid] = total
        self.owing.discard(rid)

    def _settle_all(self) -> None:
        for rid in sorted(self.owing):
            self._settle(rid)
        assert self.owed_blocks == 0, f"{self.owed_blocks} blocks still owed after settling"

    # ---- admission ---------------------------------------------------------------------------------
    def never_fits(self, rid: int, total_tokens: int) -> bool:
        """A request whose whole KV (prompt + output − 1 tokens) exceeds the pool can never run."""
        return _ceil_div(max(total_tokens - 1, 1), self.block_size) > self.pool.num_blocks

    def reservation_slots(self, rid: int) -> int:
        return 0

    def _keys(self, rid: int) -> np.ndarray | None:
        return None if self.prompt_keys is None else self.prompt_keys[rid]

    def hit_tokens(self, rid: int, num_tokens: int) -> int:
        """Prefix-cache hit of an admission of `num_tokens` to compute (0 without hash ids); a pure look-up."""
        keys = self._keys(rid)
        if keys is None:
            return 0
        self._settle_all()
        hits = self.pool._probe(num_tokens, keys, None)[0]  # NOTE: the pool has no public probe yet
        return len(hits) * self.block_size

    def can_admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        keys = None if from_swap else self._keys(rid)
        if keys is None:
            return int(_ceil_div(total_tokens, self.block_size)) - start_tokens // self.block_size <= self.free_blocks
        self._settle_all()
        return self.pool.can_allocate(total_tokens, keys[: total_tokens // self.block_size])

    def admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        """Blocks for `total_tokens`, of which `start_tokens` are prefix-cache hits (a multiple of B) or,
        `from_swap`, KV swapped back in from the host (fresh blocks, no cache look-up)."""
        if not self.can_admit(rid, start_tokens, total_tokens, from_swap):
            return False
        keys = None if from_swap else self._keys(rid)
        hit = self.pool.allocate(rid, total_tokens, None if keys is None else keys[: total_tokens // self.block_size])
        assert hit == (0 if from_swap else start_tokens), f"request {rid}: pool hit {hit}, probe said {start_tokens}"
        self.pool_tokens[rid] = self.held_tokens[rid] = total_tokens
        self.held_blocks[rid] = _ceil_div(total_tokens, self.block_size)
        return True

    # ---- growth --------------------------------------------------------------------------------------
    def grow_many(self, rids: np.ndarray, totals: np.ndarray, new_blocks: int | None = None,
                  check: bool = True) -> bool:
        """Room for `totals[i]` tokens for every request, or (False) no change at all. `new_blocks`, when
        the caller knows it (a fast-forwarded run), saves recounting; `check=False` when the caller has
        checked the fit step by step (requests that finished inside a fast-forwarded run)."""
        blocks = -(-totals // self.block_size)
        if new_blocks is None:
            new_blocks = int((blocks - self.held_blocks[rids]).sum())
            if check and new_blocks > self.free_blocks:
                return False
        self.held_tokens[rids] = totals
        if new_blocks:
            self.held_blocks[rids] = blocks
            self.owed_blocks += new_blocks
            self.owing.update(rids.tolist())  # settling skips those whose pool count is current
        return True

    def grow(self, rid: int, total: int) -> bool:
        return self.grow_many(np.array([rid]), np.array([total]))

    def decode_steps_available(self, tokens: np.ndarray) -> tuple[int, np.ndarray | None]:
        """(the most decode steps the free blocks cover, a plan for `segment_integrals`).

        Request i, holding t_i tokens, needs a new block in step j iff (t_i + j) % B == 0, so the blocks
        needed by the first s steps repeat with period B: need(s) = (s // B)·n + cum[s % B], where cum
        is the running count of requests by their first boundary step.
        """
        n, B = len(tokens), self.block_size
        if n == 0:
            return UNLIMITED_STEPS, None
        cum = np.zeros(B + 1, dtype=np.int64)
        np.cumsum(np.bincount((-tokens) % B, minlength=B), out=cum[1:])
        periods, rest = divmod(self.free_blocks, n)
        return periods * B + int(np.searchsorted(cum, rest, side="right")) - 1, cum

    # ---- release ---------------------------------------------------------------------------------------
    def release(self, rid: int, reason: str) -> None:
        if self.prompt_keys is not None:
            self._settle_all()
        elif rid in self.owing or self.pool_tokens[rid] != self.held_tokens[rid]:
            self._settle(rid)
        self.pool.release(rid, ReleaseReason(reason))
        self.pool_tokens[rid] = self.held_tokens[rid] = self.held_blocks[rid] = 0

    def sync(self) -> None:
        """Tell the pool every token and block it has not heard of (tests compare its accounting)."""
        for rid in self.pool.seqs:
            if self.pool_tokens[rid] != self.held_tokens[rid]:
                self.owing.add(rid)
        self._settle_all()

    # ---- memory ------------------------------------------------------------------------------------------
    def _state(self) -> tuple[int, int, int]:
        """(used, plain free, cached free) blocks of the pool, with the owed blocks not yet taken."""
        pool = self.pool
        cached = pool.num_cached_free_blocks
        return pool.num_used, pool.num_free_blocks - cached, cached

    def parts(self, tokens: np.ndarray, head_rid: int | None) -> tuple[np.ndarray, int]:
        """(slots per MEMORY_PARTS [6], block-table bytes) now, running requests holding `tokens` [n]."""
        B = self.block_size
        table = int(_ceil_div(tokens, B).sum()) if len(tokens) else 0
        tail = table * B - int(tokens.sum())
        used0, plain0, cached0 = self._state()
        used = (used0 + self.owed_blocks) * B  # owed blocks come off the plain stack first, then the LRU
        cached = (cached0 - max(self.owed_blocks - plain0, 0)) * B
        parts = np.array([used - tail, tail, 0, 0, cached, self.capacity_slots - used - cached], dtype=np.int64)
        return parts, table * BLOCK_TABLE_ENTRY_BYTES

    def segment_integrals(self, tokens: np.ndarray, plan: np.ndarray, d: np.ndarray, head_rid: int | None,
                          plan_steps: np.ndarray) -> tuple[np.ndarray, float, int]:
        """(Σ_j d_j · parts_j [6], Σ_j d_j · block-table bytes_j, new blocks) over k = len(d) decode steps
        from `tokens`; `plan_steps` = 0, 1, 2, … (at least k + 1 of them).

        Step j (s = j + 1) holds tokens + s per request and has taken need(s) more blocks:
            used = used0 + owed + need(s)      tail = (table0 + need(s))·B − (T0 + n·s)
            useful = used·B − tail             cached = cached0 − max(owed + need(s) − plain0, 0)
        so each integral is a combination of Σd, Σd·s, Σd·need(s) and Σd·evicted(s).
        """
        B, n, k = self.block_size, len(tokens), len(d)
        s = plan_steps[1 : k + 1]
        need = (s // B) * n + plan[s % B]
        table0 = int(_ceil_div(tokens, B).sum())
        t0 = int(tokens.sum())
        used0, plain0, cached0 = self._state()
        used0 += self.owed_blocks
        D, DS, DN = float(d.sum()), float(d @ s), float(d @ need)
        DE = 0.0
        if cached0 and self.owed_blocks + int(need[-1]) > plain0:
            DE = float(d @ np.maximum(self.owed_blocks + need - plain0, 0))
        used = used0 * B * D + B * DN
        useful = ((used0 - table0) * B + t0) * D + n * DS
        cached = cached0 * B * D - B * DE
        parts = np.array([useful, used - useful, 0.0, 0.0, cached, self.capacity_slots * D - used - cached])
        return parts, BLOCK_TABLE_ENTRY_BYTES * (table0 * D + DN), int(need[-1])

    @property
    def releases_in_segment(self) -> bool:
        """Runs of steps may go past finishes: only when block identities cannot matter (no prefix cache)."""
        return self.prompt_keys is None

    def finish_segment(self, rids: np.ndarray, tokens: np.ndarray, remaining: np.ndarray, d: np.ndarray,
                       useful: np.ndarray) -> tuple[int, np.ndarray, float]:
        """Decode steps in which requests leave as they finish (request i takes part in steps j < remaining[i];
        `useful[j]` = Σ over those of t_i + j + 1, the tokens held in step j).

        Returns (k: the leading steps whose blocks fit, Σ_{j<k} d_j · parts_j [6], Σ_{j<k} d_j · table bytes_j).
        Without prefix caching every used block belongs to a running request, so step j fits iff the
        blocks of the requests alive in it, ceil((t_i + j + 1) / B) each, fit in the pool.
        """
        assert self.prompt_keys is None, "runs through finishes need a pool without prefix caching"
        B = self.block_size
        k = len(d)
        steps = np.arange(k + 1, dtype=np.int64)
        alive = steps[None, :k] < remaining[:, None]
        blocks = (((tokens[:, None] + (steps[None, 1:] + B - 1)) // B) * alive).sum(axis=0)
        over = np.flatnonzero(blocks > self.pool.num_blocks)
        k = int(over[0]) if len(over) else k
        d, blocks, useful = d[:k], blocks[:k], useful[:k]
        used = blocks * B
        parts = np.array([float(d @ useful), float(d @ (used - useful)), 0.0, 0.0, 0.0,
                          float(d @ (self.capacity_slots - used))])
        return k, parts, float(d @ blocks) * BLOCK_TABLE_ENTRY_BYTES

    def check(self) -> None:
        self.pool.check_invariants()

    def check_whole(self) -> None:
        """After the run: every block free, no sequence live, nothing owed, invariants hold."""
        self.pool.check_invariants()
        assert not self.pool.seqs, f"{len(self.pool.seqs)} sequences still hold blocks after the run"
        assert self.owed_blocks == 0 and not self.owing, f"{self.owed_blocks} blocks still owed after the run"
        assert self.pool.num_used == 0 and self.pool.num_free_blocks == self.pool.num_blocks, "pool not whole"


class ReservationPolicy:
    """Contiguous reservation at admission from a first-fit allocator over the same number of slots."""

    def __init__(self, name: str, capacity_slots: int, prompt: np.ndarray, output: np.ndarray, max_model_len: int):
        assert name in POLICIES[1:], f"not a reservation policy: {name}"
        self.name = name
        self.block_size = 1
        self.capacity_slots = capacity_slots
        self.alloc = FirstFitAllocator(capacity_slots)
        true_len = prompt + output
        if name == "reserve-max":
            self.reserved = np.full(len(prompt), max_model_len, dtype=np.int64)
        elif name == "reserve-pow2":
            self.reserved = (1 << np.ceil(np.log2(true_len)).astype(np.int64)).astype(np.int64)
            self.reserved = np.where(self.reserved < true_len, self.reserved * 2, self.reserved)
        else:
            self.reserved = true_len.astype(np.int64)
        self.held = np.zeros(len(prompt), dtype=np.int64)  # slots reserved by a live request, 0 otherwise

    def never_fits(self, rid: int, total_tokens: int) -> bool:
        return int(self.reserved[rid]) > self.capacity_slots

    def reservation_slots(self, rid: int) -> int:
        return int(self.reserved[rid])

    def hit_tokens(self, rid: int, num_tokens: int) -> int:
        return 0

    def can_admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        return self.alloc.can_allocate(int(self.reserved[rid]))

    def admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        length = int(self.reserved[rid])
        assert total_tokens <= length, f"request {rid} needs {total_tokens} slots beyond its reservation {length}"
        if not self.alloc.allocate(rid, length):
            return False
        self.held[rid] = length
        return True

    def grow_many(self, rids: np.ndarray, totals: np.ndarray, new_blocks: int | None = None,
                  check: bool = True) -> bool:
        """Reservations cover the whole request: growth never needs memory (asserted when `check`)."""
        assert not check or np.all(totals <= self.held[rids]), "a request outgrew its reservation"
        return True

    def grow(self, rid: int, total: int) -> bool:
        assert total <= self.held[rid], f"request {rid} outgrew its reservation"
        return True

    def decode_steps_available(self, tokens: np.ndarray) -> tuple[int, None]:
        return UNLIMITED_STEPS, None

    def release(self, rid: int, reason: str) -> None:
        self.alloc.release(rid, reason)
        self.held[rid] = 0

    def sync(self, rids: np.ndarray, tokens: np.ndarray) -> None:
        return None

    def _external(self, head_rid: int | None) -> int:
        if head_rid is None:
            return 0
        return self.alloc.free_in_holes_smaller_than(int(self.reserved[head_rid]))

    def parts(self, tokens: np.ndarray, head_rid: int | None) -> tuple[np.ndarray, int]:
        useful = int(tokens.sum())
        used = self.alloc.used_slots
        external = self._external(head_rid)
        parts = np.array([useful, 0, used - useful, external, 0, self.alloc.free_slots - external], dtype=np.int64)
        return parts, 0

    def segment_integrals(self, tokens: np.ndarray, plan: None, d: np.ndarray, head_rid: int | None,
                          plan_steps: np.ndarray) -> tuple[np.ndarray, float, int]:
        """Σ_j d_j · parts_j over decode steps: only useful (T0 + n·s) moves; reservations stay put."""
        D, DS = float(d.sum()), float(d @ plan_steps[1 : len(d) + 1])
        useful = int(tokens.sum()) * D + len(tokens) * DS
        external = self._external(head_rid)
        parts = np.array([useful, 0.0, self.alloc.used_slots * D - useful, external * D, 0.0,
                          (self.alloc.free_slots - external) * D])
        return parts, 0.0, 0

    releases_in_segment = True

    def finish_segment(self, rids: np.ndarray, tokens: np.ndarray, remaining: np.ndarray, d: np.ndarray,
                       useful: np.ndarray) -> tuple[int, np.ndarray, float]:
        """As PagedPolicy.finish_segment; regions never grow, so every step fits; a leaving request's region
        is free from the step after its last. Nobody waits in such a run: no external fragmentation."""
        k = len(d)
        alive = np.arange(k, dtype=np.int64)[None, :] < remaining[:, None]
        other = self.alloc.used_slots - int(self.reserved[rids].sum())  # regions of requests not in this run
        used = other + self.reserved[rids] @ alive
        parts = np.array([float(d @ useful), 0.0, float(d @ (used - useful)), 0.0, 0.0,
                          float(d @ (self.capacity_slots - used))])
        return k, parts, 0.0

    def check(self) -> None:
        self.alloc.check_invariants()

    def check_whole(self) -> None:
        self.alloc.check_whole()


def mooncake_prompt_keys(hash_ids: np.ndarray, hash_offsets: np.ndarray, prompt: np.ndarray, block_size: int,
                         prefix_block_tokens: int = 512) -> list[np.ndarray]:
    """Per request, the content key of each full B-block of its prompt: hash_id · (512/B) + sub-block.

    Mooncake gives one id per 512-token block (equal ids = equal tokens), so B must divide 512.
    """
    if prefix_block_tokens % block_size:
        raise ValueError(f"--block {block_size} does not divide Mooncake's {prefix_block_tokens}-token hash blocks; "
                         "use a power of two up to 512")
    per = prefix_block_tokens // block_size
    keys = []
    for i in range(len(prompt)):
        ids = hash_ids[hash_offsets[i] : hash_offsets[i + 1]]
        full = min(int(prompt[i]) // block_size, len(ids) * per)  # keys only where hash ids say what is there
        sub = np.arange(full, dtype=np.int64)
        keys.append(ids[sub // per] * per + sub % per)
    return keys
