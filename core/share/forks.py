"""Sharing scenarios run step by step through the real block pool: parallel sampling and beam search.

K branches share one P-token prompt (forks) and each generates G tokens, one decode step at a time.
Full prompt blocks stay shared; the partially filled last prompt block is copied on first write by all
but the last branch to write it; every generated token lands in the branch's own blocks. Once every
branch has written (G >= 1), for P mod B > 0:

    physical = floor(P/B) + K · ceil((P mod B + G) / B)      copies = K - 1
    logical  = K · ceil((P + G) / B)                          (= blocks without sharing)

and for P mod B = 0: physical = P/B + K · ceil(G/B), copies = 0. Beam mode keeps K beams: at each step
a seeded selection picks K parents (with repetition) among the live beams; unpicked beams are dropped
(released), a beam picked c times is forked c - 1 times, then every beam writes its next token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks import ceil_div
from ..pool.block_pool import BlockPool, ReleaseReason

SCENARIO_MODES = ("parallel", "beam")
MAX_SCENARIO_BLOCKS = 20_000_000
MAX_SCENARIO_APPENDS = 5_000_000


@dataclass(frozen=True)
class ScenarioSpec:
    prefix_tokens: int
    branches: int
    gen_tokens: int
    block_size: int
    mode: str = "parallel"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in SCENARIO_MODES:
            raise ValueError(f"unknown --mode {self.mode!r}: choose parallel or beam")
        if self.branches < 1:
            raise ValueError(f"--branches must be at least 1, got {self.branches}")
        if self.prefix_tokens < 1:
            raise ValueError(f"--prefix must be at least 1 token (the prompt), got {self.prefix_tokens}")
        if self.gen_tokens < 0:
            raise ValueError(f"--gen must be >= 0 generated tokens, got {self.gen_tokens}")
        if self.block_size < 1:
            raise ValueError(f"--block must be a positive number of tokens, got {self.block_size}")
        # the pool runs step by step: keep its size and the number of decode appends sensible
        blocks = self.branches * self.blocks_per_branch
        if blocks > MAX_SCENARIO_BLOCKS or self.branches * self.gen_tokens > MAX_SCENARIO_APPENDS:
            raise ValueError(
                f"scenario too large: {self.branches} branches × ({self.prefix_tokens} + {self.gen_tokens}) tokens is "
                f"{blocks:,} blocks and {self.branches * self.gen_tokens:,} decode steps; the pool runs step by "
                f"step, keep it within {MAX_SCENARIO_BLOCKS:,} blocks and {MAX_SCENARIO_APPENDS:,} steps"
            )

    @property
    def blocks_per_branch(self) -> int:
        return ceil_div(self.prefix_tokens + self.gen_tokens, self.block_size)


@dataclass(frozen=True)
class ScenarioResult:
    """Blocks at the end of the run (every branch holds P + G tokens) and the peak during it."""

    spec: ScenarioSpec
    logical_blocks: int  # Σ over branches of their block-table length = blocks without sharing
    physical_blocks: int  # distinct blocks in use
    cow_copies: int
    peak_blocks: int  # most blocks in use at any moment of the run
    forks: int
    dropped_branches: int  # beam mode: beams released by the selection

    @property
    def saved_blocks(self) -> int:
        return self.logical_blocks - self.physical_blocks

    @property
    def saved_fraction(self) -> float:
        return self.saved_blocks / self.logical_blocks if self.logical_blocks else 0.0


def closed_form_physical_blocks(prefix_tokens: int, branches: int, gen_tokens: int, block_size: int) -> int:
    """Parallel mode once every branch has written (gen_tokens >= 1); see the module docstring."""
    full, rest = divmod(prefix_tokens, block_size)
    return full + branches * ceil_div(rest + gen_tokens, block_size)


def run_scenario(spec: ScenarioSpec, *, check: bool = False) -> ScenarioResult:
    """Run the scenario through a BlockPool; `check` calls check_invariants after every operation."""
    K, B = spec.branches, spec.block_size
    pool = BlockPool(K * (spec.blocks_per_branch + 1), B)
    peak = 0

    def track() -> None:
        nonlocal peak
        peak = max(peak, pool.num_used)
        if check:
            pool.check_invariants()

    pool.allocate(0, spec.prefix_tokens)
    track()
    beams = [0]
    next_id = 1
    for _ in range(K - 1):
        pool.fork(0, next_id)
        beams.append(next_id)
        next_id += 1
        track()
    rng = np.random.default_rng(spec.seed)
    dropped = 0
    for step in range(spec.gen_tokens):
        if spec.mode == "beam" and step > 0:
            picks = np.bincount(rng.integers(0, K, size=K), minlength=K)
            survivors = []
            for beam, count in zip(beams, picks.tolist(), strict=True):
                if count == 0:
                    pool.release(beam, ReleaseReason.CANCELLED)
                    dropped += 1
                    track()
                    continue
                survivors.append(beam)
                for _ in range(count - 1):
                    pool.fork(beam, next_id)
                    survivors.append(next_id)
                    next_id += 1
                    track()
            beams = survivors
        for beam in beams:
            pool.append(beam, 1)
            track()
    usage = pool.usage()
    stats = pool.stats()
    return ScenarioResult(
        spec=spec,
        logical_blocks=usage.logical_blocks,
        physical_blocks=usage.used_blocks,
        cow_copies=stats.cow_copies,
        peak_blocks=peak,
        forks=stats.forks,
        dropped_branches=dropped,
    )
