"""GPUs and the memory plan of one serving replica: weights, activation workspace, and the KV pool left over.

    pool bytes per GPU = memory · utilisation − weights / tp − workspace
    blocks             = pool bytes // (block_size · KV bytes per token per GPU)

Weights are `num_params × weight bytes` (the preset's parameter count, or one estimated from the config's
dimensions); `--weights-bytes` overrides. The activation workspace follows what vLLM's profiling run
measures: one forward pass over `max_batched_tokens` tokens, whose peak is dominated by the MLP's
gate+up output (2 · intermediate) plus a few hidden-sized buffers (residual, norm output, attention
output, QKV ≈ 4 · hidden), in the activation dtype (2 bytes), plus fp32 logits for `max_seqs` sequences
(sampling). It is an estimate; `--workspace-bytes` overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..blocks import ceil_div
from ..spec.models import ModelSpec
from ..spec.sizing import kv_heads_per_gpu


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: memory (bytes), HBM bandwidth (bytes/s), peak dense bf16 (FLOP/s)."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    peak_flops: float
    source: str = ""


# Memory is the capacity the driver reports (nvidia-smi MiB) for the datasheet's size; bandwidth and dense
# (no sparsity) BF16 Tensor Core FLOP/s are the SXM figures of NVIDIA's datasheets:
# - A100: "NVIDIA A100 Tensor Core GPU" datasheet (2021): 40GB HBM2 1,555 GB/s; 80GB HBM2e 2,039 GB/s;
#   BF16 Tensor Core 312 TFLOPS (624 with sparsity).
# - H100 SXM: "NVIDIA H100 Tensor Core GPU" datasheet (2023): 80GB HBM3, 3.35 TB/s; BF16 1,979 TFLOPS
#   with sparsity, i.e. 989.5 TFLOPS dense.
# - H200 SXM: "NVIDIA H200 Tensor Core GPU" datasheet (2024): 141GB HBM3e, 4.8 TB/s; BF16 1,979 TFLOPS with
#   sparsity (989.5 dense).
GPU_PRESETS: dict[str, GpuSpec] = {
    g.name.lower(): g
    for g in (
        GpuSpec("A100-40GB", 40_960 * 2**20, 1.555e12, 312e12, "NVIDIA A100 datasheet, SXM4 40GB"),
        GpuSpec("A100-80GB", 81_920 * 2**20, 2.039e12, 312e12, "NVIDIA A100 datasheet, SXM4 80GB"),
        GpuSpec("H100-SXM", 81_559 * 2**20, 3.35e12, 989.5e12, "NVIDIA H100 datasheet, SXM5 80GB"),
        GpuSpec("H200", 143_771 * 2**20, 4.8e12, 989.5e12, "NVIDIA H200 datasheet, SXM 141GB"),
    )
}
# The pool keeps ~60 bytes of numpy state per block (core/block_store.py); 2^24 blocks is ~1 GiB of host
# memory. A larger pool (a tiny model on a huge custom GPU, or --block 1) is refused, not allocated.
MAX_POOL_BLOCKS = 2**24
ACTIVATION_BYTES = 2  # bf16/fp16 activations
LOGIT_BYTES = 4  # fp32 logits for sampling


def get_gpu(name: str) -> GpuSpec:
    gpu = GPU_PRESETS.get(name.strip().lower())
    if gpu is None:
        names = ", ".join(g.name for g in GPU_PRESETS.values())
        raise ValueError(f"unknown GPU {name!r}: choose one of {names}, or give --gpu-memory --bandwidth --flops")
    return gpu


def custom_gpu(memory_bytes: int, bandwidth_bytes_per_s: float, peak_flops: float) -> GpuSpec:
    for what, value in (("--gpu-memory", memory_bytes), ("--bandwidth", bandwidth_bytes_per_s),
                        ("--flops", peak_flops)):
        if not value > 0:
            raise ValueError(f"{what} must be positive, got {value}")
    return GpuSpec("custom", int(memory_bytes), float(bandwidth_bytes_per_s), float(peak_flops), "given")


def estimate_num_params(spec: ModelSpec) -> int:
    """Parameters from the config's dimensions when no count is known.

    Per layer: Q and O projections (hidden × heads·head_dim each), K and V (hidden × kv_heads·head_dim each),
    a gated MLP (3 · hidden · intermediate; Llama-style; a non-gated MLP has 2); plus input and output
    embeddings (untied) of vocab × hidden. Norms and biases are ignored (< 0.1 %).
    """
    if spec.intermediate_size is None or spec.vocab_size is None:
        raise ValueError(
            f"model {spec.name!r} has no parameter count and no intermediate_size/vocab_size to estimate one; "
            "give --weights-bytes"
        )
    q_dim = spec.num_attention_heads * spec.head_dim
    kv_dim = spec.kv_heads * spec.head_dim
    attention = 2 * spec.hidden_size * q_dim + 2 * spec.hidden_size * kv_dim
    per_layer = attention + 3 * spec.hidden_size * spec.intermediate_size
    return spec.layers * per_layer + 2 * spec.vocab_size * spec.hidden_size


def active_params(spec: ModelSpec) -> int:
    """Parameters touched per token: num_active_params for MoE models, else all of them."""
    active = getattr(spec, "num_active_params", None)
    if active:
        return int(active)
    return int(spec.num_params) if spec.num_params else estimate_num_params(spec)


@dataclass(frozen=True)
class MemoryPlan:
    """Where one GPU's memory goes (all bytes per GPU) and the KV pool that is left."""

    gpu: GpuSpec
    tp: int
    memory_utilization: float
    weights_bytes: int  # per GPU
    workspace_bytes: int
    kv_bytes_per_token: int  # per GPU
    block_size: int

    @property
    def budget_bytes(self) -> int:
        return int(self.gpu.memory_bytes * self.memory_utilization)

    @property
    def pool_bytes(self) -> int:
        return self.budget_bytes - self.weights_bytes - self.workspace_bytes

    @property
    def num_blocks(self) -> int:
        return self.pool_bytes // (self.block_size * self.kv_bytes_per_token)

    @property
    def capacity_tokens(self) -> int:
        """Token slots of the pool; reservation policies get exactly as many slots as paging."""
        return self.num_blocks * self.block_size


def _count(n: int) -> str:
    """Thousands separators, or three significant digits for counts too long to read."""
    return f"{n:,}" if n < 10**15 else f"{float(n):.3g}"


def kv_bytes_per_token_per_gpu(spec: ModelSpec, kv_dtype_bits: int, tp: int) -> int:
    """KV bytes of one token on one GPU, by `kvcalc size`'s rule (core.sizing.kv_heads_per_gpu): tp divides
    the KV heads, or is a multiple of them (one head per GPU, replicated); anything else is a ValueError.
    MLA latents are replicated on every GPU."""
    heads_per_gpu = kv_heads_per_gpu(spec, tp)
    per_token_bits = spec.layers * spec.scalars_per_token_per_layer * kv_dtype_bits * heads_per_gpu // spec.kv_heads
    return ceil_div(per_token_bits, 8)


def plan_memory(
    spec: ModelSpec,
    gpu: GpuSpec,
    *,
    kv_dtype_bits: int,
    block_size: int,
    tp: int = 1,
    memory_utilization: float = 0.9,
    weight_bytes_per_param: float = 2.0,
    weights_bytes: int | None = None,
    workspace_bytes: int | None = None,
    max_batched_tokens: int = 8192,
    max_seqs: int = 256,
) -> MemoryPlan:
    """The memory plan; ValueError when the weights (or weights + workspace) do not fit, saying by how much."""
    if tp < 1:
        raise ValueError(f"--tp must be at least 1, got {tp}")
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"--memory-utilization must be in (0, 1], got {memory_utilization}")
    if block_size < 1:
        raise ValueError(f"--block must be at least 1, got {block_size}")
    if weights_bytes is None:
        params = int(spec.num_params) if spec.num_params else estimate_num_params(spec)
        weights_bytes = int(params * weight_bytes_per_param)
    elif weights_bytes <= 0:
        raise ValueError(f"--weights-bytes must be positive, got {weights_bytes}")
    if workspace_bytes is None:
        intermediate = spec.intermediate_size or 4 * spec.hidden_size
        per_token = (2 * intermediate + 4 * spec.hidden_size) * ACTIVATION_BYTES
        workspace_bytes = max_batched_tokens * per_token // tp + max_seqs * (spec.vocab_size or 0) * LOGIT_BYTES
    plan = MemoryPlan(
        gpu=gpu, tp=tp, memory_utilization=memory_utilization, weights_bytes=ceil_div(weights_bytes, tp),
        workspace_bytes=int(workspace_bytes), kv_bytes_per_token=kv_bytes_per_token_per_gpu(spec, kv_dtype_bits, tp),
        block_size=block_size,
    )
    gib = 2**30
    if plan.weights_bytes > plan.budget_bytes:
        raise ValueError(
            f"{spec.name} weights need {plan.weights_bytes / gib:.2f} GiB per GPU but {gpu.name} x{tp} at "
            f"utilisation {memory_utilization:g} gives {plan.budget_bytes / gib:.2f} GiB: "
            f"{(plan.weights_bytes - plan.budget_bytes) / gib:.2f} GiB short; use a larger GPU or more --tp"
        )
    if plan.num_blocks < 1:
        short = plan.block_size * plan.kv_bytes_per_token - plan.pool_bytes
        raise ValueError(
            f"{spec.name} on {gpu.name} x{tp}: weights ({plan.weights_bytes / gib:.2f} GiB) and workspace "
            f"({plan.workspace_bytes / gib:.2f} GiB) leave no room for one KV block ({short / gib:.2f} GiB short); "
            "use a larger GPU, more --tp or a smaller --max-batched-tokens"
        )
    if plan.num_blocks > MAX_POOL_BLOCKS:
        raise ValueError(
            f"{spec.name} on {gpu.name} x{tp}: the KV pool would hold {_count(plan.num_blocks)} blocks of "
            f"{block_size}, "
            f"above the simulator's limit of {MAX_POOL_BLOCKS:,}; use a larger --block or less --gpu-memory"
        )
    return plan
