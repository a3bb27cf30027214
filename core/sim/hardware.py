"""GPUs and the memory plan of one serving replica: weights, activation workspace, and the KV pool left over.

    pool bytes per GPU = memory · utilisation − weights / tp − workspace − recurrent state
    blocks             = pool bytes // (block_size · KV bytes per token per GPU)

Weights are what `kvcalc size --gpu` loads (core/model/vllm_memory.py `stage_weights`): the parameter count
(the preset's, or one estimated from the config's dimensions) in the checkpoint's stored precision (fp8 for
DeepSeek-V3, mxfp4 experts for gpt-oss, bf16 when the model names none; `checkpoint_weights`), embeddings and
head in 16 bits; `--weight-dtype` overrides the precision, `--weights-bytes` the whole figure. The activation
workspace follows what vLLM's profiling run
measures: one forward pass over `max_batched_tokens` tokens, whose peak is dominated by the MLP's
gate+up output (2 · intermediate) plus a few hidden-sized buffers (residual, norm output, attention
output, QKV ≈ 4 · hidden), in the activation dtype (2 bytes), plus fp32 logits for `max_seqs` sequences
(sampling) (core/model/gpu_plan.py). It is an estimate; `--workspace-bytes` overrides it. A hybrid model's
recurrent layers keep a constant state per sequence (Mamba, linear attention): `max_seqs` of them are
reserved before the pool, as an engine must hold them for every running sequence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from ..blocks import ceil_div
from ..dtypes import parse_dtype
from ..errors import ParameterError
from ..gpus import GPU_PRESETS, GpuSpec, custom_gpu, get_gpu
from ..model.gpu_plan import activation_bytes_estimate
from ..model.kv_groups import KVLayout, plan_blocks
from ..model.layers import bits_to_bytes
from ..model.models import ModelSpec
from ..model.vllm_memory import stage_weights
from ..model.weights import checkpoint_quantization, estimate_params

__all__ = ["GPU_PRESETS", "GpuSpec", "MemoryPlan", "custom_gpu", "get_gpu", "plan_memory"]


# The pool keeps ~60 bytes of numpy state per block (core/block_store.py); 2^24 blocks is ~1 GiB of host
# memory. A larger pool (a tiny model on a huge custom GPU, or blocks of 1 token) is refused, not allocated.
MAX_POOL_BLOCKS = 2**24


def estimate_num_params(spec: ModelSpec) -> int:
    """Parameters from the model's dimensions when no count is known (core/model/weights.py: dense, MoE with
    routed and shared experts, Mamba and linear-attention mixers)."""
    return estimate_params(spec).total


def active_params(spec: ModelSpec) -> int:
    """Parameters touched per token: num_active_params for MoE models, else all of them."""
    active = getattr(spec, "num_active_params", None)
    if active:
        return int(active)
    return int(spec.num_params) if spec.num_params else estimate_params(spec).active


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
    state_bytes: int = 0  # per GPU: the recurrent state of max_seqs sequences (0 without recurrent layers)
    # a hybrid model's KV cache groups (core/model/kv_groups.py): the pool is counted in its pages, and the
    # state comes from the pool per running sequence (state_bytes 0); None: one group of full attention
    layout: KVLayout | None = None

    @property
    def budget_bytes(self) -> int:
        return int(self.gpu.memory_bytes * self.memory_utilization)

    @property
    def pool_bytes(self) -> int:
        return self.budget_bytes - self.weights_bytes - self.workspace_bytes - self.state_bytes

    @property
    def num_blocks(self) -> int:
        if self.layout is not None:
            return plan_blocks(self.layout, max(self.pool_bytes, 0))
        return self.pool_bytes // (self.block_size * self.kv_bytes_per_token)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of the pool (a hybrid layout: one page in every layer slot of a group)."""
        return self.layout.page_bytes if self.layout is not None else self.block_size * self.kv_bytes_per_token

    @property
    def capacity_tokens(self) -> int:
        """Token slots of the pool; reservation policies get exactly as many slots as paging."""
        return self.num_blocks * self.block_size


def checkpoint_weights(spec: ModelSpec, model: str | None, config: Path | str | None,
                       weight_dtype: str | None = None) -> tuple[ModelSpec, str | None]:
    """(`spec` with the weight precision its checkpoint stores, the quantization `stage_weights` takes), as
    `kvcalc size --gpu` loads it: `weight_dtype` when given (the option overrides the checkpoint); else the
    config.json's quantization_config (--config, or a cached org/name), or a preset's checkpoint
    (presets.PRESET_CHECKPOINT_QUANTIZATION, e.g. gpt-oss's mxfp4 experts); else the spec's own weight_dtype
    (DeepSeek-V3's fp8), bf16 when it names none."""
    if weight_dtype is not None:
        return replace(spec, weight_dtype=parse_dtype(weight_dtype, "weight_dtype")), None
    stored: str | None = None
    path: Path | None = None
    if config is not None:
        path = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
    elif model is not None and "/" in model:
        from ..model.hub import cached_config

        path = Path(cached_config(model)[0])
    if path is not None:
        stored = checkpoint_quantization(json.loads(path.read_text(encoding="utf-8")))
    else:
        from ..model.presets import PRESET_CHECKPOINT_QUANTIZATION

        stored = PRESET_CHECKPOINT_QUANTIZATION.get(spec.name)
    if stored == "mxfp4":
        return spec, "mxfp4"
    return (replace(spec, weight_dtype=stored) if stored is not None else spec), None


def _count(n: int) -> str:
    """Thousands separators, or three significant digits for counts too long to read."""
    return f"{n:,}" if n < 10**15 else f"{float(n):.3g}"


def kv_bytes_per_token_per_gpu(spec: ModelSpec, kv_dtype_bits: int, tp: int) -> int:
    """KV bytes of one token on one GPU: equation 1 over the model's layers, each split by its own KV heads
    (core/model/layers.py: tp divides them, or is a multiple of them, replicated); MLA latents on every GPU."""
    return bits_to_bytes(spec.kv_bits(1, kv_dtype_bits, tp))


def plan_memory(
    spec: ModelSpec,
    gpu: GpuSpec,
    *,
    kv_dtype_bits: int,
    block_size: int,
    tp: int = 1,
    memory_utilization: float = 0.9,
    quantization: str | None = None,
    weights_bytes: int | None = None,
    workspace_bytes: int | None = None,
    max_batched_tokens: int = 8192,
    max_seqs: int = 256,
    layout: KVLayout | None = None,
) -> MemoryPlan:
    """The memory plan; ValueError when the weights (or weights + workspace) do not fit, saying by how much.
    `layout`: a hybrid model's KV cache groups; the pool then holds the state too (none reserved up front),
    and its block size is the layout's. Weights: `stage_weights` of `spec` (its weight_dtype, or `quantization`
    "mxfp4"; see `checkpoint_weights`) per GPU, or `weights_bytes` per replica split over tp."""
    if tp < 1:
        raise ParameterError(f"tp {tp} must be at least 1", "tp")
    if not 0 < memory_utilization <= 1:
        raise ParameterError(f"memory_utilization {memory_utilization:g} must be in (0, 1]", "memory_utilization")
    if block_size < 1:
        raise ParameterError(f"block_size {block_size} must be at least 1", "block_size")
    if weights_bytes is None:
        weights_per_gpu = stage_weights(spec, tp, 1, quantization)[0]
    elif weights_bytes <= 0:
        raise ParameterError(f"weights_bytes {weights_bytes} must be positive", "weights_bytes")
    else:
        weights_per_gpu = ceil_div(weights_bytes, tp)
    if workspace_bytes is None:
        workspace_bytes = activation_bytes_estimate(spec, max_batched_tokens, max_seqs, tp)
    plan = MemoryPlan(
        gpu=gpu, tp=tp, memory_utilization=memory_utilization, weights_bytes=weights_per_gpu,
        workspace_bytes=int(workspace_bytes), kv_bytes_per_token=kv_bytes_per_token_per_gpu(spec, kv_dtype_bits, tp),
        block_size=block_size if layout is None else layout.block_size,
        state_bytes=0 if layout is not None else max_seqs * bits_to_bytes(spec.state_bits(tp)), layout=layout,
    )
    gib = 2**30
    if plan.weights_bytes > plan.budget_bytes:
        raise ParameterError(
            f"{spec.name} weights need {plan.weights_bytes / gib:.2f} GiB per GPU but {gpu.name} x{tp} at "
            f"utilisation {memory_utilization:g} gives {plan.budget_bytes / gib:.2f} GiB: "
            f"{(plan.weights_bytes - plan.budget_bytes) / gib:.2f} GiB short; use a larger GPU or more tp", "tp"
        )
    if plan.num_blocks < 1 and plan.pool_bytes > 0 and layout is not None and layout.block_size != block_size:
        raise ParameterError(
            f"{spec.name} on {gpu.name} x{tp} leaves {plan.pool_bytes / gib:.2f} GiB for the KV pool, less than one "
            f"block of its {layout.layout} layout ({plan.block_bytes / gib:.2f} GiB: {layout.reason}); use a larger "
            "GPU or more tp", "tp", "gpu_memory"
        )
    if plan.num_blocks < 1 and plan.pool_bytes > 0:
        # Room is left, just not for one block this large: the block size is at fault, not the weights.
        raise ParameterError(
            f"block_size {block_size}: one KV block needs {plan.block_bytes / gib:.2f} GiB per "
            f"GPU but {spec.name} on {gpu.name} x{tp} leaves {plan.pool_bytes / gib:.2f} GiB for the KV pool; use a "
            "smaller block_size (e.g. 16)", "block_size"
        )
    if plan.num_blocks < 1:
        short = plan.block_bytes - plan.pool_bytes
        raise ParameterError(
            f"{spec.name} on {gpu.name} x{tp}: weights ({plan.weights_bytes / gib:.2f} GiB) and workspace "
            f"({plan.workspace_bytes / gib:.2f} GiB) leave no room for one KV block ({short / gib:.2f} GiB short); "
            "use a larger GPU, more tp or a smaller max_batched_tokens", "tp", "max_batched_tokens"
        )
    if plan.num_blocks > MAX_POOL_BLOCKS:
        raise ParameterError(
            f"{spec.name} on {gpu.name} x{tp}: the KV pool would hold {_count(plan.num_blocks)} blocks of "
            f"{block_size}, above the simulator's limit of {MAX_POOL_BLOCKS:,}; use a larger block_size or less "
            "gpu_memory", "block_size", "gpu_memory"
        )
    return plan
