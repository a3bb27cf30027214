"""Sharing scenarios run step by step through the real block pool: parallel sampling and beam search.

K branches share one P-token prompt (forks) and each generates G tokens, one decode step at a time. A branch
writes the KV of G − 1 of them: its first token is sampled from the prompt's logits, each decode step writes
the token before it, and the G-th is sampled and never written (as a trace replay's last output token), so a
branch holds P + G − 1 positions at the end. Full prompt blocks stay shared; the partially filled last prompt
block is copied on first write by all but the last branch to write it; every written token lands in the
branch's own blocks. Once every branch has written (G >= 2), for P mod B > 0:

    physical = floor(P/B) + K · ceil((P mod B + G − 1) / B)      copies = K - 1
    logical  = K · ceil((P + G − 1) / B)                          (= blocks without sharing)

and for P mod B = 0: physical = P/B + K · ceil((G − 1)/B), copies = 0; for G <= 1 nothing is written: ceil(P/B).
A hybrid model (`groups`: its KV cache groups, core/pool/hybrid.py) runs the same steps with one table per group: a
sliding or chunked group keeps only the blocks its layers still read (a window ends at the last written
position), and every branch gets its own recurrent state (the forked state page is copied before a branch writes
it); `group_blocks` gives each group's physical blocks. Beam mode keeps K beams: at each step after the first a
seeded selection picks K parents (with repetition) among the live beams; unpicked beams are dropped (released), a
beam picked c times is forked c - 1 times, then every beam writes its next token — but at the last step, which
selects the final beams and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..blocks import ceil_div
from ..errors import ParameterError
from ..host_memory import check_fits
from ..pool.block_pool import BlockPool, ReleaseReason
from ..pool.groups import PoolGroup
from ..pool.hybrid import HybridPool
from ..pool.store import MAX_BLOCK_TOKENS, BlockStore
from ..units import format_int_short as short

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
            raise ParameterError(f"mode {self.mode!r} is unknown: choose parallel or beam", "mode")
        if self.branches < 1:
            raise ParameterError(f"branches {self.branches} must be at least 1", "branches")
        if self.prefix_tokens < 1:
            raise ParameterError(f"prefix_tokens {self.prefix_tokens} must be at least 1 token (the prompt)",
                                 "prefix_tokens")
        if self.gen_tokens < 0:
            raise ParameterError(f"gen_tokens {self.gen_tokens} must be >= 0 generated tokens", "gen_tokens")
        if self.block_size < 1:
            raise ParameterError(f"block_size {self.block_size} must be a positive number of tokens", "block_size")
        if self.block_size > MAX_BLOCK_TOKENS:
            raise ParameterError(f"block_size {short(self.block_size)} is more tokens than a block holds (at most "
                                 f"{MAX_BLOCK_TOKENS:,}): give a block size such as 16", "block_size")
        if self.seed < 0:
            raise ParameterError(f"seed {self.seed} is negative: give a whole number from 0", "seed")
        # the pool runs step by step: keep its size and the number of decode appends sensible
        blocks = self.branches * self.blocks_per_branch
        shape = (f"branches {short(self.branches)} × (prefix_tokens {short(self.prefix_tokens)} + gen_tokens "
                 f"{short(self.gen_tokens)})")
        if blocks > MAX_SCENARIO_BLOCKS or self.decode_appends > MAX_SCENARIO_APPENDS:
            raise ParameterError(
                f"scenario too large: {shape} is {short(blocks)} blocks and {short(self.decode_appends)} decode "
                f"appends; the pool runs step by step, keep it within {MAX_SCENARIO_BLOCKS:,} blocks and "
                f"{MAX_SCENARIO_APPENDS:,} appends",
                "branches", "prefix_tokens", "gen_tokens",
            )
        check_fits(self.memory_bytes, f"{shape} in the pool", "lower branches, prefix_tokens or gen_tokens",
                   "branches", "prefix_tokens", "gen_tokens")

    @property
    def written_tokens(self) -> int:
        """Generated tokens a branch writes the KV of: all but the last (see the module docstring)."""
        return max(self.gen_tokens - 1, 0)

    @property
    def tokens_per_branch(self) -> int:
        """Positions every branch holds at the end: the prompt and its written tokens."""
        return self.prefix_tokens + self.written_tokens

    @property
    def decode_appends(self) -> int:
        """One append per branch per decode step that writes."""
        return self.branches * self.written_tokens

    @property
    def pool_blocks(self) -> int:
        """Blocks of the scenario's pool: every branch's own blocks, and one for a copy-on-write each."""
        return self.branches * (self.blocks_per_branch + 1)

    @property
    def memory_bytes(self) -> int:
        """Host memory the run needs: the pool's arrays and the branches' block tables (int64, room for
        twice their length)."""
        return BlockStore.memory_bytes(self.pool_blocks) + self.branches * 16 * max(self.blocks_per_branch, 4)

    @property
    def blocks_per_branch(self) -> int:
        return ceil_div(self.tokens_per_branch, self.block_size)


@dataclass(frozen=True)
class ScenarioResult:
    """Blocks at the end of the run (every branch holds P + G − 1 positions) and the peak during it."""

    spec: ScenarioSpec
    logical_blocks: int  # Σ over branches of their block-table length = blocks without sharing
    physical_blocks: int  # distinct blocks in use
    cow_copies: int
    peak_blocks: int  # most blocks in use at any moment of the run
    forks: int
    dropped_branches: int  # beam mode: beams released by the selection
    group_blocks: tuple[int, ...] = ()  # a hybrid pool: each group's physical blocks at the end

    @property
    def saved_blocks(self) -> int:
        return self.logical_blocks - self.physical_blocks

    @property
    def saved_fraction(self) -> float:
        return self.saved_blocks / self.logical_blocks if self.logical_blocks else 0.0


def closed_form_physical_blocks(prefix_tokens: int, branches: int, gen_tokens: int, block_size: int) -> int:
    """Parallel mode's physical blocks at the end: every branch writes gen_tokens − 1 (see the module docstring)."""
    if gen_tokens <= 1:
        return ceil_div(prefix_tokens, block_size)
    full, rest = divmod(prefix_tokens, block_size)
    return full + branches * ceil_div(rest + gen_tokens - 1, block_size)


def run_scenario(
    spec: ScenarioSpec, *, check: bool = False, progress: Callable[[int], None] | None = None,
    groups: tuple[PoolGroup, ...] | None = None, state_mode: str = "none",
) -> ScenarioResult:
    """Run the scenario through a BlockPool (or, `groups`, a HybridPool of them), one decode step (a token for
    every branch) at a time; `check` calls check_invariants after every pool call, `progress(1)` is called
    after every step."""
    K, B = spec.branches, spec.block_size
    if groups is not None:
        return _run_hybrid(spec, groups, state_mode, check, progress)
    pool = BlockPool(spec.pool_blocks, B)
    peak = 0

    def track() -> None:
        nonlocal peak
        peak = max(peak, pool.num_used)
        if check:
            pool.check_invariants()

    pool.allocate(0, spec.prefix_tokens)
    track()
    pool.fork_many([0] * (K - 1), list(range(1, K)))
    track()
    beams = np.arange(K)
    next_id = K
    rng = np.random.default_rng(spec.seed)
    dropped = 0
    for step in range(spec.gen_tokens):
        if spec.mode == "beam" and step > 0:
            picks = np.bincount(rng.integers(0, K, size=K), minlength=K)
            pool.release_many(beams[picks == 0].tolist(), ReleaseReason.CANCELLED)
            dropped += int(np.count_nonzero(picks == 0))
            track()
            extra = np.maximum(picks - 1, 0)
            children = np.arange(next_id, next_id + int(extra.sum()))
            next_id += len(children)
            pool.fork_many(np.repeat(beams, extra).tolist(), children.tolist())
            track()
            # each kept beam, then the forks of it: the order a beam-by-beam selection would leave them in
            kept = np.flatnonzero(picks)
            owner = np.concatenate((kept, np.repeat(np.arange(K), extra)))
            beams = np.concatenate((beams[kept], children))[np.argsort(owner, kind="stable")]
        if step + 1 < spec.gen_tokens:  # the last token is sampled, never written
            pool.append_many(beams.tolist(), 1)
            track()
        if progress is not None:
            progress(1)
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


def _run_hybrid(spec: ScenarioSpec, groups: tuple[PoolGroup, ...], state_mode: str, check: bool,
                progress: Callable[[int], None] | None) -> ScenarioResult:
    """`run_scenario` on a HybridPool: the same steps, one sequence at a time (the hybrid pool has no
    many-sequence calls)."""
    K = spec.branches
    # every group's blocks fit (a block of a weighted table costs its weight in units: core/pool/weighted.py)
    pool = HybridPool(spec.pool_blocks * sum(g.weight for g in groups), spec.block_size, groups, state_mode=state_mode,
                      max_group_blocks=spec.pool_blocks)
    peak = 0

    def track() -> None:
        nonlocal peak
        peak = max(peak, pool.num_used)
        if check:
            pool.check_invariants()

    pool.allocate(0, spec.prefix_tokens)
    track()
    for child in range(1, K):
        pool.fork(0, child)
    track()
    beams = list(range(K))
    next_id = K
    rng = np.random.default_rng(spec.seed)
    dropped = 0
    for step in range(spec.gen_tokens):
        if spec.mode == "beam" and step > 0:
            picks = np.bincount(rng.integers(0, K, size=K), minlength=K)
            for beam, count in zip(beams, picks.tolist(), strict=True):
                if not count:
                    pool.release(beam, ReleaseReason.CANCELLED)
            dropped += int(np.count_nonzero(picks == 0))
            kept = []
            for beam, count in zip(beams, picks.tolist(), strict=True):
                if count:
                    kept.append(beam)
                    for _ in range(count - 1):
                        pool.fork(beam, next_id)
                        kept.append(next_id)
                        next_id += 1
            beams = kept
            track()
        if step + 1 < spec.gen_tokens:  # the last token is sampled, never written
            for beam in beams:
                pool.append(beam, 1)
            track()
        if progress is not None:
            progress(1)
    usage = pool.usage()
    # blocks in the pool's units: a weighted table's entry costs its weight, as its unit tables would hold it
    logical = sum(p.logical_blocks * w for p, w in zip(pool.pools, pool.weights, strict=True))
    return ScenarioResult(
        spec=spec, logical_blocks=logical, physical_blocks=usage.used_blocks,
        cow_copies=pool.stats().cow_copies, peak_blocks=peak, forks=pool.stats().forks,
        dropped_branches=dropped, group_blocks=tuple(u.held_blocks for u in pool.group_usage()),
    )
