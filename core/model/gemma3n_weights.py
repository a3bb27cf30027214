"""Gemma-3n's weights beside what the dimension estimate (weights.py) counts: its vision tower (timm's
MobileNet-V5), its audio tower (a Conformer) with their embedders into the text model, and the text model's
per-layer embeddings, AltUp and LAuReL weights. vLLM loads all of them (its Gemma3n model builds both towers and
every text weight on the GPU), so the memory plan counts them as 16-bit weights on the first stage.

Counted from the config, per the layer shapes of transformers' Gemma3n (5.24; equal to its modules' parameters,
tests/core/model/test_gemma3n_weights.py), norms included:

* embedder (vision, audio): an embedding vocab · h, two RMSNorms 2·h, a projection h · text hidden;
* audio tower (`audio_config`, hidden h, F input features, L Conformer blocks, conv kernel K, N heads):
  subsampling convs c₀·k₀ + c₁·c₀·k₁ (+ a norm of each's channels) and a projection h · c₁ · F′, F′ the
  frequencies after both convs (each pads 1 on either side: F′ = (F + 2 − k_w) // s_w + 1, twice); per block
  24·h² + K·h + 9·h + h / N (two feed-forwards of 4·h, Q, K, V, O and a relative-position projection, a light
  convolution 2·h → h, their norms, per-dim scales);
* vision tower (`vision_config`): timm's encoder named by `architecture`; its parameter count is the
  architecture's, not in the config: `TIMM_ENCODERS` (timm 1.0.31, create_model(name, num_classes=0) as
  transformers' TimmWrapperModel builds it, Σ numel); another architecture is refused by name (a vision_config
  without `architecture` is counted as weights.vision_tower_params counts a ViT, or refused there);
* text (`text_config`, hidden H, L layers, per-layer width P, vocabulary V′ of the per-layer embeddings, A AltUp
  inputs, LAuReL rank R): V′·L·P + L·P·H + P + 2·(A − 1)·H² + L·((4 + A + 2·R + 2·P)·H + A² + A³).

google/gemma-3n-E4B-it: text decoder estimate 4,396,154,880 + per-layer embeddings etc. 2,438,777,840 + audio
681,348,640 + 3,345,408 + vision 294,126,912 + 4,460,544 = 7,818,214,224 (transformers' model: 7,818,517,072,
the difference its decoder's norms; the model card: "raw parameter count ... 8B").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ParameterError

TIMM_ENCODERS = {"mobilenetv5_300m_enc": 294_126_912}  # MobileNet-V5-300M, Gemma-3n's vision encoder
FFW_EXPANSION = 4  # the Conformer feed-forward's width over hidden (fixed in transformers' Gemma3nAudioConformer)


def is_gemma3n(config: Mapping[str, Any]) -> bool:
    return config.get("model_type") == "gemma3n"


def timm_vision(config: Mapping[str, Any]) -> bool:
    """Whether the config's vision tower is a timm encoder (`architecture`), which this module counts."""
    vision = config.get("vision_config")
    return isinstance(vision, Mapping) and "architecture" in vision


def gemma3n_params(config: Mapping[str, Any], text_hidden: int, instead: str) -> int:
    """Everything the module docstring lists, for a gemma3n config.json (`instead`: the parameter that gives the
    weights themselves, named when a part cannot be counted); a vision tower that is not a timm encoder is left to
    weights.vision_tower_params (the caller's)."""
    total = 0
    for key, count in (("vision_config", _vision), ("audio_config", _audio)):
        part = config.get(key)
        if isinstance(part, Mapping) and (key != "vision_config" or timm_vision(config)):
            total += count(part, instead) + _embedder(part, text_hidden, key, instead)
    text = config.get("text_config")
    return total + (_text_extras(text, instead) if isinstance(text, Mapping) else 0)


def _int(part: Mapping[str, Any], key: str, where: str, instead: str, default: int | None = None) -> int:
    value = part.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ParameterError(f"{where} has no {key} to count Gemma-3n's weights: give {{{instead}}} (the weights "
                             "are then not estimated)", instead)
    return value


def _embedder(part: Mapping[str, Any], text_hidden: int, where: str, instead: str) -> int:
    hidden = _int(part, "hidden_size", where, instead)
    return _int(part, "vocab_size", where, instead) * hidden + 2 * hidden + hidden * text_hidden


def _vision(vision: Mapping[str, Any], instead: str) -> int:
    name = vision.get("architecture")
    if name not in TIMM_ENCODERS:
        raise ParameterError(f"vision_config architecture {name!r}: kvcalc knows the parameters of timm's "
                             f"{', '.join(TIMM_ENCODERS)} only: give {{{instead}}} (the weights are then not "
                             "estimated)", instead)
    return TIMM_ENCODERS[name]


def _audio(audio: Mapping[str, Any], instead: str) -> int:
    where = "audio_config"
    h = _int(audio, "hidden_size", where, instead)
    channels, kernels, strides = (audio.get(k) for k in ("sscp_conv_channel_size", "sscp_conv_kernel_size",
                                                         "sscp_conv_stride_size"))
    if not (isinstance(channels, list) and isinstance(kernels, list) and isinstance(strides, list)
            and len(channels) == len(kernels) == len(strides) == 2):
        raise ParameterError(f"audio_config has no two-conv subsampling (sscp_conv_channel_size, _kernel_size, "
                             f"_stride_size) to count Gemma-3n's weights: give {{{instead}}}", instead)
    freq, previous, sscp = _int(audio, "input_feat_size", where, instead), 1, 0
    for c, (kh, kw), (_, sw) in zip(channels, kernels, strides, strict=True):
        sscp += c * previous * kh * kw + c  # the conv (no bias) and its group norm's scale
        freq, previous = (freq + 2 - kw) // sw + 1, c
    sscp += h * previous * freq  # the input projection of channels × frequencies
    heads = _int(audio, "conf_num_attention_heads", where, instead)
    kernel = _int(audio, "conf_conv_kernel_size", where, instead)
    feed_forward = 2 * FFW_EXPANSION * h * h + 2 * h  # two matrices of h · 4h and two norms, twice a block
    attention = 5 * h * h + 2 * h + h // heads  # Q, K, V, O, the relative positions' projection, norms, scales
    light_conv = 3 * h * h + kernel * h + 2 * h  # h → 2h, depthwise K, h → h, two norms
    block = 2 * feed_forward + attention + light_conv + h
    return sscp + _int(audio, "conf_num_hidden_layers", where, instead) * block


def _text_extras(text: Mapping[str, Any], instead: str) -> int:
    where = "text_config"
    hidden, layers = _int(text, "hidden_size", where, instead), _int(text, "num_hidden_layers", where, instead)
    width = _int(text, "hidden_size_per_layer_input", where, instead, 0)
    vocab = _int(text, "vocab_size_per_layer_input", where, instead, 0)
    altup, rank = _int(text, "altup_num_inputs", where, instead, 1), _int(text, "laurel_rank", where, instead, 0)
    ple = vocab * layers * width + layers * width * hidden + width if width else 0
    per_layer = (4 + altup + 2 * rank + 2 * width) * hidden + altup**2 + altup**3
    return ple + 2 * (altup - 1) * hidden * hidden + layers * per_layer
