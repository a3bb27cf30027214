"""The `paged` memory policy: the real block pool (core/pool), block size B, prefix caching from content
keys (Mooncake hash_ids, or token ids). See policies.py for the interface the scheduler uses; paged_exact.py
keeps block tables current at every step, for plans that carry slots."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import numpy as np

from ..blocks import BLOCK_TABLE_ENTRY_BYTES, ceil_div
from ..pool.block_pool import BlockPool, ReleaseReason
from ..pool.register_full import register_full
from .decode_plan import SMALL_BATCH, decode_steps_plan
from .output_keys import register_released
from .policies import UNLIMITED_STEPS

_sum = np.add.reduce  # what ndarray.sum calls, without its Python wrapper: the same sums


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

    Without a prefix cache (and without exact block tables) an admission's blocks are owed in the same way
    (`lazy_admission`): which blocks a request holds can then decide nothing — every check counts free blocks,
    and the owed ones come off the same count — so the pool hears of a request only when a caller asks for
    its accounting (`sync`), and a release forgives what was never taken (a pool allocate and release cost
    ~20 us a request: ~0.4 s of the Azure conversation trace).
    """

    name = "paged"
    exact_block_tables = False

    def __init__(self, num_blocks: int, block_size: int, num_requests: int,
                 prompt_keys: list | np.ndarray | None = None) -> None:
        self.block_size = block_size
        self.capacity_slots = num_blocks * block_size
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching=prompt_keys is not None)
        # per request, the content key of each full block of its prompt: an int64 array (Mooncake ids) or a
        # list of tuples of token ids; None: no prefix caching
        self.prompt_keys = prompt_keys
        self.pool_tokens = np.zeros(num_requests, dtype=np.int64)  # tokens the pool has been told of
        self.held_tokens = np.zeros(num_requests, dtype=np.int64)  # tokens with room reserved for them
        self.held_blocks = np.zeros(num_requests, dtype=np.int64)  # = ceil(held_tokens / B) while live
        self.owed_blocks = 0  # Σ over live requests of held_blocks − the blocks the pool has given them
        self.owing: set[int] = set()
        self.lazy_admission = prompt_keys is None and not self.exact_block_tables  # see the class docstring

    # ---- free blocks, counting what is owed ---------------------------------------------------------
    @property
    def pool(self) -> BlockPool:
        return self._pool

    @pool.setter
    def pool(self, pool: BlockPool) -> None:
        """The pool, and its free queue: len(self._free) is pool.num_free_blocks without the property's calls
        (a subclass may set a pool of its own: spec_run.SpeculativePagedPolicy)."""
        self._pool, self._free = pool, pool.store.queue

    @property
    def free_blocks(self) -> int:
        return self.pool.num_free_blocks - self.owed_blocks

    def _pool_append(self, rid: int) -> list[tuple[int, int]]:
        """One pool append of every token `rid` has room for since the last one; the copy-on-write copies."""
        old, total = int(self.pool_tokens[rid]), int(self.held_tokens[rid])
        self.owing.discard(rid)
        if old == total:
            return []
        if not old and rid not in self.pool.seqs:  # admitted lazily: the pool hears of it now
            self.pool.allocate(rid, total)
            self.pool_tokens[rid] = total
            return []
        keys = self._keys(rid)
        block_keys = None
        if keys is not None and old // self.block_size < len(keys):
            block_keys = keys[old // self.block_size : min(total // self.block_size, len(keys))]
        copies = self.pool.append(rid, total - old, block_keys)
        self.pool_tokens[rid] = total
        return copies

    def _settle(self, rid: int) -> None:
        """Take the blocks `rid` owes from the pool."""
        before = self.pool.num_free_blocks
        copies = self._pool_append(rid)
        assert not copies, f"request {rid}: a private tail block needed copy-on-write {copies}"
        self.owed_blocks -= before - self.pool.num_free_blocks

    def _live_ids(self) -> Iterable[int]:
        """The requests the pool holds. The pool keys sequences by any hashable id; this policy gives it only
        request ids (ints), which mypy cannot follow through BlockPool: hence the cast."""
        return cast("Iterable[int]", self.pool.seqs)

    def _settle_all(self) -> None:
        for rid in sorted(self.owing):
            self._settle(rid)
        assert self.owed_blocks == 0, f"{self.owed_blocks} blocks still owed after settling"

    # ---- admission ---------------------------------------------------------------------------------
    def never_fits(self, rid: int, total_tokens: int) -> bool:
        """A request whose whole KV (prompt + output − 1 tokens) exceeds the pool can never run."""
        return ceil_div(max(total_tokens - 1, 1), self.block_size) > self.pool.num_blocks

    def _keys(self, rid: int) -> np.ndarray | list | None:
        return None if self.prompt_keys is None else self.prompt_keys[rid]

    def hit_tokens(self, rid: int, num_tokens: int) -> int:
        """Prefix-cache hit of an admission of `num_tokens` to compute (0 without hash ids); a pure look-up."""
        keys = self._keys(rid)
        if keys is None:
            return 0
        self._settle_all()
        return self.pool.hit_tokens(num_tokens, keys)

    def can_admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        keys = None if from_swap else self._keys(rid)
        if keys is None:
            # NOTE: without a prefix cache nothing is a hit; in particular KV swapped back in (`from_swap`,
            # start_tokens = the swapped tokens) needs fresh blocks for every token, start included. Counting
            # its start as held let a swap-in take blocks owed to running requests, whose next growth then
            # preempted it again at once (~3x the preemptions of recompute).
            return -(-total_tokens // self.block_size) <= len(self._free) - self.owed_blocks
        self._settle_all()
        return self.pool.can_allocate(total_tokens, keys[: total_tokens // self.block_size])

    def admit(self, rid: int, start_tokens: int, total_tokens: int, from_swap: bool = False) -> bool:
        """Blocks for `total_tokens`, of which `start_tokens` are prefix-cache hits (a multiple of B) or,
        `from_swap`, KV swapped back in from the host (fresh blocks, no cache look-up)."""
        if self.lazy_admission:  # no hit, from a swap or not: every block fresh, owed (class docstring)
            blocks = -(-total_tokens // self.block_size)
            if blocks > len(self._free) - self.owed_blocks:
                return False
            assert not start_tokens or from_swap, f"request {rid}: a hit of {start_tokens} without a prefix cache"
            self.held_tokens[rid] = total_tokens
            self.held_blocks[rid] = blocks
            self.owed_blocks += blocks
            self.owing.add(rid)
            return True
        if not self.can_admit(rid, start_tokens, total_tokens, from_swap):
            return False
        keys = None if from_swap else self._keys(rid)
        hit = self.pool.allocate(rid, total_tokens, None if keys is None else keys[: total_tokens // self.block_size])
        assert hit == (0 if from_swap else start_tokens), f"request {rid}: pool hit {hit}, probe said {start_tokens}"
        self.pool_tokens[rid] = self.held_tokens[rid] = total_tokens
        self.held_blocks[rid] = ceil_div(total_tokens, self.block_size)
        return True

    # ---- growth --------------------------------------------------------------------------------------
    def grow_many(self, rids: np.ndarray, totals: np.ndarray, new_blocks: int | None = None,
                  check: bool = True) -> bool:
        """Room for `totals[i]` tokens for every request, or (False) no change at all. `new_blocks`, when
        the caller knows it (a fast-forwarded run), saves recounting; `check=False` when the caller has
        checked the fit step by step (requests that finished inside a fast-forwarded run)."""
        blocks = None
        if new_blocks is None:
            blocks = (totals + (self.block_size - 1)) // self.block_size
            new_blocks = int(_sum(blocks - self.held_blocks[rids]))
            if check and new_blocks > len(self._free) - self.owed_blocks:
                return False
        self.held_tokens[rids] = totals
        if new_blocks:
            self.held_blocks[rids] = (totals + (self.block_size - 1)) // self.block_size if blocks is None else blocks
            self.owed_blocks += new_blocks
            self.owing.update(rids.tolist())  # settling skips those whose pool count is current
        elif self.prompt_keys is not None:
            for i in np.flatnonzero(totals % self.block_size == 0).tolist():
                self._filled(int(rids[i]), int(totals[i]))
        return True

    def _filled(self, rid: int, total: int) -> None:
        """`rid` filled a keyed block without a new one: it owes an append, registered before the next look-up."""
        if total // self.block_size <= len(self.prompt_keys[rid]):  # type: ignore[index]
            self.owing.add(rid)

    def grow(self, rid: int, total: int) -> bool:
        """grow_many for one request, in plain ints."""
        blocks = -(-total // self.block_size)
        new_blocks = blocks - int(self.held_blocks[rid])
        if new_blocks > len(self._free) - self.owed_blocks:
            return False
        self.held_tokens[rid] = total
        if new_blocks:
            self.held_blocks[rid] = blocks
            self.owed_blocks += new_blocks
            self.owing.add(rid)
        elif self.prompt_keys is not None and not total % self.block_size:
            self._filled(rid, total)
        return True

    def decode_steps_available(self, tokens: np.ndarray) -> tuple[int, np.ndarray | None]:
        """(the most decode steps the free blocks cover, a plan for `segment_integrals`): decode_steps_plan."""
        if not len(tokens):
            return UNLIMITED_STEPS, None
        k, plan = decode_steps_plan(tokens, self.block_size, len(self._free) - self.owed_blocks)
        return k, np.asarray(plan, dtype=np.float64)  # the plan's counts as floats (exact): segment_integrals's

    # ---- release ---------------------------------------------------------------------------------------
    def release(self, rid: int, reason: ReleaseReason | str) -> None:
        """With a prefix cache, every owed block is taken first (the LRU order of the freed blocks is then the
        order of taking them at once); without one, the blocks `rid` owes are forgiven: counted as taken while
        it ran, they are free again now, and which block ids they would have been cannot matter."""
        reason = reason if isinstance(reason, ReleaseReason) else ReleaseReason(reason)
        if self.prompt_keys is not None:
            if self.pool_tokens[rid] != self.held_tokens[rid]:  # a block it filled without a new one: told too
                self.owing.add(rid)
            self._settle_all()  # then its full blocks holding sampled tokens are cached, as vLLM's (output_keys)
            tokens = self.pool.committed_tokens(rid)
            register_released(register_full, self.pool, self.prompt_keys, rid, tokens, self.block_size, reason)
        elif rid in self.owing:
            self.owing.discard(rid)
            self.owed_blocks -= int(self.held_blocks[rid]) - ceil_div(int(self.pool_tokens[rid]), self.block_size)
        if self.lazy_admission and not self.pool_tokens[rid]:  # admitted lazily, never settled: the pool holds none
            assert self.held_tokens[rid], f"request {rid} is not live: released twice or never admitted"
        else:
            self.pool.release(rid, reason)
        self.pool_tokens[rid] = self.held_tokens[rid] = self.held_blocks[rid] = 0

    # ---- block detail: only exact block tables have it (paged_exact.py) ------------------------------
    def fork(self, parent: int, child: int) -> None:
        raise ValueError("parallel sampling (forks) needs block tables kept exact: use ExactPagedPolicy")

    def block_table(self, rid: int) -> np.ndarray:
        raise AssertionError("this policy owes blocks to the pool between steps: its block tables are not current")

    def take_copies(self) -> list[tuple[int, int]]:
        return []  # without forks no block is shared while partially filled (asserted when settling)

    def sync(self) -> None:
        """Tell the pool every token and block it has not heard of (tests compare its accounting)."""
        for rid in self._live_ids():
            if self.pool_tokens[rid] != self.held_tokens[rid]:
                self.owing.add(rid)
        self._settle_all()

    # ---- memory ------------------------------------------------------------------------------------------
    def pool_state(self) -> tuple[int, int, int]:
        """(used, plain free, cached free) blocks of the pool, with the owed blocks not yet taken."""
        free = self._free  # the pool's counts, read from its store without the pool's properties
        cached = free.num_cached
        return self.pool.store.num_used, len(free) - cached, cached

    def _evicted(self, m: Any) -> Any:
        """E(m): cache entries among the free queue's first m blocks (m an int or an int array)."""
        return self._free.evictions_within(int(np.max(m)))[m]

    def parts(self, tokens: np.ndarray, head_rid: int | None) -> tuple[np.ndarray, int]:
        """(slots per MEMORY_PARTS [6], block-table bytes) now, running requests holding `tokens` [n]."""
        B = self.block_size
        if len(tokens) <= SMALL_BATCH:  # plain ints cost less than numpy's calls on a few values
            held = tokens.tolist()
            table = sum([-(-t // B) for t in held])
            tail = table * B - sum(held)
        else:
            table = int(ceil_div(tokens, B).sum())
            tail = table * B - int(tokens.sum())
        used0, _, cached0 = self.pool_state()
        used = (used0 + self.owed_blocks) * B  # owed blocks come off the free queue's head, evicting its entries
        cached = (cached0 - self._evicted(self.owed_blocks)) * B if cached0 else 0
        parts = np.array([used - tail, tail, 0, 0, cached, self.capacity_slots - used - cached], dtype=np.int64)
        return parts, table * BLOCK_TABLE_ENTRY_BYTES

    def segment_integrals(self, tokens: np.ndarray, plan: np.ndarray | None, d: np.ndarray, head_rid: int | None,
                          plan_steps: np.ndarray) -> tuple[np.ndarray, float, int]:
        """(Σ_j d_j · parts_j [6], Σ_j d_j · block-table bytes_j, new blocks) over k = len(d) decode steps
        from `tokens`; `plan_steps` = 0, 1, 2, … (at least k + 1 of them).

        Step j (s = j + 1) holds tokens + s per request and has taken need(s) more blocks:
            used = used0 + owed + need(s)      tail = (table0 + need(s))·B − (T0 + n·s)
            useful = used·B − tail             cached = cached0 − E(owed + need(s))
        (E(m): the cache entries among the free queue's first m blocks, which the next m hand-outs evict)
        so each integral is a combination of Σd, Σd·s, Σd·need(s) and Σd·evicted(s).
        """
        assert plan is not None, "decode_steps_available gives a plan whenever a request runs"
        B, n, k = self.block_size, len(tokens), len(d)
        s = plan_steps[1 : k + 1]
        need = (s // B) * n + plan[s % B]
        table0 = int(ceil_div(tokens, B).sum())
        t0 = int(tokens.sum())
        used0, _, cached0 = self.pool_state()
        used0 += self.owed_blocks
        D, DS, DN = float(d.sum()), float(d @ s), float(d @ need)
        DE = 0.0
        if cached0:
            DE = float(d @ self._evicted(self.owed_blocks + need.astype(np.int64)))
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

    def check_whole(self) -> None:
        """After the run: every block free, no sequence live, nothing owed, invariants hold."""
        self.pool.check_invariants()
        live = len(self.pool.seqs) + len([r for r in self.owing if r not in self.pool.seqs])  # lazily admitted too
        assert not live, f"{live} sequences still hold blocks after the run"
        assert self.owed_blocks == 0 and not self.owing, f"{self.owed_blocks} blocks still owed after the run"
        assert self.pool.num_used == 0 and self.pool.num_free_blocks == self.pool.num_blocks, "pool not whole"


def mooncake_prompt_keys(hash_ids: np.ndarray, hash_offsets: np.ndarray, prompt: np.ndarray,
                        block_size: int) -> list[np.ndarray]:
    """Per request, the content key of each full B-block of its prompt, keyed as `kvcalc share` keys it
    (core/share/replay_groups.trace_block_keys: exact when B tiles the 512-token ids, see
    traces.mooncake_block_keys; a block that does not — a Mamba hybrid's forced block — by the id holding its
    last token, hits then a lower bound); the ids are checked to be prefix-chained first where a key is one id."""
    from ..share.replay_groups import check_ids_key_blocks, trace_block_keys  # prefix caching only
    check_ids_key_blocks(hash_ids, hash_offsets, block_size)
    return [
        trace_block_keys(hash_ids[hash_offsets[i] : hash_offsets[i + 1]], int(prompt[i]), block_size,
                         f"request {i + 1}: ")
        for i in range(len(prompt))
    ]
