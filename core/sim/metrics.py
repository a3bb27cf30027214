"""Latency, throughput, goodput and the memory breakdown of a simulated run.

Definitions follow vLLM's `benchmark_serving.py`, per completed request:

    TTFT = first token − arrival        E2E = last token − arrival
    TPOT = (E2E − TTFT) / (output − 1)  (requests with more than one output token)
    ITL  = time between consecutive tokens of a request (every token after the first, every request)

Statistics are mean, p50, p90, p99 (numpy's linear percentiles, as vLLM). Duration = from the first
arrival to the end of the last request; throughput = completed requests / duration. Goodput counts the
completed requests that meet every given SLO; attainment = those / (requests − cancelled), so rejected
(OOM) and timed-out requests count as misses, and a user's cancellation counts neither way.

Memory: each part of `MEMORY_PARTS` averaged over time (weighted by step duration, idle time included)
as a fraction of the pool; they sum to 1. `useful_of_occupied` = useful / (pool − free − cached free),
the share of the memory that requests hold or fragment that stores token states — the quantity of the
vLLM paper's Figure 2 (20.4 / 26.8 / 38.2 / 96.3 %). Block tables are bytes beside the pool (as a
fraction of it, not part of the sum).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ParameterError
from .policies import MEMORY_PARTS
from .record import CANCELLED, COMPLETED, REJECTED, TIMED_OUT, RunRecord

STATS = ("mean", "p50", "p90", "p99")
SLO_KEYS = ("ttft", "tpot", "e2e")


@dataclass(frozen=True)
class Slo:
    """Latency targets in seconds (None: no target)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    @property
    def is_empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.e2e_s is None

    def describe(self) -> str:
        values = (self.ttft_s, self.tpot_s, self.e2e_s)
        parts = [f"{k}≤{v:g}s" for k, v in zip(SLO_KEYS, values, strict=True) if v is not None]
        return ", ".join(parts) if parts else "none"


def parse_slo(text: str | None) -> Slo:
    """'ttft=2,tpot=100ms,e2e=30s' -> Slo; seconds unless a value ends in ms. None: no targets."""
    if text is None:
        return Slo()
    if not text.strip():
        raise ParameterError(f"slo {text!r} names no target: give e.g. ttft=2,tpot=100ms,e2e=30, or drop slo", "slo")
    values: dict[str, float] = {}
    for item in text.split(","):
        match = re.fullmatch(r"\s*(ttft|tpot|e2e)\s*=\s*([0-9.eE+-]+)\s*(ms|s)?\s*", item)
        if not match:
            raise ParameterError(
                f"slo {text!r}: cannot read {item.strip()!r}; write e.g. ttft=2,tpot=100ms,e2e=30 (seconds unless ms)",
                "slo")
        key, number, unit = match.groups()
        try:
            value = float(number)
        except ValueError:
            raise ParameterError(f"slo {text!r}: {number!r} is not a number", "slo") from None
        if not value > 0 or not np.isfinite(value):
            raise ParameterError(f"slo {text!r}: {key} must be a positive finite time, got {number}", "slo")
        if key in values:
            raise ParameterError(f"slo {text!r}: {key} is given twice; give each target once", "slo")
        values[key] = value / 1000 if unit == "ms" else value
    return Slo(values.get("ttft"), values.get("tpot"), values.get("e2e"))


@dataclass(frozen=True)
class Stats:
    mean: float
    p50: float
    p90: float
    p99: float


def stats(values: np.ndarray) -> Stats:
    if len(values) == 0:
        return Stats(*(float("nan") for _ in STATS))
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return Stats(float(np.mean(values)), float(p50), float(p90), float(p99))


@dataclass(frozen=True)
class Latencies:
    """Per-request latencies [N] (nan where they do not apply)."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    completed: np.ndarray  # bool [N]


def latencies(record: RunRecord) -> Latencies:
    completed = record.status == COMPLETED
    ttft = record.first_token_s - record.arrival_s
    e2e = np.where(completed, record.finish_s - record.arrival_s, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(completed & (record.generated > 1), (e2e - ttft) / (record.generated - 1), np.nan)
    return Latencies(np.where(completed, ttft, np.nan), tpot, e2e, completed)


def meets_slo(lat: Latencies, slo: Slo) -> np.ndarray:
    """bool [N]: completed and within every target (TPOT of one-token requests is not checked)."""
    ok = lat.completed.copy()
    if slo.ttft_s is not None:
        ok &= lat.ttft_s <= slo.ttft_s
    if slo.tpot_s is not None:
        ok &= np.isnan(lat.tpot_s) | (lat.tpot_s <= slo.tpot_s)
    if slo.e2e_s is not None:
        ok &= lat.e2e_s <= slo.e2e_s
    return ok


def attainment(record: RunRecord, slo: Slo) -> float:
    denominator = len(record.status) - int(np.sum(record.status == CANCELLED))
    return float(np.sum(meets_slo(latencies(record), slo))) / denominator if denominator else 0.0


@dataclass(frozen=True)
class MemoryShares:
    """Each part of MEMORY_PARTS averaged over time as a share of the pool (they sum to 1), the share of the
    occupied memory that holds token states, and the block tables' bytes as a share of the pool's."""

    useful: float
    tail_fragmentation: float
    reservation_waste: float
    external_fragmentation: float
    cached_free: float
    free: float
    useful_of_occupied: float
    block_tables: float
    speculative: float | None = None  # speculative decoding: slots past the committed tokens (in the sum to 1)


@dataclass(frozen=True)
class RunSummary:
    """One run's results (`to_dict()` is its JSON document, field by field)."""

    policy: str
    requests: int
    completed: int
    rejected: int
    timed_out: int
    cancelled: int
    preemptions: int
    ttft_s: Stats
    tpot_s: Stats
    itl_s: Stats
    e2e_s: Stats
    duration_s: float
    throughput_rps: float
    output_tokens_per_s: float
    goodput_rps: float | None
    slo_attainment: float | None
    memory: MemoryShares
    block_table_bytes_mean: float
    peak_running: int
    mean_running: float
    generated_tokens: int
    steps: int
    rejected_reasons: dict[str, int]
    speculative: dict | None = None  # speculative decoding: what its steps verified, accepted and rolled back
    group_blocks_mean: list[float] | None = None  # a hybrid pool: time-averaged blocks each group holds
    prefix_cache: dict | None = None  # look-ups, hits, recomputation (prefix_stats.PrefixCacheTotals.to_dict)

    def to_dict(self) -> dict:
        doc = asdict(self)
        if self.prefix_cache is None:
            del doc["prefix_cache"]
        if self.speculative is None:  # a run without speculation reads as it always has
            del doc["speculative"], doc["memory"]["speculative"]
        if self.group_blocks_mean is None:  # so does a single-group pool's
            del doc["group_blocks_mean"]
        return doc


def summarize(record: RunRecord, slo: Slo, kv_bytes_per_token: int) -> RunSummary:
    lat = latencies(record)
    done = lat.completed
    duration = max(record.end_s - float(record.arrival_s[0]), 1e-12)
    itl = np.repeat(record.itl_values_s, record.itl_weights) if len(record.itl_weights) else np.zeros(0)
    shares = [float(v) for v in record.memory_slot_s / (duration * record.capacity_slots)]
    free, cached_free = shares[MEMORY_PARTS.index("free")], shares[MEMORY_PARTS.index("cached_free")]
    occupied = 1.0 - free - cached_free
    spec = record.speculative
    memory = MemoryShares(
        **dict(zip(MEMORY_PARTS, shares, strict=True)),
        useful_of_occupied=shares[0] / occupied if occupied > 0 else float("nan"),
        block_tables=record.block_table_byte_s / duration / (record.capacity_slots * kv_bytes_per_token),
        speculative=None if spec is None else spec.speculative_slot_s / (duration * record.capacity_slots),
    )
    met = meets_slo(lat, slo)
    status = record.status
    return RunSummary(
        policy=record.policy,
        requests=len(status),
        completed=int(np.sum(done)),
        rejected=int(np.sum(status == REJECTED)),
        timed_out=int(np.sum(status == TIMED_OUT)),
        cancelled=int(np.sum(status == CANCELLED)),
        preemptions=int(record.preemptions.sum()),
        ttft_s=stats(lat.ttft_s[done]),
        tpot_s=stats(lat.tpot_s[~np.isnan(lat.tpot_s)]),
        itl_s=stats(itl),
        e2e_s=stats(lat.e2e_s[done]),
        duration_s=duration,
        throughput_rps=float(np.sum(done)) / duration,
        output_tokens_per_s=float(record.generated.sum()) / duration,
        goodput_rps=float(np.sum(met)) / duration if not slo.is_empty else None,
        slo_attainment=attainment(record, slo) if not slo.is_empty and not bool(np.all(record.status == CANCELLED))
        else None,  # every request cancelled: no request is measured, the share is undefined (not 0)
        memory=memory,
        block_table_bytes_mean=record.block_table_byte_s / duration,
        peak_running=record.peak_running,
        mean_running=record.running_s / duration,
        generated_tokens=int(record.generated.sum()),
        steps=record.steps,
        rejected_reasons=dict(record.rejected_reason),
        speculative=None if spec is None else {
            "steps": spec.steps, "drafts": spec.drafts, "accepted": spec.accepted, "emitted_tokens": spec.emitted,
            "mean_accepted_per_step": spec.mean_accepted_per_step, "mean_tokens_per_step": spec.mean_tokens_per_step,
            "rolled_back_slots": spec.rolled_back_slots},
        group_blocks_mean=None if record.group_block_s is None else (record.group_block_s / duration).tolist(),
        prefix_cache=None if record.prefix is None else record.prefix.to_dict(),
    )


TIMELINE_COLUMNS = ("t_start_s", "t_end_s", "running", "waiting", *(f"{p}_slots" for p in MEMORY_PARTS))


def timeline_rows(record: RunRecord) -> list[tuple]:
    """Rows of TIMELINE_COLUMNS: one per general step, idle gap, or fast-forwarded run of steps (whose
    memory parts are the run's time average)."""
    return list(record.timeline)
