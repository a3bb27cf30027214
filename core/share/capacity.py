"""The prefix-cache hit rate of a trace against cache capacity: the curve, the unbounded ceiling, the
capacities that reach 50 / 90 / 99 % of it, and capacities as people type them (tokens or bytes, lists or
log ranges). Every capacity comes from one pass of stack distances (stack_distance.py), which also says
exactly what cache is modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ParameterError
from ..inputs.traces import Trace, mooncake_blocks_per_id
from ..units import format_bytes, format_count, parse_bytes, parse_int
from .stack_distance import StackDistances, chain_nodes
from .trace_blocks import check_requests, coarse_trace, in_arrival_order

if TYPE_CHECKING:
    from .cache_bytes import CachedBlockBytes


def check_capacity_blocks(capacity_blocks: int) -> None:
    if capacity_blocks < 0:
        raise ParameterError(f"capacity {capacity_blocks} must be at least 0 blocks", "capacity")


@dataclass(frozen=True)
class CapacityPoint:
    """One capacity of the sweep: `capacity_blocks` of `block_size` tokens (None: unbounded)."""

    capacity_blocks: int | None
    hit_blocks: int
    block_size: int

    @property
    def hit_tokens(self) -> int:
        return self.hit_blocks * self.block_size

    @property
    def capacity_tokens(self) -> int | None:
        return None if self.capacity_blocks is None else self.capacity_blocks * self.block_size


@dataclass(frozen=True)
class CapacityCurve:
    """Hit tokens against prefix-cache capacity at one block size; `reach[f]`: the least capacity in blocks
    whose hits reach fraction f of the unbounded cache's (None when the ceiling is 0)."""

    block_size: int
    requests: int
    prompt_tokens: int
    points: tuple[CapacityPoint, ...]
    ceiling: CapacityPoint
    reach: dict[float, int | None]

    def hit_rate(self, point: CapacityPoint) -> float:
        return point.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def share_of_ceiling(self, point: CapacityPoint) -> float:
        return point.hit_blocks / self.ceiling.hit_blocks if self.ceiling.hit_blocks else 0.0


REACH_FRACTIONS = (0.5, 0.9, 0.99)


def capacity_curve(distances: StackDistances, capacities_blocks: list[int]) -> CapacityCurve:
    """Hit blocks at each capacity, the unbounded ceiling and the capacities that reach REACH_FRACTIONS of it."""
    for c in capacities_blocks:
        check_capacity_blocks(c)
    b = distances.block_size
    points = tuple(CapacityPoint(c, distances.total_hit_blocks(distances.clamp(c)), b) for c in capacities_blocks)
    ceiling = CapacityPoint(None, distances.total_hit_blocks(None), b)
    reach = {f: (distances.capacity_for(-(-ceiling.hit_blocks * round(f * 100) // 100)) if ceiling.hit_blocks
                 else None) for f in REACH_FRACTIONS}
    return CapacityCurve(b, distances.requests, int(distances.prompt_tokens.sum()), points, ceiling, reach)


@dataclass(frozen=True)
class CapacityValue:
    """One capacity as typed: a number of tokens or of bytes."""

    amount: int
    unit: str  # "tokens" | "bytes"
    text: str

    def blocks(self, block_size: int, bytes_per_block: int | None) -> int:
        """Whole blocks of `block_size` tokens (or of `bytes_per_block` bytes) in this capacity."""
        if self.unit == "tokens":
            return self.amount // block_size
        if bytes_per_block is None:
            raise ParameterError(f"capacity {self.text!r} is in bytes: give a model (model or config) to turn "
                                 "bytes into blocks, or give tokens such as 3M", "capacity")
        return self.amount // bytes_per_block

    def pool_blocks(self, block_size: int, block_bytes: CachedBlockBytes | None) -> int:
        """As blocks(), for a GPU pool: a capacity in bytes as the layout pages it, less vLLM's null block under
        the vllm layout (CachedBlockBytes.pool_blocks); tokens are a cache's blocks, no pool's."""
        if self.unit == "bytes" and block_bytes is not None:
            return block_bytes.pool_blocks(self.amount)
        return self.blocks(block_size, None if block_bytes is None else block_bytes.bytes_per_block)


_SI = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
MAX_SWEEP_POINTS = 200
MAX_CAPACITY_TOKENS = 2**62  # as frag's lengths; bytes stop at parse_bytes' 2^90


def _one_capacity(text: str) -> CapacityValue:
    raw = text.strip()
    if raw.endswith("B"):  # 1GiB, 512MB, 4096B: bytes
        try:
            return CapacityValue(parse_bytes(raw), "bytes", raw)
        except ValueError as e:
            raise ParameterError(f"capacity {raw!r}: {e}", "capacity") from None
    number = raw.removesuffix("tokens").removesuffix("tok").strip()
    scale = _SI.get(number[-1:]) if number and not number[-1:].isdigit() else 1
    if scale is None:
        raise ParameterError(f"capacity {raw!r} is neither tokens (3M, 500k, 2e6) nor bytes (4GiB, 80GB)",
                             "capacity")
    if scale != 1:
        number = number[:-1]
    exact: Fraction | int
    try:
        exact = Fraction(number) * scale
    except (ValueError, ZeroDivisionError):
        try:
            exact = parse_int(number, "capacity") * scale
        except ValueError:
            raise ParameterError(f"capacity {raw!r} is neither tokens (3M, 500k, 2e6) nor bytes (4GiB, 80GB)",
                                 "capacity") from None
    if exact < 0 or exact != int(exact):
        raise ParameterError(f"capacity {raw!r} must be a whole, non-negative number of tokens", "capacity")
    if exact > MAX_CAPACITY_TOKENS:
        raise ParameterError(f"capacity {raw!r} is more than 2^62 tokens, beyond any trace: give a smaller size",
                             "capacity")
    return CapacityValue(int(exact), "tokens", raw)


def parse_capacities(text: str) -> list[CapacityValue]:
    """`1GiB,4GiB` (a list), `1M:64M` (10 points spaced evenly on a log scale, ends included) or
    `1M:64M:7` (7 points). Tokens: a number with an optional k/M/G (3M = 3,000,000 tokens); bytes: a
    number with a byte unit (4GiB, 80GB, 1e9B)."""
    parts = [p for p in text.split(",")]
    if not text.strip() or any(not p.strip() for p in parts):
        raise ParameterError(f"capacity {text!r} has an empty value: write e.g. 1GiB,4GiB or 1M:64M", "capacity")
    values: list[CapacityValue] = []
    origins: list[str] = []  # how each value was typed, for the repeat error
    for part in parts:
        if ":" not in part:
            values.append(_one_capacity(part))
            origins.append(repr(part.strip()))
            continue
        fields = part.split(":")
        if len(fields) not in (2, 3):
            raise ParameterError(f"capacity range {part!r} must be LOW:HIGH or LOW:HIGH:POINTS", "capacity")
        low, high = _one_capacity(fields[0]), _one_capacity(fields[1])
        count = 10 if len(fields) == 2 else _points(fields[2], part)
        if low.unit != high.unit or not 0 < low.amount < high.amount:
            raise ParameterError(f"capacity range {part!r} needs 0 < LOW < HIGH in one unit (tokens or bytes)",
                                 "capacity")
        grid = np.geomspace(low.amount, high.amount, count)
        amounts = [low.amount, *(round(float(a)) for a in grid[1:-1]), high.amount]
        if len(set(amounts)) < count:
            raise ParameterError(f"capacity range {part!r} rounds to only {len(set(amounts))} distinct whole "
                                 f"amounts for {count} points: ask fewer points or a wider range", "capacity")
        values += [CapacityValue(a, low.unit, format_count(a) if low.unit == "tokens" else format_bytes(a))
                   for a in amounts]
        origins += [f"{v.text!r} (a point of {part.strip()!r})" for v in values[-len(amounts):]]
    if len(values) > MAX_SWEEP_POINTS:
        raise ParameterError(f"capacity gives {len(values)} points: at most {MAX_SWEEP_POINTS}", "capacity")
    _refuse_repeats(values, origins)
    return values


def _refuse_repeats(values: list[CapacityValue], origins: list[str]) -> None:
    """A capacity given twice (as typed, written another way, or a range's point) would print the same row twice."""
    seen: dict[tuple[str, int], str] = {}
    for value, origin in zip(values, origins, strict=True):
        first = seen.setdefault((value.unit, value.amount), origin)
        if first is origin:
            continue
        amount = format_count(value.amount) + " tokens" if value.unit == "tokens" else format_bytes(value.amount)
        if first == origin:
            raise ParameterError(f"capacity {origin} is given twice: give each size once", "capacity")
        raise ParameterError(f"capacity gives {amount} twice, as {first} and as {origin}: give each size once",
                             "capacity")


def _points(text: str, part: str) -> int:
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 2 <= count <= MAX_SWEEP_POINTS:
        raise ParameterError(f"capacity range {part!r}: POINTS must be a whole number in 2..{MAX_SWEEP_POINTS}",
                             "capacity")
    return count


def saved_state_hit_blocks(trace: Trace, block_size: int) -> int:
    """Hit blocks of an unbounded cache for a Mamba / linear-attention hybrid that saves a recurrent state only
    where a request's prompt blocks end (vLLM's mamba_cache_mode "align" with one prefill chunk): a request
    can resume only at the end of an earlier request's full prompt blocks that are a prefix of its own, at
    most floor((p - 1) / B) blocks in. The curve's figures assume a state at every block boundary."""
    check_requests(trace, block_size, None)
    trace = coarse_trace(in_arrival_order(trace), block_size)  # B = 512·m: one id per block
    if not trace.has_prefix_ids:
        return 0
    per_id = mooncake_blocks_per_id(block_size)
    nodes = chain_nodes(trace).tolist()
    assert trace.hash_offsets is not None  # has_prefix_ids: the ids and their offsets come together
    offsets = trace.hash_offsets.tolist()
    saved: dict[int, set[int]] = {}  # id node -> blocks (1..per_id) of it after which a state was saved
    hits = 0
    for r, (p, m) in enumerate(zip(trace.prompt_tokens.tolist(), (trace.prompt_tokens // block_size).tolist(),
                                   strict=True)):
        eligible = max(p - 1, 0) // block_size
        best = 0
        for i in range(-(-eligible // per_id)):
            ends = saved.get(nodes[offsets[r] + i])
            if ends:
                room = eligible - i * per_id
                usable = [e for e in ends if e <= room]
                if usable:
                    best = i * per_id + max(usable)
        hits += best
        if m:
            i, within = divmod(m - 1, per_id)
            saved.setdefault(nodes[offsets[r] + i], set()).add(within + 1)
    return hits
