"""The layer groups of a Hugging Face config: each layer's kind (hf_layers.py) with its heads, widths,
window and recurrent state, equal layers merged.

Attention dimensions:

* KV heads `num_key_value_heads` (Falcon's `num_kv_heads` with the new decoder architecture, RefinedWeb
  `n_head_kv`, Megatron's `num_query_groups`); absent or null: one with `multi_query`, else as many as query heads;
* head dim `head_dim` (Nemotron-H / Zamba `attention_head_dim`), else hidden_size / heads; V head dim
  `v_head_dim` when it differs (MiMo), else the K head dim;
* full-attention layers of Gemma-4: `global_head_dim`, and `num_global_key_value_heads` when
  `attention_k_eq_v` is true (transformers' Gemma4 reads it only then). Rule for `attention_k_eq_v`: the
  layer has no V projection, V is K's projection normalised differently (K is rotated, V is not), so the
  two cached tensors differ and the cache keeps both: the factor 2 stays;
* sliding layers of MiMo: `swa_num_key_value_heads`, `swa_head_dim`, `swa_v_head_dim`;
* `per_layer_config` ({"05": {"head_dim": 512, "num_key_value_heads": 2}}): those layers' own values;
* MLA (`kv_lora_rank`, `qk_rope_head_dim`; q/k heads `qk_nope_head_dim + qk_rope_head_dim` wide, which a
  `qk_head_dim` must equal) for every
  attention layer; its `num_key_value_heads` is not the cache; with DeepSeek sparse attention
  (`index_head_dim`) each layer also caches the indexer's keys, in vLLM's layout: fp8 values and a float32
  scale per 128 (an engine's choice, said in the layer table), whatever the KV precision;
* `num_kv_shared_layers` (Gemma-3n, Gemma-4): the last that many layers reuse earlier layers' KV: none.
  Hunyuan's cross-layer attention (`use_cla`, `cla_share_factor`) is read only when off; on, it is refused.
* `block_configs` (DeciLM / Llama-Nemotron): per layer, `no_op` or `replace_with_linear` attention keeps no
  KV, else num_attention_heads / `n_heads_in_group` KV heads, `window_length` a sliding window.

Recurrent state and its dtypes: hf_state_fields.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ..notes import Note
from .hf_families import rope_scaled_length
from .hf_fields import ConfigFields
from .hf_layers import chunk_size, layer_kinds, sliding_window
from .hf_state_fields import model_dtype, read_state, state_dtypes
from .layers import UNKNOWN_STATE_NOTE, LayerGroup


def read_groups(f: ConfigFields, n: int, heads: int, head_dim: int, notes: list[str]) -> tuple[LayerGroup, ...]:
    """The merged layer groups of an `n`-layer config with `heads` query heads of `head_dim` (K width)."""
    return read_groups_in_order(f, n, heads, head_dim, notes)[0]


def read_groups_in_order(f: ConfigFields, n: int, heads: int, head_dim: int,
                         notes: list[str]) -> tuple[tuple[LayerGroup, ...], tuple[int, ...]]:
    """`read_groups` and each layer's index into them in model order (() unless every layer is one group)."""
    if f.raw("block_configs") is not None:
        layers = _decilm_layers(f, n, heads, head_dim)
    else:
        kinds = layer_kinds(f, n)
        recurrent = any(kind in ("recurrent", "lightning", "kda", "conv", "hybrid") for kind in kinds)
        dtypes = state_dtypes(f, notes) if recurrent else ("bf16", "bf16")
        layers = [g for kind in kinds for g in _layer(f, kind, heads, head_dim, dtypes)]
        layers = _per_layer_overrides(f, layers, n)
        layers = _shared_indexers(f, layers, n)
    layers = _windows_within_positions(f, _kv_shared(f, layers, n), notes)
    unknown = sum(1 for g in layers if g.note == UNKNOWN_STATE_NOTE)
    if unknown:
        notes.append(f"the recurrent state of {unknown} linear-attention / state-space layers is not known (the "
                     "config has no Mamba, linear_* or lightning fields): state_bytes_per_seq leaves it out")
    groups = _merge(layers)
    if len(layers) != n or any(g.count != 1 for g in layers):
        return groups, ()
    index = {dataclasses.replace(g, count=1): i for i, g in enumerate(groups)}
    return groups, tuple(index[g] for g in layers)


def _windows_within_positions(f: ConfigFields, layers: list[LayerGroup], notes: list[str]) -> list[LayerGroup]:
    """A window or chunk no shorter than the model's positions never drops a token (Phi-4-mini: sliding_window
    262,144, max_position_embeddings 131,072): those layers are full attention, paged as such."""
    positions = max_positions(f)
    wide = {g.window for g in layers if g.window is not None and positions is not None and g.window >= positions}
    if not wide:
        return layers
    notes.append(f"window {max(wide):,} is not shorter than the model's {positions:,} positions, so no token leaves "
                 "it: those layers are full attention (vLLM still registers them as that sliding window: its max "
                 "concurrency counts one block more per request)")
    return [dataclasses.replace(g, kind="full", window=None, vllm_window=g.window if g.kind == "sliding" else None)
            if g.window in wide else g for g in layers]


def _attention(f: ConfigFields, kind: str, heads: int, head_dim: int) -> LayerGroup:
    kv_lora = f.int("kv_lora_rank")
    if kv_lora is not None:
        if kind != "full":
            raise f.error(f"MLA (kv_lora_rank) with {kind} layers is not a layout kvcalc knows; it stops here")
        rope = f.int("qk_rope_head_dim")
        if rope is None:
            raise f.error("MLA config has kv_lora_rank but is missing the field 'qk_rope_head_dim'")
        f.raw("num_key_value_heads")  # the query heads' K/V count after decompression, not the cache
        nope = f.int("qk_nope_head_dim")
        k_dim = nope + rope if nope is not None else head_dim
        qk_dim = f.int("qk_head_dim")  # transformers 5 writes it: nope + rope, the query/key head width
        if qk_dim is not None and qk_dim != k_dim:
            raise f.error(f"qk_head_dim {qk_dim} is not qk_nope_head_dim + qk_rope_head_dim = {k_dim}; fix one")
        return LayerGroup("mla", 1, kv_heads=1, k_head_dim=k_dim, v_head_dim=f.int("v_head_dim") or k_dim,
                          kv_lora_rank=kv_lora, rope_dim=rope, q_heads=heads, q_lora_rank=f.int("q_lora_rank") or 0,
                          indexer_bytes=_indexer_bytes(f))
    kv_heads = kv_heads_of(f, heads)
    k_dim, v_dim, q_heads, window = head_dim, f.int("v_head_dim") or head_dim, heads, None
    k_eq_v = bool(f.flag("attention_k_eq_v")) and kind == "full"
    if kind == "full":
        global_dim = f.int("global_head_dim")
        if global_dim is not None:
            k_dim = v_dim = global_dim
        if k_eq_v:
            kv_heads = f.int("num_global_key_value_heads") or kv_heads
    elif kind == "sliding":
        kv_heads = f.int("swa_num_key_value_heads") or kv_heads
        k_dim = f.int("swa_head_dim") or k_dim
        v_dim = f.int("swa_v_head_dim") or (k_dim if f.int("swa_head_dim") else v_dim)
        q_heads, window = f.int("swa_num_attention_heads") or heads, sliding_window(f)
    else:
        window = chunk_size(f)
    other = f.raw("attention_other_setting")  # Step-3.5/3.7: one layer type's own heads and widths
    if isinstance(other, Mapping) and other.get("attention_type") == f"{kind}_attention":
        values: dict[str, Any] = {key: other.get(key) for key in ("num_attention_heads", "num_attention_groups",
                                                  "num_key_value_heads", "head_dim") if other.get(key) is not None}
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values.values()):
            raise f.error(f"attention_other_setting must give positive integers, got {dict(other)!r}")
        q_heads = values.get("num_attention_heads", q_heads)
        kv_heads = values.get("num_attention_groups", values.get("num_key_value_heads", kv_heads))
        k_dim = v_dim = values.get("head_dim", k_dim)
    return LayerGroup(kind, 1, kv_heads=kv_heads, k_head_dim=k_dim, v_head_dim=v_dim, window=window,
                      q_heads=q_heads, gated_query=bool(f.flag("attn_output_gate")), k_eq_v=k_eq_v)


def attention_layer(f: ConfigFields, layer_type: str, heads: int, head_dim: int) -> LayerGroup:
    """One attention layer named as layer_types names it (full_attention, sliding_attention, ...)."""
    kind = _LAYER_TYPE_KINDS.get(layer_type)
    if kind is None:
        raise f.error(f"{layer_type!r} is not an attention layer type kvcalc knows (full_attention, "
                      "sliding_attention, chunked_attention)")
    return _attention(f, kind, heads, head_dim)


_LAYER_TYPE_KINDS = {"full_attention": "full", "attention": "full", "sliding_attention": "sliding",
                     "chunked_attention": "chunked"}


def _indexer_bytes(f: ConfigFields) -> int:
    """DeepSeek sparse attention (`index_head_dim`, `index_topk`): the indexer's keys, as vLLM caches them,
    index_head_dim fp8 values and one float32 scale per 128: 132 B per token per layer for 128."""
    f.raw("index_n_heads", "index_topk")  # which tokens attention reads, not what the cache holds
    dim = f.int("index_head_dim")
    if dim is None:
        if f.raw("index_topk") is not None:
            raise f.error("DeepSeek sparse attention (index_topk) without 'index_head_dim': add it")
        return 0
    return dim + 4 * -(-dim // 128)


def kv_heads_of(f: ConfigFields, heads: int) -> int:
    """KV heads by the spellings in the module docstring."""
    if f.raw("model_type") == "falcon" and not f.flag("new_decoder_architecture"):
        # Falcon-7B style: `num_kv_heads` is only read with the new decoder architecture (Falcon-40B/180B).
        f.raw("num_kv_heads")
        return 1 if f.flag("multi_query") else heads
    value = f.int("num_key_value_heads", "num_kv_heads", "n_head_kv")
    # Megatron's name for the KV heads (Zamba2 writes both); Step-3.5/3.7's num_attention_groups
    groups = f.int("num_query_groups", "num_attention_groups")
    if value is not None and groups is not None and groups != value:
        raise f.error(f"{f.key_of('num_query_groups', 'num_attention_groups')} {groups} and "
                      f"{f.key_of('num_key_value_heads', 'num_kv_heads', 'n_head_kv')} {value} disagree on the KV "
                      "heads; fix one")
    value = value if value is not None else groups
    if value is not None:
        return value
    return 1 if f.flag("multi_query") else heads


def _layer(f: ConfigFields, kind: str, heads: int, head_dim: int, dtypes: tuple[str, str]) -> list[LayerGroup]:
    if kind in ("full", "sliding", "chunked"):
        return [_attention(f, kind, heads, head_dim)]
    if kind == "mlp":
        return [LayerGroup("none", 1, note="MLP only")]
    if kind == "hybrid":
        state = read_state(f, "recurrent", heads, head_dim, dtypes)
        if state is None:
            raise f.error("hybrid layers (attention + Mamba) need the Mamba fields (mamba_n_heads, mamba_d_head, "
                          "mamba_d_state, ...); add them")
        return [_attention(f, "full", heads, head_dim),
                LayerGroup("none", 1, note=state.kind, state=state, beside_attention=True)]
    state = read_state(f, kind, heads, head_dim, dtypes)
    if state is None:
        return [LayerGroup("none", 1, note=UNKNOWN_STATE_NOTE)]
    return [LayerGroup("none", 1, note=state.kind, state=state)]


def _decilm_layers(f: ConfigFields, n: int, heads: int, head_dim: int) -> list[LayerGroup]:
    blocks = f.raw("block_configs")
    if not isinstance(blocks, list) or len(blocks) != n:
        raise f.error(f"block_configs must list one block per layer ({n}), got {type(blocks).__name__}")
    layers = []
    for i, block in enumerate(blocks):
        attention = block.get("attention") if isinstance(block, Mapping) else None
        if not isinstance(attention, Mapping):
            raise f.error(f"block_configs[{i}] has no 'attention' object")
        for key in ("sparsify", "num_sink_tokens"):
            if attention.get(key) not in (None, False, 0):
                raise f.error(f"block_configs[{i}].attention.{key} is {attention[key]!r}: kvcalc does not model it")
        if attention.get("no_op") or attention.get("replace_with_linear"):
            note = "no-op" if attention.get("no_op") else "linear replacement"
            layers.append(LayerGroup("none", 1, note=f"{note} attention"))
            continue
        group = attention.get("n_heads_in_group")
        if isinstance(group, bool) or not isinstance(group, int) or group <= 0 or heads % group:
            raise f.error(f"block_configs[{i}].attention.n_heads_in_group must divide the {heads} heads, "
                          f"got {group!r}")
        window = attention.get("window_length")
        kind = "sliding" if window else "full"
        layers.append(LayerGroup(kind, 1, kv_heads=heads // group, k_head_dim=head_dim, v_head_dim=head_dim,
                                 window=window or None, q_heads=heads))
    return layers


def _per_layer_overrides(f: ConfigFields, layers: list[LayerGroup], n: int) -> list[LayerGroup]:
    table = f.raw("per_layer_config")
    if table is None:
        return layers
    if not isinstance(table, Mapping) or len(layers) != n:
        raise f.error("per_layer_config must map layer indices to objects (and layers must be one entry each)")
    layers = list(layers)
    for key, values in table.items():
        try:
            index = int(key)
        except ValueError:
            raise f.error(f"per_layer_config key {key!r} is not a layer index") from None
        unknown = set(values) - {"head_dim", "num_key_value_heads"} if isinstance(values, Mapping) else {values}
        if not 0 <= index < n or unknown:
            raise f.error(f"per_layer_config[{key!r}]: kvcalc reads head_dim and num_key_value_heads of layers "
                          f"0..{n - 1}, got {values!r}")
        g = layers[index]
        dim = values.get("head_dim", g.k_head_dim)
        layers[index] = dataclasses.replace(g, kv_heads=values.get("num_key_value_heads", g.kv_heads),
                                            k_head_dim=dim, v_head_dim=dim)
    return layers


def _shared_indexers(f: ConfigFields, layers: list[LayerGroup], n: int) -> list[LayerGroup]:
    """GLM-5 (glm_moe_dsa) `indexer_types`, one per layer: "full" layers carry DeepSeek sparse attention's
    indexer and cache its keys; "shared" layers have no indexer (they reuse an anchor layer's top-k), so they
    cache no indexer keys."""
    types = f.str_list("indexer_types", n)
    if types is None:
        return layers
    if len(layers) != n or set(types) - {"full", "shared"} or "full" not in types:
        raise f.error(f"indexer_types must give each of the {n} layers 'full' or 'shared' (at least one full), "
                      f"got {sorted(set(types))}")
    if not any(g.indexer_bytes for g in layers):
        raise f.error("indexer_types is set but the layers have no sparse-attention indexer (index_head_dim)")
    return [dataclasses.replace(g, indexer_bytes=0) if t == "shared" else g for g, t in zip(layers, types, strict=True)]


def _kv_shared(f: ConfigFields, layers: list[LayerGroup], n: int) -> list[LayerGroup]:
    cla = f.flag("use_cla")
    factor = f.int("cla_share_factor")  # Hunyuan ships a factor with cross-layer attention off: no layer shares KV
    if cla and factor is not None and factor > 1:
        raise f.error(f"use_cla true with 'cla_share_factor' {factor}: cross-layer attention shares one layer's KV "
                      f"among {factor} layers, which kvcalc does not model yet; its KV would be a guess, so it stops")
    shared = f.int("num_kv_shared_layers", minimum=0) or 0
    if not shared:
        return layers
    if shared >= n or len(layers) != n:
        raise f.error(f"num_kv_shared_layers {shared} must be below num_hidden_layers {n}")
    return layers[:n - shared] + [
        LayerGroup("none", 1, note="KV shared", q_heads=g.q_heads, k_head_dim=g.k_head_dim, v_head_dim=g.v_head_dim)
        for g in layers[n - shared:]
    ]


def _merge(layers: list[LayerGroup]) -> tuple[LayerGroup, ...]:
    """Equal layers as one group each, in order of first appearance."""
    counts: dict[LayerGroup, int] = {}
    for g in layers:
        key = dataclasses.replace(g, count=1)
        counts[key] = counts.get(key, 0) + g.count
    return tuple(dataclasses.replace(g, count=c) for g, c in counts.items())


# The fields vLLM reads a model's length from (_get_and_verify_max_len: OPT, GPT-2, MPT, ChatGLM2, Command-R's
# model_max_length, ...), plus context_length; vLLM takes the smallest of those a config sets, and so does kvcalc.
LENGTH_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_sequence_length", "max_seq_length", "seq_len", "context_length")


def max_positions(f: ConfigFields, notes: list[str] | None = None) -> int | None:
    """The model's length: the smallest of LENGTH_FIELDS that the config sets (None if it sets none), scaled by
    its rope scaling as vLLM derives it (hf_families.rope_scaled_length; `notes` says so when that changes it)."""
    lengths = [length for length in (f.int(key) for key in LENGTH_FIELDS) if length is not None]
    if not lengths:
        return None
    scaled = rope_scaled_length(f, min(lengths))
    if notes is not None and scaled != min(lengths):
        notes.append(f"rope scaling takes the model's length from {min(lengths):,} to {scaled:,}, as vLLM derives it")
    return scaled


def tied(f: ConfigFields) -> bool | None:
    """`tie_word_embeddings`; absent, the default of the model type's transformers config (Gemma, and the
    types that keep PretrainedConfig's True: Falcon, GPT-2, StarCoder, BLOOM, OPT: tied)."""
    tied = f.flag("tie_word_embeddings")
    if tied is None and (str(f.raw("model_type")).startswith("gemma") or f.raw("model_type") in _TIED_TYPES):
        return True
    return tied


# transformers' configs of these types leave tie_word_embeddings at PretrainedConfig's default, True
# (tiiuae/falcon-7b's config.json names none, and its lm_head is the embedding table)
_TIED_TYPES = frozenset({"falcon", "RefinedWeb", "RefinedWebModel", "gpt2", "gpt_bigcode", "bloom", "opt"})


# quantization_config quant_method -> the precision most weights are stored in (scales aside).
_QUANTIZED = {"fp8": "fp8", "fbgemm_fp8": "fp8", "mxfp4": "int4", "bitsandbytes_4bit": "int4"}


# vLLM's --dtype auto serves a float32 checkpoint in the platform's preferred 16-bit dtype, bf16 on the GPUs kvcalc
# plans (_resolve_auto_dtype: "Downcast for float32 models"); --weight-dtype fp32 stands for --dtype float32.
FP32_SERVED_NOTE = Note("torch_dtype float32: vLLM (its --dtype auto) serves it in bf16, so the GPU plan loads 2 B a "
                        "parameter; give {weight_dtype} fp32 for vLLM's --dtype float32", "weight_dtype")


def weight_dtype(f: ConfigFields) -> str | None:
    """The precision vLLM loads the weights in: a quantization_config's, else the model dtype with float32
    served as bf16 (FP32_SERVED_NOTE); None if the config names none."""
    quant = f.raw("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", ""))
        bits = quant.get("bits") or quant.get("w_bit")
        dtype = _QUANTIZED.get(method) or {4: "int4", 8: "int8"}.get(bits if isinstance(bits, int) else 0)
        if dtype is not None:
            return dtype
    dtype = model_dtype(f)
    return "bf16" if dtype == "fp32" else dtype


def served_dtype_notes(f: ConfigFields) -> list[str]:
    """FP32_SERVED_NOTE for a float32 checkpoint that no quantization_config overrides, else none."""
    return [FP32_SERVED_NOTE] if model_dtype(f) == "fp32" and weight_dtype(f) == "bf16" else []
