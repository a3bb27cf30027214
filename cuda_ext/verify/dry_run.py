"""The scheduling of a scenario without a model: the pool sizes whose events a scenario needs.

Which steps fit, what is preempted and what is copied depend on the requests' lengths, arrivals and samples,
not on the tokens (end-of-sequence aside, which these scenarios ignore), so the scheduler and the exact paged
policy can run with a constant-time executor that produces no tokens, in milliseconds. `fork-pressure` uses it
to pick the pool in which a step's growth fits only without its copy-on-write copies, whatever the prompts'
lengths (a real model's chat prompts are longer than the built-in model's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...core.sim.engine import Engine
from ...core.sim.paged_exact import ExactPagedPolicy
from ...core.sim.plan import StepOutcome, StepPlan
from ...core.sim.scheduler import SchedulerConfig
from ...core.sim.workload import from_token_ids


class ObservedPolicy(ExactPagedPolicy):
    """The exact paged policy, counting growths whose fit the copy-on-write copies decided (`cow_tight_fits`:
    the new blocks alone fit the free blocks, with the copies they do not)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.cow_tight_fits = 0

    def _copies_needed(self, rids: np.ndarray, totals: np.ndarray) -> int:
        copies = super()._copies_needed(rids, totals)
        if copies:
            need = int((-(-totals // self.block_size) - self.held_blocks[rids]).sum())
            self.cow_tight_fits += need <= self.pool.num_free_blocks < need + copies
        return copies


class _Clock:
    """Every step takes 1 ms and samples token 0 (no model: the tokens do not change the scheduling)."""

    def execute(self, plan: StepPlan) -> StepOutcome:
        tokens = {rid: 0 for rid, samples in zip(plan.request_ids.tolist(), plan.samples, strict=True) if samples}
        tokens.update({child: 0 for _, child in plan.events.forks})
        return StepOutcome(1e-3, tokens)


def cow_tight_fits(prompts: Sequence[Sequence[int]], new: Sequence[int], arrival_s: Sequence[float],
                   samples: Sequence[int], num_blocks: int, block_size: int, scheduler: SchedulerConfig) -> int:
    """How many growths the copies decide in a run of these requests over `num_blocks` blocks (-1: it fails)."""
    workload = from_token_ids([list(p) for p in prompts], list(new), list(arrival_s), list(samples),
                              description="dry run")
    policy = ObservedPolicy(num_blocks, block_size, len(workload))
    try:
        Engine(workload, policy, _Clock(), scheduler, np.zeros(len(workload), np.int64)).run()
    except Exception:  # a pool too small for some request: not a candidate
        return -1
    return policy.cow_tight_fits
