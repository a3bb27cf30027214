"""`kvcalc size` without a model: every preset's KV per token and per sequence at common contexts."""

from __future__ import annotations

from typing import Any

from ..core.dtypes import DTYPE_BITS
from ..core.model.models import PRESETS
from ..core.model.sizing import PRESET_CONTEXTS, preset_rows
from ..core.units import format_bytes, format_count
from .output import Field, Report, record_table
from .size_report import UNITS_NOTE, exceeds_max_positions, model_doc


def presets_report(dtype: str, tokens: int | None, tables: bool = True) -> Report:
    """The report; `tables=False` (for --json, which prints only the document) skips formatting ~250 cells."""
    contexts = PRESET_CONTEXTS if tokens is None or tokens in PRESET_CONTEXTS else (*PRESET_CONTEXTS, tokens)
    rows = preset_rows(list(PRESETS.values()), dtype, contexts)
    bits = DTYPE_BITS[dtype]
    records = _records(rows, contexts)
    doc = {
        "dtype": dtype,
        "bits_per_scalar": bits,
        "models": [
            {
                **model_doc(row.spec, bits),
                "bytes_per_token": row.bytes_per_token,
                "bytes_per_seq": {str(n): b for n, b in row.bytes_per_seq.items()},
            }
            for row in rows
        ],
    }
    notes = [f"KV per sequence at {dtype} ({bits} bits; bf16 is the default), sliding windows and chunks applied, "
             "the recurrent state of hybrid models included."]
    if len(rows) < len(PRESETS):  # a page format vLLM uses for some kinds of layer only
        notes.append(f"{dtype}: only the presets whose layers vLLM pages in it ({len(PRESETS) - len(rows)} of "
                     f"{len(PRESETS)} left out).")
    if any(r[f"exceeds_max_positions_{n}"] for r in records for n in contexts):
        notes.append("† the context is above the model's max_position_embeddings.")
    if any(not r["uniform"] for r in records):
        notes.append("* the layers differ (hybrids, windows, chunks): KV heads and head dim are those of the main "
                     "layers; kvcalc size --model NAME shows each kind of layer.")
    notes += [UNITS_NOTE,
              "Details: kvcalc size --model NAME [--tokens N --seqs S --tp T --memory 80GiB --gpu H100-SXM]."]
    if not tables:
        return Report(doc=doc, notes=notes)
    table = record_table(f"KV cache per token and per sequence ({dtype})", _fields(contexts), records)
    return Report(doc=doc, tables=[table], notes=notes)


def _records(rows: list[Any], contexts: tuple[int, ...]) -> list[dict[str, Any]]:
    """One CSV record per preset: its dimensions, bytes per token and per sequence at each context."""
    records = []
    for row in rows:
        spec = row.spec
        record: dict[str, Any] = {
            "model": spec.name, "attention": spec.attention, "layers": spec.layers, "kv_heads": spec.kv_heads,
            "head_dim": spec.latent_dim if spec.is_mla else spec.head_dim, "kv_lora_rank": spec.kv_lora_rank,
            "qk_rope_head_dim": spec.qk_rope_head_dim, "max_position_embeddings": spec.max_position_embeddings,
            "bytes_per_token": row.bytes_per_token, "is_mla": spec.is_mla,
            "state_bytes_per_seq": row.state_bytes_per_seq, "uniform": spec.is_uniform,
        }
        for n in contexts:
            record[f"bytes_per_seq_{n}"] = row.bytes_per_seq[n]
            record[f"exceeds_max_positions_{n}"] = exceeds_max_positions(spec, n)
        records.append(record)
    return records


def _fields(contexts: tuple[int, ...]) -> list[Field]:
    """The table's columns (fields without a label are CSV only)."""

    def seq_cell(n: int) -> Any:
        return lambda r: format_bytes(r[f"bytes_per_seq_{n}"]) + (" †" if r[f"exceeds_max_positions_{n}"] else "")

    def heads_cell(r: dict[str, Any]) -> Any:
        return "1 latent" if r["is_mla"] else r["kv_heads"] if r["uniform"] else f"{r['kv_heads']} *"

    fields = [
        Field("model", "model"),
        Field("attention", "attention", str.upper),
        Field("layers", "layers"),
        Field("kv_heads"),
        Field(None, "KV heads", heads_cell),
        Field("head_dim"),
        Field(None, "head dim", lambda r: f"{r['head_dim']} ({r['kv_lora_rank']}+{r['qk_rope_head_dim']})"
              if r["is_mla"] else r["head_dim"]),
        Field("kv_lora_rank"),
        Field("qk_rope_head_dim"),
        Field("max_position_embeddings"),
        Field("bytes_per_token", "bytes/token", format_count),
        Field(None, "per token", lambda r: format_bytes(r["bytes_per_token"])),
        Field("state_bytes_per_seq"),
    ]
    for n in contexts:
        fields += [Field(f"bytes_per_seq_{n}"), Field(f"exceeds_max_positions_{n}"),
                   Field(None, f"{n:,} tokens", seq_cell(n))]
    return fields
