"""Distributions of sequence lengths for constructed samples (`kvcalc frag --dist`, `kvcalc sim`).

A `LengthDistribution` is written as a spec string `name:key=value,...`:

    lognormal:mean=161,sigma=1.0     X = exp(N(mu, sigma^2)), length = ceil(X). Give exactly one of
                                     mean= (of X, so mu = ln(mean) - sigma^2/2) or median= (mu = ln(median));
                                     sigma (default 1.0, 0 < sigma <= 5) is that of the underlying normal.
                                     ceil makes the mean of the lengths larger than mean= by less than 1.
    uniform:low=1,high=2048          integers low..high, both inclusive (1 <= low <= high).
    exponential:mean=500             the discrete exponential: geometric on 1, 2, 3, ... with mean exactly
                                     `mean` (>= 1), P(length = k) = (1 - p)^(k-1) p, p = 1/mean.
    zipf:a=1.2,max=4096              P(length = k) ∝ k^-a on 1..max (a > 1; max required, <= 10^7).

`lognormal` and `exponential` also take an optional `max=`: the distribution is then truncated to
lengths <= max by resampling (i.e. conditioned on length <= max), never clamped. Their mean, median and
max are at most 2^53 (they are drawn as floats, exact up to there); uniform's bounds at most 2^62, the
longest length kvcalc holds. Other out-of-range parameters, unknown ones and one given twice are errors.

    dist = LengthDistribution.parse("lognormal:mean=161,sigma=1.0")
    dist.sample(1000, np.random.default_rng(0))   # int64 [1000], every value >= 1
    dist.describe()                              # 'lognormal(mean=161, sigma=1)'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import ParameterError
from ..host_memory import check_fits
from ..paging import MAX_LENGTH
from ..units import format_count_short, parse_int

_MAX_ZIPF_SUPPORT = 10**7  # the inverse-CDF table is max float64s
_MAX_EXACT_FLOAT = 2**53  # a sampled float above this is no longer an exact integer
_MAX_RESAMPLE_ROUNDS = 1000
# Lengths are drawn this many at a time into the result: the float scratch stays a few MB whatever the
# count, progress comes per chunk, and a sample of up to this many lengths is the very one a single draw gives.
SAMPLE_CHUNK = 1 << 20


@dataclass(frozen=True)
class _Rule:
    """What one parameter may be: an integer or a real, finite, in [low, high] (`open_low`: > low)."""

    integer: bool
    low: float
    high: float
    open_low: bool = False
    why: str = ""

    def describe(self, key: str) -> str:
        bottom = f"{key} {'>' if self.open_low else '>='} {_spell(self.low)}"
        return bottom if math.isinf(self.high) else f"{bottom} and <= {_spell(self.high)}{self.why}"


_FLOAT_LENGTH = f" (= {_MAX_EXACT_FLOAT:,}; lengths are drawn as floats, exact up to there)"
_LENGTH = f" (= {MAX_LENGTH:,}, the longest length kvcalc holds)"
_FAMILIES: dict[str, tuple[dict[str, _Rule], tuple[str, ...], dict[str, float | int], str]] = {
    # name: (rule per parameter, required ones, defaults, example)
    "lognormal": (
        {"mean": _Rule(False, 0, _MAX_EXACT_FLOAT, True, _FLOAT_LENGTH),
         "median": _Rule(False, 0, _MAX_EXACT_FLOAT, True, _FLOAT_LENGTH),
         "sigma": _Rule(False, 0, 5, True),
         "max": _Rule(True, 1, _MAX_EXACT_FLOAT, False, _FLOAT_LENGTH)},
        (), {"sigma": 1.0}, "lognormal:mean=1366,sigma=0.8",
    ),
    "uniform": (
        {"low": _Rule(True, 1, MAX_LENGTH, False, _LENGTH), "high": _Rule(True, 1, MAX_LENGTH, False, _LENGTH)},
        ("high",), {"low": 1}, "uniform:low=1,high=2048",
    ),
    "exponential": (
        {"mean": _Rule(False, 1, _MAX_EXACT_FLOAT, False, _FLOAT_LENGTH),
         "max": _Rule(True, 1, _MAX_EXACT_FLOAT, False, _FLOAT_LENGTH)},
        ("mean",), {}, "exponential:mean=500",
    ),
    "zipf": (
        {"a": _Rule(False, 1, math.inf, True),
         "max": _Rule(True, 1, _MAX_ZIPF_SUPPORT, False, " (the inverse-CDF table)")},
        ("a", "max"), {}, "zipf:a=1.2,max=4096",
    ),
}


@dataclass(frozen=True)
class LengthDistribution:
    """A distribution of sequence lengths (tokens, integers >= 1); build it with `parse(spec)`.

    `params` holds (key, value) pairs in the family's order, so equal specs compare and hash equal.
    """

    name: str
    params: tuple[tuple[str, float | int], ...]

    @classmethod
    def parse(cls, spec: str) -> LengthDistribution:
        """`"lognormal:mean=161,sigma=1.0"` -> LengthDistribution; any mistake is a ValueError naming it:
        an unknown name or parameter, one given twice, one missing, a value that is no number or out of range."""
        name, _, rest = spec.strip().partition(":")
        name = name.strip().lower()
        if name not in _FAMILIES:
            raise ValueError(
                f"unknown distribution {name!r} in {spec!r}: choose one of {', '.join(_FAMILIES)}, "
                f"e.g. {_FAMILIES['lognormal'][3]}"
            )
        rules, required, defaults, example = _FAMILIES[name]
        given: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, eq, text = (s.strip() for s in item.partition("="))
            if not eq or key not in rules:
                raise ValueError(
                    f"unknown parameter {item!r} for {name}: it takes {', '.join(rules)} as key=value, "
                    f"e.g. {example}"
                )
            if key in given:
                raise ValueError(f"{name}: {key} is given twice ({key}={given[key]} and {key}={text}): give it once")
            given[key] = text
        missing = [key for key in required if key not in given]
        if name == "lognormal" and ("mean" in given) == ("median" in given):
            missing.append("exactly one of mean or median")
        if missing:
            raise ParameterError(f"{name} needs {', '.join(missing)}: e.g. {{dist}} {example}", "dist")
        values = dict(defaults) | {key: _parse_number(text, key, name, rules[key]) for key, text in given.items()}
        if name == "uniform" and values["high"] < values["low"]:
            raise ValueError(f"uniform: high={given['high']} is out of range: it must be >= low={_fmt(values['low'])}")
        return cls(name, tuple((key, values[key]) for key in rules if key in values))

    def param(self, key: str) -> float | int | None:
        return dict(self.params).get(key)

    def _need(self, key: str) -> float | int:
        """A parameter that parse() guarantees for this distribution (required or defaulted)."""
        value = self.param(key)
        assert value is not None, f"{self.name} has no {key}"
        return value

    def describe(self) -> str:
        """`lognormal(mean=161, sigma=1)`: the spec in words, for the `source` line."""
        return f"{self.name}({', '.join(f'{k}={_fmt(v)}' for k, v in self.params)})"

    @property
    def spec(self) -> str:
        """The spec string that parses back to this distribution."""
        return f"{self.name}:{','.join(f'{k}={_fmt(v)}' for k, v in self.params)}"

    def sample(
        self, count: int, rng: np.random.Generator, progress: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """`count` lengths, int64 [count], each in 1..max (max where the distribution has one).

        Drawn SAMPLE_CHUNK at a time into one int64 array (8 bytes a length, refused up front when this
        machine has not that much memory available); `progress(n)` is told after each chunk.
        """
        if not isinstance(count, (int, np.integer)) or count < 1:
            raise ParameterError(f"count must be a positive number of lengths, got {count!r}", "count")
        check_fits(8 * int(count), f"{format_count_short(int(count))} lengths (8 bytes each)", "lower count", "count")
        cdf = self._zipf_cdf() if self.name == "zipf" else None
        out = np.empty(int(count), dtype=np.int64)
        for start in range(0, out.size, SAMPLE_CHUNK):
            chunk = out[start : start + SAMPLE_CHUNK]
            self._fill(chunk, rng, cdf)
            if progress is not None:
                progress(chunk.size)
        return out

    def _fill(self, out: np.ndarray, rng: np.random.Generator, cdf: np.ndarray | None) -> None:
        if self.name == "uniform":
            low, high = int(self._need("low")), int(self._need("high"))
            out[:] = rng.integers(low, high, size=out.size, endpoint=True, dtype=np.int64)
            return
        if cdf is not None:
            out[:] = np.searchsorted(cdf, rng.random(out.size), side="right")
            out += 1
            return
        upper = self.param("max")
        out[:] = self._draw(out.size, rng)
        for _ in range(_MAX_RESAMPLE_ROUNDS):
            bad = np.flatnonzero((out < 1) | (out > upper)) if upper is not None else np.flatnonzero(out < 1)
            if bad.size == 0:
                return
            out[bad] = self._draw(bad.size, rng)
        raise ValueError(f"{self.describe()}: almost no mass below max; raise max or lower the mean")

    def _zipf_cdf(self) -> np.ndarray:
        support = np.arange(1, int(self._need("max")) + 1, dtype=np.float64)
        cdf = np.cumsum(support ** -float(self._need("a")))
        cdf /= cdf[-1]
        cdf[-1] = 1.0  # u < 1, so searchsorted never steps past max
        return cdf

    def _draw(self, count: int, rng: np.random.Generator) -> np.ndarray:
        if self.name == "exponential":
            x = rng.geometric(1.0 / float(self._need("mean")), size=count)  # int64, computed through a float
        else:
            sigma = float(self._need("sigma"))
            median = self.param("median")
            mu = math.log(median) if median is not None else math.log(self._need("mean")) - sigma**2 / 2
            x = np.ceil(rng.lognormal(mu, sigma, size=count))
        if x.max() > _MAX_EXACT_FLOAT:
            raise ValueError(f"{self.describe()} draws lengths above 2^53; lower mean or sigma, or give max=")
        return x.astype(np.int64, copy=False)


def _parse_number(text: str, key: str, name: str, rule: _Rule) -> float | int:
    try:
        value: float | int = parse_int(text, key) if rule.integer else float(text)  # 1e3 = 1000, as for every count
    except ValueError:
        kind = "an integer" if rule.integer else "a number"
        raise ValueError(f"{name}: {key}={text!r} is not {kind}") from None
    if isinstance(value, float) and not math.isfinite(value):  # an integer is finite however large (1e400)
        raise ValueError(f"{name}: {key}={text!r} must be finite")
    if value < rule.low or (rule.open_low and value == rule.low) or value > rule.high:
        raise ValueError(f"{name}: {key}={text} is out of range: {name} needs {rule.describe(key)}")
    return value


def _spell(value: float) -> str:
    """A bound as the messages give it: 2^53 and 2^62 by name, others as short numbers."""
    if value == MAX_LENGTH:
        return "2^62"
    if value == _MAX_EXACT_FLOAT:
        return "2^53"
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _fmt(value: float | int) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
