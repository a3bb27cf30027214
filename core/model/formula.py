"""Equation 1 written out with a query's numbers, for people: '2 · 32 layers · 8,192 tokens · 8 KV heads ·
128 dim · 2 B = 1.00 GiB', one term per kind of layer, recurrent state and indexer caches added."""

from __future__ import annotations

from fractions import Fraction

from ..units import format_bytes, format_count, plural
from .layers import LayerGroup, bits_to_bytes
from .model_spec import ModelSpec


def kv_formula(spec: ModelSpec, tokens: int, bits_per_scalar: int, seqs: int, total_bits: int) -> str:
    """Equation 1 with numbers substituted and its value in IEC units (exact, half bytes included)."""
    scalar = f"{bits_per_scalar / 8:g} B"
    layout = getattr(bits_per_scalar, "name", None)
    if not spec.keeps_kv:
        text = "no KV"  # a pure recurrent model: the state below is all it keeps
    elif layout is not None:  # a quantized page (scales beside the scalars): each kind's bytes per token-layer
        parts = [f"{plural(g.count, g.kind + ' layer')} · {plural(g.tokens_held(tokens), 'token')} · "
                 f"{format_count(bits_to_bytes(g.bits_per_token(bits_per_scalar)))} B ({layout})"
                 for g in spec.layer_groups if g.keeps_kv]
        text = "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]
    elif spec.is_uniform:
        text = " · ".join([*_uniform_terms(spec, tokens), scalar])
    else:
        parts = [_group_term(g, tokens) for g in spec.layer_groups if g.keeps_kv]
        text = ("(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]) + f" · {scalar}"
        text += "".join(f" + {plural(g.count, g.kind + ' layer')} · {plural(g.tokens_held(tokens), 'token')} · "
                        f"{g.indexer_bytes} B indexer" for g in spec.layer_groups if g.indexer_bytes)
    states = [g for g in spec.layer_groups if g.state is not None]
    if states:
        text = ("" if not spec.keeps_kv else f"{text} + ") + " + ".join(
            f"{plural(g.count, g.note + ' layer')} · {format_count(bits_to_bytes(g.state_bits()))} B state"
            for g in states
        )
        text = f"({text})" if seqs != 1 else text
    if seqs != 1:
        text += f" · {seqs:,} seqs"
    return text + f" = {format_bytes(Fraction(total_bits, 8))}"


def _group_term(g: LayerGroup, tokens: int) -> str:
    """One layer group's layers · tokens held · scalars per token, e.g. '2 · 36 chunked layers · 8,192 tokens
    · 8 KV heads · 128 dim' (K and V widths written apart when they differ)."""
    layers_tokens = f"{plural(g.count, g.kind + ' layer')} · {plural(g.tokens_held(tokens), 'token')}"
    if g.kind == "mla":
        return f"{layers_tokens} · ({g.kv_lora_rank} + {g.rope_dim}) latent"
    heads = plural(g.kv_heads, "KV head")
    if g.k_head_dim == g.v_head_dim:
        return f"2 · {layers_tokens} · {heads} · {g.k_head_dim} dim"
    return f"{layers_tokens} · {heads} · ({g.k_head_dim} + {g.v_head_dim}) dim"


def _uniform_terms(spec: ModelSpec, tokens: int) -> list[str]:
    if spec.num_sliding_layers and spec.sliding_window is not None and tokens > spec.sliding_window:
        parts = []
        if spec.num_global_layers:
            parts.append(f"{plural(spec.num_global_layers, 'layer')} · {plural(tokens, 'token')}")
        parts.append(f"{plural(spec.num_sliding_layers, 'sliding layer')} · "
                     f"{plural(spec.sliding_window, 'window token')}")
        layer_tokens = "(" + " + ".join(parts) + ")"
    else:
        layer_tokens = f"{plural(spec.layers, 'layer')} · {plural(tokens, 'token')}"
    if spec.is_mla:
        return [layer_tokens, f"({spec.kv_lora_rank} + {spec.qk_rope_head_dim}) latent"]
    return ["2", layer_tokens, plural(spec.kv_heads, "KV head"), f"{spec.head_dim} dim"]
