"""Equation 1 for a model, a precision, a context and a batch: per token, block, sequence, GPU; capacity.

The sum over layers itself is core/model/layers.py (`kv_bits`, `state_bits`); this module applies it to a
query. Everything is counted in bits with Python integers, so int4 and 10^12 tokens × 10^7 sequences stay
exact; byte counts round up once (the rule in layers.py).

* `bytes_per_token`: the KV of one token in every layer that keeps KV (a sequence shorter than every window);
* `bytes_per_seq`: one sequence of `tokens` tokens, each layer capped at its window or chunk, plus
  `state_bytes_per_seq`, the constant state of recurrent layers (0 for a model without them);
* per GPU with `tp`: each layer split by its own KV heads (layers.py), recurrent state by its heads.

Capacity for a KV budget (per GPU when tp > 1):

* `max_tokens`: token positions that fit when every layer holds every token, after the recurrent state of
  one sequence (the fewest states any tokens need; 0 without recurrent layers): (budget − state) // (bytes
  per token on one GPU). With windows or chunks this ignores them, a lower bound on what fits: a windowed
  layer stores at most W tokens per sequence, so how many tokens fit depends on how they are split into
  sequences (`max_seqs`); with a state it is an upper bound on tokens split into more than one sequence;
* `max_seqs`: whole sequences of `tokens` tokens (windows applied, recurrent state included) that fit all the way
  there (a chunked layer counted at its peak, a whole chunk, which it held before its current chunk began);
* `num_blocks`: paged blocks of `block_size` tokens (every layer) that fit: equation 1, no padding;
* `layout`, `layout_blocks`: the same budget paged as vLLM pages it (core/model/kv_groups.py: groups padded
  to one size, Mamba hybrids' block raised to hold a state), the block ids `plan_blocks` gives — what
  `size --kv-memory` with this budget reports.

A pure recurrent model (Mamba, RWKV) keeps no KV: a sequence costs its state whatever its length, so
`max_seqs` is budget // state, `num_blocks` is the same count (one state page per sequence, as vLLM pages
a Mamba-only model) and `max_tokens` is what those sequences hold (max_seqs · tokens).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..blocks import DEFAULT_BLOCK_SIZE
from ..dtypes import DTYPE_BITS, parse_dtype
from ..errors import ParameterError
from .formula import kv_formula
from .kv_groups import KVLayout, kv_layout, plan_blocks
from .layers import LayerGroup, bits_to_bytes
from .model_spec import ModelSpec

__all__ = ["PRESET_CONTEXTS", "bits_to_bytes", "compute_size", "kv_heads_per_gpu", "preset_rows"]

PRESET_CONTEXTS: tuple[int, ...] = (4096, 32768, 131072)  # 4K, 32K, 128K: the no-argument table's columns


def model_layers(spec: ModelSpec) -> int:
    """All layers of the model, KV-less ones included (`spec.layers` counts only the layers that keep KV)."""
    return spec.model_layers


def _main_group(spec: ModelSpec) -> LayerGroup:
    """The KV group the uniform fields describe: the one with the most layers."""
    return max((g for g in spec.layer_groups if g.keeps_kv), key=lambda g: g.count)


def kv_heads_per_gpu(spec: ModelSpec, tp: int) -> int:
    """KV heads one of `tp` GPUs holds in the model's main layers (every KV layer is checked; MLA: 1; 0 for a
    pure recurrent model)."""
    if not spec.keeps_kv:
        return 0
    return spec.kv_heads_per_gpu(tp)[_main_group(spec)]


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
    layout: KVLayout | None = None  # vLLM's layout of the model's KV cache groups at `block_size`
    layout_blocks: int | None = None  # its block ids in the budget (plan_blocks)


@dataclass(frozen=True)
class GroupRow:
    """One line of the layer table: a layer group and what it costs (whole model, not per GPU)."""

    group: LayerGroup
    bits_per_token: int  # all `count` layers, one token each
    bits_per_seq: int  # all `count` layers, one sequence of the query's tokens (window applied)
    state_bits_per_seq: int  # all `count` layers


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
    def bits_per_token_per_layer(self) -> int | None:
        """One token in one layer, when every KV layer caches the same; None when they differ."""
        sizes = {g.bits_per_token(self.bits_per_scalar) for g in self.spec.layer_groups if g.keeps_kv}
        return sizes.pop() if len(sizes) == 1 else None

    @property
    def bits_per_token(self) -> int:
        """All layers, for a context within every window."""
        return self.spec.kv_bits(1, self.bits_per_scalar)

    @property
    def bits_per_block(self) -> int:
        return self.bits_per_token * self.block_size

    @property
    def kv_bits_per_seq(self) -> int:
        return self.spec.kv_bits(self.tokens, self.bits_per_scalar)

    @property
    def state_bits_per_seq(self) -> int:
        return self.spec.state_bits()

    @property
    def bits_per_seq(self) -> int:
        """KV of one sequence (windows applied) plus its recurrent state."""
        return self.kv_bits_per_seq + self.state_bits_per_seq

    @property
    def total_bits(self) -> int:
        return self.bits_per_seq * self.seqs

    @property
    def replicas_per_head(self) -> int:
        """GPUs that hold each KV head of the main layers (1 unless tp > KV heads; MLA: tp, on every GPU)."""
        if not self.spec.keeps_kv:
            return 1
        main = _main_group(self.spec)
        if main.kind == "mla":
            return self.tp
        return self.tp * self.kv_heads_per_gpu // main.kv_heads

    @property
    def per_gpu_bits_per_token(self) -> int:
        return self.spec.kv_bits(1, self.bits_per_scalar, self.tp)

    @property
    def per_gpu_kv_bits_per_seq(self) -> int:
        return self.spec.kv_bits(self.tokens, self.bits_per_scalar, self.tp)

    @property
    def per_gpu_bits_per_seq(self) -> int:
        return self.per_gpu_kv_bits_per_seq + self.spec.state_bits(self.tp)

    @property
    def per_gpu_bits(self) -> int:
        return self.per_gpu_bits_per_seq * self.seqs

    @property
    def per_gpu_peak_bits_per_seq(self) -> int:
        """The most one sequence holds on its way to `tokens` tokens (one GPU, its state included). A chunked
        layer frees its chunk when the next one starts, so at n tokens it holds n − C·floor((n − 1)/C) but it held
        a whole chunk of C at the last multiple of C: between those points every kind of layer only grows, so the
        peak is at `tokens` or at a chunk's last end (Llama-4-Scout at 8,193 tokens holds 1 token a chunked layer,
        and held 8,192 one token before)."""
        ends = {self.tokens} | {g.window * (self.tokens // g.window) for g in self.spec.layer_groups
                                if g.kind == "chunked" and g.window and self.tokens >= g.window}
        return (max(self.spec.kv_bits(n, self.bits_per_scalar, self.tp) for n in ends)
                + self.spec.state_bits(self.tp))

    @property
    def groups(self) -> list[GroupRow]:
        return [
            GroupRow(g, g.count * g.bits_per_token(self.bits_per_scalar) if g.keeps_kv else 0,
                     g.count * g.tokens_held(self.tokens) * g.bits_per_token(self.bits_per_scalar)
                     if g.keeps_kv else 0, g.count * g.state_bits())
            for g in self.spec.layer_groups
        ]

    @property
    def bytes_per_token_per_layer(self) -> int | None:
        bits = self.bits_per_token_per_layer
        return None if bits is None else bits_to_bytes(bits)

    @property
    def bytes_per_token(self) -> int:
        return bits_to_bytes(self.bits_per_token)

    @property
    def bytes_per_block(self) -> int:
        return bits_to_bytes(self.bits_per_block)

    @property
    def kv_bytes_per_seq(self) -> int:
        return bits_to_bytes(self.kv_bits_per_seq)

    @property
    def state_bytes_per_seq(self) -> int:
        return bits_to_bytes(self.state_bits_per_seq)

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
            self.bits_per_token_per_layer or 0, self.bits_per_token, self.bits_per_block, self.bits_per_seq,
            self.total_bits, self.per_gpu_bits_per_token, self.per_gpu_bits,
        ))

    @property
    def formula(self) -> str:
        """Equation 1 with this query's numbers, e.g. '2 · 32 layers · 8192 tokens · 8 KV heads · 128 dim · 2 B'."""
        return kv_formula(self.spec, self.tokens, self.bits_per_scalar, self.seqs, self.total_bits)


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
            raise ParameterError(
                f"model {spec.name!r} has no max_position_embeddings to take the context length from: give tokens N",
                "tokens",
            )
        tokens = spec.max_position_embeddings
    for option, value in (("tokens", tokens), ("seqs", seqs), ("block_size", block_size)):
        if value <= 0:
            raise ParameterError(f"{option} must be a positive integer, got {value}", option)
    result = SizeResult(
        spec=spec, dtype=dtype, bits_per_scalar=DTYPE_BITS[dtype], tokens=tokens, seqs=seqs, tp=tp,
        block_size=block_size, kv_heads_per_gpu=kv_heads_per_gpu(spec, tp),
    )
    spec.state_bits(tp)  # a tp that the recurrent state cannot be split by is refused here, naming it
    if memory_bytes is None:
        return result
    if memory_bytes <= 0:
        raise ParameterError(f"memory_bytes must be positive, got {memory_bytes}", "memory_bytes")
    memory_bits = memory_bytes * 8
    peak_bits = result.per_gpu_peak_bits_per_seq  # what a sequence held on its way there (chunks), not only at the end
    max_seqs = memory_bits // peak_bits
    if not spec.keeps_kv:  # pure recurrent: one state page per sequence, whatever its length
        capacity = Capacity(memory_bytes=memory_bytes, per_gpu=tp > 1, max_tokens=max_seqs * tokens,
                            max_seqs=max_seqs, num_blocks=max_seqs, block_size=block_size,
                            fits=result.per_gpu_bits <= memory_bits)
        return dataclasses.replace(result, capacity=capacity)
    try:
        layout: KVLayout | None = kv_layout(spec, result.bits_per_scalar, block_size, "vllm", tp)
    except ParameterError:  # pages vLLM cannot unify: equation 1's capacity stands alone
        layout = None
    capacity = Capacity(
        memory_bytes=memory_bytes,
        per_gpu=tp > 1,
        max_tokens=max(memory_bits - spec.state_bits(tp), 0) // result.per_gpu_bits_per_token,
        max_seqs=max_seqs,
        num_blocks=memory_bits // (result.per_gpu_bits_per_token * block_size),
        block_size=block_size,
        fits=peak_bits * seqs <= memory_bits,
        layout=layout,
        layout_blocks=None if layout is None else plan_blocks(layout, memory_bytes),
    )
    return dataclasses.replace(result, capacity=capacity)


@dataclass(frozen=True)
class PresetRow:
    """One line of the no-argument table: a model's KV per token and per sequence at common contexts."""

    spec: ModelSpec
    bytes_per_token: int
    bytes_per_seq: dict[int, int]  # context tokens -> bytes of one sequence (windows applied, state included)
    state_bytes_per_seq: int = 0


def preset_rows(
    specs: list[ModelSpec], dtype: str = "bf16", contexts: tuple[int, ...] = PRESET_CONTEXTS
) -> list[PresetRow]:
    bits = DTYPE_BITS[parse_dtype(dtype)]
    for tokens in contexts:
        if tokens <= 0:
            raise ParameterError(f"tokens must be a positive integer, got {tokens}", "tokens")
    if hasattr(bits, "layout"):  # a page format vLLM uses for some kinds of layer only (fp8_ds_mla, nvfp4 ...)
        specs = [spec for spec in specs if _pages(spec, bits)]
        if not specs:
            raise ParameterError(f"dtype {dtype!r}: vLLM pages none of these models' layers in it", "dtype")
    return [
        PresetRow(
            spec=spec,
            bytes_per_token=spec.bytes_per_token(bits),
            bytes_per_seq={n: bits_to_bytes(spec.kv_bits(n, bits) + spec.state_bits()) for n in contexts},
            state_bytes_per_seq=bits_to_bytes(spec.state_bits()),
        )
        for spec in specs
    ]


def _pages(spec: ModelSpec, bits: int) -> bool:
    """Whether every KV layer of `spec` can be paged in the format `bits` names (core/dtypes.py)."""
    try:
        spec.kv_bits(1, bits)
    except ParameterError:
        return False
    return True
