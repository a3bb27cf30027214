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
lengths <= max by resampling (i.e. conditioned on length <= max), never clamped. Other out-of-range
parameters are errors.

    dist = LengthDistribution.parse("lognormal:mean=161,sigma=1.0")
    dist.sample(1000, np.random.default_rng(0))   # int64 [1000], every value >= 1
    dist.describe()                              # 'lognormal(mean=161, sigma=1)'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..units import parse_int

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
        value: float | int = parse_int(text, key) if integer else float(text)  # 1e3 = 1000, as for every count
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{name}: {key}={text!r} is not {kind}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: {key}={text!r} must be finite")
    return value


def _fmt(value: float | int) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
