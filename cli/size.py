"""`kvcalc size`: equation 1 for a model (preset, config.json or explicit dims); capacity; TP split."""

from __future__ import annotations

from fractions import Fraction
from typing import Annotated, Any

import typer

from ..core.blocks import DEFAULT_BLOCK_SIZE
from ..core.dtypes import DEFAULT_DTYPE, DTYPE_BITS, parse_dtype
from ..core.spec.models import PRESETS, ModelSpec, resolve_model
from ..core.spec.sizing import (
    PRESET_CONTEXTS,
    SizeResult,
    compute_size,
    model_layers,
    preset_rows,
)
from ..core.units import format_bytes, format_count, parse_bytes, plural
from .options import (
    ConfigOpt,
    DtypeOpt,
    FormatOpt,
    HeadDimOpt,
    JsonOpt,
    KvHeadsOpt,
    LayersOpt,
    ModelOpt,
    int_option,
)
from .output import (
    Field,
    Format,
    Report,
    Table,
    emit,
    err_console,
    quantity_table,
    record_table,
    resolve_format,
)

TokensOpt = Annotated[
    int | None, int_option("--tokens", "-n", help="Context tokens per sequence (default: the model's max length).")
]
SeqsOpt = Annotated[int | None, int_option("--seqs", "-s", help="Number of sequences (default: 1).")]
BlockOpt = Annotated[
    int | None, int_option("--block", "-b", help=f"Block size in tokens (default: {DEFAULT_BLOCK_SIZE}).")
]
TpOpt = Annotated[int | None, int_option("--tp", help="Tensor-parallel GPUs that split the KV heads (default: 1).")]
MemoryOpt = Annotated[
    str | None, typer.Option("--memory", help="KV budget (per GPU with --tp), e.g. 80GiB, 80GB, 80e9.")
]

_UNITS_NOTE = "Bytes are exact; IEC units (1 KiB = 1024 B, 1 GiB = 2^30 B)."


def command(
    model: ModelOpt = None,
    config: ConfigOpt = None,
    layers: LayersOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    dtype: DtypeOpt = DEFAULT_DTYPE,
    tokens: TokensOpt = None,
    seqs: SeqsOpt = None,
    block: BlockOpt = None,
    tp: TpOpt = None,
    memory: MemoryOpt = None,
    json_flag: JsonOpt = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """KV-cache bytes (equation 1) per token, block, sequence, batch and GPU; what fits in a memory budget.

    Without a model: every built-in preset's KV per token and per sequence at 4,096, 32,768 and 131,072 tokens.
    The default precision is bf16 (16 bits, the same bytes as fp16).
    """
    dtype = parse_dtype(dtype)
    spec = resolve_model(model, config, layers, kv_heads, head_dim)
    if spec is None:
        given = [name for name, value in (("--seqs", seqs), ("--block", block), ("--tp", tp), ("--memory", memory))
                 if value is not None]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(
                f"{', '.join(given)} {verb} a model: add --model NAME, --config config.json, "
                "or --layers/--kv-heads/--head-dim"
            )
        emit(_presets_report(dtype, tokens), resolve_format(json_flag, fmt))
        return
    result = compute_size(
        spec, dtype, tokens=tokens, seqs=1 if seqs is None else seqs, tp=1 if tp is None else tp,
        block_size=DEFAULT_BLOCK_SIZE if block is None else block,
        memory_bytes=None if memory is None else parse_bytes(memory),
    )
    warnings = _warnings(result)
    for warning in warnings:
        err_console.print(f"warning: {warning}", highlight=False, soft_wrap=True)
    emit(_model_report(result, warnings), resolve_format(json_flag, fmt))


def _warnings(result: SizeResult) -> list[str]:
    if _exceeds_max_positions(result.spec, result.tokens):
        max_len = result.spec.max_position_embeddings
        return [f"--tokens {result.tokens:,} is above {result.spec.name}'s max_position_embeddings {max_len:,}"]
    return []


def _model_doc(spec: ModelSpec) -> dict[str, Any]:
    """The `model` object: kv_heads and head_dim describe the cache (MLA: one latent, as vLLM counts it)."""
    return {
        "name": spec.name,
        "layers": spec.layers,
        "kv_heads": spec.kv_heads,
        "head_dim": spec.latent_dim if spec.is_mla else spec.head_dim,
        "attention": spec.attention,
        "sliding_window": spec.sliding_window,
        "num_sliding_layers": spec.num_sliding_layers,
        "num_attention_heads": spec.num_attention_heads,
        "kv_lora_rank": spec.kv_lora_rank,
        "qk_rope_head_dim": spec.qk_rope_head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "num_params": spec.num_params,
        "num_active_params": spec.num_active_params,
        "source": spec.source,
    }


def _describe(spec: ModelSpec) -> str:
    if spec.is_mla:
        heads = f"one latent of {spec.kv_lora_rank}+{spec.qk_rope_head_dim} per layer"
    else:
        heads = f"{plural(spec.kv_heads, 'KV head')} × {spec.head_dim} dim"
    window = ""
    if spec.num_sliding_layers:
        window = f", sliding window {spec.sliding_window:,} on {spec.num_sliding_layers} of {spec.layers} layers"
    all_layers = model_layers(spec)
    if all_layers > spec.layers:  # a hybrid: linear-attention / state-space layers keep no KV
        no_kv = all_layers - spec.layers
        layers = f"{spec.layers} of {all_layers} layers keep KV ({no_kv} linear attention or state-space)"
    else:
        layers = plural(spec.layers, "layer")
    return f"{spec.name}: {spec.attention.upper()}, {layers}, {heads}{window}"


_EIGHTHS_OF_A_BYTE = {1: ".125", 2: ".25", 3: ".375", 4: ".5", 5: ".625", 6: ".75", 7: ".875"}


def _bits_cells(bits: int) -> list[Any]:
    """Exact bytes from bits: '7.5' and '7.50 B' for 60 bits (int4 can leave half a byte), never rounded up."""
    whole, eighths = divmod(bits, 8)
    return [format_count(whole) + _EIGHTHS_OF_A_BYTE.get(eighths, ""), format_bytes(Fraction(bits, 8))]


def _exceeds_max_positions(spec: ModelSpec, tokens: int) -> bool | None:
    """Whether `tokens` is above the model's max_position_embeddings (None: the model does not say)."""
    return None if spec.max_position_embeddings is None else tokens > spec.max_position_embeddings


def _kv_table(r: SizeResult, doc: dict[str, Any]) -> Table:
    """Equation 1 at every granularity; CSV: one row of the JSON's values (per-GPU columns also at --tp 1)."""
    spec = r.spec
    record = {**doc, "model": spec.name, "exceeds_max_positions": _exceeds_max_positions(spec, r.tokens)}
    split = r.tp > 1
    def exact(bits_key: str) -> Any:  # the display of a byte count: exact, from its bits
        return lambda record: _bits_cells(record[bits_key])

    fields = [
        Field("model"),
        Field("dtype"),
        Field("bits_per_scalar"),
        Field("bytes_per_token_per_layer"),
        Field("bits_per_token_per_layer"),
        Field(None, "per token per layer", exact("bits_per_token_per_layer")),
        Field("bytes_per_token"),
        Field("bits_per_token"),
        Field(None, f"per token ({plural(spec.layers, 'layer')})", exact("bits_per_token")),
        Field("block_size"),
        Field("bytes_per_block"),
        Field("bits_per_block"),
        Field(None, f"per block ({plural(r.block_size, 'token')})", exact("bits_per_block")),
        Field("tokens"),
        Field("exceeds_max_positions"),
        Field("bytes_per_seq"),
        Field("bits_per_seq"),
        Field(None, f"per sequence ({plural(r.tokens, 'token')})", exact("bits_per_seq")),
        Field("seqs"),
        Field("total_bytes"),
        Field("total_bits"),
        Field(None, f"all {plural(r.seqs, 'sequence')}", exact("total_bits")),
        Field("bytes_rounded_up"),
        Field("tp"),
        Field("kv_heads_per_gpu"),
        Field("per_gpu_bytes_per_token"),
        Field("per_gpu_bits_per_token"),
        Field(None, f"per token per GPU (--tp {r.tp})" if split else None, exact("per_gpu_bits_per_token")),
        Field("per_gpu_bytes"),
        Field("per_gpu_bits"),
        Field(None, f"all sequences per GPU (--tp {r.tp})" if split else None, exact("per_gpu_bits")),
    ]
    return quantity_table(f"KV cache of {spec.name} at {r.dtype}", ["quantity", "bytes", "IEC"], fields, [record])


def _capacity_table(r: SizeResult, capacity_doc: dict[str, Any]) -> Table:
    """What fits; CSV: one row of the JSON's `capacity` values plus the tokens and sequences asked about."""
    cap = r.capacity
    where = f"on each of {r.tp} GPUs" if cap.per_gpu else "on one GPU"
    record = {**capacity_doc, "tokens": r.tokens, "seqs": r.seqs}
    fields = [
        Field("memory_bytes"),
        Field("per_gpu"),
        Field("max_tokens", "max tokens (every layer holds every token)", format_count),
        Field("max_tokens_is_lower_bound"),
        Field("tokens"),
        Field("max_seqs", f"max sequences of {plural(r.tokens, 'token')}", format_count),
        Field("block_size"),
        Field("num_blocks", f"blocks of {plural(cap.block_size, 'token')}", format_count),
        Field("seqs"),
        Field("fits", f"{r.seqs:,} × {plural(r.tokens, 'token')} fit", lambda fits: "yes" if fits else "no"),
    ]
    return quantity_table(f"What fits in {format_bytes(cap.memory_bytes)} of KV {where}", ["quantity", "count"],
                          fields, [record])


def _model_report(r: SizeResult, warnings: list[str]) -> Report:
    spec = r.spec
    doc: dict[str, Any] = {
        "model": _model_doc(spec),
        "dtype": r.dtype,
        "bits_per_scalar": r.bits_per_scalar,
        "bytes_per_token_per_layer": r.bytes_per_token_per_layer,
        "bytes_per_token": r.bytes_per_token,
        "block_size": r.block_size,
        "bytes_per_block": r.bytes_per_block,
        "tokens": r.tokens,
        "seqs": r.seqs,
        "tp": r.tp,
        "kv_heads_per_gpu": r.kv_heads_per_gpu,
        "bytes_per_seq": r.bytes_per_seq,
        "total_bytes": r.total_bytes,
        "per_gpu_bytes": r.per_gpu_bytes,
        "per_gpu_bytes_per_token": r.per_gpu_bytes_per_token,
        "total_bits": r.total_bits,
        "bits_per_token_per_layer": r.bits_per_token_per_layer,
        "bits_per_token": r.bits_per_token,
        "bits_per_block": r.bits_per_block,
        "bits_per_seq": r.bits_per_seq,
        "per_gpu_bits_per_token": r.per_gpu_bits_per_token,
        "per_gpu_bits": r.per_gpu_bits,
        "bytes_rounded_up": not r.exact_bytes,
        "formula": r.formula,
        "warnings": warnings,
    }
    notes = [f"Equation 1: {r.formula}"]
    if r.tp > 1:
        notes.append(_tp_note(r))
    if spec.num_sliding_layers and r.tokens > (spec.sliding_window or 0):
        notes.append(f"Sliding-window layers hold at most {spec.sliding_window:,} tokens of a sequence.")
    if not r.exact_bytes:
        notes.append("An odd number of int4 scalars leaves half a byte: the table shows exact bytes; the JSON's "
                     "*_bytes are rounded up to whole bytes (bytes_rounded_up: true) and its *_bits are exact.")
    tables = [_kv_table(r, doc)]
    if r.capacity is not None:
        cap = r.capacity
        doc["capacity"] = {
            "memory_bytes": cap.memory_bytes,
            "per_gpu": cap.per_gpu,
            "max_tokens": cap.max_tokens,
            "max_tokens_is_lower_bound": bool(spec.num_sliding_layers),  # windows not applied to max_tokens
            "max_seqs": cap.max_seqs,
            "num_blocks": cap.num_blocks,
            "block_size": cap.block_size,
            "fits": cap.fits,
        }
        tables.append(_capacity_table(r, doc["capacity"]))
        if spec.num_sliding_layers:
            notes.append("max tokens ignores the sliding window (a lower bound); max sequences applies it.")
    notes.append(_UNITS_NOTE)
    heading = f"{_describe(spec)}; {r.dtype} ({r.bits_per_scalar} bits per scalar)"
    return Report(doc=doc, tables=tables, notes=notes, text=[heading])


def _tp_note(r: SizeResult) -> str:
    spec = r.spec
    if spec.is_mla:
        return f"--tp {r.tp}: the MLA latent is not split by heads; every GPU holds all of it."
    if r.replicas_per_head > 1:
        return (f"--tp {r.tp} > {plural(spec.kv_heads, 'KV head')}: each GPU holds 1 head, each head is replicated on "
                f"{r.replicas_per_head} GPUs.")
    return f"--tp {r.tp}: each GPU holds {r.kv_heads_per_gpu} of the {spec.kv_heads} KV heads."


def _presets_report(dtype: str, tokens: int | None) -> Report:
    contexts = PRESET_CONTEXTS if tokens is None or tokens in PRESET_CONTEXTS else (*PRESET_CONTEXTS, tokens)
    rows = preset_rows(list(PRESETS.values()), dtype, contexts)
    records = []
    for row in rows:
        spec = row.spec
        record: dict[str, Any] = {
            "model": spec.name, "attention": spec.attention, "layers": spec.layers, "kv_heads": spec.kv_heads,
            "head_dim": spec.latent_dim if spec.is_mla else spec.head_dim, "kv_lora_rank": spec.kv_lora_rank,
            "qk_rope_head_dim": spec.qk_rope_head_dim, "max_position_embeddings": spec.max_position_embeddings,
            "bytes_per_token": row.bytes_per_token, "is_mla": spec.is_mla,
        }
        for n in contexts:
            record[f"bytes_per_seq_{n}"] = row.bytes_per_seq[n]
            record[f"exceeds_max_positions_{n}"] = _exceeds_max_positions(spec, n)
        records.append(record)

    def seq_cell(n: int) -> Any:
        return lambda r: format_bytes(r[f"bytes_per_seq_{n}"]) + (" †" if r[f"exceeds_max_positions_{n}"] else "")

    fields = [
        Field("model", "model"),
        Field("attention", "attention", str.upper),
        Field("layers", "layers"),
        Field("kv_heads"),
        Field(None, "KV heads", lambda r: "1 latent" if r["is_mla"] else r["kv_heads"]),
        Field("head_dim"),
        Field(None, "head dim", lambda r: f"{r['head_dim']} ({r['kv_lora_rank']}+{r['qk_rope_head_dim']})"
              if r["is_mla"] else r["head_dim"]),
        Field("kv_lora_rank"),
        Field("qk_rope_head_dim"),
        Field("max_position_embeddings"),
        Field("bytes_per_token", "bytes/token", format_count),
        Field(None, "per token", lambda r: format_bytes(r["bytes_per_token"])),
    ]
    for n in contexts:
        fields += [Field(f"bytes_per_seq_{n}"), Field(f"exceeds_max_positions_{n}"),
                   Field(None, f"{n:,} tokens", seq_cell(n))]
    doc = {
        "dtype": dtype,
        "bits_per_scalar": DTYPE_BITS[dtype],
        "models": [
            {
                **_model_doc(row.spec),
                "bytes_per_token": row.bytes_per_token,
                "bytes_per_seq": {str(n): b for n, b in row.bytes_per_seq.items()},
            }
            for row in rows
        ],
    }
    notes = [f"KV per sequence at {dtype} ({DTYPE_BITS[dtype]} bits; bf16 is the default), sliding windows applied."]
    if any(r[f"exceeds_max_positions_{n}"] for r in records for n in contexts):
        notes.append("† the context is above the model's max_position_embeddings.")
    notes += [_UNITS_NOTE, "Details: kvcalc size --model NAME [--tokens N --seqs S --tp T --memory 80GiB]."]
    table = record_table(f"KV cache per token and per sequence ({dtype})", fields, records)
    return Report(doc=doc, tables=[table], notes=notes)
