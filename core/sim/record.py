"""What one simulated run leaves behind: request states, the time integrals accumulated while it runs
(`RunTotals`), and the `RunRecord` that metrics read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .policies import MEMORY_PARTS
from .workload import Workload

# request states (int8 codes in RunRecord.status)
WAITING, RUNNING, COMPLETED, CANCELLED, TIMED_OUT, REJECTED = range(6)


class RunTotals:
    """Time integrals and counters, added to by every step, idle gap and fast-forwarded run of steps.

    memory_slot_s       float64 [6]  Σ over time of each MEMORY_PARTS value (token slots · s)
    block_table_byte_s  Σ over time of the block-table bytes
    running_s           ∫ running requests dt;  in_system_s: ∫ (running + waiting) dt;  busy_s: time in steps
    itl_values_s        chunks of inter-token latencies; itl_weights[i]: how many requests saw each value of
                        chunk i (a fast-forwarded run adds one value per step, seen by every request in it)
    timeline            (start, end, running, waiting, *slots per part) per step, gap or run; None when off
                        (a hybrid pool's rows end with the blocks each group holds)
    group_block_s       float64 [groups]  Σ over time of the blocks each group of a hybrid pool holds; None
                        for a single-group pool
    """

    def __init__(self, record_timeline: bool) -> None:
        self.memory_slot_s = np.zeros(len(MEMORY_PARTS))
        self.block_table_byte_s = 0.0
        self.busy_s = self.running_s = self.in_system_s = 0.0
        self.itl_values_s: list[np.ndarray] = []
        self.itl_weights: list[int | np.ndarray] = []  # one weight per chunk, or one per value (add_itl_each)
        self.steps = self.segments = 0
        self.timeline: list[tuple] | None = [] if record_timeline else None
        self.group_block_s: np.ndarray | None = None

    def account(self, start_s: float, duration_s: float, parts: np.ndarray, table_bytes: float, num_running: int,
                num_waiting: int, group_blocks: list[int] | None = None) -> None:
        """A span of `duration_s` from `start_s` with the memory `parts` (slots) and these queue lengths
        (`group_blocks`: a hybrid pool's blocks per group)."""
        self.memory_slot_s += duration_s * parts
        self.block_table_byte_s += duration_s * table_bytes
        self.running_s += duration_s * num_running
        self.in_system_s += duration_s * (num_running + num_waiting)
        if group_blocks is not None:
            if self.group_block_s is None:
                self.group_block_s = np.zeros(len(group_blocks))
            self.group_block_s += duration_s * np.asarray(group_blocks, dtype=np.float64)
        if self.timeline is not None:
            row = (start_s, start_s + duration_s, num_running, num_waiting, *parts.tolist())
            self.timeline.append(row if group_blocks is None else (*row, *group_blocks))

    def add_itl(self, values_s: np.ndarray, weight: int) -> None:
        self.itl_values_s.append(values_s)
        self.itl_weights.append(weight)

    def add_itl_each(self, values_s: list[float], weights: list[int]) -> None:
        """Inter-token latencies with a weight each (the lean loop's, gathered in plain lists between flushes)."""
        self.itl_values_s.append(np.array(values_s, dtype=np.float64))
        self.itl_weights.append(np.array(weights, dtype=np.int64))

    def itl_samples(self) -> tuple[np.ndarray, np.ndarray]:
        """(values [K], weights [K]): every chunk flattened, each value with its chunk's weight (or its own)."""
        values = np.concatenate(self.itl_values_s) if self.itl_values_s else np.zeros(0)
        lengths = [len(v) for v in self.itl_values_s]
        if all(isinstance(w, int) for w in self.itl_weights):
            return values, np.repeat(np.array(self.itl_weights, np.int64), lengths)
        each = [w if isinstance(w, np.ndarray) else np.full(n, w, np.int64)
                for w, n in zip(self.itl_weights, lengths, strict=True)]
        return values, np.concatenate(each)


@dataclass(eq=False)
class RunRecord:
    """Everything a run leaves behind: per-request arrays [N], ITL samples, time integrals.

    memory_slot_s  float64 [6]  Σ over time of each MEMORY_PARTS value (slots · s)
    """

    policy: str
    workload: Workload
    capacity_slots: int
    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    generated: np.ndarray
    status: np.ndarray
    preemptions: np.ndarray
    itl_values_s: np.ndarray
    itl_weights: np.ndarray
    memory_slot_s: np.ndarray
    block_table_byte_s: float
    end_s: float
    busy_s: float
    running_s: float  # ∫ running count dt
    in_system_s: float  # ∫ (running + waiting) count dt
    peak_running: int
    steps: int
    segments: int
    timeline: list[tuple] = field(default_factory=list)
    rejected_reason: dict[str, int] = field(default_factory=dict)
    generated_token_ids: list[list[int]] | None = None  # per request, when the executor produced tokens
    speculative: Any = None  # speculative decoding: the run's speculative.SpeculativeTotals
    tiers: Any = None  # host/disk tiers below the pool: the run's tiers.TierTotals (tiers_run.py)
    group_block_s: np.ndarray | None = None  # a hybrid pool: Σ over time of each group's blocks (RunTotals)
    prefix: Any = None  # the run's prefix_stats.PrefixCacheTotals (look-ups, hits, recomputation)
