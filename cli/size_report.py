"""The documents and tables of `kvcalc size`: the model's KV (and its layer groups), capacity, the presets,
a config without a context length, and vLLM's start-up figures (--gpu)."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from ..core.dtypes import DTYPE_BITS
from ..core.model.layers import LayerGroup, bits_to_bytes
from ..core.model.models import ModelSpec
from ..core.model.sizing import PRESET_CONTEXTS, SizeResult
from ..core.units import format_bytes, format_count, plural
from .output import NOT_APPLICABLE, Field, Report, Table, quantity_table, record_table

UNITS_NOTE = "Bytes are exact; IEC units (1 KiB = 1024 B, 1 GiB = 2^30 B)."
_EIGHTHS_OF_A_BYTE = {1: ".125", 2: ".25", 3: ".375", 4: ".5", 5: ".625", 6: ".75", 7: ".875"}


def exceeds_max_positions(spec: ModelSpec, tokens: int) -> bool | None:
    """Whether `tokens` is above the model's max_position_embeddings (None: the model does not say)."""
    return None if spec.max_position_embeddings is None else tokens > spec.max_position_embeddings


def _group_doc(g: LayerGroup, bits: int) -> dict[str, Any]:
    return {
        "kind": g.kind,
        "layers": g.count,
        "kv_heads": g.kv_heads if g.keeps_kv and g.kind != "mla" else None,
        "k_head_dim": g.k_head_dim if g.keeps_kv and g.kind != "mla" else None,
        "v_head_dim": g.v_head_dim if g.keeps_kv and g.kind != "mla" else None,
        "latent_dim": g.kv_lora_rank + g.rope_dim if g.kind == "mla" else None,
        "window": g.window,
        "bytes_per_token": bits_to_bytes(g.count * g.bits_per_token(bits)) if g.keeps_kv else 0,
        "indexer_bytes_per_token": g.indexer_bytes or None,
        "state_bytes_per_seq": bits_to_bytes(g.count * g.state_bits()),
        "state": g.state.describe() if g.state else None,
        "note": g.note,
    }


def model_doc(spec: ModelSpec, bits: int) -> dict[str, Any]:
    """The `model` object: kv_heads and head_dim describe the main layers (MLA: one latent, as vLLM counts it);
    `layer_groups` every kind of layer, with its bytes at `bits` per scalar."""
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
        "model_layers": spec.model_layers,
        "state_bytes_per_seq": bits_to_bytes(spec.state_bits()),
        "layer_groups": [_group_doc(g, bits) for g in spec.layer_groups],
        "source": spec.source,
    }


def describe(spec: ModelSpec) -> str:
    """The heading line: attention kind, layers (which keep KV), heads, windows."""
    no_kv: dict[str, int] = {}
    beside: dict[str, int] = {}
    for g in spec.layer_groups:
        if not g.keeps_kv:
            into = beside if g.beside_attention else no_kv
            into[g.note] = into.get(g.note, 0) + g.count
    # attention and a recurrent mixer side by side in the same layers (Falcon-H1; Zamba2's hybrid layers)
    also = "; ".join(f"{'the ' if n == spec.layers else ''}{n} KV layers also run {note}" for note, n in beside.items())
    if no_kv:
        parts = ", ".join(f"{n} {note}" for note, n in no_kv.items())
        layers = f"{spec.layers} of {spec.model_layers} layers keep KV ({parts}{'; ' + also if also else ''})"
    else:
        layers = plural(spec.layers, "layer")
        layers += "".join(f", each with attention and {note} side by side" if n == spec.layers
                          else f" ({n} with attention and {note} side by side)" for note, n in beside.items())
    kv_groups = [g for g in spec.layer_groups if g.keeps_kv]
    if not kv_groups:  # a pure recurrent model (Mamba, RWKV)
        return f"{spec.name}: no KV cache, {layers}: a constant recurrent state per sequence"
    if len(kv_groups) > 1 and not spec.is_uniform:
        return f"{spec.name}: {layers}, {len(kv_groups)} kinds of KV layer (the layer table shows each)"
    if spec.is_mla:
        heads = f"one latent of {spec.kv_lora_rank}+{spec.qk_rope_head_dim} per layer"
    else:
        heads = f"{plural(spec.kv_heads, 'KV head')} × {spec.head_dim} dim"
    window = ""
    if spec.num_sliding_layers:
        window = f", sliding window {spec.sliding_window:,} on {spec.num_sliding_layers} of {spec.layers} layers"
    return f"{spec.name}: {spec.attention.upper()}, {layers}, {heads}{window}"


def _seq_cells(n: int) -> Callable[[dict[str, Any]], list[Any]]:
    """The display cells of a record's bits per sequence of n tokens."""
    return lambda r: _bits_cells(r[f"bits_per_seq_{n}"])


def _bits_cells(bits: int | None) -> list[Any]:
    """Exact bytes from bits: '7.5' and '7.50 B' for 60 bits (int4 can leave half a byte), never rounded up."""
    if bits is None:
        return [NOT_APPLICABLE, NOT_APPLICABLE]
    whole, eighths = divmod(bits, 8)
    return [format_count(whole) + _EIGHTHS_OF_A_BYTE.get(eighths, ""), format_bytes(Fraction(bits, 8))]


def layer_table(spec: ModelSpec, bits: int, tokens: int | None) -> Table | None:
    """One row per layer group (kind, layers, KV heads, K/V dims, window, bytes per token, state); None for a
    model whose layers are all one group of full attention (the heading says everything)."""
    groups = spec.layer_groups
    if len(groups) == 1 and groups[0].kind == "full":
        return None
    records = []
    for g in groups:
        record = _group_doc(g, bits)
        record["what"] = g.note or g.kind
        record["held"] = None if tokens is None or not g.keeps_kv else g.tokens_held(tokens)
        records.append(record)
    fields = [
        Field("kind"),
        Field("what", "layers of kind"),
        Field("layers", "layers"),
        Field("kv_heads", "KV heads"),
        Field("k_head_dim", "K dim"),
        Field("v_head_dim", "V dim"),
        Field("latent_dim", "MLA latent" if spec.is_mla else None),
        Field("window", "window / chunk", format_count),
        Field("bytes_per_token", "KV bytes/token", format_count),
        Field("indexer_bytes_per_token", "of which indexer" if any(g.indexer_bytes for g in groups) else None,
              lambda n: f"{n} B per layer (fp8 + scales)"),
        Field("held", None if tokens is None else f"tokens held of {tokens:,}", format_count),
        Field("state_bytes_per_seq", "state bytes/seq" if spec.has_state else None, format_count),
        Field("state", "state" if spec.has_state else None),
    ]
    return record_table(f"Layers of {spec.name} (KV bytes at {bits} bits per scalar, all layers of each row)",
                        fields, records)


def kv_table(r: SizeResult, doc: dict[str, Any]) -> Table:
    """Equation 1 at every granularity; CSV: one row of the JSON's values (per-GPU columns also at --tp 1)."""
    spec = r.spec
    record = {**doc, "model": spec.name, "exceeds_max_positions": exceeds_max_positions(spec, r.tokens),
              "kv_bits_per_seq": r.kv_bits_per_seq, "state_bits_per_seq": r.state_bits_per_seq}
    split = r.tp > 1

    def exact(bits_key: str) -> Any:  # the display of a byte count: exact, from its bits
        return lambda record: _bits_cells(record[bits_key])

    state = r.state_bits_per_seq > 0
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
        Field("kv_bytes_per_seq"),
        Field(None, f"KV per sequence ({plural(r.tokens, 'token')})" if state else None, exact("kv_bits_per_seq")),
        Field("state_bytes_per_seq"),
        Field(None, "recurrent state per sequence" if state else None, exact("state_bits_per_seq")),
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


def capacity_table(r: SizeResult, capacity_doc: dict[str, Any]) -> Table:
    """What fits; CSV: one row of the JSON's `capacity` values plus the tokens and sequences asked about."""
    cap = r.capacity
    assert cap is not None
    where = f"on each of {r.tp} GPUs" if cap.per_gpu else "on one GPU"
    record = {**capacity_doc, "tokens": r.tokens, "seqs": r.seqs}
    hybrid = cap.layout is not None and len(cap.layout.groups) > 1  # vLLM's blocks differ from equation 1's
    fields = [
        Field("memory_bytes"),
        Field("per_gpu"),
        Field("max_tokens", "tokens those sequences hold (no KV: a sequence costs its state at any length)"
              if not r.spec.keeps_kv else "max tokens (every layer holds every token" + (
            "; one sequence's state counted)" if r.spec.has_state else ")"), format_count),
        Field("max_tokens_is_lower_bound"),
        Field("max_tokens_counts_state"),
        Field("tokens"),
        Field("max_seqs", f"max sequences of {plural(r.tokens, 'token')}", format_count),
        Field("block_size"),
        Field("num_blocks", "state pages (no KV: one page a sequence, as vLLM pages a recurrent-only model)"
              if not r.spec.keeps_kv else f"blocks of {plural(cap.block_size, 'token')}" + (
            " (every layer, no padding)" if hybrid else ""), format_count),
        Field("vllm_num_blocks", None if cap.layout is None or not hybrid else
              f"vLLM block ids (block {cap.layout.block_size:,}, {plural(cap.layout.num_tables, 'group')})",
              format_count),
        Field("vllm_block_size"),
        Field("vllm_layout"),
        Field("seqs"),
        Field("fits", f"{r.seqs:,} × {plural(r.tokens, 'token')} fit", lambda fits: "yes" if fits else "no"),
    ]
    return quantity_table(f"What fits in {format_bytes(cap.memory_bytes)} of KV {where}", ["quantity", "count"],
                          fields, [record])


def capacity_notes(r: SizeResult) -> list[str]:
    """What max tokens counts, and why vLLM pages the same --memory into other blocks than equation 1."""
    spec, cap = r.spec, r.capacity
    assert cap is not None
    notes = []
    if spec.num_sliding_layers:
        notes.append("max tokens ignores the windows and chunks (a lower bound); max sequences applies them.")
    if spec.has_state:
        notes.append("max tokens takes one sequence's recurrent state off the budget first (the fewest any tokens "
                     "need): for tokens split into more sequences, each with its state, it is an upper bound; max "
                     "sequences counts every state.")
    layout = cap.layout
    if layout is not None and cap.layout_blocks is not None and len(layout.groups) > 1:
        notes.append(
            f"--memory is the KV budget as equation 1 pages it: blocks of {cap.block_size} tokens in every layer, "
            f"nothing padded. vLLM pages the same budget (--kv-memory) by its KV cache groups — {layout.reason} — "
            f"into {cap.layout_blocks:,} block ids of {format_bytes(layout.page_bytes)}: padding layers and padded "
            "state pages hold nothing, and sliding, chunked and state groups hold fewer blocks per sequence. "
            "--gpu also subtracts the weights, activations, non-torch memory and CUDA graphs first.")
    return notes


def tp_note(r: SizeResult) -> str:
    spec = r.spec
    if not spec.is_uniform:
        return f"--tp {r.tp}: each layer is split by its own KV heads (replicated where it has fewer than {r.tp})."
    if spec.is_mla:
        return f"--tp {r.tp}: the MLA latent is not split by heads; every GPU holds all of it."
    if r.replicas_per_head > 1:
        return (f"--tp {r.tp} > {plural(spec.kv_heads, 'KV head')}: each GPU holds 1 head, each head is replicated on "
                f"{r.replicas_per_head} GPUs.")
    return f"--tp {r.tp}: each GPU holds {r.kv_heads_per_gpu} of the {spec.kv_heads} KV heads."


def no_context_report(spec: ModelSpec, dtype: str, tp: int, block_size: int) -> Report:
    """For a config that names no context length: everything that needs none, and common contexts."""
    bits = DTYPE_BITS[dtype]
    per_token_bits = spec.kv_bits(1, bits)
    sizes = {g.bits_per_token(bits) for g in spec.layer_groups if g.keeps_kv}
    per_layer = sizes.pop() if len(sizes) == 1 else None
    state = spec.state_bits()
    per_seq = {n: spec.kv_bits(n, bits) + state for n in PRESET_CONTEXTS}
    doc: dict[str, Any] = {
        "model": model_doc(spec, bits), "dtype": dtype, "bits_per_scalar": bits,
        "bytes_per_token_per_layer": None if per_layer is None else bits_to_bytes(per_layer),
        "bytes_per_token": bits_to_bytes(per_token_bits), "block_size": block_size,
        "bytes_per_block": bits_to_bytes(per_token_bits * block_size), "tp": tp,
        "per_gpu_bytes_per_token": bits_to_bytes(spec.kv_bits(1, bits, tp)),
        "state_bytes_per_seq": bits_to_bytes(state), "tokens": None, "context_length_known": False,
        "bytes_per_seq": {str(n): bits_to_bytes(b) for n, b in per_seq.items()},
        "warnings": list(spec.notes),
    }
    record = {**doc, "model": spec.name, "bits_per_token_per_layer": per_layer, "bits_per_token": per_token_bits,
              "bits_per_block": per_token_bits * block_size, "per_gpu_bits_per_token": spec.kv_bits(1, bits, tp),
              "state_bits": state, **{f"bits_per_seq_{n}": b for n, b in per_seq.items()}}
    fields = [Field("model"), Field("dtype"), Field("bytes_per_token_per_layer"),
              Field(None, "per token per layer", lambda r: _bits_cells(r["bits_per_token_per_layer"])),
              Field("bytes_per_token"),
              Field(None, f"per token ({plural(spec.layers, 'layer')})", lambda r: _bits_cells(r["bits_per_token"])),
              Field("block_size"), Field("bytes_per_block"),
              Field(None, f"per block ({plural(block_size, 'token')})", lambda r: _bits_cells(r["bits_per_block"])),
              Field("tp"), Field("per_gpu_bytes_per_token"),
              Field(None, f"per token per GPU (--tp {tp})" if tp > 1 else None,
                    lambda r: _bits_cells(r["per_gpu_bits_per_token"])),
              Field("state_bytes_per_seq"),
              Field(None, "recurrent state per sequence" if state else None, lambda r: _bits_cells(r["state_bits"]))]
    for n in PRESET_CONTEXTS:
        fields.append(Field(None, f"per sequence of {n:,} tokens", _seq_cells(n)))
    tables = [quantity_table(f"KV cache of {spec.name} at {dtype}", ["quantity", "bytes", "IEC"], fields, [record])]
    layers = layer_table(spec, bits, None)
    if layers is not None:
        tables.insert(0, layers)
    notes = [f"{spec.name}'s config names no context length (no max_position_embeddings): per-sequence figures "
             "at common contexts; give --tokens N for one context, --seqs and --memory with it.", UNITS_NOTE]
    return Report(doc=doc, tables=tables, notes=notes, text=[f"{describe(spec)}; {dtype} ({bits} bits per scalar)"])
