"""A Hugging Face `config.json`, read offline, as a ModelSpec: every layer's KV, read by the conventions of
hf_layers.py and hf_groups.py; MLP / MoE blocks for the weight estimate (hf_ffn.py).

The file may be given itself, as the folder that holds it, or as `-` (standard input); a UTF-8 byte-order
mark is skipped, and a key given twice is refused. Common
fields and their spellings: layers `num_hidden_layers` (GPT-2/Falcon `n_layer`, MPT `n_layers`, ChatGLM
`num_layers`); query heads `num_attention_heads` (`n_head`, `n_heads`, `num_heads`); hidden `hidden_size`
(`n_embd`, `d_model`); LongCat-Flash's `num_layers` counts decoder layers of two attention sublayers each,
so it has twice as many cached layers; context `max_position_embeddings` (`n_positions`, `max_sequence_length`,
`seq_length`, `max_seq_len`; None when the config names none). Multimodal models keep the language model
under `text_config` (or `llm_config`).

A missing field raises ValueError naming the field and the file; so does a file that is not JSON. Fields are
judged by the architecture (`model_type`, hf_families.py): a known one reads the fields that shape its cache
and ignores the rest; an unknown one is read as a plain decoder only when nothing unread could change the
cache, else refused in one line naming the model_type and every such field. Pure recurrent models (Mamba,
Mamba-2, RWKV) keep no KV: hf_recurrent.py.
The spec is named after `name` (a hub repo id), else `_name_or_path`'s last part, else the folder.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ParameterError
from ..inputs.sources import is_stdin, read_source
from ..notes import Note
from .hf_families import family_of, judge_unread, refusal, refuse_unsupported
from .hf_ffn import expert_counts, ffn_groups, uniform_intermediate
from .hf_fields import ConfigFields
from .hf_groups import attention_layer, max_positions, read_groups_in_order, served_dtype_notes, tied, weight_dtype
from .hf_recurrent import recurrent_spec
from .layers import LayerGroup
from .model_spec import ModelSpec
from .weights import partial_quantization_note, unmodelled_quantization_note

# a multimodal checkpoint quantizes its language model from the top level (Kimi-K2.5, Mistral-Small-3.1 w8a8)
_TOP_LEVEL_KEPT = ("model_type", "tie_word_embeddings", "torch_dtype", "dtype", "quantization_config")
# transformers' config-class defaults for fields that published configs leave out, by model_type: transformers
# (and vLLM, which loads configs through it) fills them in. Gemma-3-4B/12B/27B-it's text_config names no vocab_size
# and no max_position_embeddings (Gemma3TextConfig: 262,208 and 131,072; tests/qa checks them against transformers).
MAX_LAYERS = 65_536  # the most layers a config may name (the largest published models have a few hundred)
CLASS_DEFAULTS: dict[str, dict[str, int]] = {
    "gemma3_text": {"vocab_size": 262_208, "max_position_embeddings": 131_072},
}


def load_config(
    path: Path | str, layers: int | None = None, head_dim: int | None = None, name: str | None = None
) -> ModelSpec:
    """Read `path` (a config.json, or a folder holding one) into a ModelSpec.

    `layers` / `head_dim` (from --layers / --head-dim) stand in for the config's fields when it lacks them.
    """
    if is_stdin(path):
        source, data = read_source(path, "a Hugging Face config.json")
        config = _parse(data, source)
        return spec_from_config(config, name=name or _model_name(config, None), source=source, layers=layers,
                                head_dim=head_dim)
    path = Path(path)
    if (not path.exists() and len(path.parts) == 2 and not path.is_absolute() and path.suffix != ".json"
            and not path.parts[0].startswith(".")):  # looks like org/name, not a file
        raise ParameterError(f"{{config}} {path}: no such file or folder; a Hugging Face model id (org/name) is read "
                             f"from the local hub cache with {{repo_id}} {path}", "config", "repo_id")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path}: no config.json in this folder; give a model folder or the config.json itself")
        path = path / "config.json"
    # FileNotFoundError and friends name the path; the CLI maps them to exit 2.
    config = _parse(path.read_bytes(), str(path))
    return spec_from_config(config, name=name or _model_name(config, path), source=str(path), layers=layers,
                            head_dim=head_dim)


def _parse(data: bytes, source: str) -> dict[str, Any]:
    """The JSON object of a config file; not UTF-8, not JSON, not an object, or a key given twice (JSON keeps
    the last silently, and which one the author meant is a guess) is a ValueError naming `source`."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"{source}: not a text file (not UTF-8); give a Hugging Face config.json") from None
    try:
        config = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{source}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
            "give a Hugging Face config.json"
        ) from None
    except RecursionError:  # json recurses once a nesting level: [[[[...]]]] 100,000 deep overflows the stack
        raise ValueError(f"{source}: JSON nested too deeply to read (no config nests more than a few levels); "
                         "give a Hugging Face config.json") from None
    except ValueError as exc:  # a key twice (below), or an integer of more digits than Python converts
        if "digits" in str(exc) and "limit" in str(exc):
            raise ValueError(f"{source}: holds an integer of more than 4,300 digits, which no config field needs; "
                             "fix the file") from None
        raise ValueError(f"{source}: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{source}: expected a JSON object (a Hugging Face config.json), got {type(config).__name__}")
    return config


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} is given twice ({out[key]!r} and {value!r}); keep one")
        out[key] = value
    return out


def spec_from_config(
    config: Mapping[str, Any], name: str, source: str, layers: int | None = None, head_dim: int | None = None
) -> ModelSpec:
    """The ModelSpec of a parsed config.json; `source` names the file in error messages.

    `layers` / `head_dim` fill in `num_hidden_layers` / `head_dim` only where the config has none.
    """
    thinker = config.get("thinker_config")
    if isinstance(thinker, Mapping) and config.get("num_hidden_layers") is None:
        # Qwen2.5-Omni / Qwen3-Omni: vLLM serves the thinker, whose text_config keeps the KV (the talker runs outside)
        config = {**{k: config[k] for k in _TOP_LEVEL_KEPT if k in config}, **thinker}
        source = f"{source} (thinker_config)"
    for nested in ("text_config", "llm_config"):
        inner = config.get(nested)
        if isinstance(inner, Mapping) and config.get("num_hidden_layers") is None:
            # Multimodal (Llava, Gemma-3/4, Llama-4, Qwen3.5 ...): the KV cache belongs to the language model.
            config = {**{k: config[k] for k in _TOP_LEVEL_KEPT if k in config}, **inner}
            source = f"{source} ({nested})"
            break
    fill = {"num_hidden_layers": layers, "head_dim": head_dim}
    config = {**config, **{k: v for k, v in fill.items() if v is not None and config.get(k) is None}}
    config = _step_layer_types(config)
    config, defaulted = _class_defaults(config)
    f = ConfigFields(config, source)
    refuse_unsupported(f)
    if family_of(f.raw("model_type")) is not None:
        spec = _read(f, name)
    else:
        try:
            spec = _read(f, name)
        except ValueError as exc:  # an architecture kvcalc does not know, whose layers it cannot place
            unread = f.unread_structural()
            if not unread and not f.data.get("model_type"):
                raise  # a hand-written config without a model_type: the failure says it all
            marked = exc if isinstance(exc, ParameterError) else None  # its {layers} marks: the caller's flags
            why = (marked.template if marked else str(exc)).removeprefix(f"{f.source}: ")
            # with look-alike fields unread, those are the news; without, the failure itself says why (and it is
            # said beside them when it names a field: the read stopped there, which left later fields unread)
            named = why.startswith(("missing the field", "field '"))
            raise refusal(f, unread, why=why if not unread or named else "",
                          params=marked.params if marked else ()) from None
    notes = tuple(n for n in (defaulted, judge_unread(f)) if n is not None)
    return dataclasses.replace(spec, notes=(*spec.notes, *notes)) if notes else spec


def _class_defaults(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None]:
    """`config` with its model_type's CLASS_DEFAULTS filled in where it has none, and a note naming them."""
    model_type = config.get("model_type")
    defaults = CLASS_DEFAULTS.get(model_type, {}) if isinstance(model_type, str) else {}
    missing = {k: v for k, v in defaults.items() if config.get(k) is None}
    if not missing:
        return config, None
    named = " and ".join(f"{k} {v:,}" for k, v in missing.items())
    return {**config, **missing}, (f"{model_type}: {named} from transformers' defaults for this model type "
                                   "(the config names none)")


def _read(f: ConfigFields, name: str) -> ModelSpec:
    """The spec of one (text) config, by the rules of its family (hf_families.py)."""
    if family_of(f.raw("model_type")) == "recurrent":
        return recurrent_spec(f, name)
    source = f.source
    n = f.required_int("num_hidden_layers", "n_layer", "num_layers", "n_layers",
                       fix="add it to the file or give {layers}", param="layers")
    if n > MAX_LAYERS:  # each layer is placed one by one: a count like 10^12 would exhaust memory, not fail
        raise f.error(f"field '{f.key_of('num_hidden_layers', 'n_layer', 'num_layers', 'n_layers')}' is {n:,}: "
                      f"more than the {MAX_LAYERS:,} layers kvcalc places one by one (real models have a few "
                      "hundred); fix the file")
    if f.raw("model_type") == "longcat_flash" and f.key_of("num_hidden_layers") is None:
        n *= 2  # LongCat-Flash: each of num_layers decoder layers holds two MLA sublayers, each with its own cache
    heads = f.required_int("num_attention_heads", "n_head", "num_heads", "n_heads")
    hidden = f.int("hidden_size", "n_embd", "d_model")
    notes: list[str] = []
    groups, order = read_groups_in_order(f, n, heads, _head_dim(f, heads, hidden), notes)
    kv_layers = sum(g.count for g in groups if g.keeps_kv)
    if kv_layers == 0:
        what = "no entry of layer_types is an attention layer" if f.raw("layer_types") else "no layer keeps KV"
        raise f.error(f"{what}, so the model keeps no KV cache")
    if kv_layers < n:
        source = f"{source} ({n - kv_layers} of {n} layers keep no KV cache)"
    experts, per_token = expert_counts(f)
    drafter_field, drafters = drafter_groups(f, groups, heads, _head_dim(f, heads, hidden))
    kv_note = checkpoint_kv_note(f)
    if kv_note is not None:
        notes.append(kv_note)
    notes += served_dtype_notes(f)
    for quantization in (unmodelled_quantization_note(f.raw("quantization_config")),
                         partial_quantization_note(f.raw("quantization_config"))):
        if quantization is not None:
            notes.append(quantization)
    positions = max_positions(f, notes)
    return ModelSpec.from_groups(
        name, groups, drafter_groups=drafters, drafter_field=drafter_field,
        num_attention_heads=heads,
        hidden_size=hidden if hidden is not None else heads * groups_head_dim(groups),
        max_position_embeddings=positions,
        intermediate_size=uniform_intermediate(f, n),
        vocab_size=f.int("vocab_size", "padded_vocab_size"),
        num_experts=experts,
        experts_per_token=per_token,
        ffn_groups=ffn_groups(f, n, hidden or heads * groups_head_dim(groups)),
        tie_word_embeddings=tied(f),
        weight_dtype=weight_dtype(f),
        source=source,
        notes=tuple(notes),
        layer_order=order,
    )


# Multi-token-prediction layers: each a decoder layer with the model's own (full or MLA) attention, which keeps
# KV only when speculative decoding drafts with it (vLLM's MTP / EAGLE proposers run them on the same KV pool).
DRAFTER_FIELDS = ("num_nextn_predict_layers",  # DeepSeek-V3/V3.2, GLM-4.5/5, MiMo, Step
                  "mtp_num_hidden_layers")  # Qwen3-Next, Qwen3.5
# and MiniMax-M2's use_mtp: num_mtp_modules × mtp_transformer_layers layers (the field named is num_mtp_modules)


def _step_layer_types(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Step-3.5/3.7 size `layer_types` over the decoder layers and then the num_nextn_predict_layers MTP layers:
    the first num_hidden_layers entries are the decoder's, the rest (as `mtp_layer_types`) the MTP layers'."""
    types, n, mtp = config.get("layer_types"), config.get("num_hidden_layers"), config.get("num_nextn_predict_layers")
    if config.get("model_type") not in ("step3p5", "step3p7") or not isinstance(types, list):
        return config
    if isinstance(n, int) and isinstance(mtp, int) and mtp > 0 and len(types) == n + mtp:
        return {**config, "layer_types": types[:n], "mtp_layer_types": types[n:]}
    return config


def drafter_groups(f: ConfigFields, groups: tuple[LayerGroup, ...], heads: int = 0,
                   head_dim: int = 0) -> tuple[str | None, tuple[LayerGroup, ...]]:
    """(the field that names them, the MTP layers' groups) — (None, ()) when the config has none."""
    step = f.str_list("mtp_layer_types")
    if step is not None:  # Step: each MTP layer of the type its layer_types entry names
        layers = [dataclasses.replace(attention_layer(f, t, heads, head_dim),
                                      note="MTP drafter (num_nextn_predict_layers)") for t in step]
        merged: dict[LayerGroup, int] = {}
        for g in layers:
            merged[g] = merged.get(g, 0) + 1
        return "num_nextn_predict_layers", tuple(dataclasses.replace(g, count=c) for g, c in merged.items())
    counts = [(field, f.int(field, minimum=0)) for field in DRAFTER_FIELDS]
    if f.flag("use_mtp"):  # MiniMax-M2: num_mtp_modules modules of mtp_transformer_layers layers each
        modules, per_module = f.int("num_mtp_modules", minimum=0), f.int("mtp_transformer_layers", minimum=0)
        counts.append(("num_mtp_modules", (modules or 0) * (1 if per_module is None else per_module)))
    for field, count in counts:
        if count:
            # the model's full (or MLA) attention layer; a model whose every attention layer is windowed: that one
            main = next((g for g in groups if g.kind in ("full", "mla")), None) or next(g for g in groups if g.keeps_kv)
            # GLM-5's index_share_for_mtp_iteration: the MTP layer reuses the model's indexer, caching no keys itself
            indexer = 0 if f.flag("index_share_for_mtp_iteration") else main.indexer_bytes
            drafter = dataclasses.replace(main, count=count, note=f"MTP drafter ({field})", indexer_bytes=indexer)
            return field, (drafter,)
    return None, ()


def checkpoint_kv_note(f: ConfigFields) -> str | None:
    """What the checkpoint's quantization_config says of the KV cache (`kv_cache_scheme`, ModelOpt's
    `kv_cache_quant_algo`) and what vLLM does with it; None when it says nothing.

    vLLM (vllm/utils/torch_utils.py, resolve_kv_cache_dtype_string) resolves --kv-cache-dtype auto to the
    checkpoint's KV precision only for ModelOpt checkpoints (quant_method modelopt*: a static 8-bit float
    scheme or "FP8" -> fp8_e4m3; anything else -> the model dtype). A compressed-tensors kv_cache_scheme
    only supplies scales: the KV is fp8 only with --kv-cache-dtype fp8. Either way its fp8 scales are per
    tensor (two numbers a layer), so the page holds 1 B a scalar and nothing per token."""
    quant = f.raw("quantization_config")
    if not isinstance(quant, Mapping):
        return None
    method = str(quant.get("quant_method", ""))
    inner = quant.get("quantization")
    inner = inner if isinstance(inner, Mapping) else quant
    scheme = next((place[key] for key in ("kv_cache_scheme", "kv_cache_quant_algo") for place in (inner, quant)
                   if place.get(key) is not None), None)
    if scheme is None:
        return None
    fp8 = (isinstance(scheme, Mapping) and scheme.get("type") == "float" and scheme.get("num_bits") == 8) or (
        isinstance(scheme, str) and scheme.lower() == "fp8")
    if isinstance(scheme, Mapping):
        what = (f"{scheme.get('num_bits')}-bit {scheme.get('type')}, {scheme.get('strategy', 'tensor')} scales"
                + (", dynamic" if scheme.get("dynamic") else ""))
    else:
        what = scheme
    said = f"the checkpoint's quantization_config ({method or 'no quant_method'}) gives the KV cache as {what}"
    static = not (isinstance(scheme, Mapping) and scheme.get("dynamic"))
    if method.startswith("modelopt"):
        if fp8 and static:
            return Note(f"{said}: vLLM's --kv-cache-dtype auto takes it and pages fp8 (per-tensor scales, nothing "
                        "per token); kvcalc sizes the precision given, so give {dtype} fp8 to match", "dtype")
        return f"{said}: vLLM's auto does not map it and keeps the model dtype; kvcalc sizes the precision given"
    if fp8:
        return Note(f"{said}: vLLM pages fp8 only with --kv-cache-dtype fp8 (these are its per-tensor scales; auto "
                    "keeps the model dtype); kvcalc sizes the precision given ({dtype} fp8 for that)", "dtype")
    return f"{said}: not a KV format vLLM pages from the checkpoint; kvcalc sizes the precision given"


def groups_head_dim(groups: tuple) -> int:
    """The K head width of the first attention group (the hidden size fallback when a config has none)."""
    return next(g.k_head_dim for g in groups if g.keeps_kv)


def _head_dim(f: ConfigFields, heads: int, hidden: int | None) -> int:
    """`head_dim` (PLaMo-2's `hidden_size_per_head`, which vLLM sets as head_dim; `attention_head_dim`, `kv_channels`;
    `attention_hidden_size` / heads), MLA's nope + rope, else hidden_size / heads."""
    head_dim = f.int("hidden_size_per_head", "head_dim", "attention_head_dim", "kv_channels")
    attention_width = f.int("attention_hidden_size")  # Zamba: attention runs on a wider input than hidden_size
    if attention_width is not None:
        if attention_width % heads or (head_dim is not None and head_dim * heads != attention_width):
            key = f.key_of("head_dim", "attention_head_dim", "kv_channels")
            per_head = "" if head_dim is None else f" · {key} {head_dim}"
            raise f.error(f"attention_hidden_size {attention_width} is not num_attention_heads {heads}{per_head}; "
                          "fix one")
        return attention_width // heads
    if head_dim is not None:
        return head_dim
    if f.int("kv_lora_rank") is not None:
        nope, rope = f.int("qk_nope_head_dim"), f.int("qk_rope_head_dim")
        if nope is not None and rope is not None:
            return nope + rope
    if hidden is None:
        raise f.error("missing the field 'hidden_size' (or 'head_dim'); add it to the file or give {head_dim}",
                      "head_dim")
    if hidden % heads:
        raise f.error(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
                      "add 'head_dim' or use {head_dim}", "head_dim")
    return hidden // heads


def _model_name(config: Mapping[str, Any], path: Path | None) -> str:
    """`_name_or_path`'s last part, else the folder holding config.json, else the file's stem (standard input:
    the model type)."""
    name_or_path = config.get("_name_or_path")
    if isinstance(name_or_path, str) and name_or_path.strip("/ "):
        return name_or_path.rstrip("/").split("/")[-1]
    if path is None:
        return str(config.get("model_type") or "config")
    folder = path.resolve().parent.name
    if folder and path.name == "config.json":
        return folder
    return path.stem
