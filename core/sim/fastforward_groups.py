"""Runs of decode steps on a hybrid pool that go on past finishes (nobody waits): the batch shrinks as
requests reach their last token, up to the next arrival — fastforward._segment_through_finishes for a
GroupedPagedPolicy, with the figures of stepping, byte for byte.

Request i (t_i tokens, r_i tokens to go) decodes in steps j < r_i; in step j each group holds
ceil((t_i + j + 1) / B) − first(t_i + j) of its blocks (GroupedPagedPolicy.decode_run), masked by j < r_i,
and the step fits iff the blocks of the requests alive in it fit. Step j's time is the decode step of the n_j
alive requests, taken per stretch of constant n_j (the step-time model's scalar path, as a plain step takes
it); every integral is added step by step in step order (step_sums.in_order). The pool is brought up to
date after the run: the finished requests leave (in finishing order, each at its own time), then the survivors
grow by k tokens at once (_advance_pool); the run is kept only as long as that update fits the pool too.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .step_sums import add_run

if TYPE_CHECKING:
    from .paged_groups import GroupedPagedPolicy
    from .record import RunTotals
    from .scheduler import Scheduler
    from .steptime import StepTimeModel


class FastForward(Protocol):
    """What a grouped run reads of fastforward.FastForward (its caller): named here so that this module does
    not import the one that imports it."""

    scheduler: Scheduler
    steptime: StepTimeModel
    totals: RunTotals
    policy: Any

    def _steps_upto(self, k: int) -> np.ndarray: ...
    def _excess(self, tokens: np.ndarray, k: int, alive_steps: np.ndarray | None = None) -> np.ndarray | float: ...
    def _until(self) -> float: ...


def grouped_run_through_finishes(ff: FastForward) -> bool:
    """One such run from now (False: none taken — the caller takes a general step)."""
    s, st, totals, policy = ff.scheduler, ff.steptime, ff.totals, ff.policy
    run = s.running_ids
    n = len(run)
    if s.waiting or not s.steady or n == 0 or n > s.config.max_batched_tokens or not policy.runs_decode:
        return False
    if len(policy.pool.pools[0].seqs) != n:  # a sequence outside the batch holds blocks
        return False
    tokens0 = s.computed[run]
    remaining = s.stop_at[run] - s.generated[run]
    k = int(remaining.max())
    until = ff._until()
    if until < np.inf:  # no decode step is shorter than one token's (weights, overhead, one state)
        k = min(k, int((until - s.now_s) / st.decode_steps_s(1, 0.0)) + 2)
    d, alive = _step_times(ff, tokens0, remaining, k)
    ends = np.empty(k + 1)
    ends[0] = s.now_s
    ends[1:] = d
    np.cumsum(ends, out=ends)
    if until < np.inf:
        k = min(k, int(np.searchsorted(ends[:k], until, side="left")))
    k, memory = _memory(policy, tokens0, remaining, k)
    if k < 2:
        return False
    d, ends, alive = d[:k], ends[: k + 1], alive[:k]
    add_run(totals, d, ends, policy.run_memory(memory, k), alive, 0)
    taken = np.minimum(remaining, k)
    s.computed[run] = tokens0 + taken
    s.generated[run] += taken
    s.last_token_s[run] = ends[taken]
    _advance_pool(ff, run, tokens0, remaining, k, ends)
    s.now_s = float(ends[-1])
    s.steady = True
    return True


def _step_times(ff: FastForward, tokens0: np.ndarray, remaining: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(d [k]: step j's time, alive [k]: requests in step j); a stretch of constant n_j at a time."""
    st = ff.steptime
    n = len(tokens0)
    order = np.argsort(remaining, kind="stable")
    by_remaining = remaining[order]
    context_done = np.zeros(n + 1, np.int64)
    np.cumsum(tokens0[order] + 1, out=context_done[1:])
    steps = ff._steps_upto(k)[:k]
    gone = np.searchsorted(by_remaining, steps, side="right")
    alive = n - gone
    context = (context_done[-1] - context_done[gone] + steps * alive).astype(np.float64)
    excess = ff._excess(tokens0, k, remaining)
    d = np.empty(k)
    cuts = [0, *(np.flatnonzero(np.diff(alive)) + 1).tolist(), k]
    for a, b in itertools.pairwise(cuts):
        d[a:b] = st.decode_steps_s(int(alive[a]), context[a:b], excess if isinstance(excess, float) else excess[a:b])
    return d, alive


def _memory(policy: GroupedPagedPolicy, tokens0: np.ndarray, remaining: np.ndarray, k: int) -> tuple[int, tuple]:
    """(the leading steps of k that fit, decode_run's memory tuple over the k steps). A run of k' steps fits
    iff every step's blocks fit and so does the pool's update after it (_advance_pool): the requests that
    finished released, every survivor grown from first(t_i) to t_i + k' tokens before it frees."""
    B, N = policy.block_size, policy.pool.num_blocks
    steps = np.arange(k, dtype=np.int64)
    computed = tokens0[:, None] + steps[None, :]
    live = steps[None, :] < remaining[:, None]
    table = (computed + B) // B
    survive = steps[None, :] + 1 < remaining[:, None]  # [i, j]: still running after a run of j + 1 steps
    held, written, peak = [], [], np.zeros(k, np.int64)
    for group, count in policy._kinds():
        first = policy._first(group, computed)
        held.append((((table - first) * live).sum(axis=0), count))
        written.append((((computed + 1 - B * first) * live).sum(axis=0), count))
        start = first if isinstance(first, int) else first[:, :1]
        peak += count * ((table - start) * survive).sum(axis=0)
    used = sum(h * c for h, c in held)
    over = np.flatnonzero(used > N)
    k = int(over[0]) if len(over) else k
    fits = np.flatnonzero(peak[:k] <= N)  # a run of j + 1 steps may end where its update fits
    k = int(fits[-1]) + 1 if len(fits) else 0
    return k, (held, written, used)


def _advance_pool(ff: FastForward, run: np.ndarray, tokens0: np.ndarray, remaining: np.ndarray, k: int,
                  ends: np.ndarray) -> None:
    """The pool and the queues after the run: the requests that finished leave in finishing order, each at its
    own time (their blocks freed whatever they held: without prefix caching no figure depends on which); the
    survivors free what their first step frees, grow by k tokens in one hand-out, then free what their last step
    frees (GroupedPagedPolicy.advance_run's order); then checked against the closed form."""
    s, policy = ff.scheduler, ff.policy
    pool = policy.pool
    gone = []
    for i in np.argsort(remaining, kind="stable").tolist():
        if remaining[i] > k:
            break
        s.now_s = float(ends[remaining[i]])
        s.close(int(run[i]))
        gone.append(int(run[i]))
    survivors = np.flatnonzero(remaining > k)
    if len(survivors):
        pool.advance_private(run[survivors].tolist(), k, 1, check=False)
    if gone:
        left = set(gone)
        s.running = [r for r in s.running if r not in left]
        s.set_running()
    _check(policy, tokens0[survivors], k)


def _check(policy: GroupedPagedPolicy, tokens: np.ndarray, k: int) -> None:
    """The pool holds what the closed form says the survivors (t_i tokens at the start) hold after step k − 1."""
    B = policy.block_size
    computed = tokens + (k - 1)
    table = (computed + B) // B
    used = useful = 0
    for group, count in policy._kinds():
        first = policy._first(group, computed)
        used += count * int((table - first).sum())
        useful += count * int((computed + 1 - B * first).sum())
    usage = policy.pool.usage()
    assert usage.used_blocks == used == usage.logical_blocks and usage.useful_tokens == useful, (
        f"hybrid run through finishes: pool holds {usage.used_blocks} blocks / {usage.useful_tokens} tokens, "
        f"the closed form {used} / {useful}")
