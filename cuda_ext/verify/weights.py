"""The verify model's weights, drawn from a seed, and their names in Hugging Face's Llama checkpoints.

Weights are drawn in float32 on the CPU from one `torch.Generator`, in a fixed order, so the same
(config, seed) gives the same weights on any machine; they are then cast to the dtype and moved to the
device. Scales keep every activation of order 1 (a linear layer's weights have std 1/sqrt(fan_in); the
embedding rows std 1/sqrt(hidden), so tied logits have std about 1). RMSNorm weights are 1 + N(0, 0.1^2)
rather than ones, so a norm weight loaded into the wrong place changes the logits and a test notices.

Linear weights are stored as torch.nn.Linear stores them, [out_features, in_features]: y = x @ w.T.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .config import ModelConfig, torch_dtype

NORM_WEIGHT_STD = 0.1


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: torch.Tensor  # [hidden]
    wq: torch.Tensor  # [num_q_heads * head_dim, hidden]
    wk: torch.Tensor  # [num_kv_heads * head_dim, hidden]
    wv: torch.Tensor  # [num_kv_heads * head_dim, hidden]
    wo: torch.Tensor  # [hidden, num_q_heads * head_dim]
    mlp_norm: torch.Tensor  # [hidden]
    w_gate: torch.Tensor  # [intermediate, hidden]
    w_up: torch.Tensor  # [intermediate, hidden]
    w_down: torch.Tensor  # [hidden, intermediate]


@dataclass(frozen=True)
class ModelWeights:
    config: ModelConfig
    seed: int | None  # None: loaded from a checkpoint
    dtype: str  # 'fp32' | 'bf16' | 'fp16'
    embedding: torch.Tensor  # [vocab, hidden]
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [vocab, hidden]; the embedding itself when tied

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    @property
    def torch_dtype(self) -> torch.dtype:
        return self.embedding.dtype


def init_weights(
    config: ModelConfig, seed: int = 0, dtype: str = "fp32", device: str | torch.device = "cpu"
) -> ModelWeights:
    """Deterministic weights for `config` from `seed`, cast to `dtype` on `device`."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    target = torch_dtype(dtype)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return normal(out_features, in_features, std=1.0 / math.sqrt(in_features))

    def norm() -> torch.Tensor:
        return 1.0 + normal(config.hidden_size, std=NORM_WEIGHT_STD)

    hidden, inter = config.hidden_size, config.intermediate_size
    embedding = normal(config.vocab_size, hidden, std=1.0 / math.sqrt(hidden))
    layers = []
    for _ in range(config.num_layers):
        layers.append({
            "attn_norm": norm(),
            "wq": linear(config.q_width, hidden),
            "wk": linear(config.kv_width, hidden),
            "wv": linear(config.kv_width, hidden),
            "wo": linear(hidden, config.q_width),
            "mlp_norm": norm(),
            "w_gate": linear(inter, hidden),
            "w_up": linear(inter, hidden),
            "w_down": linear(hidden, inter),
        })
    final_norm = norm()
    lm_head = None if config.tie_word_embeddings else linear(config.vocab_size, hidden)

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=target)

    embedding = cast(embedding)
    return ModelWeights(
        config=config,
        seed=seed,
        dtype=dtype,
        embedding=embedding,
        layers=tuple(LayerWeights(**{name: cast(t) for name, t in layer.items()}) for layer in layers),
        final_norm=cast(final_norm),
        lm_head=embedding if lm_head is None else cast(lm_head),
    )


def checkpoint_reader(
    config: ModelConfig, state: dict[str, torch.Tensor], where: object, implied_by: str, dtype: str,
    device: str | torch.device,
) -> tuple[Callable[[str, tuple[int, ...]], torch.Tensor],
           Callable[[Callable[[int, str], str]], tuple[LayerWeights, ...]]]:
    """`take(name, shape)`: a checkpoint tensor (removed from `state`), checked against the shape `implied_by`
    its metadata, cast to `dtype` on `device`; and `layers(name_of)`: every layer's LayerWeights, where
    `name_of(i, field)` is the checkpoint's name of LayerWeights `field` in layer i. One reader for every
    checkpoint format (safetensors, GGUF), which differ only in their tensor names."""
    target = torch_dtype(dtype)

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        tensor = state.pop(name, None)
        if tensor is None:
            raise ValueError(f"{where}: the tensor {name} is missing")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{where}: {name} is {list(tensor.shape)}, {implied_by} implies {list(shape)}")
        return tensor.to(device=device, dtype=target)

    hidden, inter = config.hidden_size, config.intermediate_size
    shapes = {"attn_norm": (hidden,), "wq": (config.q_width, hidden), "wk": (config.kv_width, hidden),
              "wv": (config.kv_width, hidden), "wo": (hidden, config.q_width), "mlp_norm": (hidden,),
              "w_gate": (inter, hidden), "w_up": (inter, hidden), "w_down": (hidden, inter)}

    def layers(name_of: Callable[[int, str], str]) -> tuple[LayerWeights, ...]:
        return tuple(LayerWeights(**{field: take(name_of(i, field), shape) for field, shape in shapes.items()})
                     for i in range(config.num_layers))

    return take, layers


HF_LAYER_NAMES = {
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}


def to_hf_llama_state_dict(weights: ModelWeights) -> dict[str, torch.Tensor]:
    """The weights under the names of Hugging Face's `LlamaForCausalLM` (same layouts, no transposes).
    With tied embeddings `lm_head.weight` is left out: the model ties it to `model.embed_tokens.weight`."""
    state = {"model.embed_tokens.weight": weights.embedding, "model.norm.weight": weights.final_norm}
    for i, layer in enumerate(weights.layers):
        for ours, theirs in HF_LAYER_NAMES.items():
            state[f"model.layers.{i}.{theirs}"] = getattr(layer, ours)
    if not weights.config.tie_word_embeddings:
        state["lm_head.weight"] = weights.lm_head
    return state
