"""One scenario's result, and the rule that settles its status: shared by every model's scenarios.

    ScenarioResult            what a run found (tokens, logits, events, errors) -> .to_dict() in the JSON
    settle(result, needs, fault, started)   passed | failed | not exercised, the fault's verdict, the wall time
    EVENTS                    the events a scenario may need, in the table's order
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

EVENTS = ("prefix_hit_tokens", "cow_copies", "forks", "preemptions", "swaps", "cancellations", "evictions",
          "prefill_chunks", "mixed_steps", "eos_finishes", "beams_dropped", "cancelled_blocks_reused",
          "deferred_free_blocks", "rollbacks", "mid_block_chunks", "capped_hits", "cow_tight_fits", "late_reads")


class PlantedFault(Protocol):
    """A fault planted in one run (faults.Fault, hybrid_scenarios.HybridFault): how often it acted."""

    fired: int


@dataclass
class ScenarioResult:
    name: str
    requests: int
    tokens_compared: int
    mismatched_tokens: int
    first_mismatch: dict[str, Any] | None
    max_abs_logit_diff: float
    passed: bool
    events: dict[str, int]
    needs: list[str] = field(default_factory=list)  # the events the scenario's name needs non-zero
    missing_events: list[str] = field(default_factory=list)  # needed, but zero
    content_errors: int = 0
    first_content_error: str | None = None
    invariant_error: str | None = None
    hit_error: str | None = None  # a prefix-cache hit other than the scenario's construction implies
    error: str | None = None  # the run stopped with an exception
    fault_fired: int | None = None
    status: str = "passed"  # passed | failed (a check failed) | not exercised (checks clean, a needed event 0)
    fault: str | None = None  # with a fault planted: caught | undetected | not exercised (it never acted here)
    steps: int = 0
    wall_s: float = 0.0
    logit_tolerance: float | None = None  # fp32: the bound on max_abs_logit_diff (verdict.fp32_logit_tolerance)
    # per request: (prompt, reference tokens, paged tokens), for a report that shows text; not in to_dict
    outputs: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        del doc["outputs"]
        return doc


def fault_verdict(fired: int, status: str) -> str:
    """A planted fault in one scenario: caught (it acted and a check failed), undetected (it acted and every
    check passed: a hole in the checks), or not exercised (it never acted here). A scenario that only missed
    its events did not catch anything."""
    if not fired:
        return "not exercised"
    return "caught" if status == "failed" else "undetected"


def settle(result: ScenarioResult, needs: tuple[str, ...] | list[str], fault: PlantedFault | None,
           started: float) -> ScenarioResult:
    """A run's status (failed / not exercised / passed), its fault's verdict and its wall time: one rule for
    every model's scenarios (`result` is completed in place and returned)."""
    result.needs = list(needs)
    result.missing_events = [e for e in needs if not result.events.get(e)]
    checks_failed = (not result.passed or result.content_errors or result.invariant_error or result.error
                     or result.hit_error)
    result.status = "failed" if checks_failed else "not exercised" if result.missing_events else "passed"
    result.passed = result.status == "passed"
    if fault is not None:
        result.fault_fired = fault.fired
        result.fault = fault_verdict(fault.fired, result.status)
    result.wall_s = time.perf_counter() - started
    return result
