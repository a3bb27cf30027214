"""The JSON document of `kvcalc frag`: lengths, schemes, model bytes per KV cache group, speculative peaks
(the tables and CSV read their records from it)."""

from __future__ import annotations

from typing import Any

from ..core.frag import FragAnalysis, ModelBytes, SpeculativePeaks
from ..core.inputs.lengths import Lengths
from ..core.paged_bytes import GroupBytes
from .size_speculative import speculation_doc


def document(source: Lengths, result: FragAnalysis, dtype_name: str) -> dict[str, Any]:
    fixed = result.fixed
    doc: dict[str, Any] = {
        "lengths": {
            "count": source.count,
            "total": source.total,
            "min": source.min,
            "max": source.max,
            "mean": float(source.mean),
            "source": source.description,
            "kind": source.kind,
        },
        "fixed": {
            "max_len": fixed.max_len,
            "useful": fixed.useful_tokens,
            "allocated": fixed.allocated_tokens,
            "waste": fixed.waste_tokens,
            "utilization": float(fixed.utilization),
        },
        "paged": [
            {
                "block_size": p.block_size,
                "blocks": p.num_blocks,
                "useful": p.useful_tokens,
                "allocated": p.allocated_tokens,
                "waste": p.waste_tokens,
                "utilization": float(p.utilization),
                "block_table_bytes_exact": p.block_table_bytes_exact,
                "block_table_bytes_dense": p.block_table_bytes_dense,
            }
            for p in result.paged
        ],
    }
    if result.model_bytes is not None:
        _add_model_bytes(doc, result.model_bytes, dtype_name)
    if result.speculative is not None:
        doc["speculative"] = speculative_doc(result.speculative)
    if result.per_sequence is not None:
        doc["per_seq"] = result.per_sequence.records()
    return doc


def _add_model_bytes(doc: dict[str, Any], model: ModelBytes, dtype_name: str) -> None:
    """The model, its bytes beside each scheme's token positions, and the best block size."""
    doc["model"] = model_doc(model, dtype_name)
    doc["fixed"].update(
        useful_kv_bytes=model.fixed.useful_kv_bytes,
        allocated_kv_bytes=model.fixed.allocated_kv_bytes,
        reservation_waste_bytes=model.fixed.waste_kv_bytes,
        state_bytes=model.fixed.state_bytes,
        allocated_state_bytes=model.fixed.allocated_state_bytes,
        held_bytes=model.fixed.held_bytes,
    )
    for entry, kv, layout in zip(doc["paged"], model.paged, model.layouts, strict=True):
        entry.update(
            used_block_size=kv.used_block_size,
            block_size_reason=layout.reason,
            engine_accepts=kv.engine_accepts,
            useful_kv_bytes=kv.useful_kv_bytes,
            allocated_kv_bytes=kv.allocated_kv_bytes,
            fragmentation_bytes=kv.fragmentation_bytes,
            padding_bytes=kv.padding_bytes,
            state_bytes=kv.state_bytes,
            allocated_state_bytes=kv.allocated_state_bytes,
            block_table_bytes_exact=kv.block_table_bytes_exact,
            block_table_bytes_dense=kv.block_table_bytes_dense,
            held_bytes=kv.held_bytes,
            groups=[group_doc(g) for g in kv.groups],
        )
    best = model.best
    doc["best_block_size"] = {
        "objective": BEST_OBJECTIVE, "block_size": best.block_size, "used_block_size": best.used_block_size,
        "held_bytes": best.held_bytes, "among": list(best.candidates),
    }


STATE_PAGES = {  # as the pool holds them (core/pool/groups.py PoolGroup.first_block; core/paged_bytes.state_pages)
    "none": "one state page per sequence (no prefix caching of the state)",
    "align": "a sequence of n tokens holds 1 state page, 2 when n − 1 is a multiple of B (its last step crossed "
             "into a new page; the page it resumed from is freed at the next step); a state is saved where a step "
             "ends (prefix caching)",
    "all": "a sequence of n tokens holds 1 state page, 2 when n − 1 is a multiple of B (its last step crossed into "
           "a new page); a state is saved at every block boundary, the pages behind freed but cached (prefix "
           "caching)",
}
BEST_OBJECTIVE = "fewest bytes held: KV and recurrent state allocated, plus exact block tables"


def model_doc(model: ModelBytes, dtype_name: str) -> dict[str, Any]:
    spec, layout = model.spec, model.layouts[0]
    return {
        "name": spec.name,
        "attention": spec.attention,
        "dtype": dtype_name,
        "bits_per_scalar": model.dtype_bits,
        "bytes_per_token": spec.bytes_per_token(model.dtype_bits),
        "sliding_window": spec.sliding_window,
        "num_sliding_layers": spec.num_sliding_layers,
        "kv_cache_groups": model.kv_cache_groups,
        "layout": layout.layout,
        "group_size": layout.group_size,
        "state_bytes_per_seq": model.state_bytes_per_seq,
    }


def group_doc(g: GroupBytes) -> dict[str, Any]:
    """One group's record: `blocks` counts the blocks of all its tables (block ids under vllm), `block_bytes` one
    of them (one table's block, the group's block across its tables / tables), so blocks × block_bytes =
    allocated_bytes."""
    group = g.group
    return {
        "kind": group.kind, "source": group.source, "window": group.window, "layers": group.layers,
        "padded_layers": group.padded_layers, "block_tables": group.tables, "block_tokens": group.block_tokens,
        "block_bytes": group.block_bytes // group.tables, "blocks": g.block_ids, "useful_bytes": g.useful_bytes,
        "allocated_bytes": g.allocated_bytes, "padding_bytes": g.padding_bytes,
        "block_table_bytes": g.block_table_bytes,
    }


def speculative_doc(peaks: SpeculativePeaks) -> dict[str, Any]:
    entries = []
    for p in peaks.block_sizes:
        entry: dict[str, Any] = {
            "block_size": p.block_size,
            "blocks": p.plain.num_blocks,
            "peak_blocks": p.peak.num_blocks,
            "extra_blocks": p.extra_blocks,
            "extra_fraction": float(p.extra_fraction),
            "peak_allocated": p.peak.allocated_tokens,
            "peak_utilization": float(p.peak.utilization),
            "concurrency_ratio": float(p.concurrency),
        }
        if p.peak_bytes is not None:
            entry.update(peak_allocated_kv_bytes=p.peak_bytes.allocated_kv_bytes, extra_kv_bytes=p.extra_kv_bytes)
        if p.peak_bytes is not None and p.peak_bytes.allocated_state_bytes:  # extra_kv_bytes holds these pages too
            entry["peak_allocated_state_bytes"] = p.peak_bytes.allocated_state_bytes
        entries.append(entry)
    return {**speculation_doc(peaks.speculation), "paged": entries}
