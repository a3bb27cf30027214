"""Runs of decode steps on a hybrid pool that go on past finishes (nobody waits): the batch shrinks as
requests reach their last token, up to the next arrival — fastforward._segment_through_finishes for a
GroupedPagedPolicy, with the figures of stepping, byte for byte.

Request i (t_i tokens, r_i tokens to go) decodes in steps j < r_i; in step j each group holds
ceil((t_i + j + 1) / B) − first(t_i + j) of its blocks (GroupedPagedPolicy.decode_run), masked by j < r_i,
and the step fits iff the blocks of the requests alive in it fit. Step j's time is the decode step of the n_j
alive requests, taken per stretch of constant n_j (the step-time model's scalar path, as a plain step takes
it); every integral is added step by step in step order (step_sums.add_run). The pool is brought up to
date after the run: the finished requests leave (in finishing order, each at its own time), then the survivors
grow by k tokens at once (_advance_pool); the run is kept only as long as that update fits the pool too.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .group_runs import RunForm, check_run, covered, run_form
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
    def _grouped_segment(self, k: int, d: np.ndarray, ends: np.ndarray) -> bool: ...


def grouped_run_through_finishes(ff: FastForward) -> bool:
    """One such run from now (False: none taken — the caller takes a general step)."""
    s, st, totals, policy = ff.scheduler, ff.steptime, ff.totals, ff.policy
    run = s.running_ids
    n = len(run)
    if s.waiting or not s.steady or n == 0 or n > s.config.max_batched_tokens or not policy.runs_decode:
        return False
    if policy.num_seqs() != n:  # a sequence outside the batch holds blocks
        return False
    tokens0 = s.computed[run]
    remaining = s.stop_at[run] - s.generated[run]
    if not policy._private:  # prefix caching: block ids matter, a run stops at the first finish
        return _prefix_run(ff, tokens0, remaining)
    k = int(remaining.max())
    until = ff._until()
    if until < np.inf:  # no decode step is shorter than one token's (weights, overhead, one state)
        k = min(k, int((until - s.now_s) / st.decode_steps_s(1, 0.0)) + 2)
    d, alive = _step_times(ff, tokens0, remaining, k)
    ends, k = _ends(s.now_s, d, k, until)
    k, memory = _memory(policy, tokens0, remaining, k)
    if k < 2:
        return False
    d, ends, alive = d[:k], ends[: k + 1], alive[:k]
    add_run(totals, d, ends, policy.run_memory(memory, k), alive, 0)
    taken = np.minimum(remaining, k)
    s.computed[run] = tokens0 + taken
    s.generated[run] += taken
    s.last_token_s[run] = ends[taken]
    _advance_pool(ff, run, remaining, k, ends, memory)
    s.now_s = float(ends[-1])
    s.steady = True
    return True


def _prefix_run(ff: FastForward, tokens0: np.ndarray, remaining: np.ndarray) -> bool:
    """A run of decode steps up to the first finish (or arrival) on a prefix-caching pool (hybrid_runs, through
    GroupedPagedPolicy.decode_run): fastforward's _grouped_segment takes it (nobody waits here) — the pool
    advanced, then the requests at their last token leave, in batch order, at the run's end."""
    s = ff.scheduler
    k = int(remaining.min())
    until = ff._until()
    if until < np.inf:
        k = min(k, int((until - s.now_s) / ff.steptime.decode_steps_s(1, 0.0)) + 2)
    if k < 2:
        return False
    d = _step_times(ff, tokens0, remaining, k)[0]
    ends, k = _ends(s.now_s, d, k, until)
    return k >= 2 and ff._grouped_segment(k, d, ends)


def _ends(now_s: float, d: np.ndarray, k: int, until: float) -> tuple[np.ndarray, int]:
    """(ends [k + 1]: step j ends at ends[j + 1], summed from now in step order as now += d; the steps that start
    before `until`, at most k)."""
    ends = np.empty(k + 1)
    ends[0] = now_s
    ends[1:] = d
    np.cumsum(ends, out=ends)
    if until < np.inf:
        k = min(k, int(np.searchsorted(ends[:k], until, side="left")))
    return ends, k


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
    seqs = alive.astype(np.float64)
    if st.num_experts:
        # NOTE: a MoE model's share of weights read is a power of the tokens, whose numpy loop may round differently
        # from the scalar path's: each stretch of constant n_j gets its weights' time as decode_steps_s(n_j) takes it
        # (weights_s · weights_read_share(float(n_j)), plain floats), and every other term is elementwise as there
        weights = np.empty(k)
        cuts = [0, *(np.flatnonzero(np.diff(alive)) + 1).tolist(), k]
        for a, b in itertools.pairwise(cuts):
            weights[a:b] = st.weights_s * st.weights_read_share(float(alive[a]))
        st = _dense(ff, weights)
    return np.asarray(st.step_s(seqs, context, context + seqs, 0.0, excess, excess, seqs)), alive


def _dense(ff: FastForward, weights: np.ndarray) -> StepTimeModel:
    """ff's step-time model as a dense one whose weights take `weights` [k] seconds per step (step_s then reads
    weights_s as they are): one copy made per fast path, its weights set per run (a frozen dataclass's field, set
    on this private copy only)."""
    dense = ff.__dict__.get("_dense_steptime")
    if dense is None:
        dense = ff.__dict__["_dense_steptime"] = dataclasses.replace(ff.steptime, num_experts=0)
    object.__setattr__(dense, "weights_s", weights)
    return dense


def _memory(policy: GroupedPagedPolicy, tokens0: np.ndarray, remaining: np.ndarray, k: int) -> tuple[int, RunForm]:
    """(the leading steps of k that fit, their closed form: group_runs.run_form). A run of k' steps fits iff
    every step's blocks fit and so does the pool's update after it (_advance_pool): the requests that finished
    released, every survivor grown from first(t_i) to t_i + k' tokens before it frees."""
    N = policy._pool.num_blocks
    form = run_form(policy, tokens0, k, remaining)
    over = np.flatnonzero((form.used > N) | ~covered(policy, tokens0, k, form.used, remaining))
    k = int(over[0]) if len(over) else k
    fits = np.flatnonzero(form.peak[:k] <= N)  # a run of j + 1 steps may end where its update fits
    return (int(fits[-1]) + 1 if len(fits) else 0), form


def _advance_pool(ff: FastForward, run: np.ndarray, remaining: np.ndarray, k: int, ends: np.ndarray,
                  form: RunForm) -> None:
    """The pool and the queues after the run: the requests that finished leave in finishing order, each at its
    own time (their blocks freed whatever they held: without prefix caching no figure depends on which); the
    survivors grow by k tokens, one at a time as stepping grows them (HybridPool.advance_private); then the pool
    is checked against the closed form (group_runs.check_run)."""
    s, policy = ff.scheduler, ff.policy
    gone = []
    for i in np.argsort(remaining, kind="stable").tolist():
        if remaining[i] > k:
            break
        s.now_s = float(ends[remaining[i]])
        s.close(int(run[i]))
        gone.append(int(run[i]))
    survivors = np.flatnonzero(remaining > k)
    if len(survivors):
        policy.advance_private(run[survivors].tolist(), k)
    if gone:
        left = set(gone)
        s.running = [r for r in s.running if r not in left]
        s.set_running()
    check_run(policy, form, k)
