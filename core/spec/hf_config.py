"""A Hugging Face `config.json`, read offline, as a ModelSpec (the fields that decide KV size).

What is read, and which spelling wins:

* layers: `num_hidden_layers` (GPT-2/Falcon `n_layer`, MPT `n_layers`, ChatGLM `num_layers` accepted);
* query heads: `num_attention_heads` (`n_head`, `n_heads`, `num_heads`);
* KV heads: `num_key_value_heads` (Falcon `num_kv_heads` with `new_decoder_architecture`, RefinedWeb
  `n_head_kv`); absent: one KV head when `multi_query` is true (Falcon-7B, GPT-BigCode), otherwise as
  many as query heads (MHA);
* head dim: `head_dim` when present (it differs from hidden_size / heads for Gemma and Qwen3), else
  hidden_size / heads;
* sliding window: `sliding_window` (ignored when `use_sliding_window` is false, as Qwen2/Qwen3 ship),
  applied to the layers that `layer_types` marks "sliding_attention", or per `sliding_window_pattern`,
  or per the model type's known alternation, or to every layer (Mistral-7B-v0.1);
* MLA (DeepSeek-V2/V3): `kv_lora_rank` + `qk_rope_head_dim`; `num_key_value_heads` is then not the cache
  (the spec gets kv_heads 1: the latent is the one cached "head", as vLLM counts it);
* multimodal models keep the language model's fields under `text_config`;
* `layer_types` entries "linear_attention" / "mamba" (Qwen3-Next, hybrids) keep no KV cache and are not
  counted as KV layers;
* MoE (for `sim`'s weight reads): routed experts `n_routed_experts` (DeepSeek), `num_local_experts`
  (Mixtral) or `num_experts` (Qwen-MoE), and `num_experts_per_tok`; both or neither.

A missing field raises ValueError naming the field and the file; so does a file that is not JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .models import ModelSpec

# Model types whose sliding-window layers alternate by a fixed period when the config has neither
# `layer_types` nor `sliding_window_pattern`: of every `period` layers, all but the last one slide.
#   gemma2: transformers' Gemma2 makes layer i sliding when i is even -> every other layer (period 2);
#   gemma3 / gemma3_text: five local layers then one global (Gemma3TextConfig default pattern 6);
#   cohere2: three sliding layers then one global (Cohere2Config default pattern 4).
_KNOWN_PERIODS: dict[str, int] = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}

# `layer_types` entries whose layers keep a fixed-size state instead of a KV cache.
_NO_KV_LAYER_TYPES = frozenset({"linear_attention", "mamba", "mamba2", "conv"})

_ALIASES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "max_position_embeddings": (
        "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len"
    ),
    "intermediate_size": ("intermediate_size", "ffn_dim", "ffn_hidden_size", "n_inner"),
    "num_experts": ("n_routed_experts", "num_local_experts", "num_experts"),
}


def load_config(path: Path | str, layers: int | None = None, head_dim: int | None = None) -> ModelSpec:
    """Read `path` (a config.json) into a ModelSpec named after the model (or its folder).

    `layers` / `head_dim` (from --layers / --head-dim) stand in for the config's fields when it lacks them.
    """
    path = Path(path)
    try:
        # FileNotFoundError and friends name the path; the CLI maps them to exit 2.
        config = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (not UTF-8); give a Hugging Face config.json") from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
            "give a Hugging Face config.json"
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object (a Hugging Face config.json), got {type(config).__name__}")
    return spec_from_config(config, name=_model_name(config, path), source=str(path), layers=layers,
                            head_dim=head_dim)


def spec_from_config(
    config: Mapping[str, Any], name: str, source: str, layers: int | None = None, head_dim: int | None = None
) -> ModelSpec:
    """The ModelSpec of a parsed config.json; `source` names the file in error messages.

    `layers` / `head_dim` fill in `num_hidden_layers` / `head_dim` only where the config has none.
    """
    text_config = config.get("text_config")
    if isinstance(text_config, Mapping) and _first(config, "num_hidden_layers") is None:
        # Multimodal (Llava, Gemma-3, Mllama, Qwen2-VL ...): the KV cache belongs to the language model.
        config = {"model_type": config.get("model_type"), **text_config}
        source = f"{source} (text_config)"
    fill = {"num_hidden_layers": layers, "head_dim": head_dim}
    config = {**config, **{k: v for k, v in fill.items() if v is not None and _first(config, k) is None}}
    layers = _required_int(config, "num_hidden_layers", source)
    heads = _required_int(config, "num_attention_heads", source)
    kv_lora_rank = _optional_int(config, "kv_lora_rank", source)
    qk_rope_head_dim = _optional_int(config, "qk_rope_head_dim", source)
    if kv_lora_rank is not None and qk_rope_head_dim is None:
        raise ValueError(f"{source}: MLA config has kv_lora_rank but is missing the field 'qk_rope_head_dim'")
    head_dim = _optional_int(config, "head_dim", source)
    hidden_size = _optional_int(config, "hidden_size", source)
    if kv_lora_rank is not None and head_dim is None:
        # MLA query/key heads are nope + rope wide; the cache does not use it (one latent per token).
        nope = _optional_int(config, "qk_nope_head_dim", source)
        head_dim = nope + qk_rope_head_dim if nope is not None and qk_rope_head_dim is not None else None
    if head_dim is None:
        if hidden_size is None:
            raise ValueError(
                f"{source}: missing the field 'hidden_size' (or 'head_dim'); add it to the file or give --head-dim"
            )
        if hidden_size % heads:
            raise ValueError(
                f"{source}: hidden_size {hidden_size} is not a multiple of num_attention_heads {heads}; "
                "add 'head_dim' or use --head-dim"
            )
        head_dim = hidden_size // heads
    all_layers, layers = layers, _kv_layers(config, layers, source)
    if layers < all_layers:
        source = f"{source} ({all_layers - layers} of {all_layers} layers keep no KV cache)"
    window, num_sliding = _sliding(config, layers, source)
    return ModelSpec(
        name=name,
        layers=layers,
        num_attention_heads=heads,
        kv_heads=1 if kv_lora_rank is not None else _kv_heads(config, heads, source),
        head_dim=head_dim,
        hidden_size=hidden_size if hidden_size is not None else heads * head_dim,
        max_position_embeddings=_optional_int(config, "max_position_embeddings", source),
        intermediate_size=_optional_int(config, "intermediate_size", source),
        vocab_size=_optional_int(config, "vocab_size", source),
        sliding_window=window,
        num_sliding_layers=num_sliding,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim if kv_lora_rank is not None else None,
        num_kv_free_layers=all_layers - layers,
        **_experts(config, source),
        source=source,
    )


def _experts(config: Mapping[str, Any], source: str) -> dict[str, int | None]:
    """{num_experts, experts_per_token} of a MoE config, both None for a dense one."""
    experts = _optional_int(config, "num_experts", source)
    per_token = _optional_int(config, "num_experts_per_tok", source)
    if (experts is None) != (per_token is None):
        missing = "num_experts_per_tok" if per_token is None else "n_routed_experts / num_local_experts"
        raise ValueError(f"{source}: a MoE config needs both the expert count and num_experts_per_tok "
                         f"(missing {missing}); add it to the file")
    if experts is not None and per_token > experts:  # type: ignore[operator]
        raise ValueError(f"{source}: num_experts_per_tok {per_token} exceeds the {experts} experts; fix the file")
    return {"num_experts": experts, "experts_per_token": per_token}


def _model_name(config: Mapping[str, Any], path: Path) -> str:
    """`_name_or_path`'s last part, else the folder holding config.json, else the model type."""
    name_or_path = config.get("_name_or_path")
    if isinstance(name_or_path, str) and name_or_path.strip("/ "):
        return name_or_path.rstrip("/").split("/")[-1]
    folder = path.resolve().parent.name
    if folder and path.name == "config.json":
        return folder
    model_type = config.get("model_type")
    return model_type if isinstance(model_type, str) and model_type else path.stem


def _first(config: Mapping[str, Any], field: str) -> Any:
    for key in _ALIASES.get(field, (field,)):
        if config.get(key) is not None:
            return config[key]
    return None


def _optional_int(config: Mapping[str, Any], field: str, source: str) -> int | None:
    value = _first(config, field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{source}: field '{field}' must be a positive integer, got {value!r}")
    return value


def _required_int(config: Mapping[str, Any], field: str, source: str) -> int:
    value = _optional_int(config, field, source)
    if value is None:
        fix = " or give --layers" if field == "num_hidden_layers" else ""
        raise ValueError(f"{source}: missing the field '{field}'; add it to the file{fix}")
    return value


def _kv_heads(config: Mapping[str, Any], heads: int, source: str) -> int:
    if config.get("model_type") == "falcon" and not config.get("new_decoder_architecture"):
        # Falcon-7B style: `num_kv_heads` is only read with the new decoder architecture (Falcon-40B/180B).
        return 1 if config.get("multi_query") else heads
    for key in ("num_key_value_heads", "num_kv_heads", "n_head_kv"):
        if config.get(key) is not None:
            return _optional_int(config, key, source)  # type: ignore[return-value]
    return 1 if config.get("multi_query") else heads


def _kv_layers(config: Mapping[str, Any], layers: int, source: str) -> int:
    """Layers that keep a KV cache: all of them, unless `layer_types` marks some as linear attention or
    state-space layers (Qwen3-Next, hybrids), whose state does not grow with the context."""
    layer_types = config.get("layer_types")
    if not isinstance(layer_types, list):
        return layers
    if len(layer_types) != layers:
        raise ValueError(
            f"{source}: layer_types lists {len(layer_types)} layers but num_hidden_layers is {layers}; fix one"
        )
    kv_layers = sum(1 for kind in layer_types if kind not in _NO_KV_LAYER_TYPES)
    if kv_layers == 0:
        raise ValueError(f"{source}: no entry of layer_types is an attention layer, so the model keeps no KV cache")
    return kv_layers


def _sliding(config: Mapping[str, Any], layers: int, source: str) -> tuple[int | None, int]:
    """(window, number of sliding-window layers among the KV layers); (None, 0) when no layer slides."""
    window = _optional_int(config, "sliding_window", source)
    if window is None or config.get("use_sliding_window") is False:
        return None, 0
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list):
        num_sliding = sum(1 for kind in layer_types if kind == "sliding_attention")
        return (window, num_sliding) if num_sliding else (None, 0)
    period = _optional_int(config, "sliding_window_pattern", source) or _KNOWN_PERIODS.get(
        str(config.get("model_type"))
    )
    if period is not None:
        return window, layers - layers // period
    if config.get("use_sliding_window") and config.get("max_window_layers") is not None:
        # Qwen2 with the window switched on: layers from index max_window_layers upward slide.
        first = config["max_window_layers"]
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(f"{source}: field 'max_window_layers' must be a non-negative integer, got {first!r}")
        num_sliding = max(0, layers - first)
        return (window, num_sliding) if num_sliding else (None, 0)
    return window, layers
