"""The model of the shared options: a preset, a Hugging Face config (a file, a folder, or org/name from the
local hub cache), or explicit dimensions; and explicit dimensions applied on top of one of those.

ModelSpec (model_spec.py) holds the dimensions; presets.py the built-in models; hf_config.py reads configs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..errors import ParameterError
from ..notes import Note, concat
from .layers import LayerGroup
from .model_spec import ModelSpec
from .presets import PRESETS, get_preset

__all__ = ["PRESETS", "ModelSpec", "get_preset", "resolve_model", "with_overrides"]


def resolve_model(
    model: str | None,
    config: Path | str | None,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    kv_free: bool = False,
) -> ModelSpec | None:
    """The model of the shared options `--model`, `--config`, `--layers`, `--kv-heads`, `--head-dim`.

    A pure recurrent model (Mamba, RWKV: no KV, a state per sequence) is returned only with `kv_free`
    (`kvcalc size` sizes its state); the commands that page KV refuse it naming the model.

    `--model` is a preset name, or `org/name` read offline from the local Hugging Face hub cache; `--config`
    a config.json or the folder that holds one; or fully explicit dimensions (a spec named "custom", MHA: as
    many query heads as KV heads). Explicit dimensions override a preset's or config's values. None when
    nothing was given. ValueError when both --model and --config are given, or explicit dimensions alone
    are incomplete.
    """
    if model is not None and config is not None:
        raise ParameterError("give either {model} or {config}, not both", "model", "config")
    dims = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim}
    for name, value in dims.items():
        if value is not None and value <= 0:
            raise ParameterError(f"{name} must be a positive integer, got {value}", name)
    given = {name: value for name, value in dims.items() if value is not None}
    if model is not None:
        spec = _preset_or_hub(model, layers, head_dim)
    elif config is not None:
        from .hf_config import load_config

        spec = load_config(config, layers=layers, head_dim=head_dim)
    elif not given:
        return None
    elif len(given) < len(dims):
        missing = ", ".join(f"{{{f}}}" for f in dims if f not in given)
        raise ParameterError(
            f"explicit model dimensions need {{layers}}, {{kv_heads}} and {{head_dim}} together (missing {missing}); "
            "or give {model}/{config} and override some of them", *(f for f in dims if f not in given),
            *(f for f in dims if f in given), "model", "config",
        )
    else:
        assert layers is not None and kv_heads is not None and head_dim is not None
        return ModelSpec(
            name="custom", layers=layers, num_attention_heads=kv_heads, kv_heads=kv_heads, head_dim=head_dim,
            hidden_size=kv_heads * head_dim, max_position_embeddings=None,
            source=Note("explicit {layers}/{kv_heads}/{head_dim}", "layers", "kv_heads", "head_dim"),
        )
    if not spec.keeps_kv and not kv_free:
        raise ValueError(f"{spec.name} keeps no KV cache (every layer is recurrent: a state of "
                         f"{spec.state_bits() // 8:,} B per sequence); this command pages KV, so "
                         "there is nothing to page: size its state with `kvcalc size`")
    if not spec.keeps_kv and (layers is not None or kv_heads is not None or head_dim is not None):
        raise ParameterError(f"{spec.name} keeps no KV cache, so {{layers}}, {{kv_heads}} and {{head_dim}} have "
                             "nothing to override; drop them", "layers", "kv_heads", "head_dim")
    return with_overrides(spec, layers=layers, kv_heads=kv_heads, head_dim=head_dim)


def _preset_or_hub(model: str, layers: int | None, head_dim: int | None) -> ModelSpec:
    """A preset, else (for an `org/name`) the config.json of the local hub cache."""
    if "/" not in model.strip().strip("/"):
        return get_preset(model)
    from .hf_config import load_config
    from .hub import cached_config

    path, repo_id = cached_config(model)
    return load_config(path, layers=layers, head_dim=head_dim, name=repo_id)


def with_overrides(
    spec: ModelSpec, layers: int | None = None, kv_heads: int | None = None, head_dim: int | None = None
) -> ModelSpec:
    """`spec` with the given dimensions replaced (and re-validated); the name records what changed.

    Only a spec that its uniform fields describe can be overridden: one whose layers differ (hybrids,
    per-layer heads) has no single value to replace, so that is refused rather than guessed.
    """
    changes: dict[str, Any] = {}  # ints, each for a field of its own type in dataclasses.replace
    if spec.is_mla and (kv_heads is not None or head_dim is not None):
        raise ParameterError(
            f"{spec.name} uses MLA: its cache is one latent of kv_lora_rank + qk_rope_head_dim per token, "
            "so {kv_heads} and {head_dim} do not apply; drop them (or edit a config.json)", "kv_heads", "head_dim"
        )
    # A hybrid's own values: all its layers (`spec.layers` counts only those with KV, so Nemotron-H's --layers 10,
    # its KV layers, was silently no change), the main group's heads; checked before the sliding proportion below.
    own = {"layers": spec.model_layers, "kv_heads": spec.kv_heads, "head_dim": spec.head_dim}
    given = {k: v for k, v in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim))
             if v is not None and v != own[k]}
    if given and not spec.is_uniform:
        raise ParameterError(
            f"{spec.name}'s layers differ ({len(spec.layer_groups)} layer groups), so "
            f"{', '.join(f'{{{k}}} {v}' for k, v in given.items())} has no one value to replace: edit its "
            "config.json instead", *given)
    if not spec.is_uniform:
        return spec  # every value given is the model's own
    if layers is not None and layers != spec.layers:
        changes["layers"] = layers
        if spec.num_sliding_layers:
            # Keep the model's sliding/global proportion only when it stays exact; never round silently.
            num_sliding, remainder = divmod(layers * spec.num_sliding_layers, spec.layers)
            if remainder:
                raise ParameterError(
                    f"{{layers}} {layers}: {spec.name} has {spec.num_sliding_layers} of {spec.layers} layers "
                    "with a sliding window, which does not scale to a whole number of layers; "
                    "give a config.json with layer_types instead", "layers"
                )
            changes["num_sliding_layers"] = num_sliding
    if kv_heads is not None and kv_heads != spec.kv_heads:
        changes["kv_heads"] = kv_heads
    if head_dim is not None and head_dim != spec.head_dim:
        changes["head_dim"] = head_dim
    if not changes:
        return spec
    label = ", ".join(f"{k}={v}" for k, v in changes.items() if k != "num_sliding_layers")
    # layer_groups=() re-derives the groups from the changed uniform fields; estimated weights no longer apply.
    return dataclasses.replace(spec, name=f"{spec.name} ({label})", layer_groups=(),
                               source=concat(spec.source, f"; overridden: {label}"), **changes)


DRAFTER_METHODS = ("draft", "eagle", "mtp")  # the drafting methods whose drafter keeps KV of its own


def with_drafter(spec: ModelSpec, method: str | None, draft: ModelSpec | None = None) -> tuple[ModelSpec, str | None]:
    """`spec` with the KV its drafter keeps under speculative decoding `method`, and a sentence saying what
    was added (or, with no method, that the config's MTP layers exist and are not counted; None if nothing).

    * mtp, eagle: the config's own multi-token-prediction layers (`drafter_groups`), or `draft`'s layers when a
      draft config is given (an EAGLE head is its own small model);
    * draft: the draft model's layers (`draft`, from --draft-config); without one the drafter's KV is unknown;
    * ngram, or no method: no drafter KV.

    The drafter's layers join the target's in the same KV pool, at the same precision and TP split (vLLM).
    """
    mtp = spec.drafter_layers
    field = spec.drafter_field
    if draft is not None and method not in DRAFTER_METHODS:
        raise ParameterError(f"{{draft}} gives a drafter's layers, which only {{method}} "
                             f"{' | '.join(DRAFTER_METHODS)} uses; add {{method}} draft", "draft", "method")
    if method not in DRAFTER_METHODS:
        if mtp:
            return spec, Note(f"{spec.name}'s config has {mtp} MTP layer{'s' if mtp > 1 else ''} ({field} {mtp}), "
                              "which keep KV only under speculative decoding: not counted here ({spec_tokens} K "
                              "{spec_method} mtp adds them)", "spec_tokens", "spec_method")
        return spec, None
    if draft is not None:
        if not draft.keeps_kv:
            raise ParameterError(f"{{draft}}: {draft.name} keeps no KV cache; a recurrent drafter is not modelled",
                                 "draft")
        added = tuple(dataclasses.replace(g, note=f"drafter {draft.name}" + (f": {g.note}" if g.note else ""))
                      for g in draft.layer_groups)
        what = f"the draft model {draft.name} ({draft.model_layers} layer{'s' if draft.model_layers > 1 else ''}, " \
               f"{draft.layers} with KV)"
    elif method == "draft":
        return spec, Note("{spec_method} draft without {draft}: the draft model's own KV is not counted (give "
                          "{draft} PATH to add it)", "spec_method", "draft")
    elif not mtp:
        raise ParameterError(f"{{method}} {method}: {spec.name}'s config has no MTP layers (num_nextn_predict_layers, "
                             "mtp_num_hidden_layers) for the drafter; give the drafter's config with {draft} PATH",
                             "method", "draft")
    else:
        added = spec.drafter_groups
        what = f"{mtp} MTP drafter layer{'s' if mtp > 1 else ''} ({field} {mtp})"
    kv = sum(g.count for g in added if g.keeps_kv)
    groups, unified = _unify_chunked(spec.layer_groups + added, method)
    merged = dataclasses.replace(
        spec, name=f"{spec.name} + {method} drafter", layer_groups=groups, layers=spec.layers + kv,
        num_kv_free_layers=spec.num_kv_free_layers + sum(g.count for g in added if not g.keeps_kv),
        drafter_groups=(), source=concat(spec.source, f"; with {what}"),
    )
    return merged, Note(f"{{spec_method}} {method}: the KV of {what} is included in every figure (vLLM keeps it in "
                        "the same KV pool, at the same precision)" + unified, "spec_method")


def _unify_chunked(groups: tuple[LayerGroup, ...], method: str) -> tuple[tuple[LayerGroup, ...], str]:
    """vLLM turns its hybrid KV cache manager off for chunked local attention with an EAGLE-style drafter (eagle,
    mtp: speculative_config.use_eagle()) and pages the chunked layers as full attention; (groups, what the note
    adds)."""
    chunked = sum(g.count for g in groups if g.kind == "chunked")
    if not chunked or method not in ("eagle", "mtp"):
        return groups, ""
    full = tuple(dataclasses.replace(g, kind="full", window=None) if g.kind == "chunked" else g for g in groups)
    return full, (f"; and with it vLLM turns its hybrid KV cache manager off for chunked local attention, so the "
                  f"{chunked} chunked layers are paged as full attention (every token)")
