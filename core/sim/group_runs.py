"""What a hybrid pool holds through a run of k decode steps, in closed form (GroupedPagedPolicy.decode_run and
fastforward_groups' runs through finishes), all kinds of group at once.

In step j (0-based) request i grows from c = t_i + j to c + 1 tokens: each table of a kind first frees the blocks
before its first block f(c) (pool.hybrid_private.first_blocks), then grows to ceil((c + 1) / B) entries, so it
holds ceil((c + 1) / B) − f(c) blocks with c + 1 − B · f(c) tokens written in them. Summed over the requests in
step j (all of them, or those with more than j tokens to go) and over tables (a kind's count of them):

    held[kind, j], written[kind, j]   per table of the kind;  used[j] = Σ count · held
    peak[j]    blocks held once the pool update after a run of j + 1 steps (hybrid_private.advance_private) has
               grown every request still running then from f(t_i) to t_i + j + 1 tokens, before it frees
    kept[j], kept_written[j]   what those requests hold after such a run (the pool's count then, `check_run`)

Every sum is over exact integers, so the figures are those of stepping, bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from ..blocks import BLOCK_TABLE_ENTRY_BYTES
from ..pool.groups import PoolGroup
from ..pool.hybrid import HybridPool
from ..pool.hybrid_private import first_blocks
from ..pool.hybrid_runs import DecodeRun

if TYPE_CHECKING:
    from .group_counts import PrivateCounts


class GroupedPolicy(Protocol):
    """What a run's closed form reads of GroupedPagedPolicy (paged_groups, which imports this module)."""

    block_size: int
    _pool: HybridPool

    def _kinds(self) -> list[tuple[PoolGroup, int]]: ...
    def num_used(self) -> int: ...
    def _counts_now(self) -> PrivateCounts | None: ...


class RunForm(NamedTuple):
    held: np.ndarray  # int64 [kinds, k]
    written: np.ndarray  # int64 [kinds, k]
    used: np.ndarray  # int64 [k]
    peak: np.ndarray  # int64 [k]
    kept: np.ndarray  # int64 [k]
    kept_written: np.ndarray  # int64 [k]


def run_form(policy: GroupedPolicy, tokens: np.ndarray, k: int, remaining: np.ndarray | None = None) -> RunForm:
    """The closed form of k decode steps of requests holding `tokens` [n] (≥ 1 each); `remaining` [n]: the tokens
    each has to go (it leaves after its last; None: every request runs all k steps)."""
    B, mode = policy.block_size, policy._pool.state_mode
    steps = np.arange(k, dtype=np.int64)
    computed = tokens[:, None] + steps  # [n, k]
    kinds = policy._kinds()
    counts = np.array([count for _, count in kinds], dtype=np.int64)
    firsts = [first_blocks(group, computed, B, mode) for group, _ in kinds]
    freeing = [i for i, f in enumerate(firsts) if not isinstance(f, int)]
    # the quantities summed over requests: table length, tokens written, and each freeing kind's first block
    terms = np.empty((2 + len(freeing), *computed.shape), dtype=np.int64)  # [2 + m, n, k]
    np.floor_divide(computed + B, B, out=terms[0])
    np.add(computed, 1, out=terms[1])
    for row, i in enumerate(freeing, 2):
        terms[row] = firsts[i]
    starts = terms[2:, :, 0]  # [m, n]: f(t_i), where the pool update grows from
    if remaining is None:
        live = kept = terms.sum(axis=1)  # [2 + m, k]
        start_sums = np.repeat(starts.sum(axis=1)[:, None], k, axis=1)  # [m, k]
    else:
        live = (terms * (steps < remaining[:, None])).sum(axis=1)
        survive = steps + 1 < remaining[:, None]  # [n, k]: still running after a run of j + 1 steps
        kept = (terms * survive).sum(axis=1)
        start_sums = starts @ survive
    first_sums = np.zeros((len(kinds), k), dtype=np.int64)
    first_sums[freeing] = live[2:]
    held = live[0] - first_sums
    written = live[1] - B * first_sums
    total, freeing_counts = int(counts.sum()), counts[freeing]
    return RunForm(held, written, counts @ held, total * kept[0] - freeing_counts @ start_sums,
                   total * kept[0] - freeing_counts @ kept[2:], total * kept[1] - B * (freeing_counts @ kept[2:]))


def check_run(policy: GroupedPolicy, form: RunForm, k: int) -> None:
    """The pool after a run of k steps (advance_private) holds what the closed form says the requests still
    running hold: used blocks (each in one table) and the tokens written in them (the counts', where the pool's
    decode growth is kept as counts: group_counts, whose settling checks the pool against them)."""
    used, useful = int(form.kept[k - 1]), int(form.kept_written[k - 1])
    counts = policy._counts_now()
    if counts is not None:
        assert counts.used == used and counts.written == useful, (
            f"hybrid run of {k} steps: the counts hold {counts.used} blocks / {counts.written} tokens, the closed "
            f"form {used} / {useful}")
        return
    pool = policy._pool
    store = pool.store
    logical = sum(p.logical_blocks for p in pool.pools)
    assert store.num_used == used == logical and store.useful_tokens == useful and not store.queue.num_cached, (
        f"hybrid run of {k} steps: pool holds {store.num_used} blocks ({logical} in tables) / {store.useful_tokens} "
        f"tokens, the closed form {used} / {useful}")


def covered(policy: GroupedPolicy, tokens: np.ndarray, k: int, used: np.ndarray,
            remaining: np.ndarray | None = None, *, num_used: int | None = None) -> np.ndarray | np.bool_:
    """[k] bool (or one True for all): step j's growth fits in the blocks free before it, none of its own frees
    counted (`used`: the blocks held after each step, run_form's). vLLM frees and allocates request by request,
    so a later request's frees cannot pay for an earlier one's growth; where the whole growth fits before any free,
    every request's does (GroupedPagedPolicy.grow_many steps the same way). A table opens a block when its c tokens
    fill whole blocks (c % B == 0); every table of a request grows alike (a state page of mode none, that moves in
    place, counted too: a step kept is covered, one not kept is stepped)."""
    B, pool = policy.block_size, policy._pool
    now = policy.num_used() if num_used is None else num_used  # blocks used before the run
    if not k or max(now, int(used[:k].max())) + len(pool.pools) * len(tokens) <= pool.num_blocks:
        return np.True_  # every request opening a block in every table is covered at every step
    steps = np.arange(k, dtype=np.int64)
    opens = (tokens[:, None] + steps) % B == 0  # [n, k]
    if remaining is not None:
        opens &= steps < remaining[:, None]
    before = np.concatenate((np.array([now], dtype=np.int64), used[: k - 1]))
    return before + len(pool.pools) * opens.sum(axis=0) <= pool.num_blocks


class RunMemory:
    """GroupedPagedPolicy's memory of a run's steps from its closed form, by kind of group."""

    groups: tuple[PoolGroup, ...]
    block_size: int
    capacity_slots: int

    def _kinds(self) -> list[tuple[PoolGroup, int]]:
        """The distinct groups with how many tables each (Gemma-3: full ×1, sliding ×6)."""
        if self._kinds_memo is not None:
            return self._kinds_memo
        counts: dict[PoolGroup, int] = {}
        for g in self.groups:
            key = PoolGroup(g.kind, g.window)
            counts[key] = counts.get(key, 0) + 1
        self._kinds_memo = list(counts.items())
        return self._kinds_memo

    _kinds_memo: list[tuple[PoolGroup, int]] | None = None


    def run_memory(self, form: RunForm | DecodeRun, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(parts [k, 6] int64, block-table bytes [k] int64, blocks per group [k, G] int64) of the first k
        steps of a run (`run_form`): what `parts` and `group_blocks` return after each of those steps."""
        B = self.block_size
        if isinstance(form, DecodeRun):  # the pool's usage after each step (parts' non-private form)
            return form.memory(k, self.capacity_slots)
        used = form.used[:k]
        state = np.array([g.kind == "state" for g, _ in self._kinds()])  # a state page: B useful slots, a state
        written = np.where(state[:, None], form.held[:, :k] * B, form.written[:, :k])
        useful = np.array([c for _, c in self._kinds()], dtype=np.int64) @ written
        parts = np.zeros((k, 6), dtype=np.int64)
        parts[:, 0] = useful
        parts[:, 1] = used * B - useful
        parts[:, 5] = self.capacity_slots - used * B
        return parts, used * BLOCK_TABLE_ENTRY_BYTES, form.held[self._kind_of_group(), :k].T

    def _kind_of_group(self) -> list[int]:
        """Each group's index in `_kinds` (memoised like it)."""
        if self._kind_memo is None:
            index = {group: i for i, (group, _) in enumerate(self._kinds())}
            self._kind_memo = [index[PoolGroup(g.kind, g.window)] for g in self.groups]
        return self._kind_memo

    _kind_memo: list[int] | None = None
