"""The whole-GPU answer as vLLM prints it at start-up: KV memory, blocks, tokens, maximum concurrency.

    requested        = total memory × gpu_memory_utilization                                   (per GPU)
    kv_cache_bytes   = requested − weights / tp − activation peak − non-torch memory  (or given directly)
    num_blocks       = kv_cache_bytes // (page bytes × layers per KV-cache group)
    max_concurrency  = num_blocks / Σ_groups blocks one request of max_model_len needs
    kv_cache_tokens  = int(max_concurrency × max_model_len)                 (vLLM's current log line)

Weights are the parameter count (the preset's, or core/model/weights.py's estimate) × the checkpoint dtype's
bytes (bf16 when the config names none). The activation peak is what vLLM's profiling forward pass over
`max_num_batched_tokens` leaves: the MLP's gate and up outputs (2 · intermediate) and about four hidden-sized
buffers per token in bf16, over tp, plus fp32 logits of `max_num_seqs` sequences; non-torch memory (CUDA
context, NCCL buffers) a flat figure. Both are estimates and labelled so; `kv_memory_bytes` skips all three.

KV-cache groups follow vLLM's hybrid allocator. Layers with the same cache spec (kind, window, bytes per
token per GPU; a recurrent layer: its state bytes) are one type. A model of one type (or of attention
layers that all hold every token) has one group: a block holds `block_size` tokens of every layer. Mixed
types are cut into groups of G layers each, G the smallest type's layer count (the largest's when that is
under 1.25 × the smallest), the last group of a type padded; every group pages the same bytes: with
recurrent layers the attention block grows to the multiple of 16 tokens whose page holds a layer's state
(the state's page padded to it), and a smaller attention page grows its block until it matches the
largest. A group's blocks for one request: full and MLA cdiv(max_model_len, block); sliding
cdiv(min(W − 1 + max_num_batched_tokens, max_model_len), block) + 1; chunked
cdiv(min(C + max_num_batched_tokens, max_model_len), block); recurrent 1.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from ..blocks import ceil_div
from ..dtypes import dtype_bits
from ..errors import ParameterError
from .layers import bits_to_bytes
from .model_spec import ModelSpec
from .weights import param_count

ACTIVATION_BYTES = 2  # bf16/fp16 activations
LOGIT_BYTES = 4  # fp32 logits for sampling
NON_TORCH_BYTES = 512 * 2**20  # CUDA context and communication buffers outside torch's allocator: an estimate
ATTENTION_BLOCK_ALIGNMENT = 16  # tokens: attention kernels' block granularity when a block must grow
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 256


def activation_bytes_estimate(spec: ModelSpec, max_batched_tokens: int, max_seqs: int, tp: int) -> int:
    """Peak activation bytes of one profiling forward pass on one GPU (see the module docstring)."""
    intermediate = spec.intermediate_size or 4 * spec.hidden_size
    per_token = (2 * intermediate + 4 * spec.hidden_size) * ACTIVATION_BYTES
    return max_batched_tokens * per_token // tp + max_seqs * (spec.vocab_size or 0) * LOGIT_BYTES


@dataclass(frozen=True)
class CacheGroup:
    """One of vLLM's KV-cache groups: `layers` layers (the last group of a type may pad) of one type."""

    kind: str  # full, sliding, chunked, mla, or the recurrent state's kind
    layers: int
    block_size: int  # tokens per block (0 for a recurrent state: one block holds one sequence's state)
    blocks_per_request: int


@dataclass(frozen=True)
class GpuPlan:
    """Per GPU; see the module docstring. `estimates` name the figures that are estimates."""

    gpu: str
    memory_bytes: int
    tp: int
    gpu_memory_utilization: float
    max_model_len: int
    requested_bytes: int
    weights_bytes: int | None
    activation_bytes: int | None
    non_torch_bytes: int | None
    kv_cache_bytes: int
    page_bytes: int
    group_size: int
    groups: tuple[CacheGroup, ...]
    estimates: tuple[str, ...]

    @property
    def block_bytes(self) -> int:
        """Bytes of one block id: a page in each of the `group_size` layer slots that groups share."""
        return self.page_bytes * self.group_size

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_bytes // self.block_bytes

    @property
    def blocks_per_request(self) -> int:
        return sum(g.blocks_per_request for g in self.groups)

    @property
    def max_concurrency(self) -> Fraction:
        return Fraction(self.num_blocks, self.blocks_per_request)

    @property
    def kv_cache_tokens(self) -> int:
        return int(self.max_concurrency * self.max_model_len)

    @property
    def block_size(self) -> int:
        """Tokens per block of the attention groups (the smallest, as vLLM logs one block size)."""
        return min(g.block_size for g in self.groups if g.block_size)


def plan_gpu(
    spec: ModelSpec,
    *,
    kv_dtype_bits: int,
    block_size: int,
    max_model_len: int,
    tp: int = 1,
    gpu_name: str = "",
    gpu_memory_bytes: int | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    kv_memory_bytes: int | None = None,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
) -> GpuPlan:
    """vLLM's start-up figures for `spec` on one GPU of `tp` (memory from the GPU, or `kv_memory_bytes`)."""
    for name, value in (("block_size", block_size), ("max_model_len", max_model_len), ("tp", tp),
                        ("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs)):
        if value <= 0:
            raise ParameterError(f"{name} must be a positive integer, got {value}", name)
    if not 0 < gpu_memory_utilization <= 1:
        raise ParameterError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}",
                             "gpu_memory_utilization")
    page, group_size, groups = cache_groups(spec, kv_dtype_bits, block_size, max_model_len, tp,
                                            max_num_batched_tokens)
    estimates: list[str] = []
    if kv_memory_bytes is not None:
        if kv_memory_bytes <= 0:
            raise ParameterError(f"kv_memory_bytes must be positive, got {kv_memory_bytes}", "kv_memory_bytes")
        weights = activation = non_torch = None
        requested = int((gpu_memory_bytes or 0) * gpu_memory_utilization)
        kv = kv_memory_bytes
        estimates.append("kv_cache_bytes given")
    else:
        if gpu_memory_bytes is None:
            raise ParameterError("kv_memory_bytes or the GPU's memory (gpu_memory_bytes) is needed for a GPU plan",
                                 "kv_memory_bytes", "gpu_memory_bytes")
        requested = int(gpu_memory_bytes * gpu_memory_utilization)
        params = param_count(spec)
        weight_dtype = spec.weight_dtype or "bf16"
        weights = ceil_div(params.total * dtype_bits(weight_dtype), 8 * tp)
        if params.estimated:
            estimates.append("weights: parameters estimated from the dimensions")
        if spec.weight_dtype is None:
            estimates.append("weights: bf16 assumed (the model names no dtype)")
        elif dtype_bits(weight_dtype) < 16:
            estimates.append(f"weights: {weight_dtype} per parameter (a quantized checkpoint; scales aside)")
        activation = activation_bytes_estimate(spec, max_num_batched_tokens, max_num_seqs, tp)
        non_torch = NON_TORCH_BYTES
        estimates += ["activation peak", "non-torch memory"]
        kv = requested - weights - activation - non_torch
        if kv <= 0:
            raise ParameterError(
                f"tp {tp}: {spec.name} on {gpu_name or 'the GPU'}: weights {weights / 2**30:.2f} GiB, activations "
                f"{activation / 2**30:.2f} GiB and non-torch {non_torch / 2**30:.2f} GiB leave no KV memory of "
                f"the {requested / 2**30:.2f} GiB requested; use more tp, a larger GPU or a higher "
                "gpu_memory_utilization", "tp", "gpu_memory_utilization"
            )
    if len(groups) > 1:
        estimates.append("hybrid KV-cache groups: vLLM's hybrid allocator rules")
    return GpuPlan(gpu_name, gpu_memory_bytes or 0, tp, gpu_memory_utilization, max_model_len, requested, weights,
                   activation, non_torch, kv, page, group_size, groups, tuple(estimates))


def cache_groups(
    spec: ModelSpec, kv_dtype_bits: int, block_size: int, max_model_len: int, tp: int, max_num_batched_tokens: int
) -> tuple[int, int, tuple[CacheGroup, ...]]:
    """(page bytes, layers per group, the groups) by the rules in the module docstring."""
    types: Counter[tuple[str, int | None, int]] = Counter()
    for g in spec.layer_groups:
        if g.keeps_kv:
            types[(g.kind, g.window, g.bits_per_token(kv_dtype_bits, tp))] += g.count
        elif g.state is not None:
            types[(g.state.kind, None, g.state.bits(tp))] += g.count

    def blocks(kind: str, window: int | None, tokens_per_block: int) -> int:
        if kind in ("full", "mla"):
            return ceil_div(max_model_len, tokens_per_block)
        if kind == "sliding":
            assert window is not None
            return ceil_div(min(window - 1 + max_num_batched_tokens, max_model_len), tokens_per_block) + 1
        if kind == "chunked":
            assert window is not None
            return ceil_div(min(window + max_num_batched_tokens, max_model_len), tokens_per_block)
        return 1  # a recurrent state: one block per sequence

    attention = {key: n for key, n in types.items() if key[0] in ("full", "sliding", "chunked", "mla")}
    if len({(kind, window) for kind, window, _ in attention}) == 1 and len(attention) == len(types):
        # One block table: a block holds block_size tokens of every layer. Equal layers share one page size
        # (group_size of them); unequal ones (per-layer heads) page side by side, one page of their sum.
        (kind, window, bits), layers = next(iter(attention.items()))
        group = (CacheGroup(kind, sum(attention.values()), block_size, blocks(kind, window, block_size)),)
        if len(attention) == 1:
            return bits_to_bytes(bits * block_size), layers, group
        return bits_to_bytes(block_size * sum(b * n for (_, _, b), n in attention.items())), 1, group
    states = {key: n for key, n in types.items() if key not in attention}
    attention_block = block_size
    if states:
        one_layer = max(bits for _, _, bits in attention)
        state_page = max(bits for _, _, bits in states)
        aligned = ATTENTION_BLOCK_ALIGNMENT * ceil_div(state_page, ATTENTION_BLOCK_ALIGNMENT * one_layer)
        attention_block = max(block_size, aligned)
    page_bits = max([bits * attention_block for _, _, bits in attention] + [bits for _, _, bits in states])
    counts = list(types.values())
    group_size = max(counts) if max(counts) < 1.25 * min(counts) else min(counts)
    groups = []
    for (kind, window, bits), n in types.items():
        if (kind, window, bits) in states:
            tokens_per_block = 0
        else:
            if page_bits % bits:
                raise ValueError(f"{spec.name}: vLLM cannot page its {kind} layers ({bits // 8} B per token) with "
                                 f"the others ({page_bits // 8} B pages): no whole number of tokens per block")
            tokens_per_block = page_bits // bits
        for start in range(0, n, group_size):
            groups.append(CacheGroup(kind, min(group_size, n - start), tokens_per_block,
                                     blocks(kind, window, tokens_per_block or 1)))
    return bits_to_bytes(page_bits), group_size, tuple(groups)

