"""Which kind each layer of a Hugging Face config is, by the conventions real configs use.

One convention names the layer kinds (when a config carries two, they must agree):

* `layers_block_type` (a list) or `hybrid_override_pattern` (Nemotron-H: M Mamba, * attention, - MLP, E MoE);
* `layer_types`: full_attention, sliding_attention, chunked_attention, linear_attention, mamba, attention,
  conv, hybrid (attention and Mamba in one layer), mlp / moe (no attention), indexed_attention (DeepSeek
  sparse attention: MLA with its indexer, which needs `index_head_dim`);
* `attn_type_list` (MiniMax: 1 softmax attention, 0 lightning linear attention);
* `hybrid_layer_pattern` (MiMo: 0 full, 1 sliding window, with its own `swa_*` heads and dims);
* `attn_layer_period` / `attn_layer_offset` (Jamba: attention where i % period == offset, else Mamba);
* `linear_attn_config` (Kimi-Linear: `full_attn_layers` and `kda_layers`, numbered from 1);
* `attn_layer_indices` (Bamba), `full_attn_idxs` (LFM2, else short convolution), `hybrid_layer_ids` (Zamba2:
  hybrid layers, the rest Mamba), `full_attention_interval`
  (Qwen3-Next / Qwen3.5, default 4: every 4th layer full, the rest linear attention);
* `global_attn_every_n_layers` (AFMoE: every n-th layer full, the rest sliding);
* Falcon-H1: every layer hybrid; PLaMo-2: `mamba_step` (attention where i % step == step // 2, else Mamba).

Otherwise attention layers only, windowed by: `attention_chunk_size` on the RoPE layers of `no_rope_layers`
(Llama-4; NoPE layers are global; default one NoPE layer in `no_rope_layer_interval` = 4);
`sliding_window_pattern` (or transformers 5's `_sliding_window_pattern`; an int p: layer i slides unless
(i + 1) % p == 0; or a string like "LLLG") or the
model type's alternation (gemma2 and gpt_oss 2, gemma3 6, gemma4 6 with the last layer global, cohere2 and
exaone4 4), as transformers' configs default them; Qwen2/3 `use_sliding_window` with `max_window_layers`
(layers from that index slide); else `sliding_window` on every layer (Mistral-7B-v0.1); else none.
`use_sliding_window: false` switches a window off. A window that a config sets but that no layer can be
given is an error, as is any kind kvcalc does not know.
"""

from __future__ import annotations

from itertools import pairwise

from .hf_fields import ConfigFields

# The kinds this module returns, per layer:
#   full, sliding, chunked: attention; recurrent: Mamba or linear attention (the state by the fields);
#   lightning: MiniMax's linear attention; kda: Kimi Delta Attention; conv: short convolution;
#   hybrid: attention + Mamba in one layer;
#   mlp: no mixer (MLP or MoE only).
_LAYER_TYPES = {
    "full_attention": "full", "attention": "full", "sliding_attention": "sliding",
    "chunked_attention": "chunked", "linear_attention": "recurrent", "mamba": "recurrent", "mamba2": "recurrent",
    "conv": "conv", "hybrid": "hybrid", "mlp": "mlp", "moe": "mlp",
    "indexed_attention": "full",  # DeepSeek sparse attention (transformers 5): MLA + the indexer's key cache
}
_PATTERN_CHARS = {"M": "recurrent", "*": "full", "-": "mlp", "E": "mlp"}
_PERIODS = {"gemma2": 2, "gpt_oss": 2, "gemma3": 6, "gemma3_text": 6, "gemma4": 6, "gemma4_text": 6,
            "cohere2": 4, "exaone4": 4}
_LAST_LAYER_GLOBAL = frozenset({"gemma4", "gemma4_text"})  # transformers' Gemma4 forces it
_INTERVAL_DEFAULT_TYPES = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
_JAMBA_TYPES = frozenset({"jamba"})
_LLAMA4_TYPES = frozenset({"llama4", "llama4_text"})
_KDA_TYPES = frozenset({"kimi_linear", "kimi_k3", "kimi_k3_text"})  # linear_attention is Kimi Delta Attention


def layer_kinds(f: ConfigFields, n: int) -> list[str]:
    """The kind of each of the `n` layers (see the module docstring)."""
    model_type = str(f.raw("model_type"))
    # Read by the rules below only in some cases, and (as in transformers) irrelevant in the others: a
    # pattern beside layer_types, max_window_layers with the window off, NoPE layers without chunks.
    f.raw("use_sliding_window", "max_window_layers", "sliding_window_pattern", "_sliding_window_pattern",
          "no_rope_layers", "no_rope_layer_interval", "sliding_window", "sliding_window_size")
    found = [(field, kinds) for field, kinds in _named_kinds(f, n, model_type) if kinds is not None]
    for (field, kinds), (other, other_kinds) in pairwise(found):
        if kinds != other_kinds:
            raise f.error(f"{field} and {other} disagree on which layers are which; remove one of them")
    kinds = found[0][1] if found else _attention_kinds(f, n, model_type)
    if found and "sliding" in kinds and (f.flag("use_sliding_window") is False or _window(f) is None):
        raise f.error(f"field '{found[0][0]}' marks layers sliding but the config gives no sliding_window; add it")
    _check_windows(f, kinds, model_type)
    return kinds


def _named_kinds(f: ConfigFields, n: int, model_type: str):
    """(field, kinds or None) for each convention that names layer kinds."""
    blocks = f.raw("layers_block_type")
    pattern = f.raw("hybrid_override_pattern")
    if blocks is not None:
        names = _strings(f, blocks, n, "layers_block_type")
        yield "layers_block_type", [_kind(f, "layers_block_type", b, _LAYER_TYPES) for b in names]
    if pattern is not None:
        if not isinstance(pattern, str) or len(pattern) != n:
            raise f.error(f"hybrid_override_pattern must have one character per layer ({n}), got {pattern!r}")
        yield "hybrid_override_pattern", [_kind(f, "hybrid_override_pattern", c, _PATTERN_CHARS) for c in pattern]
    types = f.str_list("layer_types", n)
    if types is not None and "indexed_attention" in types and f.int("index_head_dim") is None:
        raise f.error("layer_types marks indexed_attention (DeepSeek sparse attention) but the config gives no "
                      "index_head_dim, the width of the indexer's cached keys; add it")
    if types is not None:
        # linear_attention is MiniMax's lightning attention, and Kimi Delta Attention in transformers 5's
        # Kimi-Linear (its own configs use linear_attn_config)
        linear = "lightning" if model_type.startswith("minimax") else "kda" if model_type in _KDA_TYPES else None
        yield "layer_types", [linear if linear and t == "linear_attention" else
                              _kind(f, "layer_types", t, _LAYER_TYPES) for t in types]
    attn_types = f.int_list("attn_type_list", n)
    if attn_types is not None:
        yield "attn_type_list", [_kind(f, "attn_type_list", t, {1: "full", 0: "lightning"}) for t in attn_types]
    mimo = f.int_list("hybrid_layer_pattern", n)
    if mimo is not None:
        yield "hybrid_layer_pattern", [_kind(f, "hybrid_layer_pattern", t, {0: "full", 1: "sliding"}) for t in mimo]
    period, offset = f.int("attn_layer_period"), f.int("attn_layer_offset", minimum=0)
    if period is not None or offset is not None or model_type in _JAMBA_TYPES:
        period, offset = period or 8, 4 if offset is None else offset  # JambaConfig's defaults
        if offset >= period:
            raise f.error(f"attn_layer_offset {offset} must be below attn_layer_period {period}")
        yield "attn_layer_period", ["full" if i % period == offset else "recurrent" for i in range(n)]
    for field, kind, other in (("attn_layer_indices", "full", "recurrent"), ("full_attn_idxs", "full", "conv"),
                               ("hybrid_layer_ids", "hybrid", "recurrent")):
        indices = f.int_list(field)
        if indices is not None:
            yield field, [kind if i in set(indices) else other for i in range(n)]
    every = f.int("global_attn_every_n_layers")
    if every is not None:
        yield "global_attn_every_n_layers", ["sliding" if (i + 1) % every else "full" for i in range(n)]
    interval = f.int("full_attention_interval")
    if interval is not None or (model_type in _INTERVAL_DEFAULT_TYPES and types is None):
        interval = interval or 4
        yield "full_attention_interval", ["full" if (i + 1) % interval == 0 else "recurrent" for i in range(n)]
    if model_type == "falcon_h1":
        yield "model_type falcon_h1", ["hybrid"] * n
    if model_type == "plamo2":
        yield "mamba_step", _plamo2_kinds(f, n)
    kda = f.raw("linear_attn_config")
    if kda is not None:
        yield "linear_attn_config", _kda_kinds(f, kda, n)


def _plamo2_kinds(f: ConfigFields, n: int) -> list[str]:
    """PLaMo-2 as vLLM's plamo2.is_mamba places it: with mamba_enabled, layer i is Mamba unless
    i % mamba_step == mamba_step // 2 (a model of fewer than mamba_step // 2 + 1 layers: attention on the last
    only); attention_window_size is not read (vLLM's Plamo2AttentionMixer attends to every token)."""
    f.raw("attention_window_size", "full_attention_idx")
    if f.flag("mamba_enabled") is False:
        return ["full"] * n
    step = f.required_int("mamba_step")
    if step < 2:
        raise f.error(f"mamba_step {step} must be at least 2 (vLLM asserts it)")
    if n <= step // 2:
        return ["recurrent"] * (n - 1) + ["full"]
    return ["full" if i % step == step // 2 else "recurrent" for i in range(n)]


def _kda_kinds(f: ConfigFields, kda: object, n: int) -> list[str]:
    """Kimi-Linear: `full_attn_layers` and `kda_layers` list the layers, numbered from 1."""
    if not isinstance(kda, dict) or not {"full_attn_layers", "kda_layers"} <= set(kda):
        raise f.error("linear_attn_config must list full_attn_layers and kda_layers (layer numbers from 1)")
    kinds: list[str | None] = [None] * n
    for field, kind in (("full_attn_layers", "full"), ("kda_layers", "kda")):
        for layer in kda[field]:
            if not isinstance(layer, int) or not 1 <= layer <= n or kinds[layer - 1] is not None:
                raise f.error(f"linear_attn_config.{field} has {layer!r}: layers are numbered 1..{n}, each once")
            kinds[layer - 1] = kind
    if None in kinds:
        raise f.error(f"linear_attn_config leaves layer {kinds.index(None) + 1} out of both lists")
    return [kind for kind in kinds if kind is not None]  # every layer has one (checked above)


def _strings(f: ConfigFields, value: object, n: int, field: str) -> list[str]:
    if not isinstance(value, list) or len(value) != n or any(not isinstance(v, str) for v in value):
        raise f.error(f"{field} must be a list of {n} strings (one per layer), got {value!r}")
    return value


def _kind(f: ConfigFields, field: str, value: object, table: dict) -> str:
    if value not in table:
        known = ", ".join(repr(k) for k in table)
        raise f.error(f"{field} has the entry {value!r}, a layer kind kvcalc does not know (it knows {known}); "
                      "its KV would be a guess, so it stops here")
    return table[value]


def _attention_kinds(f: ConfigFields, n: int, model_type: str) -> list[str]:
    """Attention-only models: which layers slide or are chunked."""
    chunk = f.int("attention_chunk_size")
    no_rope = f.raw("no_rope_layers")
    interval = f.int("no_rope_layer_interval")
    if chunk is not None and (model_type in _LLAMA4_TYPES or no_rope is not None):
        # transformers' Llama4TextConfig: an empty or absent list means one NoPE layer every `interval`.
        ropes = f.int_list("no_rope_layers", n) if no_rope else [(i + 1) % (interval or 4) != 0 for i in range(n)]
        assert ropes is not None  # no_rope is a non-empty list, so int_list returned it
        if any(rope not in (0, 1) for rope in ropes):  # (True / False from the interval are 1 / 0)
            raise f.error(f"no_rope_layers must list 1 (RoPE: chunked) or 0 (NoPE: full attention) a layer, got "
                          f"{sorted(set(ropes) - {0, 1})}; fix the file")
        return ["chunked" if rope else "full" for rope in ropes]
    if f.flag("use_sliding_window") is False or _window(f) is None:
        return ["full"] * n
    pattern = f.raw("sliding_window_pattern", "_sliding_window_pattern")
    if isinstance(pattern, str):
        if not pattern or set(pattern) - {"L", "G"}:
            raise f.error(f"sliding_window_pattern {pattern!r} must be a string of L (local) and G (global)")
        return ["sliding" if pattern[i % len(pattern)] == "L" else "full" for i in range(n)]
    period = f.int("sliding_window_pattern", "_sliding_window_pattern") or _PERIODS.get(model_type)
    if period is not None:
        kinds = ["sliding" if (i + 1) % period else "full" for i in range(n)]
        if model_type in _LAST_LAYER_GLOBAL and kinds:
            kinds[-1] = "full"
        return kinds
    first = f.int("max_window_layers", minimum=0)
    if f.flag("use_sliding_window") and first is not None:
        return ["sliding" if i >= first else "full" for i in range(n)]
    return ["sliding"] * n


def _window(f: ConfigFields) -> int | None:
    """The sliding window: `sliding_window` or MiMo's `sliding_window_size` (equal when both are given)."""
    window, size = f.int("sliding_window"), f.int("sliding_window_size")
    if window is not None and size is not None and window != size:
        raise f.error(f"sliding_window {window} and sliding_window_size {size} disagree; remove one")
    return window if window is not None else size


def sliding_window(f: ConfigFields) -> int:
    """The window of the sliding layers (required when a layer slides)."""
    window = None if f.flag("use_sliding_window") is False else _window(f)
    if window is None:
        raise f.error("layers are marked sliding_attention but the config gives no sliding_window; add it")
    return window


def chunk_size(f: ConfigFields) -> int:
    chunk = f.int("attention_chunk_size")
    if chunk is None:
        raise f.error("layers are marked chunked_attention but the config gives no attention_chunk_size; add it")
    return chunk


def _check_windows(f: ConfigFields, kinds: list[str], model_type: str) -> None:
    """A window or chunk size that the config sets must belong to some layer (else: which? never a guess)."""
    window = None if f.flag("use_sliding_window") is False else _window(f)
    attention = any(kind in ("full", "chunked", "hybrid") for kind in kinds)
    if window is not None and "sliding" not in kinds and attention:
        if f.raw("max_window_layers") is not None and not f.flag("use_sliding_window"):
            return  # Qwen2/3 ship a window value with use_sliding_window unset: transformers applies none
        raise f.error(f"sliding_window {window} is set but the layer kinds mark no sliding layer, so kvcalc "
                      "cannot tell which layers it applies to; set layer_types (or remove sliding_window)")
    chunk = f.int("attention_chunk_size")
    if chunk is not None and "chunked" not in kinds and chunk != window:
        raise f.error(f"attention_chunk_size {chunk} is set but no layer is chunked (no layer_types "
                      "'chunked_attention', no Llama-4 no_rope_layers), so kvcalc cannot tell which layers it "
                      "applies to; set layer_types")
