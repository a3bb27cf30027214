"""Sequence lengths for equations 2–3: given, read from a file or a real trace, or sampled.

Every source yields one `Lengths`: an int64 array of token counts (each >= 1) and a `source` line that says
whether the lengths are real (a trace, and which file), user-supplied (a list or a file of unknown
provenance) or constructed (a distribution with its parameters and seed). Real and constructed lengths
must never be confused; the `kind` field carries that.

Constructed samples come from a `LengthDistribution` (core/distributions.py, re-exported here), written
as a spec string such as `lognormal:mean=161,sigma=1.0`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Literal

import numpy as np

from ..errors import ParameterError
from ..notes import Note, concat
from ..paging import MAX_LENGTH, exact_sum
from ..units import plural
from .distributions import LengthDistribution
from .files import ints_from_text, read_lengths_array, validated
from .sources import InputSource, source_name
from .traces import read_trace

__all__ = [
    "DEFAULT_SAMPLE_COUNT",
    "PHASES",
    "WORKED_EXAMPLE_TOKENS",
    "LengthDistribution",
    "Lengths",
    "lengths_from_trace",
    "load_lengths",
    "parse_lengths_list",
    "read_lengths_file",
    "sample_lengths",
    "worked_example",
]

LengthKind = Literal["real", "user", "constructed"]
# The worked example `kvcalc frag` shows by default: 968 useful positions; fixed reservation to 512
# allocates 2,560, pages of 16 allocate 992 and pages of 32 allocate 1,024.
WORKED_EXAMPLE_TOKENS = (37, 91, 128, 201, 511)
PHASES = ("total", "prompt")


@dataclass(frozen=True, eq=False)
class Lengths:
    """Sequence lengths: `tokens` int64 [N], N >= 1, each >= 1; `kind` real | user | constructed.

    The statistics are computed once (each is a pass over up to 10^7 lengths).
    """

    tokens: np.ndarray
    kind: LengthKind
    source: str

    def __post_init__(self) -> None:
        assert self.tokens.dtype == np.int64 and self.tokens.ndim == 1, "lengths must be a 1-D int64 array"
        assert self.tokens.size >= 1 and self.min >= 1, "loaders validate before building Lengths"

    @property
    def count(self) -> int:
        return int(self.tokens.size)

    @cached_property
    def total(self) -> int:
        """Σ n, exact (see paging.exact_sum for why int64 alone is not enough)."""
        return exact_sum(self.tokens, bound=self.max)

    @cached_property
    def min(self) -> int:
        return int(self.tokens.min())

    @cached_property
    def max(self) -> int:
        return int(self.tokens.max())

    @property
    def mean(self) -> Fraction:
        return Fraction(self.total, self.count)

    @property
    def description(self) -> str:
        """`real: azure trace …` — the kind first, so nobody mistakes a sample for a trace."""
        return concat(f"{self.kind}: ", self.source)


def worked_example() -> Lengths:
    tokens = np.array(WORKED_EXAMPLE_TOKENS, dtype=np.int64)
    return Lengths(tokens, "constructed", "the built-in worked example (37, 91, 128, 201, 511)")


def parse_lengths_list(text: str) -> Lengths:
    """`"37,91,128"` -> Lengths; errors name the item (1-based)."""
    items = [s.strip() for s in text.split(",")]
    if any(not s for s in items):
        raise ParameterError(f"{{lengths}} {text!r} has an empty item: write integers separated by commas, "
                             "e.g. 37,91,128", "lengths")

    def where(i: int) -> str:
        return f"{{lengths}} item {i + 1}"  # marked: the message is raised again as lengths' ParameterError

    try:
        values = validated(ints_from_text(items, where, option_spellings=True), where, "{lengths}")
    except ValueError as exc:
        raise ParameterError(str(exc), "lengths") from None
    return Lengths(values, "user", Note(f"{{lengths}} ({values.size:,} given on the command line)", "lengths"))


def read_lengths_file(source: InputSource, column: str | None = None) -> Lengths:
    """One integer per line; a CSV column (`column` given); a JSON list (.json); a NumPy array (.npy).
    `source` is a path, `-` (standard input) or a binary stream."""
    values = read_lengths_array(source, column)
    name = source_name(source)
    what = f"column {column} of {name}" if column else name
    return Lengths(values, "user", f"lengths file {what} ({plural(values.size, 'length')})")


def lengths_from_trace(kind: str, source: InputSource, phase: str = "total") -> Lengths:
    """Real lengths: prompt + output per request (`total`), or the prompt alone (`prompt`)."""
    if phase not in PHASES:
        raise ParameterError(f"unknown phase {phase!r}: choose total (prompt + output) or prompt", "phase")
    trace = read_trace(kind, source)
    what = "prompt + output" if phase == "total" else "prompt only"
    if phase == "total":
        # each part is at most 2^62, but their sum may not fit int64: compare before adding
        bad = np.flatnonzero(trace.prompt_tokens > MAX_LENGTH - trace.output_tokens)
        if bad.size:
            i = int(bad[0])
            total = int(trace.prompt_tokens[i]) + int(trace.output_tokens[i])
            raise ParameterError(f"{trace.path}, request {i + 1} (file order): length {total} ({what}) is too "
                                 "large (lengths must be <= 2^62); use {phase} prompt or fix the trace", "phase")
        tokens = trace.prompt_tokens + trace.output_tokens
    else:
        tokens = trace.prompt_tokens.copy()
    bad = np.flatnonzero(tokens < 1)
    if bad.size:
        raise ValueError(
            f"{trace.path}, request {int(bad[0]) + 1} (file order): length 0 ({what}); "
            "every sequence must hold at least 1 token"
        )
    columns = "ContextTokens + GeneratedTokens" if kind == "azure" else "input_length + output_length"
    if phase == "prompt":
        columns = columns.split(" + ")[0]
    description = f"{trace.kind} trace {trace.path}, {plural(len(trace), 'request')}, {what} ({columns})"
    return Lengths(tokens, "real", description)


def sample_lengths(
    dist: LengthDistribution, count: int, seed: int, progress: Callable[[int], None] | None = None
) -> Lengths:
    """A constructed, seeded sample; the source line names the distribution and the seed. `progress(n)`:
    n more lengths drawn."""
    if seed < 0:  # numpy's own message ("expected non-negative integer") names neither the option nor the fix
        raise ParameterError(f"seed {seed} is negative: give a whole number from 0 to 2**63-1 (e.g. seed 0)", "seed")
    tokens = dist.sample(count, np.random.default_rng(seed), progress)
    return Lengths(tokens, "constructed", f"{plural(count, 'sample')} of {dist.describe()}, seed {seed}")


DEFAULT_SAMPLE_COUNT = 10_000


def load_lengths(
    lengths: str | None = None,
    lengths_file: InputSource | None = None,
    column: str | None = None,
    trace: tuple[str, InputSource] | None = None,
    phase: str | None = None,
    dist: str | None = None,
    count: int | None = None,
    seed: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Lengths:
    """The one source the options name (`kvcalc frag`'s); none: the worked example.

    Two sources, or an option that belongs to a source not given (e.g. --seed without --dist), is an
    error rather than something silently ignored. `progress(n)` counts lengths drawn from --dist (the
    only source that can take long: --count 1e9 is about a minute).
    """
    sources = {"lengths": lengths, "lengths_file": lengths_file, "trace": trace, "dist": dist}
    given = [name for name, value in sources.items() if value is not None]
    if len(given) > 1:
        raise ParameterError("give one source of lengths, not " + " and ".join(f"{{{name}}}" for name in given),
                             *given)
    for option, value, owner, present in (
        ("column", column, "lengths_file", lengths_file),
        ("phase", phase, "trace", trace),
        ("count", count, "dist", dist),
        ("seed", seed, "dist", dist),
    ):
        if value is not None and present is None:
            raise ParameterError(f"{{{option}}} applies only to {{{owner}}}: add {{{owner}}} or drop {{{option}}}",
                                 option, owner)
    if lengths is not None:
        return parse_lengths_list(lengths)
    if lengths_file is not None:
        return read_lengths_file(lengths_file, column)
    if trace is not None:
        return lengths_from_trace(trace[0], trace[1], "total" if phase is None else phase.strip().lower())
    if dist is not None:
        sample_count = DEFAULT_SAMPLE_COUNT if count is None else count
        return sample_lengths(LengthDistribution.parse(dist), sample_count, 0 if seed is None else seed, progress)
    return worked_example()
