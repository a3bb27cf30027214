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
    prefix-chunked     a shared system prompt under a 7-token step budget             prefix_hit_tokens, prefill_chunks,
                                                                                      mid_block_chunks
    aligned-repeat     whole-block prompts sent again while cached (hit = len - B,    prefix_hit_tokens, capped_hits
                       checked)
    fork-pressure      parallel samples in an 18-block pool                          forks, cow_copies, preemptions,
                                                                                      cow_tight_fits
    evict-return       a prefix returns after a request took every other block (its   prefix_hit_tokens, evictions
                       hit checked against least-recently-used eviction)
    async-cancel       cancel-reuse with each step's K/V read again one step later    cancellations, late_reads,
                                                                                      deferred_free_blocks

With `source` (real chat prompts, chat.py) the prompts are the source's and the pools scale with their length.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ...core.sim.scheduler import SchedulerConfig
from .dry_run import cow_tight_fits
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
    eos_token: int | None = None  # the model's own end-of-sequence token (real prompts); None: ignore EOS


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
    expect_hits: tuple[tuple[int, int], ...] = ()  # (row, prefix-cache hit tokens its construction implies)
    async_reads: bool = False  # each step's K/V read again one step later, after the next step's writes


class RandomPrompts:
    """Prompts of seeded random token ids (the built-in model's): exactly the lengths asked for."""

    def __init__(self, rng: np.random.Generator, vocab: int) -> None:
        self.rng, self.vocab = rng, vocab

    def system(self, length: int) -> tuple[int, ...]:
        """A shared prefix (a system prompt) of `length` tokens."""
        return tuple(int(t) for t in self.rng.integers(0, self.vocab, length))

    def tokens(self, lengths: list[int], prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
        """One prompt per length: the prefix, then that many fresh tokens."""
        return [prefix + self.system(n) for n in lengths]

    def aligned(self, lengths: list[int], prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
        """Prompts whose whole length is a multiple of the block size."""
        return [prefix + self.system(n - len(prefix)) for n in lengths]


def _requests(prompts: list[tuple], new: list[int], arrival_steps: list[int], samples: list[int] | None = None,
              **kw) -> Requests:
    return Requests(tuple(prompts), tuple(new), tuple(1e-3 * a for a in arrival_steps),
                    tuple(samples or [1] * len(prompts)), **kw)


def _blocks(prompts: list[tuple], new: list[int], block_size: int) -> int:
    """The blocks requests hold at most, each alone: prompt + output − 1 tokens (the last one is never written)."""
    return sum(-(-(len(p) + n - 1) // block_size) for p, n in zip(prompts, new, strict=True))


def _common(a: tuple, b: tuple) -> int:
    """Length of the common prefix of two prompts."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def expected_hit(cached: tuple, prompt: tuple, block_size: int) -> int:
    """The hit tokens of `prompt` on a cache holding `cached`'s full blocks: the whole blocks of their common
    prefix, never the block of the prompt's last token (it must be recomputed to produce logits)."""
    return min(_common(cached, prompt), len(prompt) - 1) // block_size * block_size


def _tight_pool(reqs: Requests, near: int, block_size: int, scheduler: SchedulerConfig) -> int:
    """The pool size nearest `near` (smaller first at equal distance) in which some step's growth fits only
    without its copy-on-write copies — found by running the scheduler without a model (dry_run), since
    which sizes do depends on the prompts' lengths."""
    for size in sorted(range(max(near // 2, 1), 2 * near + 1), key=lambda n: (abs(n - near), n)):
        if cow_tight_fits(reqs.prompts, reqs.max_new_tokens, reqs.arrival_s, reqs.num_samples, size, block_size,
                          scheduler) > 0:
            return size
    return near


def build(name: str, vocab: int, seed: int, source=None) -> Scenario:
    """The scenario `name` with prompts drawn from `seed` over a vocabulary of `vocab` token ids, or from
    `source` (an object with RandomPrompts' methods: real chat prompts, `chat.ChatPrompts`). Pool sizes are
    written for the random prompts' lengths and scaled by the prompts' real token count, so a pool under
    pressure stays under pressure with longer prompts."""
    if name not in _RECIPES:
        raise ValueError(f"scenario {name!r} is unknown; use one of {', '.join(SCENARIOS)}")
    rng = np.random.default_rng([seed, SCENARIOS.index(name)])
    return _RECIPES[name](_Build(source if source is not None else RandomPrompts(rng, vocab), source), name)


class _Build:
    """What every scenario recipe draws on: the prompt source, the model's end-of-sequence token (real prompts),
    and the scaling of pool sizes and output lengths to real prompts (`real`: a source was given)."""

    def __init__(self, src, source) -> None:
        self.src, self.tokens, self.real = src, src.tokens, source is not None
        self.eos = getattr(source, "eos_token_id", None)  # real prompts: the model's own end of sequence

    def pool(self, num_blocks: int, prompts: list[tuple], new: list[int], nominal: list[int]) -> int:
        """`num_blocks` for prompts of the `nominal` lengths, scaled to these prompts' demand."""
        if not self.real:
            return num_blocks
        nominal_blocks = sum(-(-(n + m - 1) // BLOCK_SIZE) for n, m in zip(nominal, new, strict=True))
        return max(-(-num_blocks * _blocks(prompts, new, BLOCK_SIZE) // nominal_blocks), 1)

    def out(self, new: list[int]) -> list[int]:
        """Output lengths: with a real model 60 % of them (its step costs ~80 ms of CPU, the built-in one's ~1)."""
        return new if not self.real else [max(3, (3 * n + 4) // 5) for n in new]

    def cut(self, cancel_after: dict[int, int]) -> dict[int, int]:
        return cancel_after if not self.real else {row: max(1, 3 * n // 5) for row, n in cancel_after.items()}


def _ragged(r: _Build, name: str) -> Scenario:
    lengths = [1, 17, 5, 40, 12, 3, 26, 9, 33, 2, 21, 7]
    new = [12, 5, 9, 16, 4, 10, 8, 14, 6, 11, 7, 13]
    prompts = r.tokens(lengths)
    reqs = _requests(prompts, new, [0, 0, 0, 1, 2, 3, 5, 8, 8, 12, 15, 20], eos_from_reference=r.eos is None,
                     eos_token=r.eos)
    return Scenario(name, ("mixed_steps", "eos_finishes"), num_blocks=r.pool(128, prompts, new, lengths),
                    requests=reqs)


def _chunked_prefill(r: _Build, name: str) -> Scenario:
    lengths, new = [45, 61, 30, 9, 23], r.out([6, 6, 8, 10, 5])
    prompts = r.tokens(lengths)
    reqs = _requests(prompts, new, [0, 0, 2, 4, 6])
    return Scenario(name, ("prefill_chunks",), num_blocks=r.pool(96, prompts, new, lengths), requests=reqs,
                    scheduler=replace(DEFAULT_SCHEDULER, max_batched_tokens=16))


def _prefix_cache(r: _Build, name: str) -> Scenario:
    first, second = r.src.system(20), r.src.system(18)
    prompts = r.tokens([3, 6], first) + r.tokens([5, 2, 7, 4], second) + r.tokens([1, 6, 3], first)
    new = r.out([6] * 9)
    nominal = [23, 26, 23, 20, 25, 22, 21, 26, 23]
    reqs = _requests(prompts, new, [0, 0, 15, 15, 16, 16, 40, 40, 41])
    return Scenario(name, ("prefix_hit_tokens", "evictions"), num_blocks=r.pool(20, prompts, new, nominal),
                    requests=reqs, prefix_caching=True)


def _parallel_sampling(r: _Build, name: str) -> Scenario:
    lengths, new = [13, 22, 7], r.out([8, 6, 10])
    prompts = r.tokens(lengths)
    reqs = _requests(prompts, new, [0, 0, 4], [3, 2, 4], sampling=SAMPLED)
    return Scenario(name, ("forks", "cow_copies"), num_blocks=r.pool(96, prompts, new, lengths), requests=reqs)


def _beam_search(r: _Build, name: str) -> Scenario:
    prompts = r.tokens([11, 6])
    return Scenario(name, ("forks", "cow_copies", "beams_dropped"), num_blocks=r.pool(64, prompts, [8, 8], [11, 6]),
                    beam_prompts=tuple(tuple(p) for p in prompts))


def _preempt(r: _Build, name: str) -> Scenario:
    mode = name.removeprefix("preempt-")
    lengths, new = [10, 14, 18, 11, 20, 13], r.out([20, 24, 16, 22, 18, 20])
    prompts = r.tokens(lengths)
    reqs = _requests(prompts, new, [0] * 6)
    needs = ("preemptions",) if mode == "recompute" else ("preemptions", "swaps")
    return Scenario(name, needs, num_blocks=r.pool(24, prompts, new, lengths), requests=reqs,
                    scheduler=replace(DEFAULT_SCHEDULER, preempt=mode))


def _cancel(r: _Build, name: str) -> Scenario:
    system = r.src.system(10)
    prompts = r.tokens([3, 5, 2, 6], system) + r.tokens([7, 9, 4, 8, 6])
    new = r.out([16, 14, 16, 12, 10, 10, 10, 10, 10])
    reqs = _requests(prompts, new, [0, 0, 0, 0, 1, 1, 2, 2, 3],
                     [2, 1, 2, 1, 1, 1, 1, 1, 1], cancel_after=r.cut({0: 5, 2: 3, 3: 7, 5: 4, 8: 6}))
    # 26 blocks: tight enough that a cancelled request's blocks are handed out in the next step under vLLM's one
    # free queue too (never-used blocks first, then freed ones in free order), not only under a stack of free ids
    num_blocks = r.pool(26, prompts, new, [13, 15, 12, 16, 7, 9, 4, 8, 6])
    if name == "async-cancel":  # blocks come back one step later: no reuse in the very next plan
        return Scenario(name, ("cancellations", "deferred_free_blocks", "late_reads"), num_blocks=num_blocks,
                        requests=reqs, scheduler=replace(DEFAULT_SCHEDULER, max_seqs=5), async_reads=True)
    return Scenario(name, ("cancellations", "cancelled_blocks_reused", "deferred_free_blocks"),
                    num_blocks=num_blocks, requests=reqs, scheduler=replace(DEFAULT_SCHEDULER, max_seqs=5))


def _tiny_pool(r: _Build, name: str) -> Scenario:
    system = r.src.system(9)
    prompts = r.tokens([4, 7, 2], system) + r.tokens([15, 6, 22]) + r.tokens([5, 3], system)
    new = [14, 10, 12, 9, 16, 8, 11, 10]  # not shortened: its preemptions and evictions need the growth
    reqs = _requests(prompts, new, [0, 0, 1, 2, 3, 5, 9, 12],
                     [2, 1, 2, 1, 1, 1, 2, 1], sampling=SAMPLED, cancel_after={1: 4, 5: 5, 9: 3})
    return Scenario(name, ("prefix_hit_tokens", "cow_copies", "forks", "preemptions", "swaps", "cancellations",
                           "evictions"), num_blocks=r.pool(24, prompts, new, [13, 16, 11, 15, 6, 22, 14, 12]),
                    requests=reqs, prefix_caching=True,
                    scheduler=replace(DEFAULT_SCHEDULER, max_batched_tokens=24, preempt="swap"))


def _speculative(r: _Build, name: str) -> Scenario:
    system = r.src.system(10)
    prompts = r.tokens([3, 6, 2], system) + r.tokens([9, 14, 5])
    new = [18, 14, 20, 16, 12, 18]  # not shortened: its preemptions need the growth
    reqs = _requests(prompts, new, [0, 0, 4, 6, 8, 8], eos_from_reference=r.eos is None, eos_token=r.eos)
    return Scenario(name, ("rollbacks", "preemptions", "prefix_hit_tokens"),
                    num_blocks=r.pool(22, prompts, new, [13, 16, 12, 9, 14, 5]), requests=reqs,
                    prefix_caching=True, spec_tokens=3)


def _prefix_chunked(r: _Build, name: str) -> Scenario:
    # a 7-token step budget (not a multiple of the block size): prefill chunks end inside full prompt
    # blocks, whose content keys the pool must get only once the block is written
    system = r.src.system(18)
    lengths, new = [5, 9, 3, 11, 7, 6], r.out([5, 4, 6, 5, 4, 6])
    prompts = r.tokens(lengths, system)
    reqs = _requests(prompts, new, [0, 0, 6, 6, 12, 14])
    return Scenario(name, ("prefix_hit_tokens", "prefill_chunks", "mid_block_chunks"),
                    num_blocks=r.pool(64, prompts, new, [18 + n for n in lengths]), requests=reqs,
                    prefix_caching=True, scheduler=replace(DEFAULT_SCHEDULER, max_batched_tokens=7))


def _aligned_repeat(r: _Build, name: str) -> Scenario:
    # prompts a whole number of blocks long, sent again while cached: the hit stops one block short (the
    # block of the last prompt token is recomputed for its logits), exactly len - BLOCK_SIZE tokens
    system = r.src.system(8)
    originals = r.src.aligned([16, 12], system) + r.src.aligned([20])
    prompts = originals + originals
    new = r.out([5] * 6)
    expect = tuple((3 + i, expected_hit(p, p, BLOCK_SIZE)) for i, p in enumerate(originals))
    reqs = _requests(prompts, new, [0, 0, 0, 12, 12, 13])
    return Scenario(name, ("prefix_hit_tokens", "capped_hits"), num_blocks=r.pool(64, prompts, new, [16, 12, 20] * 2),
                    requests=reqs, prefix_caching=True, expect_hits=expect)


def _fork_pressure(r: _Build, name: str) -> Scenario:
    # parallel samples forked in a pool that is nearly full: a step's growth fits only if its
    # copy-on-write copies of shared partial blocks are counted too
    lengths, new = [13, 10, 7, 15, 9], r.out([10, 12, 9, 8, 11])
    prompts = r.tokens(lengths)
    reqs = _requests(prompts, new, [0, 0, 1, 2, 3], [3, 2, 4, 3, 2], sampling=SAMPLED)
    num_blocks = _tight_pool(reqs, r.pool(18, prompts, new, lengths), BLOCK_SIZE, DEFAULT_SCHEDULER)
    return Scenario(name, ("forks", "cow_copies", "preemptions", "cow_tight_fits"), num_blocks=num_blocks,
                    requests=reqs)


def _evict_return(r: _Build, name: str) -> Scenario:
    # a returns (b2 shares b's system prompt) after z evicted all but b2's prefix blocks: the least recently
    # used cached blocks go first, a block's chain from its first block on, so exactly that prefix is left
    first, second = r.src.system(12), r.src.system(16)
    a, b = r.tokens([6], first)[0], r.tokens([7], second)[0]
    z = r.tokens([40])[0]
    b2, a2 = r.tokens([5], second)[0], r.tokens([6], first)[0]
    prompts, new = [a, b, z, b2, a2], r.out([4, 4, 6, 4, 4])
    q = expected_hit(b, b2, BLOCK_SIZE) // BLOCK_SIZE
    # z holds every block but b2's q prefix blocks at its peak: the pool is exactly that big
    num_blocks = q + _blocks([z], [new[2]], BLOCK_SIZE)
    alone = max(_blocks([p], [m], BLOCK_SIZE) for p, m in zip(prompts, new, strict=True))
    assert num_blocks >= alone, "a request alone"
    reqs = _requests(prompts, new, [0, 10, 20, 40, 50])
    return Scenario(name, ("prefix_hit_tokens", "evictions"), num_blocks=num_blocks, requests=reqs,
                    prefix_caching=True, expect_hits=((3, q * BLOCK_SIZE),))


_RECIPES = {
    "ragged": _ragged,
    "chunked-prefill": _chunked_prefill,
    "prefix-cache": _prefix_cache,
    "parallel-sampling": _parallel_sampling,
    "beam-search": _beam_search,
    "preempt-recompute": _preempt,
    "preempt-swap": _preempt,
    "cancel-reuse": _cancel,
    "async-cancel": _cancel,
    "tiny-pool": _tiny_pool,
    "speculative": _speculative,
    "prefix-chunked": _prefix_chunked,
    "aligned-repeat": _aligned_repeat,
    "fork-pressure": _fork_pressure,
    "evict-return": _evict_return,
}


SCENARIOS = ("ragged", "chunked-prefill", "prefix-cache", "parallel-sampling", "beam-search", "preempt-recompute",
             "preempt-swap", "cancel-reuse", "tiny-pool", "speculative", "prefix-chunked", "aligned-repeat",
             "fork-pressure", "evict-return", "async-cancel")


def sampling_of_row(requests: Requests, row: int, seed: int) -> SamplingParams:
    """Each row's own seed, so parallel samples differ and a row draws the same tokens in any batch."""
    s = requests.sampling
    return s if s.greedy else SamplingParams(s.temperature, s.top_k, seed * 1_000_003 + row)
