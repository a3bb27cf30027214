"""verify's scenarios on the hybrid model (`--model hybrid-tiny`), and its two faults.

Blocks of B = 4 tokens, window W = 8 (a sliding table holds 3 blocks and frees one every 4 tokens), the state in
mode all (a saved state page at every block boundary) unless said otherwise. Prompts are seeded token ids.

    name                     what the requests and the pool do                    events that must be > 0
    hybrid-ragged            10 requests of 3..40 prompt tokens arriving over      mixed_steps, window_frees
                             time, decoded together
    hybrid-prefix-cache      a shared 21-token system prompt; later requests hit   prefix_hit_tokens, state_restores,
                             it in every group (hits checked: the whole blocks      window_frees
                             of the common prefix)
    hybrid-prefix-chunked    the same under a 7-token step budget: a hit resumes    prefix_hit_tokens, prefill_chunks,
                             mid-prompt, chunks read the state the last one saved   state_restores
    hybrid-no-saved-state    the same prompts in mode align, a state saved only     mixed_steps (and every hit
                             where a step ends: the 23-token prompt's at 20, which  checked: 0 0 0 20 20)
                             the two requests after it hit; none inside the others
    hybrid-forks             n = 3 seeded samples per prompt, forked at the first   forks, cow_copies, state_copies
                             token: each branch gets its own copy of the state
    hybrid-preempt-recompute a pool of about a third of the demand; recompute       preemptions, window_frees
    hybrid-preempt-swap      the same with swap: K/V of every group and the state   preemptions, swaps,
                             pages to the host and back                             swapped_state_pages
    hybrid-cancel            cancellations mid-generation, a queue waiting for      cancellations
                             their blocks
    hybrid-speculative       K = 3 greedy drafts a step (a drafter that proposes    rollbacks, accepted_drafts,
                             the reference's tokens with one in three corrupted),   state_rewinds,
                             verified in one paged pass through reserve / commit;   prefix_hit_tokens
                             a rejected tail rewinds the state page to the last
                             accepted position; a shared prompt hits

Faults (each installed into one run's pool or executor; `fired` counts its effects):

    swa-early-free  the sliding group frees one block more than its rule allows: a block still inside the
                    window (the next token reads it) goes back to the free queue (kvcached #446's class of bug)
    stale-state     a prefix-cache hit restores the state page of the block before the hit's last one: a state
                    saved at another position
    no-state-rewind after a verification rejects drafts, the state page keeps the state computed over them (the
                    K/V of rejected drafts is harmless, overwritten next step; a recurrent state is not): the
                    bug class of vLLM #48375
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from ...core.sim.scheduler import SchedulerConfig
from .scenarios import SAMPLED, RandomPrompts, Requests, _requests, expected_hit

HYBRID_BLOCK_SIZE = 4
HYBRID_SCHEDULER = SchedulerConfig(max_batched_tokens=256, max_seqs=64, max_model_len=1024)
HYBRID_SCENARIOS = ("hybrid-ragged", "hybrid-prefix-cache", "hybrid-prefix-chunked", "hybrid-no-saved-state",
                    "hybrid-forks", "hybrid-preempt-recompute", "hybrid-preempt-swap", "hybrid-cancel",
                    "hybrid-speculative")
HYBRID_INJECTIONS = ("swa-early-free", "stale-state", "no-state-rewind")
# events only a hybrid run has, with their short names for the table
HYBRID_EVENT_LABELS = {"window_frees": "window frees", "state_restores": "state restores",
                       "state_copies": "state copies", "swapped_state_pages": "swapped state pages",
                       "accepted_drafts": "accepted drafts", "state_rewinds": "state rewinds"}


@dataclass(frozen=True)
class HybridScenario:
    name: str
    needs: tuple[str, ...]
    num_blocks: int
    requests: Requests
    block_size: int = HYBRID_BLOCK_SIZE
    scheduler: SchedulerConfig = HYBRID_SCHEDULER
    prefix_caching: bool = False
    state_mode: str = "all"
    expect_hits: tuple[tuple[int, int], ...] = field(default=())  # (row, hit tokens its construction implies)
    spec_tokens: int = 0  # speculative decoding: K greedy drafts per decode step, verified in one pass


def build_hybrid(name: str, vocab: int, seed: int) -> HybridScenario:
    """The scenario `name` with prompts drawn from `seed` (see the module docstring)."""
    if name not in HYBRID_SCENARIOS:
        raise ValueError(f"hybrid scenario {name!r} is not known; use one of {', '.join(HYBRID_SCENARIOS)}")
    prefix = name in ("hybrid-prefix-cache", "hybrid-prefix-chunked", "hybrid-no-saved-state")
    # the three prefix scenarios send the same prompts: one memoised reference, and their hits compare
    rng = np.random.default_rng([seed, 1000 + HYBRID_SCENARIOS.index("hybrid-prefix-cache" if prefix else name)])
    src = RandomPrompts(rng, vocab)
    B = HYBRID_BLOCK_SIZE
    if name == "hybrid-ragged":
        lengths = [3, 40, 9, 17, 25, 6, 33, 12, 21, 29]
        reqs = _requests(src.tokens(lengths), [14, 10, 16, 12, 9, 15, 11, 13, 10, 12], list(range(0, 20, 2)))
        return HybridScenario(name, ("mixed_steps", "window_frees"), 200, reqs)
    if prefix:
        system = src.system(21)
        prompts = src.tokens([5, 11, 2, 8, 14], system)
        # the first request finishes (and leaves its blocks cached) before the others arrive
        reqs = _requests(prompts, [12, 10, 12, 9, 11], [0, 40, 41, 42, 43])
        if name == "hybrid-no-saved-state":
            # align saves a state where a step ends, a prompt's last full block (vLLM's aligned split): 26 -> 24,
            # 32 -> 32, 23 -> 20, 29 -> 28, 35 -> 32; of them only 20 is inside the 21 shared tokens, saved by row 2
            # before rows 3 and 4 look up: they hit its 20 tokens, the others nothing
            return HybridScenario(name, ("mixed_steps",), 120, reqs, prefix_caching=True, state_mode="align",
                                  expect_hits=((0, 0), (1, 0), (2, 0), (3, 20), (4, 20)))
        hits = ((0, 0), *((row, expected_hit(prompts[0], p, B)) for row, p in enumerate(prompts) if row))
        if name == "hybrid-prefix-cache":
            return HybridScenario(name, ("prefix_hit_tokens", "state_restores", "window_frees"), 120, reqs,
                                  prefix_caching=True, expect_hits=hits)
        chunked = SchedulerConfig(max_batched_tokens=7, max_seqs=64, max_model_len=1024)
        return HybridScenario(name, ("prefix_hit_tokens", "prefill_chunks", "state_restores"), 120, reqs,
                              scheduler=chunked, prefix_caching=True, expect_hits=hits)
    if name == "hybrid-forks":
        prompts = src.tokens([7, 13, 10])
        reqs = _requests(prompts, [10, 8, 9], [0, 1, 2], [3, 2, 3], sampling=SAMPLED)
        return HybridScenario(name, ("forks", "cow_copies", "state_copies"), 120, reqs)
    if name in ("hybrid-preempt-recompute", "hybrid-preempt-swap"):
        prompts = src.tokens([14, 22, 9, 30, 17, 11])
        reqs = _requests(prompts, [16, 12, 18, 10, 14, 16], [0, 0, 1, 1, 2, 2])
        swap = name.endswith("swap")
        sched = SchedulerConfig(max_batched_tokens=256, max_seqs=64, max_model_len=1024,
                                preempt="swap" if swap else "recompute")
        needs = ("preemptions", "swaps", "swapped_state_pages") if swap else ("preemptions", "window_frees")
        return HybridScenario(name, needs, 44, reqs, scheduler=sched)
    if name == "hybrid-speculative":
        system = src.system(13)
        prompts = src.tokens([6, 3, 10, 1], system)
        reqs = _requests(prompts, [20, 18, 22, 16], [0, 30, 31, 32])
        return HybridScenario(name, ("rollbacks", "accepted_drafts", "state_rewinds", "prefix_hit_tokens"), 120,
                              reqs, prefix_caching=True, spec_tokens=3)
    prompts = src.tokens([10, 18, 7, 25, 13, 9, 16])  # hybrid-cancel
    reqs = _requests(prompts, [20, 18, 22, 16, 14, 12, 15], [0, 0, 0, 0, 1, 1, 2],
                     cancel_after={0: 3, 2: 6, 3: 2})
    return HybridScenario(name, ("cancellations",), 60, reqs)


class HybridFault:
    """A fault planted in one hybrid run: `install(policy)` for the pool's part, `restored_page` for the
    executor's; `fired` counts its effects."""

    def __init__(self, name: str) -> None:
        if name not in HYBRID_INJECTIONS:
            raise ValueError(f"inject {name!r} is not a fault of the hybrid model; use one of "
                             f"{', '.join(HYBRID_INJECTIONS)}")
        self.name = name
        self.fired = 0

    def install(self, policy) -> None:
        if self.name != "swa-early-free":
            return
        for group, bp in zip(policy.groups, policy.pool.pools, strict=True):
            if group.kind == "sliding":
                self._early_free(bp)

    def _early_free(self, bp) -> None:
        skip, B = bp.skip_blocks, bp.block_size

        def one_block_early(seq_id: Hashable, first_block: int) -> int:
            # the bug: the window's first block computed from n − W instead of n − W + 1, rounded up a block
            seq = bp.seqs[seq_id]
            wrong = first_block + 1
            if wrong * B <= bp.committed_tokens(seq_id) and seq.num_skipped < wrong <= seq.num_blocks:
                self.fired += 1
                first_block = wrong
            return skip(seq_id, first_block)

        bp.skip_blocks = one_block_early

    def skips_rewind(self) -> bool:
        """Whether the executor leaves a state computed over rejected drafts in place."""
        if self.name == "no-state-rewind":
            self.fired += 1
            return True
        return False

    def restored_page(self, page: int, hit_tokens: int, block_size: int) -> int:
        """The state page a request resuming at a prefix-cache hit reads (logical `page` when correct)."""
        if self.name == "stale-state" and page >= 1:
            self.fired += 1
            return page - 1
        return page
