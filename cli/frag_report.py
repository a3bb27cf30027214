"""The report of `kvcalc frag`: one `frag_report` assembles the document (cli/frag_doc.py), the tables
(cli/frag_tables.py), the notes and the chart."""

from __future__ import annotations

from fractions import Fraction

from ..core.frag import FragAnalysis, ModelBytes, SpeculativePeaks
from ..core.inputs.lengths import Lengths
from ..core.model.kv_groups import VLLM_BLOCK_SIZES
from ..core.notes import concat
from ..core.spec_decode import SPEC_METHODS
from ..core.units import format_bytes, format_count, plural
from .frag_doc import BEST_OBJECTIVE, STATE_PAGES, document
from .frag_tables import (
    PER_SEQ_TABLE_MAX,
    bytes_table,
    chart,
    groups_table,
    per_seq_table,
    speculative_table,
    token_table,
)
from .output import Report

__all__ = ["PER_SEQ_TABLE_MAX", "frag_report", "header", "model_notes", "per_seq_table", "speculative_note"]


def frag_report(source: Lengths, result: FragAnalysis, dtype_name: str, sweep: bool, default_max_len: bool,
                drafter: str | None) -> Report:
    """The document, the tables (token positions; with a model its bytes and groups; the speculative peaks; per
    sequence), the chart with --sweep, and the notes."""
    report = Report(doc=document(source, result, dtype_name), text=header(source))
    report.tables.append(token_table(result))
    if result.model_bytes is not None:
        report.tables.append(bytes_table(result.model_bytes, dtype_name))
    if result.speculative is not None:
        report.tables.append(speculative_table(result.speculative, report.doc["speculative"]))
    if result.per_sequence is not None:
        report.tables.append(per_seq_table(result.per_sequence, result.fixed.max_len))
    if sweep:
        report.footer.append(chart(result))
    report.notes = [
        "utilisation = Σ n / allocated positions (position utilisation, not device utilisation); "
        "block tables hold int32 ids: exact = Σ ceil(n/B) entries, dense = N × ceil(M/B) entries.",
    ]
    if result.model_bytes is not None:
        if result.model_bytes.kv_cache_groups > 1:
            report.tables.insert(2, groups_table(result.model_bytes))
        report.notes += model_notes(result.model_bytes, sweep)
    if result.speculative is not None:
        report.notes.append(speculative_note(result.speculative, default_max_len))
    if drafter is not None:
        report.notes.append(drafter)
    return report


def speculative_note(peaks: SpeculativePeaks, default_max_len: bool) -> str:
    speculation = peaks.speculation
    note = (f"Speculative peak: each step reserves 1 + K + λ = {speculation.slots_per_step} slots past the committed "
            f"tokens (λ = {speculation.lookahead_slots} lookahead slots: {SPEC_METHODS[speculation.method]}); a "
            f"sequence of n tokens can run its last step from n − 1, so it holds up to n + {speculation.extra_slots}. "
            "concurrency vs plain = blocks / peak blocks: the share of these sequences that a pool sized for them "
            "holds at their peaks.")
    if default_max_len:
        note += " M is the smallest power of two that holds the longest peak."
    return note


def two_decimals(value: Fraction) -> str:
    """An exact mean with two decimals and thousands separators, never through a float (a mean of 3·10^18-token
    lengths has more digits than a double holds)."""
    hundredths = round(value * 100)
    sign = "-" if hundredths < 0 else ""
    return f"{sign}{abs(hundredths) // 100:,}.{abs(hundredths) % 100:02d}"


def header(source: Lengths) -> list[str]:
    return [
        concat("Lengths — ", source.description),
        f"{plural(source.count, 'sequence')}, {plural(source.total, 'token')}; min {format_count(source.min)}, "
        f"max {format_count(source.max)}, mean {two_decimals(source.mean)}",
    ]


def model_notes(model: ModelBytes, sweep: bool) -> list[str]:
    """What the bytes tables assume: the layout and why its block size, windows and chunks, the state, the
    best block size."""
    layout = model.layouts[0]
    raised: dict[int, list[str]] = {}  # used block size -> the sizes given that the layout raised to it
    for kv in model.paged:
        if kv.used_block_size != kv.block_size:
            assert kv.used_block_size is not None  # a paged scheme's layout always says its block size
            raised.setdefault(kv.used_block_size, []).append(str(kv.block_size))
    if raised:
        mapping = "; ".join(f"B = {', '.join(given)} → {format_count(used)}" for used, given in raised.items())
        first = next(lay for kv, lay in zip(model.paged, model.layouts, strict=True)
                     if kv.used_block_size != kv.block_size)
        notes = [f"Layout {layout.layout}: {mapping}. Why, for B = {first.requested_block_size}: {first.reason}."]
    else:
        common = layout.reason.removeprefix(f"block {layout.block_size}: as given; ")
        notes = [f"Layout {layout.layout}: the block sizes as given; {common}."]
    kinds = {g.kind for g in layout.groups}
    text = (f"Bytes in IEC units (KiB = 2^10 B); one block table per sequence per KV cache group "
            f"({model.kv_cache_groups})")
    if model.kv_cache_groups > 1:
        text += ("; in the KV cache groups table, block = one block of one table (one block id under vllm), "
                 "blocks held = the blocks of all the group's tables, so allocated = block × blocks held")
    if "sliding" in kinds:
        text += "; sliding-window layers keep only the blocks that hold one of the last W tokens"
    if "chunked" in kinds:
        text += ("; chunked layers keep only the current chunk (blocks before C · floor((n − 1)/C) are freed), "
                 "not the last C tokens")
    if kinds & {"sliding", "chunked"}:
        text += "; a freed block stays in its table as a null entry (vLLM's tables keep their length)"
    notes.append(text + ".")
    if model.has_state:
        notes.append(
            f"Recurrent state: {format_bytes(model.state_bytes_per_seq)} per sequence across its recurrent layers, "
            f"its own column; mamba_cache_mode {layout.mamba_cache_mode!r}: {STATE_PAGES[layout.mamba_cache_mode]}; "
            "state allocated includes the padding of each state page.")
    if kinds & {"sliding", "chunked"} or model.has_state:
        notes.append("The token-position table (and the per-sequence rows) ignore windows, chunks and states: "
                     "every layer holds every position at the block size asked for; the KV bytes tables apply "
                     "them at the block size used.")
    best = model.best
    refused = layout.layout == "vllm" and not any(kv.engine_accepts for kv in model.paged)
    if refused:
        notes.append(f"None of the sizes given ({', '.join(str(kv.block_size) for kv in model.paged)}) is one vLLM's "
                     f"block_size accepts ({', '.join(map(str, VLLM_BLOCK_SIZES))}): their figures are for blocks "
                     "vLLM would refuse.")
    if len(best.candidates) > 1:
        used = f" (paged as {format_count(best.used_block_size)})" if best.used_block_size != best.block_size else ""
        among = ("the sizes given that vLLM's block_size accepts" if layout.layout == "vllm" and not refused
                 else "the sizes given")
        notes.append(f"Best block size for {BEST_OBJECTIVE}: B = {best.block_size}{used}, "
                     f"{format_bytes(best.held_bytes)}; chosen among {among}: "
                     f"{', '.join(str(b) for b in best.candidates)}.")
    elif sweep or len(model.paged) > 1:
        notes.append(f"Best block size: only B = {best.block_size} of those given is one vLLM accepts.")
    return notes
