"""The verify model's dimensions: a frozen spec, torch-free so the CLI can report it without importing torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

DTYPE_NAMES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class ModelConfig:
    """A small decoder-only transformer of the Llama family (RMSNorm, RoPE, GQA, SwiGLU).

    NOTE: head_dim defaults to 64 because the CUDA decode kernel supports head dims 64, 128 and 256 only;
    64 keeps the model tiny (q is 4 x 64 = 256 wide, K/V 2 x 64) and lets the same default run through
    the kernel on a GPU. Query head h reads KV head h // group, group = num_q_heads // num_kv_heads (the
    Hugging Face `repeat_kv` order).
    """

    vocab_size: int = 256
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_q_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position: int = 4096  # the longest sequence RoPE and the contiguous cache are built for

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_q_heads",
                     "num_kv_heads", "head_dim", "max_position"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                f"num_q_heads {self.num_q_heads} is not a multiple of num_kv_heads {self.num_kv_heads}; "
                "GQA needs q heads = group x KV heads"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (RoPE rotates pairs of dimensions)")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ValueError(f"rope_theta {self.rope_theta} and rms_norm_eps {self.rms_norm_eps} must be positive")

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def q_width(self) -> int:
        return self.num_q_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_dtype_name(dtype: str) -> str:
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPE_NAMES)}")
    return dtype


def torch_dtype(dtype: str) -> Any:
    """'fp32' | 'bf16' | 'fp16' -> the torch dtype (imports torch)."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[check_dtype_name(dtype)]
