"""One simulated run, put together: workload + memory policy + executor + scheduler -> RunRecord.

`SimSetup` holds everything but the workload and the policy name, so `--compare` and the max-rate search
run several policies and rates on identical settings. The executor is the step-time model unless the
caller brings one (a model runner); block tables are then kept exact for its plans' slots and copies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..blocks import ceil_div
from ..errors import ParameterError
from .engine import Engine
from .fastforward import FastForward
from .options import DEFAULT_POLICY
from .paged import PagedPolicy
from .plan import Executor
from .policies import POLICIES, MemoryPolicy
from .record import RunRecord
from .scheduler import Scheduler
from .settings import SimSetup, prompt_block_keys
from .steptime import StepTimeExecutor
from .workload import Workload, cancellation_points, length_streams


def parse_policies(text: str, param: str = "policy") -> list[str]:
    """Comma-separated policy names -> a list; unknown, empty or repeated names are errors (never dropped).
    `param` is the parameter that holds the text (policy or compare)."""
    names = [p.strip().lower() for p in text.split(",")]
    if not text.strip() or any(not p for p in names):
        raise ParameterError(f"{param} {text!r} has an empty name: list policies from {', '.join(POLICIES)}, "
                             "separated by single commas", param)
    bad = [p for p in names if p not in POLICIES]
    if bad:  # the value said, not the parameter: "policy" is a word of the message itself
        raise ValueError(f"unknown policy {', '.join(bad)}: choose from {', '.join(POLICIES)}")
    repeated = sorted({p for p in names if names.count(p) > 1})
    if repeated:
        raise ParameterError(f"{param} {text!r} names {', '.join(repeated)} twice; list each one once", param)
    return names


def choose_policies(policy: str | None, compare: str | None) -> list[str]:
    """`policy` (one) or `compare` (several); both at once is refused, since which one wins would be a
    guess."""
    if policy is not None and compare is not None:
        raise ParameterError(f"give policy {policy} or compare {compare}, not both: list all of them in compare",
                             "policy", "compare")
    if compare is not None:
        return parse_policies(compare, "compare")
    names = parse_policies(DEFAULT_POLICY if policy is None else policy)
    if len(names) > 1:
        raise ParameterError(f"policy {policy!r} names several policies; use compare {policy}", "policy", "compare")
    return names


def make_policy(name: str, workload: Workload, setup: SimSetup, *, exact_block_tables: bool = False) -> MemoryPolicy:
    """The memory policy `name` for `workload`; `exact_block_tables` (always with forks) keeps the paged
    policy's block tables current at every step, for plans that carry slots and copies."""
    n = len(workload)
    forks = workload.fork_parent is not None
    if name == "paged":
        keys = prompt_block_keys(workload, setup)
        if setup.groups is not None:
            if exact_block_tables:
                raise ValueError("a hybrid model's pool has one block table per group: an executor that reads "
                                 "block tables cannot run on it yet")
            from .paged_groups import GroupedPagedPolicy  # a hybrid's only: a plain run never loads it
            return GroupedPagedPolicy(setup.capacity_blocks, setup.block_size, setup.groups, setup.state_mode, n,
                                      keys, setup.scheduler.max_batched_tokens, page_bytes=setup.page_bytes)
        if exact_block_tables or forks:
            from .paged_exact import ExactPagedPolicy  # tables kept current: a plain run never loads it
            return ExactPagedPolicy(setup.capacity_blocks, setup.block_size, n, keys)
        return PagedPolicy(setup.capacity_blocks, setup.block_size, n, keys)
    if forks:
        raise ValueError(f"parallel samples share blocks through forks: use the paged policy, not {name}")
    from .reserve import ReservationPolicy  # the reserve-* policies only
    return ReservationPolicy(name, setup.capacity_blocks * setup.block_size, workload.prompt_tokens,
                             workload.output_tokens, setup.scheduler.max_model_len)


def run_policy(workload: Workload, name: str, setup: SimSetup, *, executor: Executor | None = None,
               record_timeline: bool = False, progress: Callable[[int], None] | None = None) -> RunRecord:
    """Run `workload` under policy `name` with `executor` (default: the step-time model, fast-forwarded
    when the setup allows); the pool is checked whole at the end (AssertionError if not). `progress` is
    called with the number of arrivals taken in since its last call."""
    record = run_until(workload, name, setup, None, executor=executor, record_timeline=record_timeline,
                       progress=progress)
    assert record is not None
    return record


def run_until(workload: Workload, name: str, setup: SimSetup, stop: Callable[[Scheduler], bool] | None, *,
              executor: Executor | None = None, record_timeline: bool = False,
              progress: Callable[[int], None] | None = None) -> RunRecord | None:
    """run_policy, ended early when `stop` (verdict.Verdict, asked with the scheduler every engine.STOP_EVERY
    steps) says so: then None (speculative and tiered runs always run whole)."""
    if executor is None and workload.prompt_token_ids is not None:
        raise ValueError("a workload with token ids needs an executor that produces tokens (a model runner); "
                         "the step-time model produces none")
    _, _, cancel_rng = length_streams(setup.seed)
    cancel_at = cancellation_points(workload.output_tokens, setup.cancel_fraction, cancel_rng)
    if setup.speculation is not None:
        from .spec_run import run_speculative

        return run_speculative(workload, name, setup, setup.speculation, executor=executor,
                               record_timeline=record_timeline, progress=progress, cancel_at=cancel_at)
    policy = make_policy(name, workload, setup, exact_block_tables=executor is not None)
    if setup.tiers is not None and executor is None:  # host and disk tiers below the pool
        from .tiers_run import run_tiered

        return run_tiered(workload, name, policy, setup, cancel_at=cancel_at, record_timeline=record_timeline,
                          progress=progress)
    engine = Engine(workload, policy, executor or StepTimeExecutor(setup.steptime), setup.scheduler, cancel_at,
                    record_timeline=record_timeline, progress=progress)
    fast = setup.scheduler.fast_forward and executor is None and workload.fork_parent is None
    return engine.run(FastForward(engine, setup.steptime) if fast else None, stop)


def unlimited(setup: SimSetup, workload: Workload) -> SimSetup:
    """The same setup with a pool large enough that no policy ever waits for memory (tests, ablations)."""
    need = int(np.sum(workload.prompt_tokens + workload.output_tokens)) + setup.scheduler.max_model_len
    blocks = ceil_div(max(need, setup.scheduler.max_model_len * len(workload)), setup.block_size) + 1
    if setup.groups is not None:  # every group may hold every token
        blocks *= len(setup.groups)
    return replace(setup, capacity_blocks=blocks)
