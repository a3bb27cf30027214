"""Parameters from dimensions, for the memory plan of `sim` and `size --gpu` when no count is known.

    total  = embeddings + Σ_layers (attention or recurrent mixer + MLP / MoE + norms)
    active = total − the routed experts a token does not pick (experts − experts_per_token per MoE layer)

Per layer, from its layer group (core/model/layers.py) and its FFN group:

* attention: Q hidden·h_q·d_K (twice as wide with a query gate), K hidden·h_KV·d_K, V hidden·h_KV·d_V (none
  when K = V), O h_q·d_V·hidden; MLA: q_a hidden·q_lora + q_b q_lora·h_q·d_K (or hidden·h_q·d_K without
  q_lora), kv_a hidden·(kv_lora_rank + rope), kv_b kv_lora_rank·h_q·(d_K − rope + d_V), O h_q·d_V·hidden;
* Mamba-2: in_proj hidden·(2·d_inner + 2·g·d_state + heads), conv (d_inner + 2·g·d_state)·d_conv,
  out_proj d_inner·hidden; Mamba-1: in_proj hidden·2·d_inner, conv d_inner·d_conv, x_proj
  d_inner·(dt_rank + 2·d_state), dt_proj dt_rank·d_inner, A d_inner·d_state, out_proj d_inner·hidden;
  Gated DeltaNet: in_proj hidden·(2·k_heads·k_dim + 2·v_heads·v_dim + 2·v_heads), conv (2·k_heads·k_dim +
  v_heads·v_dim)·d_conv, out_proj v_heads·v_dim·hidden; lightning attention and Kimi Delta Attention:
  q, k, v and gate hidden·4·h·d, out h·d·hidden; short conv: in_proj hidden·3·d, conv d·d_conv, out d·hidden;
* MLP: (3 gated, else 2)·hidden·intermediate; MoE: routed experts of their own width, a router
  hidden·experts, the dense / shared part of `dense_intermediate`;
* embeddings vocab·hidden, twice unless tied.

Biases, norms and small per-head vectors are left out (well under 1 % of any model here); it is an estimate
and says so. Checked against published parameter counts in tests/core/model/test_weights.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ParameterError
from ..notes import Note
from .layers import FfnGroup, LayerGroup
from .model_spec import ModelSpec
from .state import RecurrentState


@dataclass(frozen=True)
class ParamCount:
    total: int
    active: int
    estimated: bool  # True when counted from dimensions here, False when the spec carries the counts


def param_count(spec: ModelSpec) -> ParamCount:
    """The spec's own counts when it has them, else the estimate from dimensions (ValueError if it lacks them)."""
    if spec.num_params:
        return ParamCount(spec.num_params, spec.num_active_params or spec.num_params, estimated=False)
    return estimate_params(spec)


def estimate_params(spec: ModelSpec) -> ParamCount:
    """Total and active parameters from the spec's dimensions (see the module docstring)."""
    if spec.vocab_size is None:
        raise ValueError(f"model {spec.name!r} has no vocab_size to count its embedding weights: use a preset or a "
                         "config.json that names one, or give the KV memory itself (size --kv-memory)")
    hidden = spec.hidden_size
    mixer = sum(g.count * _mixer_params(g, hidden) for g in spec.layer_groups)
    ffn_groups = spec.ffn_groups or _default_ffn(spec)
    ffn_total = sum(f.count * _ffn_params(f, hidden, f.experts) for f in ffn_groups)
    ffn_active = sum(f.count * _ffn_params(f, hidden, f.experts_per_token) for f in ffn_groups)
    embeddings = spec.vocab_size * hidden * (1 if spec.tie_word_embeddings else 2)
    total = embeddings + mixer + ffn_total
    return ParamCount(total, embeddings + mixer + ffn_active, estimated=True)


def _default_ffn(spec: ModelSpec) -> tuple[FfnGroup, ...]:
    """One gated MLP (or one MoE block of `intermediate_size` experts) in every layer."""
    if spec.intermediate_size is None:
        raise ValueError(
            f"model {spec.name!r} has no intermediate_size to count its MLP weights: use a preset or a config.json "
            "that names one, or give the KV memory itself (size --kv-memory)"
        )
    if spec.num_experts:
        assert spec.experts_per_token is not None
        return (FfnGroup(spec.model_layers, experts=spec.num_experts, experts_per_token=spec.experts_per_token,
                         expert_intermediate=spec.intermediate_size),)
    return (FfnGroup(spec.model_layers, dense_intermediate=spec.intermediate_size),)


def _ffn_params(f: FfnGroup, hidden: int, experts: int) -> int:
    matrices = 3 if f.gated else 2
    routed = experts * matrices * hidden * f.expert_intermediate + (hidden * f.experts if f.experts else 0)
    return matrices * hidden * f.dense_intermediate + routed


def _mixer_params(g: LayerGroup, hidden: int) -> int:
    if g.state is not None:
        return _recurrent_params(g.state, hidden)
    if not g.q_heads:
        return 0  # no-op or MLP-only layers
    out = g.q_heads * g.v_head_dim * hidden
    if not g.keeps_kv:  # a KV-shared layer (Gemma-3n, Gemma-4): its own Q and O, another layer's K and V
        return hidden * g.q_heads * g.k_head_dim * (2 if g.gated_query else 1) + out
    if g.kind == "mla":
        q = hidden * g.q_lora_rank + g.q_lora_rank * g.q_heads * g.k_head_dim if g.q_lora_rank else (
            hidden * g.q_heads * g.k_head_dim)
        kv = hidden * (g.kv_lora_rank + g.rope_dim) + g.kv_lora_rank * g.q_heads * (
            g.k_head_dim - g.rope_dim + g.v_head_dim)
        return q + kv + out
    q = hidden * g.q_heads * g.k_head_dim * (2 if g.gated_query else 1)
    k = hidden * g.kv_heads * g.k_head_dim
    v = 0 if g.k_eq_v else hidden * g.kv_heads * g.v_head_dim
    return q + k + v + out


def _recurrent_params(s: RecurrentState, hidden: int) -> int:
    if s.kind == "mamba2":
        conv_dim = s.d_inner + 2 * s.n_groups * s.d_state
        return hidden * (s.d_inner + conv_dim + s.heads) + conv_dim * s.d_conv + s.d_inner * hidden
    if s.kind == "mamba1":
        return (hidden * 2 * s.d_inner + s.d_inner * s.d_conv + s.d_inner * (s.dt_rank + 2 * s.d_state)
                + s.dt_rank * s.d_inner + s.d_inner * s.d_state + s.d_inner * hidden)
    if s.kind == "gated_deltanet":
        key_dim, value_dim = s.k_heads * s.k_dim, s.heads * s.head_dim
        return (hidden * (2 * key_dim + 2 * value_dim + 2 * s.heads) + (2 * key_dim + value_dim) * s.d_conv
                + value_dim * hidden)
    if s.kind in ("lightning", "kda"):
        return hidden * 4 * s.heads * s.head_dim + s.heads * s.head_dim * hidden
    if s.kind == "rwkv":  # RWKV-4: time mixing's key, value, receptance, output + channel mixing's receptance
        return 5 * hidden * hidden
    return hidden * 3 * s.d_inner + s.d_inner * s.d_conv + s.d_inner * hidden  # short_conv


def vision_tower_params(vision: Mapping[str, Any], text_hidden: int, instead: str = "weights_bytes") -> int:
    """Parameters of a multimodal checkpoint's vision tower (its `vision_config`) and a projector into the text
    model: an estimate, labelled so by its callers.

        per layer: Q, K, V, O 4·h² + 4·h biases; MLP (3 matrices when gated, `hidden_act` silu, else 2)·h·I
                   + I + h biases; two LayerNorms 4·h
        patches:   channels · patch² · h + h;  positions (image / patch)² · h;  final LayerNorm 2·h
        projector: h · text_hidden + text_hidden² (a two-layer MLP; models that merge patches first differ)

    SigLIP-so400m (27 layers, h 1,152, I 4,304, patch 14, image 384): 412,987,248 + 6,553,600 for a 2,048-wide
    text model (granite-vision-3.3-2b: vLLM 0.19 loads 0.80 GiB more than for granite-3.1-2b; this gives 0.78).

    A tower without these fields (Gemma-3n's MobileNet-V5 has a width, no layer count) is refused, naming the
    parameter `instead` that gives the weights themselves (then nothing asks for the tower).
    """
    def field(*names: str, default: int | None = None) -> int:
        for name in names:
            value = vision.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        if default is None:
            kind = f" ({vision['model_type']})" if isinstance(vision.get("model_type"), str) else ""
            raise ParameterError(f"vision_config{kind} has no {' / '.join(names)} to count the vision tower's "
                                 f"weights: give {{{instead}}} (the weights are then not estimated)", instead)
        return default

    h = field("hidden_size", "embed_dim", "width")
    inter = field("intermediate_size", "mlp_dim", default=4 * h)
    layers = field("num_hidden_layers", "depth", "num_layers")
    patch = field("patch_size", default=14)
    image = field("image_size", default=0)
    channels = field("num_channels", "in_channels", "in_chans", default=3)
    gated = str(vision.get("hidden_act", "")).lower() in ("silu", "swiglu")
    per_layer = 4 * h * h + 4 * h + (3 if gated else 2) * h * inter + inter + h + 4 * h
    positions = (image // patch) ** 2 * h if image else 0
    tower = layers * per_layer + channels * patch * patch * h + h + positions + 2 * h
    return tower + h * text_hidden + text_hidden * text_hidden


def audio_tower_params(audio: Mapping[str, Any], text_hidden: int, instead: str = "weights_bytes") -> int:
    """Parameters of a Whisper-style audio encoder (`audio_config`: Qwen2-Audio, Qwen2.5-Omni's thinker, Voxtral)
    and a projector into the text model: an estimate, labelled so by its callers.

        convs:     num_mel_bins · d · 3 + d, then d · d · 3 + d (two 1-D convolutions of width 3)
        positions: max_source_positions (default 1,500) · d
        per layer: Q, K, V, O 4·d² + 3·d biases (K has none); fc1, fc2 2·d·F + F + d; two LayerNorms 4·d
        final LayerNorm 2·d; projector d · W + W, W the encoder's `output_dim` or the text hidden size

    Qwen2.5-Omni-7B's (d 1,280, 32 layers, F 5,120, 128 mel bins, output_dim 3,584): 641,560,064. An encoder
    without d_model / encoder_layers / encoder_ffn_dim is refused, naming the parameter `instead`.
    """
    def field(name: str, default: int | None = None) -> int:
        value = audio.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            kind = f" ({audio['model_type']})" if isinstance(audio.get("model_type"), str) else ""
            raise ParameterError(f"audio_config{kind} has no positive integer {name} to count the audio tower's "
                                 f"weights: give {{{instead}}} (the weights are then not estimated)", instead)
        return value

    d, ffn, layers = field("d_model"), field("encoder_ffn_dim"), field("encoder_layers")
    convs = field("num_mel_bins", 128) * d * 3 + d + d * d * 3 + d
    per_layer = 4 * d * d + 3 * d + 2 * d * ffn + ffn + d + 4 * d
    width = field("output_dim") if audio.get("output_dim") is not None else text_hidden
    return convs + field("max_source_positions", 1500) * d + layers * per_layer + 2 * d + d * width + width


def config_vision_params(config: Mapping[str, Any], text_hidden: int, instead: str = "weights_bytes") -> int:
    """The vision tower's parameters of a config.json (0 when it has no `vision_config`); `instead`: the parameter
    that gives the weights without this count, named when the tower cannot be counted. Gemma-3n: its vision and
    audio towers and the text weights the dimension estimate leaves out (core/model/gemma3n_weights.py)."""
    from .gemma3n_weights import gemma3n_params, is_gemma3n, timm_vision

    thinker = config.get("thinker_config")
    if isinstance(thinker, Mapping) and config.get("num_hidden_layers") is None:
        config = thinker  # Qwen2.5-Omni / Qwen3-Omni: vLLM loads the thinker, whose towers sit beside its text_config
    vision = config.get("vision_config")
    audio = config.get("audio_config")
    if isinstance(audio, Mapping) and not is_gemma3n(config):  # Qwen2-Audio, Qwen-Omni, Voxtral
        audio_params = audio_tower_params(audio, text_hidden, instead)
        return audio_params + (vision_tower_params(vision, text_hidden, instead) if isinstance(vision, Mapping) else 0)
    gemma3n = gemma3n_params(config, text_hidden, instead) if is_gemma3n(config) else 0
    if gemma3n and timm_vision(config):
        return gemma3n  # its vision tower included
    return gemma3n + (vision_tower_params(vision, text_hidden, instead) if isinstance(vision, Mapping) else 0)


def checkpoint_quantization(config: Mapping[str, Any]) -> str | None:
    """How a config.json's `quantization_config` stores the linear weights: "mxfp4" (routed experts only, as
    gpt-oss), "fp8", "int8", "int4", or None when it names no quantization kvcalc reads.

    compressed-tensors (RedHat's w8a8, w4a16, fp8-dynamic checkpoints) gives the weights' `num_bits` and `type`
    per config group; GPTQ / AWQ give `bits`; fp8 and mxfp4 are named by `quant_method`.
    """
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return None
    method = str(quant.get("quant_method", "")).lower()
    if method == "mxfp4":
        return "mxfp4"
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8"
    bits = quant.get("bits") or quant.get("w_bit")
    kind = "int"
    groups = quant.get("config_groups")
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping) and isinstance(weights.get("num_bits"), int):
                bits, kind = weights["num_bits"], str(weights.get("type", "int")).lower()
                break
    if bits == 8:
        return "fp8" if kind == "float" else "int8"
    if bits == 4:
        return "int4"
    return None


def unmodelled_quantization_note(quant: Any) -> Note | None:
    """Said when a `quantization_config` stores the weights in a precision that neither checkpoint_quantization
    nor the config's weight dtype reads (GPTQ 3-bit, bitsandbytes 8-bit, ModelOpt...): the GPU plan would load
    them at the model's dtype, silently (a compressed-tensors config that quantizes only the KV cache is none)."""
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", ""))
        groups = quant.get("config_groups")
        if (checkpoint_quantization({"quantization_config": quant}) is not None or method in _WEIGHT_DTYPE_METHODS
                or (method == "compressed-tensors" and not groups)):
            return None
        bits = quant.get("bits") or quant.get("w_bit")
        what = f"quant_method {method!r}" + (f", {bits} bits" if bits is not None else "")
    elif quant is None:
        return None
    else:
        what = f"{quant!r}, not an object"
    return Note(f"quantization_config ({what}) stores the weights in a precision kvcalc does not model: a GPU plan "
                "loads them at the model's dtype; give {weight_dtype} (or the KV memory itself)", "weight_dtype")


# kept-at-16-bit patterns already modelled (LM head, embeddings, a vision / audio tower) or negligible (routers,
# norms, biases): the rest leave linear layers unquantized
_MODELLED_OR_SMALL = re.compile(r"lm_head|embed|wte|output_layer|vision|visual|mm_projector|audio|router|norm|bias|"
                                r"gate\$?$", re.IGNORECASE)


def partial_quantization_note(quant: Any) -> str | None:
    """Said when a checkpoint kvcalc reads as fp8 / int8 / int4 keeps linear layers other than the LM head and the
    embeddings at 16 bits (compressed-tensors `ignore`, AWQ / GPTQ `modules_to_not_convert`: Kimi-K2-Thinking
    quantizes only its routed experts) or groups its int4 weights other than by 128: the GPU plan takes every linear
    layer at that precision in groups of 128, so it under-counts the weights. mxfp4 is modelled (experts only)."""
    precision = checkpoint_quantization({"quantization_config": quant}) if isinstance(quant, Mapping) else None
    if precision not in ("fp8", "int8", "int4"):
        return None
    kept = quant.get("ignore") or quant.get("modules_to_not_convert") or []
    kept = [k for k in kept if isinstance(k, str) and not _MODELLED_OR_SMALL.search(k)] if isinstance(
        kept, list) else []
    groups = {w.get("group_size") for g in (quant.get("config_groups") or {}).values() if isinstance(g, Mapping)
              for w in [g.get("weights")] if isinstance(w, Mapping)} | {quant.get("group_size")}
    odd = sorted(g for g in groups if isinstance(g, int) and g not in (128, -1)) if precision == "int4" else []
    if not kept and not odd:
        return None
    said = [f"keeps {len(kept)} module pattern(s) at 16 bits ({', '.join(kept[:3])}{', ...' if len(kept) > 3 else ''})"
            ] if kept else []
    said += [f"groups its int4 weights by {', '.join(map(str, odd))} (kvcalc: 128)"] if odd else []
    return (f"quantization_config {' and '.join(said)}: the GPU plan takes every linear layer at {precision} in "
            "groups of 128, so its weights are an under-count (start from vLLM's own KV memory line where you can)")


# quant_method values that hf_groups.weight_dtype reads itself (bitsandbytes' 4-bit load)
_WEIGHT_DTYPE_METHODS = frozenset({"bitsandbytes_4bit"})
