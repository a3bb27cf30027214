"""One simulated run, put together: workload + memory plan + step-time model + scheduler -> RunRecord.

`SimSetup` holds everything but the workload and the policy name, so `--compare` and the max-rate search
run several policies and rates on identical settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..blocks import ceil_div
from .hardware import MemoryPlan
from .paged import PagedPolicy, mooncake_prompt_keys
from .policies import POLICIES
from .reserve import ReservationPolicy
from .scheduler import Engine, RunRecord, SchedulerConfig
from .steptime import StepTimeModel
from .workload import Workload, cancellation_points, length_streams


@dataclass(frozen=True)
class SimSetup:
    """Settings shared by every run of one `kvcalc sim` invocation."""

    capacity_blocks: int
    block_size: int
    steptime: StepTimeModel
    scheduler: SchedulerConfig
    cancel_fraction: float = 0.0
    seed: int = 0
    prefix_caching: bool = True

    @classmethod
    def from_plan(cls, plan: MemoryPlan, steptime: StepTimeModel, scheduler: SchedulerConfig, **kw) -> SimSetup:
        return cls(plan.num_blocks, plan.block_size, steptime, scheduler, **kw)


def parse_policies(text: str, flag: str = "--policy") -> list[str]:
    """Comma-separated policy names -> a list; unknown, empty or repeated names are errors (never dropped)."""
    names = [p.strip().lower() for p in text.split(",")]
    if not text.strip() or any(not p for p in names):
        raise ValueError(f"{flag} {text!r} has an empty name: list policies from {', '.join(POLICIES)}, "
                         "separated by single commas")
    bad = [p for p in names if p not in POLICIES]
    if bad:
        raise ValueError(f"unknown policy {', '.join(bad)}: choose from {', '.join(POLICIES)}")
    repeated = sorted({p for p in names if names.count(p) > 1})
    if repeated:
        raise ValueError(f"{flag} {text!r} names {', '.join(repeated)} twice; list each policy once")
    return names


def choose_policies(policy: str | None, compare: str | None) -> list[str]:
    """`--policy` (one) or `--compare` (several); both at once is refused, since which one wins would be a
    guess: list every policy to run in --compare."""
    if policy is not None and compare is not None:
        raise ValueError(f"give --policy {policy} or --compare {compare}, not both: "
                         "list every policy to run in --compare")
    if compare is not None:
        return parse_policies(compare, "--compare")
    names = parse_policies("paged" if policy is None else policy)
    if len(names) > 1:
        raise ValueError(f"--policy {policy!r} names several policies; use --compare {policy}")
    return names


def make_policy(name: str, workload: Workload, setup: SimSetup):
    n = len(workload)
    if name == "paged":
        keys = None
        if setup.prefix_caching and workload.hash_ids is not None and workload.hash_offsets is not None:
            keys = mooncake_prompt_keys(workload.hash_ids, workload.hash_offsets, workload.prompt_tokens,
                                        setup.block_size)
        return PagedPolicy(setup.capacity_blocks, setup.block_size, n, keys)
    return ReservationPolicy(name, setup.capacity_blocks * setup.block_size, workload.prompt_tokens,
                             workload.output_tokens, setup.scheduler.max_model_len)


def run_policy(workload: Workload, name: str, setup: SimSetup, *, record_timeline: bool = False,
               progress: Callable[[float], None] | None = None) -> RunRecord:
    """Simulate `workload` under policy `name`; the pool is checked whole at the end (AssertionError if not)."""
    _, _, cancel_rng = length_streams(setup.seed)
    cancel_at = cancellation_points(workload.output_tokens, setup.cancel_fraction, cancel_rng)
    policy = make_policy(name, workload, setup)
    engine = Engine(workload, policy, setup.steptime, setup.scheduler, cancel_at,
                    record_timeline=record_timeline, progress=progress)
    return engine.run()


def unlimited(setup: SimSetup, workload: Workload) -> SimSetup:
    """The same setup with a pool large enough that no policy ever waits for memory (tests, ablations)."""
    need = int(np.sum(workload.prompt_tokens + workload.output_tokens)) + setup.scheduler.max_model_len
    blocks = ceil_div(max(need, setup.scheduler.max_model_len * len(workload)), setup.block_size) + 1
    return SimSetup(blocks, setup.block_size, setup.steptime, setup.scheduler, setup.cancel_fraction, setup.seed,
                    setup.prefix_caching)
