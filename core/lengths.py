"""Sequence lengths for equations 2–3: given, read from a file or a real trace, or sampled.

Every source yields one `Lengths`: an int64 array of token counts (each >= 1) and a `source` line that says
whether the lengths are real (a trace, and which file), user-supplied (a list or a file of unknown
provenance) or constructed (a distribution with its parameters and seed). DESIGN.md asks that real and
constructed lengths are never confused; the `kind` field carries that.

Constructed samples come from a `LengthDistribution` (core/distributions.py, re-exported here), written
as a spec string such as `lognormal:mean=161,sigma=1.0`.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from pathlib import Path
from typing import Literal

import numpy as np

from kvcalc.core.distributions import LengthDistribution
from kvcalc.core.paging import MAX_LENGTH, exact_sum
from kvcalc.core.traces import read_trace

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
WORKED_EXAMPLE_TOKENS = (37, 91, 128, 201, 511)  # DESIGN.md's worked example (968 useful positions)
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
        return f"{self.kind}: {self.source}"


def _validated(values: np.ndarray, where: list[str] | None, what: str) -> np.ndarray:
    """Check that every length is in 1..MAX_LENGTH; `where[i]` locates item i in error messages."""
    if values.size == 0:
        raise ValueError(f"{what} holds no lengths: give at least one positive integer")
    problem = None
    if int(values.min()) < 1:
        bad, problem = values < 1, "is not positive; every sequence holds at least 1 token"
    elif int(values.max()) > MAX_LENGTH:
        bad, problem = values > MAX_LENGTH, "is too large (lengths must be <= 2^62)"
    if problem is not None:
        i = int(np.argmax(bad))
        place = where[i] if where is not None else f"{what}, item {i + 1}"
        raise ValueError(f"{place}: length {int(values[i])} {problem}")
    return values


def _ints_from_text(items: list[str], places: list[str], hint: str = "") -> np.ndarray:
    """Parse integer strings; the fast path is vectorised, the slow one finds and names the first bad item."""
    try:
        return np.array(items).astype(np.int64) if items else np.zeros(0, np.int64)
    except (ValueError, OverflowError):
        pass
    for text, place in zip(items, places, strict=True):
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{place}: {text!r} is not an integer length{hint}") from None
        if value > 2**62:
            raise ValueError(f"{place}: length {value} is too large (lengths must be <= 2^62)")
    raise AssertionError("unreachable: numpy rejected the items but int() accepted every one")


def worked_example() -> Lengths:
    tokens = np.array(WORKED_EXAMPLE_TOKENS, dtype=np.int64)
    return Lengths(tokens, "constructed", "the worked example of DESIGN.md (37, 91, 128, 201, 511)")


def parse_lengths_list(text: str) -> Lengths:
    """`"37,91,128"` -> Lengths; errors name the item (1-based)."""
    items = [s.strip() for s in text.split(",")]
    places = [f"--lengths item {i + 1}" for i in range(len(items))]
    if any(not s for s in items):
        raise ValueError(f"--lengths {text!r} has an empty item: write integers separated by commas, e.g. 37,91,128")
    values = _validated(_ints_from_text(items, places), places, "--lengths")
    return Lengths(values, "user", f"--lengths ({values.size:,} given on the command line)")


def read_lengths_file(path: str | Path, column: str | None = None) -> Lengths:
    """One integer per line; a CSV column (`column` given); a JSON list (.json); a NumPy array (.npy)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    if column is not None:
        values = _read_csv_column(path, column)
    elif path.suffix.lower() == ".npy":
        values = _read_npy(path)
    elif path.suffix.lower() == ".json":
        values = _read_json(path)
    else:
        values = _read_lines(path)
    what = f"column {column} of {path}" if column else str(path)
    return Lengths(values, "user", f"lengths file {what} ({values.size:,} lengths)")


def _read_lines(path: Path) -> np.ndarray:
    numbered = [(i, s.strip()) for i, s in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)]
    numbered = [(i, s) for i, s in numbered if s]
    if not numbered:
        raise ValueError(f"{path} is empty: write one positive integer per line")
    items = [s for _, s in numbered]
    places = [f"{path}:{i}" for i, _ in numbered]
    hint = ""
    if "," in items[0]:
        hint = f"; for a CSV give --column NAME (the first line has {items[0]})"
    return _validated(_ints_from_text(items, places, hint), places, str(path))


def _read_csv_column(path: Path, column: str) -> np.ndarray:
    import csv

    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        if not header:
            raise ValueError(f"{path} is empty: a CSV needs a header line with the column {column}")
        if column not in header:
            raise ValueError(
                f"{path} has no column {column!r}: its columns are {', '.join(header)}; pick one with --column"
            )
        index = header.index(column)
        items: list[str] = []
        places: list[str] = []
        for row in reader:
            if not row or all(not cell.strip() for cell in row):
                continue
            place = f"{path}:{reader.line_num} (column {column})"
            if len(row) <= index:
                raise ValueError(f"{place}: the row has {len(row)} cells, fewer than the header's {len(header)}")
            items.append(row[index].strip())
            places.append(place)
    if not items:
        raise ValueError(f"{path} has a header but no rows: give at least one length")
    return _validated(_ints_from_text(items, places), places, str(path))


def _read_json(path: Path) -> np.ndarray:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno}): write a list [37, 91]") from None
    if not isinstance(data, list):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not a list: write a list like [37, 91, 128]")
    if not data:
        raise ValueError(f"{path} is an empty list: give at least one length")
    for i, value in enumerate(data):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{path}, item {i + 1}: {value!r} is not an integer length")
        if value > 2**62:
            raise ValueError(f"{path}, item {i + 1}: length {value} is too large (lengths must be <= 2^62)")
    return _validated(np.array(data, dtype=np.int64), None, str(path))


def _read_npy(path: Path) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise ValueError(f"{path} is not a readable .npy array ({exc}); save it with numpy.save") from None
    if array.ndim != 1:
        raise ValueError(f"{path} holds an array of shape {array.shape}: give a 1-D array of lengths")
    if array.dtype.kind == "f":
        fractional = np.flatnonzero(~np.isfinite(array) | (array != np.floor(array)) | (np.abs(array) > 2**53))
        if fractional.size:
            i = int(fractional[0])
            raise ValueError(f"{path}, item {i + 1}: {array[i].item()!r} is not an integer length")
    elif array.dtype.kind not in "iu":
        raise ValueError(f"{path} holds {array.dtype} values: give integer lengths")
    elif array.dtype.kind == "u" and array.size and int(array.max()) > 2**62:
        raise ValueError(f"{path}: a length above 2^62 is too large")
    return _validated(np.asarray(array, dtype=np.int64), None, str(path))


def lengths_from_trace(kind: str, path: str | Path, phase: str = "total") -> Lengths:
    """Real lengths: prompt + output per request (`total`), or the prompt alone (`prompt`)."""
    if phase not in PHASES:
        raise ValueError(f"unknown --phase {phase!r}: choose total (prompt + output) or prompt")
    trace = read_trace(kind, path)
    tokens = trace.prompt_tokens + trace.output_tokens if phase == "total" else trace.prompt_tokens.copy()
    what = "prompt + output" if phase == "total" else "prompt only"
    bad = np.flatnonzero(tokens < 1)
    if bad.size:
        raise ValueError(
            f"{trace.path}, request {int(bad[0]) + 1} (file order): length 0 ({what}); "
            "every sequence must hold at least 1 token"
        )
    columns = "ContextTokens + GeneratedTokens" if kind == "azure" else "input_length + output_length"
    if phase == "prompt":
        columns = columns.split(" + ")[0]
    return Lengths(tokens, "real", f"{trace.kind} trace {trace.path}, {len(trace):,} requests, {what} ({columns})")


def sample_lengths(dist: LengthDistribution, count: int, seed: int) -> Lengths:
    """A constructed, seeded sample; the source line names the distribution and the seed."""
    tokens = dist.sample(count, np.random.default_rng(seed))
    return Lengths(tokens, "constructed", f"{count:,} samples of {dist.describe()}, seed {seed}")


DEFAULT_SAMPLE_COUNT = 10_000


def load_lengths(
    lengths: str | None = None,
    lengths_file: str | Path | None = None,
    column: str | None = None,
    trace: tuple[str, str | Path] | None = None,
    phase: str | None = None,
    dist: str | None = None,
    count: int | None = None,
    seed: int | None = None,
) -> Lengths:
    """The one source the options name (`kvcalc frag`'s); none: the worked example.

    Two sources, or an option that belongs to a source not given (e.g. --seed without --dist), is an
    error rather than something silently ignored.
    """
    sources = {"--lengths": lengths, "--lengths-file": lengths_file, "--trace": trace, "--dist": dist}
    given = [name for name, value in sources.items() if value is not None]
    if len(given) > 1:
        raise ValueError(f"give one source of lengths, not {' and '.join(given)}")
    for option, value, owner, present in (
        ("--column", column, "--lengths-file", lengths_file),
        ("--phase", phase, "--trace", trace),
        ("--count", count, "--dist", dist),
        ("--seed", seed, "--dist", dist),
    ):
        if value is not None and present is None:
            raise ValueError(f"{option} applies only to {owner}: add {owner} or drop {option}")
    if lengths is not None:
        return parse_lengths_list(lengths)
    if lengths_file is not None:
        return read_lengths_file(lengths_file, column)
    if trace is not None:
        return lengths_from_trace(trace[0], trace[1], (phase or "total").strip().lower())
    if dist is not None:
        sample_count = DEFAULT_SAMPLE_COUNT if count is None else count
        return sample_lengths(LengthDistribution.parse(dist), sample_count, 0 if seed is None else seed)
    return worked_example()
