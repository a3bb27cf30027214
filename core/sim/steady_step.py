"""The fast path's general step (fastforward.FastForward.advance, where no run of decode steps can be taken): every
running request decodes one token and waiting requests may be admitted, with less numpy work than a plain step (and
no StepPlan); where that growth does not fit, the running requests are preempted from the back as the plain step
preempts them. The same integers and the same order of updates as the plain step (`fast_forward=False` takes a plain
step every time; tests compare the two).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .steptime import swap_bytes

if TYPE_CHECKING:
    from .engine import Engine
    from .record import RunTotals
    from .scheduler import Scheduler
    from .steptime import StepTimeModel

# ndarray.sum reduces with this ufunc and the same arguments, through a Python-level wrapper that costs more than the
# reduction itself on a batch of ~11 requests: the same results, called directly
_sum = np.add.reduce


def steady_step(engine: Engine, st: StepTimeModel) -> bool:
    """The common general step, with less numpy work: every running request decodes one token (steady)
    and waiting requests may be admitted. The same integers and the same order of updates as a plain
    step (which `fast_forward=False` uses for every step; tests compare the two). False: take a plain step."""
    s, policy, totals = engine.scheduler, engine.policy, engine.totals
    run = s.running_ids
    n = len(run)
    if not s.steady or n == 0 or n > s.config.max_batched_tokens:
        return False
    tokens_run = s.computed[run]
    grown = tokens_run + 1
    if not policy.grow_many(run, grown):
        return _preempting_step(engine, st)  # memory is short: the running requests are preempted from the back
    admitted: list[int] = []
    chunks: list[int] = []
    s.admit_waiting(s.config.max_batched_tokens - n, admitted, chunks)
    swapped = 0.0
    if s.swapped_in_now:
        swapped = swap_bytes((), s.swapped_in_now, st.kv_bytes_per_token)
        s.swapped_in_now = []
    context = int(_sum(tokens_run)) + n  # decode: Σ (c + 1) positions attended
    tokens, positions, moved = n, context, context + n
    computed = s.computed
    starts = [int(computed[rid]) for rid in admitted]  # scalar reads: fancy indexing by a list costs more
    for start, new in zip(starts, chunks, strict=True):
        tokens += new
        positions += start * new + new * (new + 1) // 2
        moved += start + 2 * new
    excess = (0.0, 0.0)
    if st.sliding_share:
        excess = st.chunk_excess(np.concatenate([tokens_run, np.array(starts, np.int64)]),
                                 np.concatenate([np.ones(n, np.int64), np.array(chunks, np.int64)]))
    d = float(st.step_s(float(tokens), float(positions), float(moved), swapped, *excess, float(n + len(starts))))
    computed[run] = grown
    sampled_admitted = []
    prompt_tokens, generated = s.prompt_tokens, s.generated
    for rid, start, new in zip(admitted, starts, chunks, strict=True):
        computed[rid] = end = start + new
        if end == prompt_tokens[rid] + generated[rid]:  # its known tokens computed: it samples
            sampled_admitted.append(rid)
    s.finished_now = 0
    parts, table_bytes = policy.parts(computed[s.running_ids] if admitted else grown, s.head())
    engine.account(d, parts, table_bytes)
    s.now_s += d
    totals.busy_s += d
    totals.steps += 1
    last_token_s = s.last_token_s
    totals.add_itl(s.now_s - last_token_s[run], 1)
    _admitted_tokens(s, totals, sampled_admitted)
    last_token_s[run] = s.now_s
    generated[run] += 1
    sampled = run
    if sampled_admitted:
        sampled = np.concatenate([run, np.array(sampled_admitted, np.int64)])
        for rid in sampled_admitted:
            last_token_s[rid] = s.now_s
            generated[rid] += 1
    s.finish(sampled)
    s.steady = len(sampled) - s.finished_now == len(s.running)
    return True


def _preempting_step(engine: Engine, st: StepTimeModel) -> bool:
    """A steady step whose growth does not fit: the plain step's outcome (the scheduler grows the running
    requests one by one, preempting from the back, and admits nobody), without its StepPlan. Only where the
    plan's events cannot change the step's time: preemption by recompute (nothing crosses the host link),
    no sliding window, no prefix cache (`lazy_admission`: no tiers either). False: take the plain step."""
    s, policy, totals = engine.scheduler, engine.policy, engine.totals
    lazy = getattr(policy, "lazy_admission", False)  # paged without a prefix cache
    if not lazy or s.config.preempt != "recompute" or st.sliding_share or s.swapped_in_now:
        return False
    ids: list[int] = []
    news: list[int] = []
    s._schedule_running_one_by_one(s.config.max_batched_tokens, ids, news)
    assert s.preempted_now and ids == s.running, "a steady step that did not fit preempts, and keeps a prefix"
    s.preempted_now, s.released = [], []  # the plain step's events, taken by its plan
    run = s.running_ids
    m = len(ids)
    computed = s.computed
    start = computed[run]
    positions = int(_sum(start)) + m  # every request decodes one token: StepTimeExecutor.duration_s's sums
    d = float(st.step_s(float(m), float(positions), float(positions + m), 0.0, 0.0, 0.0, float(m)))
    grown = start + 1
    computed[run] = grown
    s.finished_now = 0
    parts, table_bytes = policy.parts(grown, s.head())
    engine.account(d, parts, table_bytes)
    s.now_s += d
    totals.busy_s += d
    totals.steps += 1
    totals.add_itl(s.now_s - s.last_token_s[run], 1)  # every one of them has its first token (steady)
    s.last_token_s[run] = s.now_s
    s.generated[run] += 1
    s.finish(run)
    s.steady = m - s.finished_now == len(s.running)
    return True


def _admitted_tokens(s: Scheduler, totals: RunTotals, sampled_admitted: list[int]) -> None:
    """The first token of each admitted request that completed its prompt this step, or the gap since its
    last token (one that was preempted and recomputed)."""
    first_token_s = s.first_token_s
    later = [rid for rid in sampled_admitted if first_token_s[rid] == first_token_s[rid]]  # not NaN
    if later:
        totals.add_itl(s.now_s - s.last_token_s[later], 1)
    for rid in sampled_admitted:
        if first_token_s[rid] != first_token_s[rid]:  # NaN: no token yet
            first_token_s[rid] = s.now_s
