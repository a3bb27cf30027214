"""verify's report: the scenario table (events, verdicts), the notes on the pass rule, each scenario and a
planted fault, and the decoded texts side by side; shared by `kvcalc verify` and `--model hybrid-tiny`."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from .output import Field, Report, Table, record_table

if TYPE_CHECKING:  # torch-free at import: the types only (cuda_ext.verify's modules import torch)
    from ..cuda_ext.verify.outcome import VerifyRun
    from ..cuda_ext.verify.result import ScenarioResult

# every event a scenario reports, in the table's order, with its short display name
EVENT_LABELS = {
    "prefix_hit_tokens": "hits", "cow_copies": "CoW", "forks": "forks", "preemptions": "preempt", "swaps": "swaps",
    "cancellations": "cancel", "evictions": "evict", "prefill_chunks": "chunks", "mixed_steps": "mixed",
    "eos_finishes": "EOS", "beams_dropped": "dropped", "cancelled_blocks_reused": "reused",
    "deferred_free_blocks": "deferred", "rollbacks": "rollbacks", "mid_block_chunks": "mid-block chunks",
    "capped_hits": "capped hits", "cow_tight_fits": "CoW-decided fits", "late_reads": "late reads",
}


def _events_cell(scenario: ScenarioResult) -> str:
    """The events the scenario's name needs, with their counts (0! for one that did not happen)."""
    events = scenario.events
    labels = {k: EVENT_LABELS.get(k, k.replace("_", " ")) for k in scenario.needs}  # hybrid: its own events
    return ", ".join(f"{labels[k]} {events[k]:,}" if events[k] else f"{labels[k]} 0!" for k in scenario.needs)


def _verdict_cell(scenario: ScenarioResult) -> str:
    if scenario.status == "not exercised":
        return "not exercised (events)"
    if scenario.passed:
        cell = "pass"
    else:
        reasons = [label for value, label in ((scenario.mismatched_tokens, "tokens"),
                                              (scenario.content_errors, "content"),
                                              (scenario.invariant_error, "invariants"), (scenario.hit_error, "hits"),
                                              (scenario.error, "error")) if value]
        cell = "FAIL" + (f" ({', '.join(reasons)})" if reasons else " (logits)")
    if scenario.fault is not None:
        cell += {"caught": "; fault caught", "undetected": "; fault UNDETECTED",
                 "not exercised": "; fault idle"}[scenario.fault]
    return cell


def _scenario_table(run: VerifyRun) -> Table:
    """One row per scenario; CSV adds every event (a hybrid run's own events too) and `passed`."""
    event_keys = [*EVENT_LABELS, *dict.fromkeys(k for s in run.scenarios for k in s.events if k not in EVENT_LABELS)]
    records = [{**s.to_dict(), **{f"event_{k}": s.events.get(k, 0) for k in event_keys},
                "events_cell": _events_cell(s), "verdict_cell": _verdict_cell(s)} for s in run.scenarios]
    fields = [
        Field("name", "scenario"),
        Field("requests", "requests", "{:,}".format),
        Field("tokens_compared", "tokens compared", "{:,}".format),
        Field("mismatched_tokens", "mismatches", "{:,}".format),
        Field("max_abs_logit_diff", "max |Δlogit|", "{:.1e}".format),
        Field(None, "events", lambda record: record["events_cell"]),
        Field(None, "verdict", lambda record: record["verdict_cell"]),
        Field("passed"),
        *(Field(f"event_{k}") for k in event_keys),
    ]
    model, config = run.model, run.model.config
    weights = "seeded weights" if model.weights == "seeded" else model.weights
    title = (f"kvcalc verify: {run.dtype} on {run.device}, attention {run.attention_backend}, {weights}, "
             f"{config.num_layers} layers x {config.hidden_size} wide, {config.num_q_heads}/{config.num_kv_heads} "
             f"heads of {config.head_dim}, vocab {config.vocab_size}, seed {model.seed}, blocks of {run.block_size}")
    return record_table(title, fields, records)


EVENTS_NOTE = (
    "events: those the scenario's name needs — hits = prefix-cache hit tokens, CoW = copy-on-write copies, chunks = "
    "prefill chunks, mixed = steps batching prefill and decode, EOS = end-of-sequence finishes, dropped = beams "
    "dropped, reused = a cancelled request's blocks handed out in the next step, deferred = blocks held back by the "
    "pool's step window, mid-block chunks = prefill chunks ending inside a keyed prompt block, capped hits = whole "
    "cached block-aligned prompts hit one block short, CoW-decided fits = growths that fit only without their "
    "copy-on-write copies, late reads = contexts read again one step later; all events in --json")


def _rule_note(run: VerifyRun) -> str:
    rule = run.pass_rule
    if run.dtype != "fp32":
        return f"pass rule ({run.dtype}): {rule.tokens}; invariants, content check and events as for fp32"
    bounds = [s.logit_tolerance for s in run.scenarios if s.logit_tolerance is not None]
    low, high = (f"{min(bounds):.1e}", f"{max(bounds):.1e}") if bounds else ("", "")
    span = "" if not bounds else f" = {low} here" if low == high else f" = {low}..{high} here"
    return (f"pass rule: every token identical, |Δlogit| <= {rule.fp32_logit_tolerance}{span}; the pool's "
            "invariants before every step and whole after; the content check clean; the events the "
            "scenario's name needs non-zero (0! marks one missing)")


def _scenario_notes(s: ScenarioResult) -> list[str]:
    notes = []
    if s.first_mismatch is not None:
        m = s.first_mismatch
        tokens = [("none (it stopped)" if t is None else t) for t in (m["reference_token"], m["test_token"])]
        notes.append(f"{s.name}: first divergence at request {m['request']}, output token {m['position']}: "
                     f"reference {tokens[0]}, paged {tokens[1]}")
    for value, label in ((s.error, "stopped"), (s.invariant_error, "pool invariant"), (s.hit_error, "hits"),
                         (s.first_content_error, "content check")):
        if value:
            notes.append(f"{s.name}: {label}: {value}")
    return notes


def build_report(run: VerifyRun) -> Report:
    notes = [EVENTS_NOTE, _rule_note(run), *(n for s in run.scenarios for n in _scenario_notes(s))]
    if run.inject:
        notes.append(_inject_note(run))
    notes.append({"passed": "verdict: all scenarios passed", "failed": "verdict: FAILED",
                  "not exercised": "verdict: NOT EXERCISED (no check failed, but a scenario missed an event its name "
                                   "promises)"}[run.status])
    tables = [_scenario_table(run)]
    if run.texts:
        text_fields = [Field("scenario", "scenario"), Field("request", "request"), Field("user", "user asks"),
                       Field("reference", "contiguous reference answers"), Field("paged", "paged answers"),
                       Field("identical")]
        tables.append(record_table("decoded text: each request alone over a contiguous cache, and through the pool, "
                                   "the scheduler and paged attention", text_fields, [asdict(t) for t in run.texts]))
    return Report(doc=run.to_dict(), tables=tables, notes=notes)


def _inject_note(run: VerifyRun) -> str:
    fault, results, status = f"--inject {run.inject}", run.scenarios, run.inject_status
    assert status is not None, "a run with a fault planted"
    fired = sum(s.fault_fired or 0 for s in results)
    caught = [s.name for s in results if s.fault == "caught"]
    missed = [s.name for s in results if s.fault == "undetected"]
    idle = [s.name for s in results if s.fault == "not exercised"]
    if status == "not exercised":
        return f"{fault}: NOT EXERCISED: the fault never acted in these scenarios (nothing for it to corrupt)"
    where = f"acted {fired:,} times; caught by {', '.join(caught) or 'NO scenario'}"
    where += f"; UNDETECTED in {', '.join(missed)}" if missed else ""
    where += f"; never acted in {', '.join(idle)}" if idle else ""
    verdict = {"caught": "CAUGHT wherever it acted", "undetected": "UNDETECTED where it acted",
               "failed": "a scenario it never acted in FAILED"}[status]
    return f"{fault}: {verdict}: {where}"
