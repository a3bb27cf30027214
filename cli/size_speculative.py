"""The speculative-decoding part of `kvcalc size` (--spec-tokens): a sequence's blocks and KV without
speculation and at its speculative peak, and how many fit in the budget each way (core/spec_decode.py)."""

from __future__ import annotations

from typing import Any

from ..core.spec_decode import SPEC_METHODS, Speculation, SpeculativeSize
from ..core.units import format_bytes, format_count, plural
from .output import Field, Report, quantity_table


def speculation_doc(speculation: Speculation) -> dict[str, Any]:
    """What one speculative step reserves, the keys `size` and `frag` both open their `speculative` object with."""
    return {
        "spec_tokens": speculation.spec_tokens,
        "method": speculation.method,
        "lookahead_slots": speculation.lookahead_slots,
        "slots_per_step": speculation.slots_per_step,
        "extra_slots_per_seq": speculation.extra_slots,
        "peak_blocks_formula": speculation.formula,
    }


def add_speculative(report: Report, size: SpeculativeSize) -> None:
    """The JSON's `speculative` object, its table and its note."""
    speculation = size.speculation
    doc: dict[str, Any] = {
        **speculation_doc(speculation),
        "tokens": size.tokens,
        "block_size": size.block_size,
        "per_gpu": size.tp > 1,
        "max_model_len": size.max_model_len,
        "peak_slots": size.peak_slots,
        "trimmed_at_max_model_len": size.trimmed,
        "blocks_per_seq": size.plain_blocks,
        "peak_blocks_per_seq": size.peak_blocks,
        "extra_blocks_per_seq": size.extra_blocks,
        "paged_bytes_per_seq": size.plain_bytes_per_seq,
        "peak_bytes_per_seq": size.peak_bytes_per_seq,
        "memory_bytes": size.memory_bytes,
        "max_seqs_paged": size.plain_max_seqs,
        "max_seqs": size.peak_max_seqs,
    }
    report.doc["speculative"] = doc
    records = [
        {"scheme": "plain", "slots_per_step": 1, "slots_per_seq": size.tokens, "blocks_per_seq": size.plain_blocks,
         "bytes_per_seq": size.plain_bytes_per_seq, "max_seqs": size.plain_max_seqs},
        {"scheme": "speculative", "slots_per_step": speculation.slots_per_step, "slots_per_seq": size.peak_slots,
         "blocks_per_seq": size.peak_blocks, "bytes_per_seq": size.peak_bytes_per_seq, "max_seqs": size.peak_max_seqs},
    ]
    common = {"spec_tokens": speculation.spec_tokens, "method": speculation.method, "tokens": size.tokens,
              "block_size": size.block_size}
    records = [{**r, **common} for r in records]
    where = f" per GPU (of {size.tp})" if size.tp > 1 else ""
    fields = [
        Field("scheme"),
        Field("slots_per_step", "slots a decode step reserves past the committed tokens", format_count),
        Field("slots_per_seq", f"slots a sequence of {plural(size.tokens, 'token')} holds at most", format_count),
        Field("blocks_per_seq", f"blocks of {plural(size.block_size, 'token')}", format_count),
        Field("bytes_per_seq", f"KV in those blocks{where}", format_bytes),
    ]
    if size.memory_bytes is not None:
        fields.append(Field("max_seqs", f"sequences that fit in {format_bytes(size.memory_bytes)}{where}",
                            format_count))
    fields += [Field(key) for key in common]
    report.tables.append(quantity_table(
        f"Speculative decoding: {plural(speculation.spec_tokens, 'draft')} per step "
        f"({SPEC_METHODS[speculation.method]}), peak blocks {speculation.formula}",
        ["quantity", "without speculation", "at the speculative peak"], fields, records,
    ))
    note = (f"Speculative decoding: a step reserves 1 + K + λ slots past the committed tokens (λ = "
            f"{speculation.lookahead_slots} lookahead slots); a sequence of n tokens can run its last step from "
            f"n − 1, so it holds up to n + {speculation.extra_slots} slots, in whole blocks (windowed layers keep "
            "only their window's blocks).")
    if size.trimmed:
        note += (f" vLLM schedules no position past max_model_len {size.max_model_len:,}: the peak is trimmed "
                 f"there, to {size.peak_slots:,} slots.")
    report.notes.insert(-1, note)
