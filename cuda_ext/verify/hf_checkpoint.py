"""A local Hugging Face Llama checkpoint (config.json + safetensors), read offline into verify's model.

    read_llama_config(directory) -> ModelConfig         config.json of model_type "llama"
    load_llama_weights(directory, dtype, device) -> ModelWeights

Only what the verify model computes is accepted: RMSNorm, plain RoPE (rope type "default", no scaling),
SiLU-gated MLP, no biases. A config field that would change the math and that the model does not
implement (rope scaling, attention or MLP biases, another activation) is refused by name, never ignored;
so is a tensor the model would not use.

safetensors is read here directly (its layout is an 8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}}, then the bytes), so that kvcalc needs no extra package; a sharded
checkpoint's `model.safetensors.index.json` names the file of each tensor.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Any

import torch

from .config import ModelConfig
from .weights import HF_LAYER_NAMES, ModelWeights, checkpoint_reader

_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_UNUSED_TENSOR_SUFFIXES = ("rotary_emb.inv_freq",)  # old checkpoints store RoPE's frequencies; recomputed here


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: a Hugging Face checkpoint directory holds config.json "
                                "and model.safetensors (or model.safetensors.index.json and its shards)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None


def read_llama_config(directory: Path) -> ModelConfig:
    """config.json -> ModelConfig; ValueError naming the field that the verify model cannot compute."""
    if Path(directory).is_file():
        raise ValueError(f"{directory} is a file: give the folder that holds config.json ({Path(directory).parent})")
    path = Path(directory) / "config.json"
    cfg = _read_json(path)
    if cfg.get("model_type") != "llama":
        raise ValueError(f"{path}: model_type {cfg.get('model_type')!r} is not 'llama'; verify runs the Llama "
                         "architecture only")
    refused = {
        "hidden_act": cfg.get("hidden_act", "silu") != "silu",
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "mlp_bias": bool(cfg.get("mlp_bias", False)),
        "rope_scaling": cfg.get("rope_scaling") is not None,
    }
    rope = cfg.get("rope_parameters") or {}
    refused["rope_parameters"] = rope.get("rope_type", "default") != "default"
    bad = [name for name, wrong in refused.items() if wrong]
    if bad:
        raise ValueError(f"{path}: {bad[0]} {cfg[bad[0]]!r} is not computed by verify's model (plain RoPE, SiLU, "
                         "no biases); choose a checkpoint without it")
    try:
        heads = int(cfg["num_attention_heads"])
        return ModelConfig(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_q_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_position=int(cfg.get("max_position_embeddings", 2048)),
        )
    except KeyError as exc:
        raise ValueError(f"{path}: the field {exc.args[0]!r} is missing") from None


def _safetensors_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map", {})
        return sorted({directory / name for name in weight_map.values()})
    single = directory / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{directory} holds neither model.safetensors nor model.safetensors.index.json")
    return [single]


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one .safetensors file (copied out of the file)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if len(data) < 8:
            raise ValueError(f"{path} is too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", data[:8])
        if header_len > len(data) - 8:
            raise ValueError(f"{path}: the header length {header_len} runs past the file; is it a safetensors file?")
        header = json.loads(bytes(data[8 : 8 + header_len]))
        base = 8 + header_len
        tensors = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            dtype = _SAFETENSORS_DTYPES.get(entry["dtype"])
            if dtype is None:
                raise ValueError(f"{path}: tensor {name} is {entry['dtype']}; verify reads F32, F16 and BF16")
            begin, end = entry["data_offsets"]
            raw = bytearray(data[base + begin : base + end])
            tensors[name] = torch.frombuffer(raw, dtype=dtype).reshape(entry["shape"]) if raw else torch.zeros(
                entry["shape"], dtype=dtype)
    return tensors


def load_llama_weights(directory: Path, dtype: str = "fp32", device: str | torch.device = "cpu") -> ModelWeights:
    """The checkpoint's weights in verify's layout (the same [out, in] linear layout as HF: no transposes),
    cast to `dtype` on `device`."""
    directory = Path(directory)
    config = read_llama_config(directory)
    state: dict[str, torch.Tensor] = {}
    for path in _safetensors_files(directory):
        state.update(read_safetensors(path))
    take, read_layers = checkpoint_reader(config, state, directory, "config.json", dtype, device)
    hidden = config.hidden_size
    embedding = take("model.embed_tokens.weight", (config.vocab_size, hidden))
    layers = read_layers(lambda i, field: f"model.layers.{i}.{HF_LAYER_NAMES[field]}")
    final_norm = take("model.norm.weight", (hidden,))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # some tied checkpoints store the shared tensor twice
        lm_head = embedding
    else:
        lm_head = take("lm_head.weight", (config.vocab_size, hidden))
    unused = sorted(n for n in state if not n.endswith(_UNUSED_TENSOR_SUFFIXES))
    if unused:
        raise ValueError(f"{directory}: the tensor {unused[0]} (and {len(unused) - 1} more) is not part of the "
                         "Llama model verify computes")
    return ModelWeights(config=config, seed=None, dtype=dtype, embedding=embedding, layers=layers,
                        final_norm=final_norm, lm_head=lm_head)
