"""A private hybrid pool's decode growth kept as counts (GroupedPagedPolicy, paged_groups.py): the pool hears of it
later, in one append per request (`settle`).

In a private pool (no prefix caching, fork or speculative slot: HybridPool.private) which block ids a table holds
matters to nobody, and what a sequence holds is a function of its length and of where each kind of group's tables
start (`num_skipped`). A decode growth of every running request by one token — the engine's commonest pool call —
is therefore decided and recorded here in plain integers, with HybridPool.advance_private's rule: per request of t
tokens and kind of group (`count` tables, `skipped` blocks freed so far), the tables are ceil(t / B) long, the first
block kept once the step has freed is f = max(skipped, first_block(t, t + 1)) (skipped for a kind that frees
nothing), the step takes count · (ceil((t + 1) / B) − max(ceil(t / B), f)) fresh blocks and frees
count · max(0, min(f, ceil(t / B)) − skipped). The request then holds count · (ceil(t' / B) − f) blocks of the kind,
with t' − B · f tokens written in them (a state page: B, a whole state; HybridPool.state_slack).

An admission is counted too (its tables start at HybridPool._private_firsts), and a request that leaves before the
pool settles never reaches it; one the pool holds is released there (whatever its tables hold: no settling needed).
The pool itself is updated (`settle`: HybridPool.advance_private of each request's pending tokens, chunk 1 — what a
run of decode steps does, so the tables and invariants are those of stepping; an admission placed as it is now,
`_place`) before anything that reads or changes it otherwise: any growth the counts do not take (a refused one, a
prefill chunk), a fork, a swap, the checks, a read of the policy's `pool`. Settling goes request by request, those
whose pending steps free more than they take first, so the pool never holds more than it does before or after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from ..blocks import BLOCK_TABLE_ENTRY_BYTES
from ..pool.hybrid_ordered import held_blocks

if TYPE_CHECKING:
    from ..pool.hybrid import HybridPool


class PrivateCounts:
    """The counts (see the module docstring): per live request its tokens, where each kind's tables start, and the
    tokens its pool tables hold; totals over requests of the blocks used, the useful slots and each kind's blocks."""

    def __init__(self, pool: HybridPool) -> None:
        self.pool, self.B, self.mode = pool, pool.block_size, pool.state_mode
        kinds = pool.kinds()
        rows = pool._rows()
        self.counts = [count for _, _, count, _ in rows]
        self.leads = [lead for _, _, _, lead in rows]
        self.frees = [(i, group) for i, ((nothing, _, _, _), (group, _)) in enumerate(zip(rows, kinds, strict=True))
                      if not nothing]
        self.state = [group.kind == "state" for group, _ in kinds]
        self.total = sum(self.counts)
        self.state_tables = sum([count for count, state in zip(self.counts, self.state, strict=True) if state])
        self.tokens: dict[int, int] = {}
        self.skipped: dict[int, list[int]] = {}
        self.pool_tokens: dict[int, int] = {}  # what the pool's tables hold; < tokens: growth pending
        self.deferred: dict[int, tuple[int, int]] = {}  # admitted, not yet in the pool: (tokens, computed) then
        # align: the fill of the page each state table of a request holds past it since a jump (HybridLayout._resume),
        # let go at the request's next step; one per state table, all alike (the kind's tables are)
        self.resumed: dict[int, int] = {}
        self.state_kind = next((i for i, state in enumerate(self.state) if state), -1)
        self.used = self.useful = self.written = 0  # blocks; slots of whole states and tokens; tokens written
        self.kind_blocks = [0] * len(kinds)  # Σ over requests of one table's blocks per kind
        self.group_kinds = [0] * len(pool.pools)  # each group's kind (an index into the pool's kinds)
        for i, (_, members) in enumerate(kinds):
            for g in members:
                self.group_kinds[g] = i

    # ---- one request's holdings ------------------------------------------------------------------------
    def _add(self, tokens: int, skipped: list[int], sign: int) -> None:
        """Add (sign 1) or take away (−1) what a request of `tokens` with tables starting at `skipped` holds."""
        B, length = self.B, -(-tokens // self.B)
        for i, (count, first) in enumerate(zip(self.counts, skipped, strict=True)):
            held, written = length - first, tokens - B * first
            self.kind_blocks[i] += sign * held
            self.used += sign * count * held
            self.written += sign * count * written
            self.useful += sign * count * (held * B if self.state[i] else written)

    def _move(self, t: int, old: list[int], t2: int, new: list[int]) -> None:
        """A request goes from `t` tokens with tables starting at `old` to `t2` starting at `new` (≥ old each): `_add`
        of the one less `_add` of the other, in one pass. Every table grows by g = ceil(t2 / B) − ceil(t / B) blocks
        and t2 − t tokens; a kind whose start moves by d holds d blocks and B·d tokens (state: slots) fewer."""
        B = self.B
        g, dt = -(-t2 // B) + (t // -B), t2 - t  # t // -B = −ceil(t / B)
        self.used += self.total * g
        self.written += self.total * dt
        self.useful += self.state_tables * g * B + (self.total - self.state_tables) * dt
        if g:
            self.kind_blocks = [held + g for held in self.kind_blocks]
        for i, _ in self.frees:
            d = new[i] - old[i]
            if d:
                count = self.counts[i]
                self.kind_blocks[i] -= d
                self.used -= count * d
                self.written -= count * B * d
                self.useful -= count * B * d

    def _past(self, fill: int, sign: int) -> None:
        """Add (sign 1) or take away (−1) a request's pages past its state tables, `fill` tokens each (B useful)."""
        count = self.state_tables
        self.kind_blocks[self.state_kind] += sign
        self.used += sign * count
        self.written += sign * count * fill
        self.useful += sign * count * self.B

    def _let_go(self, rid: int) -> None:
        """The pages `rid` holds past its tables let go (at its next step or release)."""
        fill = self.resumed.pop(rid, None)
        if fill is not None:
            self._past(fill, -1)

    def admitted(self, rid: int) -> None:
        """`rid` is in the pool as it stands (allocated, or grown by the pool itself): its holdings read from its
        tables, and the pages it holds past them (align)."""
        pool = self.pool
        tokens = pool.pools[0].seqs[rid].num_tokens
        skipped = [pool.pools[lead].seqs[rid].num_skipped for lead in self.leads]
        self.tokens[rid] = self.pool_tokens[rid] = tokens
        self.skipped[rid] = skipped
        self._add(tokens, skipped, 1)
        pages = pool._resumed.get(rid) if pool._resumed else None
        if pages:
            fills = {int(pool.store.fill[block]) for _, block in pages.values()}
            assert len(pages) == self.state_tables and len(fills) == 1, f"request {rid}: pages held past its tables"
            self.resumed[rid] = fills.pop()
            self._past(self.resumed[rid], 1)

    def admit(self, rid: int, tokens: int, computed: int) -> None:
        """`rid` admitted with `tokens`, `computed` of them held already (a swap-in): HybridPool.allocate_private's
        tables, each kind's starting at its first block (_private_firsts), kept as counts until the pool settles."""
        skipped = self.pool._private_firsts(tokens, computed)
        self.tokens[rid], self.skipped[rid], self.pool_tokens[rid] = tokens, skipped, 0
        self.deferred[rid] = (tokens, computed)
        self._add(tokens, skipped, 1)

    def released(self, rid: int) -> bool:
        """`rid` leaves; whether the pool holds it (else it never heard of it, and nothing is left to free)."""
        self._add(self.tokens.pop(rid), self.skipped.pop(rid), -1)
        self._let_go(rid)
        del self.pool_tokens[rid]
        return self.deferred.pop(rid, None) is None

    # ---- decode growth -----------------------------------------------------------------------------------
    def step(self, ids: list[int], free: int, credit: bool) -> bool:
        """HybridPool.advance_private(ids, 1, 1, check=True, credit=credit) where it grows them all: done in the
        counts, True; False where the growth does not fit in `free` blocks (+ its own frees, with `credit`):
        nothing done (the caller settles and asks the pool, whose refusal frees what it frees)."""
        B, mode, counts, frees, tokens, skipped = self.B, self.mode, self.counts, self.frees, self.tokens, self.skipped
        total, resumed = self.total, self.resumed
        need = gone = 0
        moves = []
        for rid in ids:
            if resumed and rid in resumed:  # align: the page held past its state tables, let go first
                gone += self.state_tables
            t = tokens[rid]
            held = -(-t // B)
            old = skipped[rid]
            new = old[:]
            # each table takes ceil((t + 1) / B) − max(held, first) fresh blocks: 1 where t fills whole blocks, less
            # any first block past its end (`over`; a kind that frees nothing starts at 0)
            over = 0
            for i, group in frees:
                new[i] = first = max(old[i], group.first_block(t, t + 1, B, mode))
                gone += counts[i] * max(0, min(first, held) - old[i])
                over += counts[i] * max(0, first - held)
            need += (0 if t % B else total) - over
            moves.append((rid, t, old, new))
        if need > free + (gone if credit else 0):
            return False
        for rid, t, old, new in moves:
            if resumed:
                self._let_go(rid)
            self._move(t, old, t + 1, new)
            tokens[rid], skipped[rid] = t + 1, new
        return True

    def run(self, ids: list[int], k: int) -> None:
        """k decode steps of each of `ids` (a run found to fit: HybridPool.advance_private(ids, k, 1, check=False)):
        each kind's tables start where the last step's free left them."""
        B, mode, tokens, skipped = self.B, self.mode, self.tokens, self.skipped
        for rid in ids:
            if self.resumed:
                self._let_go(rid)
            t, old = tokens[rid], skipped[rid]
            new = old[:]
            for i, group in self.frees:
                new[i] = max(old[i], group.first_block(t + k - 1, t + k, B, mode))
            self._move(t, old, t + k, new)
            tokens[rid], skipped[rid] = t + k, new

    # ---- the pool ----------------------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        return self.tokens != self.pool_tokens

    def settle(self) -> None:
        """The pool's tables brought to the counts (module docstring), then checked against them."""
        if self.tokens == self.pool_tokens:
            return
        pool, B = self.pool, self.B
        late = []
        for rid, t in self.tokens.items():
            if t != self.pool_tokens[rid]:
                before = 0
                if rid not in self.deferred:
                    seqs = [pool.pools[lead].seqs[rid] for lead in self.leads]
                    before = sum(count * (seq.num_blocks - seq.num_skipped) for count, seq in zip(self.counts, seqs,
                                                                                                   strict=True))
                    before += len(pool._resumed.get(rid, ())) if pool._resumed else 0  # (align: past the tables)
                after = sum(count * (-(-t // B) - first) for count, first in zip(self.counts, self.skipped[rid],
                                                                                 strict=True))
                late.append((after - before, rid, t - self.pool_tokens[rid]))
        for _, rid, add in sorted(late):  # those that shrink first: the pool never holds more than before or after
            if rid in self.deferred:
                self._place(rid)
            else:
                pool.advance_private([rid], add, 1, check=False)
            self.pool_tokens[rid] = self.tokens[rid]
            assert [pool.pools[lead].seqs[rid].num_skipped for lead in self.leads] == self.skipped[rid], (
                f"request {rid}: the pool's tables start at other blocks than the counts say")
        self.check()

    def _place(self, rid: int) -> None:
        """A deferred admission into the pool, at once where it is now: allocate_private of its tokens t from
        `computed` on — its admission's, or t − 1 once it has decoded, whose first blocks are those its last decode
        step kept (first_block grows with the tokens computed: the check after settling holds it to that); only
        the store's count of prompt tokens, which nothing in a private run reads, differs from stepping."""
        tokens, computed = self.deferred.pop(rid)
        t = self.tokens[rid]
        self.pool.allocate_private(rid, t, computed if t == tokens else t - 1)

    def check(self) -> None:
        """The pool (settled) holds what the counts say."""
        pool = self.pool
        store = pool.store
        useful = store.useful_tokens + pool.state_slack()
        groups = [self.kind_blocks[i] for i in self.group_kinds]
        held = (store.num_used, useful, store.useful_tokens, [p.logical_blocks for p in pool.pools])
        assert held == (self.used, self.useful, self.written, groups), (
            f"pool {store.num_used} blocks / {useful} useful slots, the counts {self.used} / {self.useful}")

    def resync(self) -> None:
        """The counts read again from the pool (settled, after an operation the counts did not take)."""
        pool = self.pool
        assert not self.deferred, "resync of counts with admissions the pool has not heard of"
        self.tokens, self.skipped, self.pool_tokens, self.resumed = {}, {}, {}, {}
        self.used = self.useful = self.written = 0
        self.kind_blocks = [0] * len(self.counts)
        for rid in list(pool.pools[0].seqs):
            self.admitted(cast("int", rid))  # the policy's sequences are request ids


class CountedPolicy:
    """GroupedPagedPolicy's side of the counts: made at the first call that finds the pool private (`_counts_now`),
    kept through its decode growth, the pool settled when read from outside (`pool`) or asked (`sync`)."""

    _pool: HybridPool
    block_size: int
    capacity_slots: int

    @property
    def _private(self) -> bool:  # pragma: no cover - GroupedPagedPolicy's
        raise NotImplementedError

    @property
    def pool(self) -> HybridPool:
        """The pool, brought up to date with the decode growth kept as counts (group_counts): what a caller outside
        reads. This module's own hot paths read `_pool`, which may lag behind the counts."""
        if self._counts is not None:
            self._counts.settle()
        return self._pool

    @pool.setter
    def pool(self, pool: HybridPool) -> None:
        self._pool, self._counts = pool, None


    def advance_private(self, ids: list[int], k: int) -> None:
        """k decode steps of each of `ids`, found to fit (HybridPool.advance_private(ids, k, 1, check=False)): in
        the counts where they are kept (group_counts)."""
        counts = self._counts_now()
        if counts is None:
            self._pool.advance_private(ids, k, 1, check=False)
        else:
            counts.run(ids, k)

    def num_seqs(self) -> int:
        """Sequences holding blocks now (the counts' where they are kept)."""
        counts = self._counts_now()
        return len(self._pool.pools[0].seqs) if counts is None else len(counts.tokens)

    def num_used(self) -> int:
        """Blocks used now (the counts' where they are kept)."""
        counts = self._counts_now()
        return self._pool.num_used if counts is None else counts.used

    def _free_blocks(self) -> int:
        counts = self._counts_now()
        return self._pool.num_free_blocks if counts is None else self._pool.num_blocks - counts.used

    lazy_counts = True  # a private pool's decode growth kept as counts (group_counts); False: the pool at once

    def _counts_now(self) -> PrivateCounts | None:
        """The counts of a private pool (made at the first call that finds the pool private), else None."""
        if self._paused or not self._private:
            return None
        if self._counts is None and self.lazy_counts:
            self._counts = PrivateCounts(self._pool)
            self._counts.resync()
        return self._counts

    _counts: PrivateCounts | None = None
    _paused = False  # the pool is being changed itself (grow_many's pool path): no counts meanwhile


    def sync(self) -> None:
        """The pool brought up to date with the counts of its decode growth (group_counts), if any."""
        if self._counts is not None:
            self._counts.settle()

    def parts(self, tokens: np.ndarray, head_rid: int | None) -> tuple[np.ndarray, int]:
        """(slots per MEMORY_PARTS [6], block-table bytes): the pool's own accounting (a state page's
        slots count as used and useful: a whole state; tail fragmentation is the attention blocks' unused slots)."""
        counts = self._counts_now()
        if counts is not None:  # the same totals, from the counts (group_counts: checked when the pool settles)
            used = counts.used * self.block_size
            return (np.array([counts.useful, used - counts.useful, 0, 0, 0, self.capacity_slots - used],
                             dtype=np.int64), counts.used * BLOCK_TABLE_ENTRY_BYTES)
        if self._private:  # the store's running totals: no block is cached, shared or of another size
            store, pools = self._pool.store, self._pool.pools
            used = store.num_used * self.block_size
            useful = store.useful_tokens + self._pool.state_slack()
            return (np.array([useful, used - useful, 0, 0, 0, self.capacity_slots - used],
                             dtype=np.int64), sum(p.logical_blocks for p in pools) * BLOCK_TABLE_ENTRY_BYTES)
        usage = self._pool.usage()
        slots = usage.block_size  # a block's slots: the block size, or the lcm of the groups' (group_blocks, mixed)
        used, cached = usage.used_blocks * slots, usage.cached_free_blocks * slots
        parts: np.ndarray = np.array([usage.useful_tokens, usage.tail_fragmentation_slots, 0, 0, cached,
                                      usage.num_blocks * slots - used - cached], dtype=np.int64)
        if slots != self.block_size:  # the same shares, in the slots of `block_size` a block (capacity_slots)
            parts = parts * (self.block_size / slots)
        return parts, usage.logical_blocks * BLOCK_TABLE_ENTRY_BYTES

    def group_blocks(self) -> list[int]:
        """Blocks each group's tables hold now (a block is in one group only; in a private pool, in one table)."""
        counts = self._counts_now()
        if counts is not None:
            return [counts.kind_blocks[i] for i in counts.group_kinds]
        if self._private:
            return [p.logical_blocks for p in self._pool.pools]
        return held_blocks(self._pool)  # pool.group_usage()'s held blocks, in one pass
