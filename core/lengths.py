"""Sequence lengths for equations 2–3: given, read from a file or a real trace, or sampled.

Every source yields one `Lengths`: an int64 array of token counts (each >= 1) and a `source` line that says
whether the lengths are real (a trace, and which file), user-supplied (a list or a file of unknown
provenance) or constructed (a distribution with its parameters and seed). DESIGN.md asks that real and
constructed lengths are never confused; the `kind` field carries that.

Constructed samples come from a `LengthDistribution`, written as a spec string `name:key=value,...`:

    lognormal:mean=161,sigma=1.0     X = exp(N(mu, sigma^2)), length = ceil(X). Give exactly one of
                                     mean= (of X, so mu = ln(mean) - sigma^2/2) or median= (mu = ln(median));
                                     sigma (default 1.0, 0 < sigma <= 5) is that of the underlying normal.
                                     ceil makes the mean of the lengths larger than mean= by less than 1.
    uniform:low=1,high=2048          integers low..high, both inclusive (1 <= low <= high).
    exponential:mean=500             the discrete exponential: geometric on 1, 2, 3, ... with mean exactly
                                     `mean` (>= 1), P(length = k) = (1 - p)^(k-1) p, p = 1/mean.
    zipf:a=1.2,max=4096              P(length = k) ∝ k^-a on 1..max (a > 1; max required, <= 10^7).

`lognormal` and `exponential` also take an optional `max=`: the distribution is then truncated to
lengths <= max by resampling (i.e. conditioned on length <= max), never clamped. Other out-of-range
parameters are errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal

import numpy as np

from kvcalc.core.traces import read_trace

LengthKind = Literal["real", "user", "constructed"]
WORKED_EXAMPLE_TOKENS = (37, 91, 128, 201, 511)  # DESIGN.md's worked example (968 useful positions)
PHASES = ("total", "prompt")
_MAX_ZIPF_SUPPORT = 10**7  # the inverse-CDF table is max float64s
_MAX_EXACT_FLOAT = 2**53  # a sampled float above this is no longer an exact integer
_MAX_RESAMPLE_ROUNDS = 1000


@dataclass(frozen=True)
class _Family:
    keys: tuple[str, ...]  # every parameter it takes
    required: tuple[str, ...]
    defaults: dict[str, float | int]
    example: str


_FAMILIES: dict[str, _Family] = {
    "lognormal": _Family(("mean", "median", "sigma", "max"), (), {"sigma": 1.0}, "lognormal:mean=1366,sigma=0.8"),
    "uniform": _Family(("low", "high"), ("high",), {"low": 1}, "uniform:low=1,high=2048"),
    "exponential": _Family(("mean", "max"), ("mean",), {}, "exponential:mean=500"),
    "zipf": _Family(("a", "max"), ("a", "max"), {}, "zipf:a=1.2,max=4096"),
}
_INTEGER_KEYS = ("low", "high", "max")


@dataclass(frozen=True)
class LengthDistribution:
    """A distribution of sequence lengths (tokens, integers >= 1); build it with `parse(spec)`.

    `params` holds (key, value) pairs in the family's order, so equal specs compare and hash equal.
    """

    name: str
    params: tuple[tuple[str, float | int], ...]

    @classmethod
    def parse(cls, spec: str) -> LengthDistribution:
        """`"lognormal:mean=161,sigma=1.0"` -> LengthDistribution; any mistake is a ValueError naming it."""
        name, _, rest = spec.strip().partition(":")
        name = name.strip().lower()
        family = _FAMILIES.get(name)
        if family is None:
            raise ValueError(
                f"unknown distribution {name!r} in {spec!r}: choose one of {', '.join(_FAMILIES)}, "
                f"e.g. {_FAMILIES['lognormal'].example}"
            )
        values: dict[str, float | int] = dict(family.defaults)
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, eq, text = (s.strip() for s in item.partition("="))
            if not eq or key not in family.keys:
                raise ValueError(
                    f"unknown parameter {item!r} for {name}: it takes {', '.join(family.keys)} as key=value, "
                    f"e.g. {family.example}"
                )
            values[key] = _parse_number(text, key, name, integer=key in _INTEGER_KEYS)
        missing = [key for key in family.required if key not in values]
        if name == "lognormal" and ("mean" in values) == ("median" in values):
            missing.append("exactly one of mean or median")
        if missing:
            raise ValueError(f"{name} needs {', '.join(missing)}: e.g. --dist {family.example}")
        dist = cls(name, tuple((key, values[key]) for key in family.keys if key in values))
        dist._check_ranges()
        return dist

    def param(self, key: str) -> float | int | None:
        return dict(self.params).get(key)

    def describe(self) -> str:
        """`lognormal(mean=161, sigma=1)`: the spec in words, for the `source` line."""
        return f"{self.name}({', '.join(f'{k}={_fmt(v)}' for k, v in self.params)})"

    @property
    def spec(self) -> str:
        """The spec string that parses back to this distribution."""
        return f"{self.name}:{','.join(f'{k}={_fmt(v)}' for k, v in self.params)}"

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """`count` lengths, int64 [count], each in 1..max (max where the distribution has one)."""
        if not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"--count must be a positive number of lengths, got {count!r}")
        if self.name == "uniform":
            return rng.integers(self.param("low"), self.param("high"), size=count, endpoint=True, dtype=np.int64)
        if self.name == "zipf":
            support = np.arange(1, int(self.param("max")) + 1, dtype=np.float64)
            cdf = np.cumsum(support ** -float(self.param("a")))
            cdf /= cdf[-1]
            cdf[-1] = 1.0  # u < 1, so searchsorted never steps past max
            return np.searchsorted(cdf, rng.random(count), side="right").astype(np.int64) + 1
        upper = self.param("max")
        out = self._draw(count, rng)
        for _ in range(_MAX_RESAMPLE_ROUNDS):
            bad = np.flatnonzero((out < 1) | (out > upper)) if upper is not None else np.flatnonzero(out < 1)
            if bad.size == 0:
                return out
            out[bad] = self._draw(bad.size, rng)
        raise ValueError(f"{self.describe()}: almost no mass below max; raise max or lower the mean")

    def _draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        if self.name == "exponential":
            return rng.geometric(1.0 / float(self.param("mean")), size=count).astype(np.int64)
        sigma = float(self.param("sigma"))
        median = self.param("median")
        mu = math.log(median) if median is not None else math.log(self.param("mean")) - sigma**2 / 2
        x = np.ceil(rng.lognormal(mu, sigma, size=count))
        if x.max() > _MAX_EXACT_FLOAT:
            raise ValueError(f"{self.describe()} draws lengths above 2^53; lower mean or sigma, or give max=")
        return x.astype(np.int64)

    def _check_ranges(self) -> None:
        p = dict(self.params)
        checks = {
            "mean": p.get("mean", 1) >= (1 if self.name == "exponential" else 0) and p.get("mean", 1) > 0,
            "median": p.get("median", 1) > 0,
            "sigma": 0 < p.get("sigma", 1) <= 5,
            "low": p.get("low", 1) >= 1,
            "high": p.get("high", 1) >= p.get("low", 1),
            "a": p.get("a", 2) > 1,
            "max": 1 <= p.get("max", 1) <= (_MAX_ZIPF_SUPPORT if self.name == "zipf" else 2**62),
        }
        rules = {
            "mean": "a positive mean (>= 1 for exponential)",
            "median": "a positive median",
            "sigma": "0 < sigma <= 5",
            "low": "low >= 1",
            "high": "high >= low",
            "a": "an exponent a > 1",
            "max": f"1 <= max <= {_MAX_ZIPF_SUPPORT:,}" if self.name == "zipf" else "max >= 1",
        }
        for key, ok in checks.items():
            if not ok:
                raise ValueError(
                    f"{self.describe()}: {key}={_fmt(p[key])} is out of range; {self.name} needs {rules[key]}"
                )


def _parse_number(text: str, key: str, name: str, integer: bool) -> float | int:
    try:
        value: float | int = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{name}: {key}={text!r} is not {kind}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: {key}={text!r} must be finite")
    return value


def _fmt(value: float | int) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True, eq=False)
class Lengths:
    """Sequence lengths: `tokens` int64 [N], N >= 1, each >= 1; `kind` real | user | constructed."""

    tokens: np.ndarray
    kind: LengthKind
    source: str

    def __post_init__(self) -> None:
        assert self.tokens.dtype == np.int64 and self.tokens.ndim == 1, "lengths must be a 1-D int64 array"
        assert self.tokens.size >= 1 and int(self.tokens.min()) >= 1, "loaders validate before building Lengths"

    @property
    def count(self) -> int:
        return int(self.tokens.size)

    @property
    def total(self) -> int:
        """Σ n, exact (see paging.exact_sum for why int64 alone is not enough)."""
        from kvcalc.core.paging import exact_sum

        return exact_sum(self.tokens)

    @property
    def min(self) -> int:
        return int(self.tokens.min())

    @property
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
    """Check that every length is >= 1; `where[i]` locates item i in error messages."""
    if values.size == 0:
        raise ValueError(f"{what} holds no lengths: give at least one positive integer")
    bad = np.flatnonzero(values < 1)
    if bad.size:
        i = int(bad[0])
        place = where[i] if where is not None else f"{what}, item {i + 1}"
        raise ValueError(f"{place}: length {int(values[i])} is not positive; every sequence holds at least 1 token")
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
            raise ValueError(f"{path}, item {i + 1}: {array[i]!r} is not an integer length")
    elif array.dtype.kind not in "iu":
        raise ValueError(f"{path} holds {array.dtype} values: give integer lengths")
    elif array.dtype.kind == "u" and array.size and int(array.max()) > 2**62:
        raise ValueError(f"{path}: a length above 2^62 is too large")
    return _validated(array.astype(np.int64), None, str(path))


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
