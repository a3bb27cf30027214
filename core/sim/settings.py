"""The settings shared by every run of one `kvcalc sim` invocation (`SimSetup`), and the prompt block keys
of a workload with token ids. Apart from run.py so that the plain and the speculative runner both use them
without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..pool.groups import PoolGroup, pool_groups
from .hardware import MemoryPlan
from .paged import mooncake_prompt_keys
from .scheduler import SchedulerConfig
from .speculative import SimSpeculation
from .steptime import StepTimeModel
from .workload import Workload


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
    speculation: SimSpeculation | None = None  # speculative decoding (spec_run.py runs it)
    # a hybrid model's pool groups (paged_groups.py), one per block table; None: one group of full attention
    groups: tuple[PoolGroup, ...] | None = None
    state_mode: str = "none"  # mamba_cache_mode of the state groups
    tiers: Any = None  # host and disk prefix-cache tiers below the pool (tiers.SimTiers; tiers_run.py runs them)
    page_bytes: int = 0  # a hybrid pool's bytes per block id (KVLayout.page_bytes: what a swap moves per block)
    null_blocks: int = 0  # of the memory plan's blocks, those never handed out (vLLM's null block)

    @classmethod
    def from_plan(cls, plan: MemoryPlan, steptime: StepTimeModel, scheduler: SchedulerConfig, *, null_blocks: int,
                  **kw) -> SimSetup:
        """The pool of `plan`: its num_blocks less `null_blocks` (VLLM_NULL_BLOCKS as vLLM pages it, 0 for the
        ideal layout) free block ids, for every policy alike."""
        groups = None if plan.layout is None else pool_groups(plan.layout, weighted=True)
        mode = "none" if plan.layout is None else plan.layout.mamba_cache_mode
        page_bytes = 0 if plan.layout is None or groups is None else plan.layout.page_bytes
        return cls(max(plan.num_blocks - null_blocks, 0), plan.block_size, steptime, scheduler, groups=groups,
                   state_mode=mode, page_bytes=page_bytes, null_blocks=null_blocks, **kw)


def token_block_keys(token_ids: tuple[int, ...], block_size: int) -> list[tuple[int, ...]]:
    """The content key of each full block of a prompt: its token ids (the pool interns them)."""
    return [tuple(token_ids[i : i + block_size]) for i in range(0, len(token_ids) - block_size + 1, block_size)]


def prompt_block_keys(workload: Workload, setup: SimSetup) -> list | np.ndarray | None:
    """The paged pool's content keys of every prompt's full blocks, when prefix caching is on and the workload
    says what its prompts hold (token ids, or Mooncake hash ids); None otherwise."""
    if not setup.prefix_caching:
        return None
    if workload.prompt_token_ids is not None:
        return [token_block_keys(p, setup.block_size) for p in workload.prompt_token_ids]
    if workload.hash_ids is not None and workload.hash_offsets is not None:
        return mooncake_prompt_keys(workload.hash_ids, workload.hash_offsets, workload.prompt_tokens,
                                    setup.block_size)
    return None
