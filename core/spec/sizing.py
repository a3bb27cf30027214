"""Equation 1 for a model, a precision, a context and a batch: per token, block, sequence, GPU; capacity.

    M_KV = 2 · L · n · h_KV · d_h · b        (MLA: L · n · (kv_lora_rank + rope dim) · b, no factor 2)

Everything is counted in bits (int4 is half a byte) with Python integers, so 10^12 tokens times 10^7
sequences is still exact. Sliding-window layers hold at most `window` tokens of a sequence.

Tensor parallelism (`tp` GPUs) splits the KV heads as engines do (vLLM, SGLang):

* tp <= h_KV: each GPU holds h_KV / tp heads; tp must divide h_KV;
* tp > h_KV: each GPU holds one head, each head replicated on tp / h_KV GPUs; tp must be a multiple of h_KV;
* MLA: the latent is not split by heads, so every GPU holds all of it.

Capacity for a KV budget (per GPU when tp > 1):

* `max_tokens`: token positions that fit when every layer holds every token (full-attention terms):
  budget // (bytes per token on one GPU). For sliding-window models this is the count with no window
  applied, i.e. a lower bound on what fits: a sliding layer stores at most `window` tokens per sequence,
  so how many tokens really fit depends on how they are split into sequences; `max_seqs` answers that.
* `max_seqs`: whole sequences of `tokens` tokens (windows applied) that fit.
* `num_blocks`: paged blocks of `block_size` tokens (full-attention terms, every layer) that fit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction

from ..blocks import DEFAULT_BLOCK_SIZE, ceil_div
from ..dtypes import DTYPE_BITS, parse_dtype
from ..units import format_bytes, plural
from .models import ModelSpec

PRESET_CONTEXTS: tuple[int, ...] = (4096, 32768, 131072)  # 4K, 32K, 128K: the no-argument table's columns


def bits_to_bytes(bits: int) -> int:
    """Whole bytes that hold `bits` (rounded up: only an odd count of int4 scalars leaves half a byte)."""
    return ceil_div(bits, 8)




def model_layers(spec: ModelSpec) -> int:
    """All layers of the model, KV-less ones included (`spec.layers` counts only the layers that keep KV)."""
    return spec.layers + spec.num_kv_free_layers


def kv_heads_per_gpu(spec: ModelSpec, tp: int) -> int:
    """KV heads that one of `tp` GPUs holds; MLA: 1 (the latent, replicated on every GPU)."""
    if tp <= 0:
        raise ValueError(f"--tp must be a positive number of GPUs, got {tp}")
    if spec.is_mla or tp == 1:
        return spec.kv_heads
    heads = spec.kv_heads
    if tp <= heads:
        if heads % tp:
            raise ValueError(
                f"--tp {tp} does not divide the {heads} KV heads of {spec.name}: use a --tp that divides "
                f"{heads} ({', '.join(str(d) for d in _divisors(heads))}) or a multiple of {heads}"
            )
        return heads // tp
    if tp % heads:
        raise ValueError(
            f"--tp {tp} is above the {heads} KV heads of {spec.name} but not a multiple of {heads}, so the heads "
            f"cannot be replicated evenly: use a multiple of {heads} ({heads * 2}, {heads * 4}, ...) "
            f"or a divisor of {heads}"
        )
    return 1  # each GPU holds one head; each head lives on tp // heads GPUs


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Capacity:
    """What fits in `memory_bytes` of KV (on each GPU when `per_gpu`); see the module docstring."""

    memory_bytes: int
    per_gpu: bool
    max_tokens: int
    max_seqs: int
    num_blocks: int
    block_size: int
    fits: bool  # the requested seqs x tokens fit in the budget


@dataclass(frozen=True)
class SizeResult:
    """Equation 1 for one query. `*_bits` are exact; the byte properties round up only half bytes (int4)."""

    spec: ModelSpec
    dtype: str
    bits_per_scalar: int
    tokens: int
    seqs: int
    tp: int
    block_size: int
    kv_heads_per_gpu: int
    capacity: Capacity | None = None

    @property
    def bits_per_token_per_layer(self) -> int:
        return self.spec.scalars_per_token_per_layer * self.bits_per_scalar

    @property
    def bits_per_token(self) -> int:
        """All layers, for a context within every window."""
        return self.spec.layers * self.bits_per_token_per_layer

    @property
    def bits_per_block(self) -> int:
        return self.bits_per_token * self.block_size

    @property
    def bits_per_seq(self) -> int:
        return self.spec.kv_bits(self.tokens, self.bits_per_scalar)

    @property
    def total_bits(self) -> int:
        return self.bits_per_seq * self.seqs

    @property
    def gpu_share(self) -> tuple[int, int]:
        """(numerator, denominator): the fraction of the KV one GPU holds (1/1 for MLA and tp = 1)."""
        if self.spec.is_mla:
            return 1, 1
        return self.kv_heads_per_gpu, self.spec.kv_heads

    @property
    def replicas_per_head(self) -> int:
        """GPUs that hold each KV head (1 unless tp > KV heads; MLA: tp, the latent is on every GPU)."""
        if self.spec.is_mla:
            return self.tp
        return self.tp * self.kv_heads_per_gpu // self.spec.kv_heads

    def _per_gpu(self, bits: int) -> int:
        num, den = self.gpu_share
        share, remainder = divmod(bits * num, den)
        assert remainder == 0, "a GPU's share of the KV heads is a whole number of heads"
        return share

    @property
    def per_gpu_bits_per_token(self) -> int:
        return self._per_gpu(self.bits_per_token)

    @property
    def per_gpu_bits_per_seq(self) -> int:
        return self._per_gpu(self.bits_per_seq)

    @property
    def per_gpu_bits(self) -> int:
        return self._per_gpu(self.total_bits)

    @property
    def bytes_per_token_per_layer(self) -> int:
        return bits_to_bytes(self.bits_per_token_per_layer)

    @property
    def bytes_per_token(self) -> int:
        return bits_to_bytes(self.bits_per_token)

    @property
    def bytes_per_block(self) -> int:
        return bits_to_bytes(self.bits_per_block)

    @property
    def bytes_per_seq(self) -> int:
        return bits_to_bytes(self.bits_per_seq)

    @property
    def total_bytes(self) -> int:
        return bits_to_bytes(self.total_bits)

    @property
    def per_gpu_bytes(self) -> int:
        return bits_to_bytes(self.per_gpu_bits)

    @property
    def per_gpu_bytes_per_token(self) -> int:
        return bits_to_bytes(self.per_gpu_bits_per_token)

    @property
    def exact_bytes(self) -> bool:
        """False when some `*_bytes` count is a half byte (odd int4 scalar count) and was rounded up."""
        return all(bits % 8 == 0 for bits in (
            self.bits_per_token_per_layer, self.bits_per_token, self.bits_per_block, self.bits_per_seq,
            self.total_bits, self.per_gpu_bits_per_token, self.per_gpu_bits,
        ))

    @property
    def formula(self) -> str:
        """Equation 1 with this query's numbers, e.g. '2 · 32 layers · 8192 tokens · 8 KV heads · 128 dim · 2 B'."""
        return kv_formula(self.spec, self.tokens, self.bits_per_scalar, self.seqs, self.total_bits)


def kv_formula(spec: ModelSpec, tokens: int, bits_per_scalar: int, seqs: int, total_bits: int) -> str:
    """Equation 1 with numbers substituted and its value in IEC units."""
    if spec.num_sliding_layers and spec.sliding_window is not None and tokens > spec.sliding_window:
        parts = []
        if spec.num_global_layers:
            parts.append(f"{plural(spec.num_global_layers, 'layer')} · {plural(tokens, 'token')}")
        parts.append(f"{plural(spec.num_sliding_layers, 'sliding layer')} · "
                     f"{plural(spec.sliding_window, 'window token')}")
        layer_tokens = "(" + " + ".join(parts) + ")"
    else:
        layer_tokens = f"{plural(spec.layers, 'layer')} · {plural(tokens, 'token')}"
    if spec.is_mla:
        per_layer = f"({spec.kv_lora_rank} + {spec.qk_rope_head_dim}) latent"
        terms = [layer_tokens, per_layer]
    else:
        terms = ["2", layer_tokens, plural(spec.kv_heads, "KV head"), f"{spec.head_dim} dim"]
    scalar_bytes = bits_per_scalar / 8
    terms.append(f"{scalar_bytes:g} B")
    if seqs != 1:
        terms.append(f"{seqs:,} seqs")
    return " · ".join(terms) + f" = {format_bytes(Fraction(total_bits, 8))}"  # exact, half bytes included


def compute_size(
    spec: ModelSpec,
    dtype: str = "bf16",
    tokens: int | None = None,
    seqs: int = 1,
    tp: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    memory_bytes: int | None = None,
) -> SizeResult:
    """Equation 1 for `seqs` sequences of `tokens` tokens (default: the model's max_position_embeddings)."""
    dtype = parse_dtype(dtype)
    if tokens is None:
        if spec.max_position_embeddings is None:
            raise ValueError(
                f"model {spec.name!r} has no max_position_embeddings to take the context length from: give --tokens N"
            )
        tokens = spec.max_position_embeddings
    for option, value in (("--tokens", tokens), ("--seqs", seqs), ("--block", block_size)):
        if value <= 0:
            raise ValueError(f"{option} must be a positive integer, got {value}")
    result = SizeResult(
        spec=spec, dtype=dtype, bits_per_scalar=DTYPE_BITS[dtype], tokens=tokens, seqs=seqs, tp=tp,
        block_size=block_size, kv_heads_per_gpu=kv_heads_per_gpu(spec, tp),
    )
    if memory_bytes is None:
        return result
    if memory_bytes <= 0:
        raise ValueError(f"--memory must be positive, got {memory_bytes}")
    memory_bits = memory_bytes * 8
    capacity = Capacity(
        memory_bytes=memory_bytes,
        per_gpu=tp > 1,
        max_tokens=memory_bits // result.per_gpu_bits_per_token,
        max_seqs=memory_bits // result.per_gpu_bits_per_seq,
        num_blocks=memory_bits // (result.per_gpu_bits_per_token * block_size),
        block_size=block_size,
        fits=result.per_gpu_bits <= memory_bits,
    )
    return dataclasses.replace(result, capacity=capacity)


@dataclass(frozen=True)
class PresetRow:
    """One line of the no-argument table: a model's KV per token and per sequence at common contexts."""

    spec: ModelSpec
    bytes_per_token: int
    bytes_per_seq: dict[int, int]  # context tokens -> bytes of one sequence (windows applied)


def preset_rows(
    specs: list[ModelSpec], dtype: str = "bf16", contexts: tuple[int, ...] = PRESET_CONTEXTS
) -> list[PresetRow]:
    bits = DTYPE_BITS[parse_dtype(dtype)]
    for tokens in contexts:
        if tokens <= 0:
            raise ValueError(f"--tokens must be a positive integer, got {tokens}")
    return [
        PresetRow(
            spec=spec,
            bytes_per_token=bits_to_bytes(spec.layers * spec.scalars_per_token_per_layer * bits),
            bytes_per_seq={n: bits_to_bytes(spec.kv_bits(n, bits)) for n in contexts},
        )
        for spec in specs
    ]
