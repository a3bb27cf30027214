"""The search space of `kvcalc plan` and what one point of it is: exactly one `kvcalc sim --max-rate` invocation.

A point is a GPU type, a TP degree, a block size, a token budget per step, a KV precision and a number of
replicas. Its simulation is the `SimOptions` of the plan's base options (workload, model, SLO, attainment)
with those six settings and `find_max_rate` on; one replica receives the workload at 1/replicas of its
rate (a constructed workload: `rate` R / n; a trace: `time_scale` / n, the same arrival pattern n times
slower — an even split by the load balancer, whose imbalance is not modelled). `sim_argv` writes that
`SimOptions` back as the `kvcalc sim` command line that rebuilds it field for field, so that the printed
command and the plan run the same code on the same inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from itertools import product
from pathlib import Path

from ..blocks import DEFAULT_BLOCK_SIZE
from ..dtypes import DEFAULT_DTYPE, parse_dtype
from ..errors import ParameterError
from ..gpus import GPU_PRESETS, get_gpu
from ..model.vllm_memory import DEFAULT_MAX_NUM_BATCHED_TOKENS
from ..sim.options import DEFAULT_RATE, SimOptions

DEFAULT_TP = (1, 2, 4)
DEFAULT_REPLICAS = (1, 2, 4)
MAX_POINTS = 10_000  # a grid this large is a typo (a range of thousands), not a plan to run


@dataclass(frozen=True, order=True)
class Point:
    """One deployment: `replicas` copies of `tp` GPUs of type `gpu`, each with these engine settings."""

    gpu: str
    tp: int
    block_size: int
    max_batched_tokens: int
    kv_dtype: str
    replicas: int

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas

    def label(self) -> str:
        return (f"{self.gpu} tp{self.tp} ×{self.replicas} block {self.block_size} "
                f"mbt {self.max_batched_tokens} {self.kv_dtype}")


@dataclass(frozen=True)
class Space:
    """The values of each setting; the points are their product, in this order (the plan's point order)."""

    gpus: tuple[str, ...]
    tp: tuple[int, ...] = DEFAULT_TP
    block_sizes: tuple[int, ...] = (DEFAULT_BLOCK_SIZE,)
    max_batched_tokens: tuple[int, ...] = (DEFAULT_MAX_NUM_BATCHED_TOKENS,)
    kv_dtypes: tuple[str, ...] = (DEFAULT_DTYPE,)
    replicas: tuple[int, ...] = DEFAULT_REPLICAS

    def points(self) -> list[Point]:
        return [Point(*values) for values in product(self.gpus, self.tp, self.block_sizes, self.max_batched_tokens,
                                                      self.kv_dtypes, self.replicas)]


def parse_ints(text: str, param: str, *, lowest: int = 1, highest: int = 2**31 - 1) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4): distinct integers in [lowest, highest], in the order given."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ParameterError(f"{param} {text!r} has an empty item: give integers separated by single commas, "
                             "e.g. 1,2,4", param)
    values = []
    for item in items:
        try:
            value = int(item)
        except ValueError:
            raise ParameterError(f"{param} {text!r}: {item!r} is not an integer; give e.g. 1,2,4", param) from None
        if not lowest <= value <= highest:
            raise ParameterError(f"{param} {text!r}: {value} must be between {lowest:,} and {highest:,}", param)
        values.append(value)
    _no_repeats(values, text, param)
    return tuple(values)


def parse_dtypes(text: str, param: str = "kv_dtype") -> tuple[str, ...]:
    """'bf16,fp8' -> ('bf16', 'fp8'), each a known precision, each once."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ParameterError(f"{param} {text!r} has an empty item: give precisions separated by single commas, "
                             "e.g. bf16,fp8", param)
    values = [parse_dtype(item, param) for item in items]
    _no_repeats(values, text, param)
    return tuple(values)


def _no_repeats(values: Sequence, text: str, param: str) -> None:
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        raise ParameterError(f"{param} {text!r} names {', '.join(repeated)} twice; give each value once", param)


def parse_prices(items: Sequence[str], param: str = "gpu_cost") -> dict[str, float]:
    """['H100-SXM=4.5', 'A100-80GB=2'] -> {GPU preset name: price per GPU-hour}. No built-in prices: every
    GPU the plan may use is one given here, at a positive finite price."""
    if not items:
        raise ParameterError(f"{param} is required: give each GPU to consider with its price per GPU-hour, e.g. "
                             f"{param} H100-SXM=4.5 {param} A100-80GB=2 (kvcalc has no built-in prices)", param)
    prices: dict[str, float] = {}
    for item in items:
        name, eq, price_text = item.partition("=")
        if not eq or not name.strip() or not price_text.strip():
            raise ParameterError(f"{param} {item!r}: write NAME=PRICE_PER_HOUR, e.g. H100-SXM=4.5", param)
        try:
            gpu = get_gpu(name, "(kvcalc plan searches the preset GPUs)")
        except ValueError as exc:
            raise ParameterError(f"{param} {item!r}: {exc}", param) from None
        try:
            price = float(price_text)
        except ValueError:
            raise ParameterError(f"{param} {item!r}: {price_text.strip()!r} is not a number; write e.g. "
                                 f"{gpu.name}=4.5 (per GPU-hour)", param) from None
        if not (price > 0 and math.isfinite(price)):
            raise ParameterError(f"{param} {item!r}: the price must be a positive finite number per GPU-hour", param)
        if gpu.name in prices:
            raise ParameterError(f"{param} names {gpu.name} twice; give each GPU once", param)
        prices[gpu.name] = price
    return prices


def check_gpus(gpus: Sequence[str], prices: dict[str, float], param: str = "gpu") -> tuple[str, ...]:
    """The GPUs to search: those given (each must have a price), or every priced one. A GPU without a price
    is refused, never searched at a guessed cost."""
    if not gpus:
        return tuple(prices)
    names = []
    for name in gpus:
        gpu = GPU_PRESETS.get(name.strip().lower())
        if gpu is None:
            raise ParameterError(f"{param} {name!r} is not a known GPU: choose from "
                                 f"{', '.join(g.name for g in GPU_PRESETS.values())}", param)
        if gpu.name not in prices:
            raise ParameterError(f"{param} {gpu.name} has no price: add gpu_cost {gpu.name}=PRICE_PER_HOUR "
                                 "(kvcalc has no built-in prices)", param, "gpu_cost")
        names.append(gpu.name)
    _no_repeats(names, ",".join(gpus), param)
    return tuple(names)


def check_space(space: Space) -> None:
    count = len(space.gpus) * len(space.tp) * len(space.block_sizes) * len(space.max_batched_tokens) \
        * len(space.kv_dtypes) * len(space.replicas)
    if count > MAX_POINTS:
        raise ParameterError(f"the plan has {count:,} points, more than {MAX_POINTS:,}: give fewer values of tp, "
                             "block, max_batched_tokens, kv_dtype or replicas", "tp", "block", "replicas")


def point_options(base: SimOptions, point: Point) -> SimOptions:
    """The `kvcalc sim --max-rate` options of one point: one replica at 1/replicas of the workload's rate."""
    load: dict = {}
    if base.trace is not None:
        load["time_scale"] = base.time_scale / point.replicas
    else:
        rate = DEFAULT_RATE if base.rate is None else float(base.rate)
        load["rate"] = repr(rate / point.replicas)
    return replace(base, gpu=point.gpu, tp=point.tp, block_size=point.block_size,
                   max_batched_tokens=point.max_batched_tokens, dtype=point.kv_dtype, find_max_rate=True, **load)


def _text(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def sim_argv(options: SimOptions) -> list[str]:
    """The `kvcalc sim` arguments that rebuild `options` exactly: every field that differs from its default,
    as its flag (floats by repr, so the command line reads back the same number)."""
    argv: list[str] = []
    for f in fields(SimOptions):
        value = getattr(options, f.name)
        if value == f.default:
            continue
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        if f.metadata.get("negate"):
            argv.append(flag)  # the default is True; this field is False
        elif isinstance(value, bool):
            argv.append(flag)
        elif isinstance(value, tuple):
            argv += [flag, *(_text(v) for v in value)]
        elif isinstance(value, Path):
            argv += [flag, str(value)]
        else:
            argv += [flag, _text(value)]
    return argv
