"""Workloads for `kvcalc sim`: when each request arrives and how long its prompt and output are.

Two kinds, never mixed and always labelled:

* real — a trace file (Azure LLM inference 2023, Mooncake FAST'25) with its own arrival times, optionally
  sped up or slowed down (`time_scale`) and cut to its first `limit` requests;
* constructed — seeded arrivals at a mean rate R, either Poisson or gamma with burstiness b, exactly as
  vLLM's `benchmark_serving.py` draws them (inter-arrival ~ Gamma(shape=b, scale=1/(R·b)); b = 1 is
  Poisson), and lengths from the same distributions `kvcalc frag --dist` offers.

A constructed workload keeps its lengths when only the rate changes: arrivals are drawn at unit rate and
divided by R (Gamma(b, 1/(R·b)) = Gamma(b, 1/b) / R), and arrivals, prompts, outputs and cancellation
points come from independent child streams of one seed. The max-rate search relies on this.

A model runner (a real forward pass behind the scheduler) needs more than lengths: `from_token_ids` builds
constructed requests that carry their prompts' token ids (which also key the prefix cache) and may ask for
n > 1 parallel samples, each an extra row that forks from its parent when the parent's first token comes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import pairwise

import numpy as np

from ..errors import ParameterError
from ..inputs.traces import RequestArrays, Trace

ARRIVALS = ("poisson", "gamma")
# Arrivals spread over more than ~31 years come from a mistyped rate (--rate 1e-300) and would overflow the
# simulator's time integrals (time × token slots); refused, naming the parameter to change.
MAX_SPAN_S = 1e9


def _check_span(arrival_s: np.ndarray, param: str, value: float) -> None:
    span = float(arrival_s[-1] - arrival_s[0]) if len(arrival_s) else 0.0
    if not span <= MAX_SPAN_S:
        raise ParameterError(f"{param} {value:g}: the arrivals would span {span:g} s, more than {MAX_SPAN_S:g} s "
                             f"(31 years); give a larger {param}", param)


@dataclass(frozen=True, eq=False)
class Workload(RequestArrays):
    """N requests as parallel arrays, sorted by arrival.

    arrival_s      float64 [N]   seconds from the first arrival
    prompt_tokens  int64   [N]   >= 1
    output_tokens  int64   [N]   >= 1 (a prefill always samples one token)
    hash_ids / hash_offsets      Mooncake prefix-block ids (one per 512 tokens), or None
    kind           "real" or "constructed"; `description` says what, without repeating the kind
    prompt_token_ids             per request, its prompt's token ids (None: lengths only)
    fork_parent    int64   [N]   the row a parallel sample forks from (same arrival and prompt, an earlier
                                 row), -1 for a request of its own; None: no parallel samples
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    kind: str
    description: str
    hash_ids: np.ndarray | None = None
    hash_offsets: np.ndarray | None = None
    notes: tuple[str, ...] = ()
    unit_arrival_s: np.ndarray | None = None  # constructed: the seeded arrivals at mean rate 1/s
    prompt_token_ids: tuple[tuple[int, ...], ...] | None = None
    fork_parent: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        if n == 0:
            raise ValueError("the workload holds no requests: give a trace that has some, or at least one request")
        assert self.arrival_s.shape == (n,) and self.output_tokens.shape == (n,), "workload arrays differ in length"
        if self.prompt_token_ids is not None:
            assert [len(p) for p in self.prompt_token_ids] == self.prompt_tokens.tolist(), "token ids vs lengths"
        if self.fork_parent is not None:
            child = np.flatnonzero(self.fork_parent >= 0)
            parent = self.fork_parent[child]
            assert np.all(parent < child) and np.all(self.fork_parent[parent] < 0), "a fork's parent is an earlier root"
            assert np.array_equal(self.arrival_s[parent], self.arrival_s[child]), "a fork arrives with its parent"
            assert np.array_equal(self.prompt_tokens[parent], self.prompt_tokens[child]), "a fork shares the prompt"

    def fork_children(self) -> dict[int, list[int]]:
        """parent row -> the rows of its parallel samples (empty without any)."""
        children: dict[int, list[int]] = {}
        if self.fork_parent is not None:
            for child in np.flatnonzero(self.fork_parent >= 0).tolist():
                children.setdefault(int(self.fork_parent[child]), []).append(child)
        return children

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0])

    @property
    def mean_rate_per_s(self) -> float:
        """(N − 1) / span: the mean arrival rate (inf when every request arrives at once)."""
        return (len(self) - 1) / self.span_s if self.span_s > 0 else float("inf")

    def at_rate(self, rate_per_s: float) -> Workload:
        """The same requests arriving at mean rate R: a constructed workload's unit-rate arrivals / R, or a
        trace's own times rescaled so that (N − 1) / span = R."""
        if not rate_per_s > 0 or not np.isfinite(rate_per_s):
            raise ParameterError(f"rate_per_s {rate_per_s} must be a positive finite number", "rate_per_s")
        if self.unit_arrival_s is not None:
            base = self.unit_arrival_s
        elif self.span_s > 0:
            base = self.arrival_s * self.mean_rate_per_s
        else:
            raise ValueError("every request arrives at once: there is no arrival pattern to rescale")
        return replace(self, arrival_s=base / rate_per_s,
                       description=f"{self.description}, arrivals rescaled to {rate_per_s:g}/s")


def count_text(count: int, noun: str) -> str:
    """'1 request', '2,000 requests'."""
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def _at_least_one(values: np.ndarray, what: str, notes: list[str]) -> np.ndarray:
    zeros = int(np.count_nonzero(values < 1))
    if zeros:
        verb = "was" if zeros == 1 else "were"
        notes.append(f"{count_text(zeros, 'request')} with {what} 0 {verb} simulated as {what} 1")
        values = np.maximum(values, 1)
    return values.astype(np.int64)


def from_trace(trace: Trace, time_scale: float = 1.0, limit: int | None = None) -> Workload:
    """A real workload from a trace; `time_scale` x > 1 speeds arrivals up x-fold (times divided by x)."""
    if not time_scale > 0 or not np.isfinite(time_scale):
        raise ParameterError(f"time_scale {time_scale:g} must be a positive number (2 = twice as fast)", "time_scale")
    if limit is not None:
        trace = trace.head(limit)
    late = np.flatnonzero(~np.isfinite(trace.arrival_s))
    if len(late):  # a time scale cannot fix it: the trace itself holds no time for that request
        raise ValueError(f"{trace.kind} trace {trace.path}: request {late[0] + 1} arrives at "
                         f"{trace.arrival_s[late[0]]}, not a finite time; fix or remove its timestamp")
    order = np.argsort(trace.arrival_s, kind="stable")
    notes: list[str] = []
    hash_ids, hash_offsets = trace.hash_ids, trace.hash_offsets
    if hash_ids is not None and hash_offsets is not None and not np.array_equal(order, np.arange(len(order))):
        pieces = [trace.request_hash_ids(int(i)) for i in order]
        hash_offsets = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)
        hash_ids = np.concatenate(pieces) if pieces else hash_ids[:0]
    arrival = trace.arrival_s[order]
    with np.errstate(over="ignore"):  # an overflow is refused just below
        arrival = (arrival - arrival[0]) / time_scale
    _check_span(arrival, "time_scale", time_scale)
    scale_text = "" if time_scale == 1 else f", arrivals x{time_scale:g} faster"
    return Workload(
        arrival_s=arrival,
        prompt_tokens=_at_least_one(trace.prompt_tokens[order], "prompt length", notes),
        output_tokens=_at_least_one(trace.output_tokens[order], "output length", notes),
        kind="real",
        description=f"{trace.kind} trace {trace.path} ({count_text(len(arrival), 'request')}{scale_text})",
        hash_ids=hash_ids,
        hash_offsets=hash_offsets,
        notes=tuple(notes),
    )


def unit_rate_arrivals(count: int, arrival: str, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times at mean rate 1/s: first at 0, then cumulative Gamma(b, 1/b) gaps (b = 1: Poisson)."""
    arrival = arrival.strip().lower()
    if arrival not in ARRIVALS:
        raise ParameterError(f"arrival {arrival!r} must be poisson or gamma", "arrival")
    if arrival == "poisson":
        burstiness = 1.0
    if not burstiness > 0 or not np.isfinite(burstiness):
        raise ParameterError(f"burstiness {burstiness:g} must be a positive number (1 = Poisson, < 1 burstier)",
                             "burstiness")
    gaps = rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=max(count - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])


def constructed(
    count: int,
    rate_per_s: float,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    *,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    lengths_text: str = "",
) -> Workload:
    """Seeded constructed workload; `prompt_tokens`/`output_tokens` are the sampled lengths [count].

    rate_per_s = inf sends every request at time 0 (an offline batch, as vLLM's --request-rate inf).
    """
    if count < 1:
        raise ParameterError(f"count {count} must be at least 1", "count")
    if not rate_per_s > 0:
        raise ParameterError(f"rate_per_s {rate_per_s:g} must be a positive number of requests per second (or inf)",
                             "rate_per_s")
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
    unit = unit_rate_arrivals(count, arrival, burstiness, rng)
    with np.errstate(over="ignore"):  # an overflow is refused just below
        arrival_s = np.zeros(count) if np.isinf(rate_per_s) else unit / rate_per_s
    _check_span(arrival_s, "rate_per_s", rate_per_s)
    notes: list[str] = []
    kind_text = "Poisson" if arrival.strip().lower() == "poisson" or burstiness == 1 else f"gamma b={burstiness:g}"
    return Workload(
        arrival_s=arrival_s,
        prompt_tokens=_at_least_one(np.asarray(prompt_tokens), "prompt length", notes),
        output_tokens=_at_least_one(np.asarray(output_tokens), "output length", notes),
        kind="constructed",
        description=f"{count_text(count, 'request')}, {kind_text} arrivals at {rate_per_s:g}/s, seed {seed}"
        + (f", {lengths_text}" if lengths_text else ""),
        notes=tuple(notes),
        unit_arrival_s=unit,
    )


def from_token_ids(prompts: list[list[int]], max_new_tokens: list[int], arrival_s: list[float] | None = None,
                   num_samples: list[int] | None = None, description: str = "requests with token ids") -> Workload:
    """Constructed requests with their prompts' token ids; request i asks for `num_samples[i]` parallel
    samples (default 1), each up to `max_new_tokens[i]` tokens, arriving at `arrival_s[i]` (default 0).

    The rows are request 0 and its samples, then request 1 and its samples, …; arrivals must be sorted
    (the scheduler takes requests in row order)."""
    count = len(prompts)
    arrival = [0.0] * count if arrival_s is None else list(arrival_s)
    samples = [1] * count if num_samples is None else list(num_samples)
    if not len(max_new_tokens) == len(arrival) == len(samples) == count:
        raise ParameterError(f"max_new_tokens, arrival_s and num_samples need one entry per prompt ({count})",
                             "max_new_tokens", "arrival_s", "num_samples")
    if any(len(p) < 1 for p in prompts) or any(m < 1 for m in max_new_tokens) or any(n < 1 for n in samples):
        raise ParameterError("prompts need a token each, max_new_tokens and num_samples must be >= 1",
                             "prompts", "max_new_tokens", "num_samples")
    if any(b < a for a, b in pairwise(arrival)):
        raise ParameterError(f"arrival_s {arrival} must be sorted", "arrival_s")
    rows = [(i, j) for i in range(count) for j in range(samples[i])]
    first_row = {i: r for r, (i, j) in enumerate(rows) if j == 0}
    return Workload(
        arrival_s=np.array([arrival[i] for i, _ in rows], dtype=np.float64),
        prompt_tokens=np.array([len(prompts[i]) for i, _ in rows], dtype=np.int64),
        output_tokens=np.array([max_new_tokens[i] for i, _ in rows], dtype=np.int64),
        kind="constructed",
        description=description,
        prompt_token_ids=tuple(tuple(int(t) for t in prompts[i]) for i, _ in rows),
        fork_parent=np.array([first_row[i] if j else -1 for i, j in rows], dtype=np.int64)
        if max(samples, default=1) > 1 else None,
    )


def length_streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """Independent generators for prompt lengths, output lengths and cancellation points of one seed."""
    prompts, outputs, cancels = (np.random.default_rng(c) for c in np.random.SeedSequence(seed).spawn(4)[1:])
    return prompts, outputs, cancels


def cancellation_points(
    output_tokens: np.ndarray, fraction: float, rng: np.random.Generator
) -> np.ndarray:
    """Per request, the output count at which it is cancelled, or 0 for never [N] int64.

    A `fraction` of the requests that can stop early (output >= 2) is drawn; each stops after a uniform
    number of tokens in 1 .. output − 1, so it has a first token and a partial output.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ParameterError(f"fraction {fraction:g} must be between 0 and 1", "fraction")
    n = len(output_tokens)
    cancel_at = np.zeros(n, dtype=np.int64)
    eligible = np.flatnonzero(output_tokens >= 2)
    chosen = rng.permutation(eligible)[: round(fraction * len(eligible))]
    cancel_at[chosen] = rng.integers(1, output_tokens[chosen])
    return cancel_at
