"""verify's scenarios: the requests, the pool and the scheduler settings of each, and the events it must show.

Every scenario but `beam-search` runs through the scheduler (`speculative` through its speculative
form, core/sim/spec_run.py) (core/sim) over an exact-table paged policy on
the real block pool; `beam-search` runs its own lockstep driver over the same pool and executor. Prompts
are token ids drawn from the run's seed; arrivals are in steps of the executor's constant clock (1 ms),
so a schedule is the same on every machine. Block size 4 keeps blocks small enough that a few tokens
cross boundaries, fill partial blocks and share them.

    name               what the requests and the pool do                            events that must be > 0
    ragged             12 requests of 1..40 prompt tokens arriving over time; some   mixed_steps, eos_finishes
                       stop at an end-of-sequence token
    chunked-prefill    prompts of up to 61 tokens under a 16-token step budget       prefill_chunks
    prefix-cache       two system prompts; a pool that evicts the first's blocks     prefix_hit_tokens, evictions
    parallel-sampling  n = 2..4 seeded samples per prompt, forked at the first token forks, cow_copies
    beam-search        width 3, beams forked and dropped every step                 forks, cow_copies, beams_dropped
    preempt-recompute  a pool of a third of the demand; recompute                    preemptions
    preempt-swap       the same with swap                                            preemptions, swaps
    cancel-reuse       cancellations mid-generation, a queue waiting for their blocks cancellations,
                                                                                      cancelled_blocks_reused,
                                                                                      deferred_free_blocks
    tiny-pool          all of the above at once in 24 blocks                        prefix_hit_tokens, cow_copies,
                                                                                      forks, preemptions, swaps,
                                                                                      cancellations, evictions
    speculative        K = 3 greedy drafts by a smaller model, verified in one pass;  rollbacks, preemptions,
                       rollback keep and free, prefix caching, a pool that preempts   prefix_hit_tokens
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ...core.sim.scheduler import SchedulerConfig
from .sampling import GREEDY, SamplingParams

BLOCK_SIZE = 4
DEFAULT_SCHEDULER = SchedulerConfig(max_batched_tokens=256, max_seqs=64, max_model_len=4096)
SAMPLED = SamplingParams(temperature=0.8, top_k=20)  # its seed is set per request


@dataclass(frozen=True)
class Requests:
    """Requests for the scheduler: prompt i asks for num_samples[i] parallel samples (rows i.0, i.1, …)."""

    prompts: tuple[tuple[int, ...], ...]
    max_new_tokens: tuple[int, ...]
    arrival_s: tuple[float, ...]
    num_samples: tuple[int, ...]
    sampling: SamplingParams = GREEDY
    cancel_after: dict[int, int] = field(default_factory=dict)  # row -> generated tokens at its cancellation
    eos_from_reference: bool = False  # pick an end-of-sequence token that some reference output contains


@dataclass(frozen=True)
class Scenario:
    name: str
    needs: tuple[str, ...]  # events that must be non-zero
    num_blocks: int
    block_size: int = BLOCK_SIZE
    requests: Requests | None = None  # None: beam search
    scheduler: SchedulerConfig = DEFAULT_SCHEDULER
    prefix_caching: bool = False
    beam_prompts: tuple[tuple[int, ...], ...] = ()
    beam_width: int = 3
    beam_tokens: int = 8
    spec_tokens: int = 0  # speculative decoding: K drafts per decode step (speculative.py runs it)


def _prompts(rng: np.random.Generator, vocab: int, lengths: list[int], prefix: tuple[int, ...] = ()) -> list[tuple]:
    return [prefix + tuple(int(t) for t in rng.integers(0, vocab, n)) for n in lengths]


def _requests(prompts: list[tuple], new: list[int], arrival_steps: list[int], samples: list[int] | None = None,
              **kw) -> Requests:
    return Requests(tuple(prompts), tuple(new), tuple(1e-3 * a for a in arrival_steps),
                    tuple(samples or [1] * len(prompts)), **kw)


def build(name: str, vocab: int, seed: int) -> Scenario:
    """The scenario `name` with prompts drawn from `seed` over a vocabulary of `vocab` token ids."""
    rng = np.random.default_rng([seed, SCENARIOS.index(name)])
    tokens = lambda lengths, prefix=(): _prompts(rng, vocab, lengths, prefix)  # noqa: E731
    if name == "ragged":
        lengths = [1, 17, 5, 40, 12, 3, 26, 9, 33, 2, 21, 7]
        reqs = _requests(tokens(lengths), [12, 5, 9, 16, 4, 10, 8, 14, 6, 11, 7, 13],
                         [0, 0, 0, 1, 2, 3, 5, 8, 8, 12, 15, 20], eos_from_reference=True)
        return Scenario(name, ("mixed_steps", "eos_finishes"), num_blocks=128, requests=reqs)
    if name == "chunked-prefill":
        reqs = _requests(tokens([45, 61, 30, 9, 23]), [6, 6, 8, 10, 5], [0, 0, 2, 4, 6])
        return Scenario(name, ("prefill_chunks",), num_blocks=96, requests=reqs,
                        scheduler=replace(DEFAULT_SCHEDULER, max_batched_tokens=16))
    if name == "prefix-cache":
        first, second = tuple(tokens([20])[0]), tuple(tokens([18])[0])
        prompts = tokens([3, 6], first) + tokens([5, 2, 7, 4], second) + tokens([1, 6, 3], first)
        reqs = _requests(prompts, [6] * 9, [0, 0, 15, 15, 16, 16, 40, 40, 41])
        return Scenario(name, ("prefix_hit_tokens", "evictions"), num_blocks=20, requests=reqs, prefix_caching=True)
    if name == "parallel-sampling":
        reqs = _requests(tokens([13, 22, 7]), [8, 6, 10], [0, 0, 4], [3, 2, 4], sampling=SAMPLED)
        return Scenario(name, ("forks", "cow_copies"), num_blocks=96, requests=reqs)
    if name == "beam-search":
        return Scenario(name, ("forks", "cow_copies", "beams_dropped"), num_blocks=64,
                        beam_prompts=tuple(tuple(p) for p in tokens([11, 6])))
    if name in ("preempt-recompute", "preempt-swap"):
        mode = name.removeprefix("preempt-")
        reqs = _requests(tokens([10, 14, 18, 11, 20, 13]), [20, 24, 16, 22, 18, 20], [0] * 6)
        needs = ("preemptions",) if mode == "recompute" else ("preemptions", "swaps")
        return Scenario(name, needs, num_blocks=24, requests=reqs,
                        scheduler=replace(DEFAULT_SCHEDULER, preempt=mode))
    if name == "cancel-reuse":
        system = tuple(tokens([10])[0])
        prompts = tokens([3, 5, 2, 6], system) + tokens([7, 9, 4, 8, 6])
        reqs = _requests(prompts, [16, 14, 16, 12, 10, 10, 10, 10, 10], [0, 0, 0, 0, 1, 1, 2, 2, 3],
                         [2, 1, 2, 1, 1, 1, 1, 1, 1], cancel_after={0: 5, 2: 3, 3: 7, 5: 4, 8: 6})
        return Scenario(name, ("cancellations", "cancelled_blocks_reused", "deferred_free_blocks"),
                        num_blocks=40, requests=reqs,
                        scheduler=replace(DEFAULT_SCHEDULER, max_seqs=5))
    if name == "tiny-pool":
        system = tuple(tokens([9])[0])
        prompts = tokens([4, 7, 2], system) + tokens([15, 6, 22]) + tokens([5, 3], system)
        reqs = _requests(prompts, [14, 10, 12, 9, 16, 8, 11, 10], [0, 0, 1, 2, 3, 5, 9, 12],
                         [2, 1, 2, 1, 1, 1, 2, 1], sampling=SAMPLED, cancel_after={1: 4, 5: 5, 9: 3})
        return Scenario(name, ("prefix_hit_tokens", "cow_copies", "forks", "preemptions", "swaps", "cancellations",
                               "evictions"), num_blocks=24, requests=reqs, prefix_caching=True,
                        scheduler=replace(DEFAULT_SCHEDULER, max_batched_tokens=24, preempt="swap"))
    if name == "speculative":
        system = tuple(tokens([10])[0])
        prompts = tokens([3, 6, 2], system) + tokens([9, 14, 5])
        reqs = _requests(prompts, [18, 14, 20, 16, 12, 18], [0, 0, 4, 6, 8, 8], eos_from_reference=True)
        return Scenario(name, ("rollbacks", "preemptions", "prefix_hit_tokens"), num_blocks=22, requests=reqs,
                        prefix_caching=True, spec_tokens=3)
    raise ValueError(f"scenario {name!r} is unknown; use one of {', '.join(SCENARIOS)}")


SCENARIOS = ("ragged", "chunked-prefill", "prefix-cache", "parallel-sampling", "beam-search", "preempt-recompute",
             "preempt-swap", "cancel-reuse", "tiny-pool", "speculative")


def sampling_of_row(requests: Requests, row: int, seed: int) -> SamplingParams:
    """Each row's own seed, so parallel samples differ and a row draws the same tokens in any batch."""
    s = requests.sampling
    return s if s.greedy else SamplingParams(s.temperature, s.top_k, seed * 1_000_003 + row)
