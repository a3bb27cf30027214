"""GPUs and the memory plan of one serving replica: the same plan as `kvcalc size --gpu`, and the KV pool left.

    requested          = memory · utilisation
    pool bytes per GPU = requested − weights / tp − activation peak − non-torch memory − CUDA graphs
                         − recurrent state (only a model sim pages without KV cache groups)
    blocks             = kv_groups.plan_blocks(layout, pool bytes)   (one group: pool // (block · KV bytes/token))

Every term but the state is core/model/vllm_memory.py's `predict_memory` for the vLLM version asked for
(0.21 by default: utilisation 0.92, CUDA graphs subtracted; 0.19: 0.9, not subtracted), with `max_seqs`
sequences (vLLM's default by GPU: 1,024 on a GPU of 70 GiB or more other than an A100, else 256) and
`max_batched_tokens` tokens in the profiling run: the weights as loaded (the checkpoint's stored precision, fp8
for DeepSeek-V3, mxfp4 experts for gpt-oss, bf16 when the model names none; `checkpoint_weights`; the rotary
cache; a vision tower), the larger of the forward pass and the sampler warm-up plus the fused-MoE workspace, the
non-torch memory of tp. The blocks are core/model/kv_groups.py's `plan_blocks`, as size's. So `kvcalc sim` and
`kvcalc size --gpu` give the same blocks for the same model, GPU, tp, utilisation, version, quantization, block
size, max_seqs and max_batched_tokens (tests/core/sim/test_sim_memory_plan.py). `--weights-bytes` replaces the
weights and `--workspace-bytes` the activation peak; the other terms stay. A hybrid model's recurrent state
comes from the pool per running sequence (its KV cache groups); a model paged as one group with a state (none
today) would reserve `max_seqs` of them before the pool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

from ..blocks import ceil_div
from ..dtypes import parse_dtype
from ..errors import ParameterError
from ..gpus import GPU_PRESETS, GpuSpec, custom_gpu, get_gpu
from ..model.gpu_plan import DEFAULT_MAX_NUM_SEQS
from ..model.kv_groups import KVLayout, plan_blocks
from ..model.layers import bits_to_bytes
from ..model.models import ModelSpec
from ..model.vllm_memory import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_VLLM_VERSION,
    default_max_num_seqs,
    get_version,
    predict_memory,
)
from ..model.weights import checkpoint_quantization, config_vision_params, estimate_params
from ..pool.groups import pool_ids

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
    """Where one GPU's memory goes (all bytes per GPU) and the KV pool that is left (module docstring)."""

    gpu: GpuSpec
    tp: int
    memory_utilization: float
    weights_bytes: int  # per GPU
    workspace_bytes: int  # the activation peak of vLLM's profiling run (fused-MoE workspace included)
    kv_bytes_per_token: int  # per GPU
    block_size: int
    state_bytes: int = 0  # per GPU: the recurrent state of max_seqs sequences (0 without recurrent layers)
    # a hybrid model's KV cache groups (core/model/kv_groups.py): the pool is counted in its pages, and the
    # state comes from the pool per running sequence (state_bytes 0); None: one group of full attention
    layout: KVLayout | None = None
    non_torch_bytes: int = 0  # CUDA context, cuBLAS, communicators (vllm_memory.non_torch_bytes)
    cuda_graph_bytes: int = 0  # subtracted by vLLM 0.21 and later (0 for 0.19, which only logs it)
    vllm_version: str = DEFAULT_VLLM_VERSION
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS  # the sampler warm-up's requests (and the scheduler's running limit)
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS

    @property
    def budget_bytes(self) -> int:
        return int(self.gpu.memory_bytes * self.memory_utilization)

    @property
    def pool_bytes(self) -> int:
        return (self.budget_bytes - self.weights_bytes - self.workspace_bytes - self.non_torch_bytes
                - self.cuda_graph_bytes - self.state_bytes)

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
        """Token slots of the pool; reservation policies get exactly as many slots as paging. A hybrid layout's
        block is one page of ONE group, so its slots are the tokens every attention group can hold at once:
        num_blocks // Σ_attention pages_per_block / block_tokens (Gemma-3-27B on an H100, 6 sliding + 1 full
        tables of 16 tokens: 14,435 · 16 // 7 = 32,994, not 14,435 · 16). Windows hold fewer tokens and states
        take pages besides, so it is the pool's size in tokens of every layer, not a concurrency."""
        if self.layout is None:
            return self.num_blocks * self.block_size
        per_token = sum((Fraction(g.pages_per_block, g.block_tokens) for g in self.layout.attention_groups),
                        Fraction(0))
        return int(self.num_blocks / per_token) if per_token else 0


def _config_path(model: str | None, config: Path | str | None) -> Path | None:
    """The config.json behind --config (a file or its folder) or a cached org/name; None for a preset."""
    if config is not None:
        return Path(config) / "config.json" if Path(config).is_dir() else Path(config)
    if model is not None and "/" in model:
        from ..model.hub import cached_config

        return Path(cached_config(model)[0])
    return None


QUANTIZATIONS = ("fp8", "mxfp4")  # vLLM --quantization values the weights model (as size --gpu --quantization)


def checkpoint_weights(spec: ModelSpec, model: str | None, config: Path | str | None, weight_dtype: str | None = None,
                       quantization: str | None = None) -> tuple[ModelSpec, str | None]:
    """(`spec` with the weight precision its checkpoint stores, the quantization `stage_weights` takes), as
    `kvcalc size --gpu` loads it: `weight_dtype` when given (the option overrides the checkpoint); else the
    config.json's quantization_config (--config, or a cached org/name), or a preset's checkpoint
    (presets.PRESET_CHECKPOINT_QUANTIZATION, e.g. gpt-oss's mxfp4 experts); else the spec's own weight_dtype
    (DeepSeek-V3's fp8), bf16 when it names none. `quantization` (vLLM's --quantization) fp8 stores the linear
    layers in fp8, mxfp4 the routed experts in mxfp4; it overrides the rest."""
    if quantization is not None:
        quantization = quantization.strip().lower()
        if quantization not in QUANTIZATIONS:
            raise ParameterError(f"quantization {quantization!r} is not modelled: give fp8 or mxfp4 (or weight_dtype "
                                 "for a checkpoint stored at one precision)", "quantization", "weight_dtype")
    if weight_dtype is not None:
        spec, stored = replace(spec, weight_dtype=parse_dtype(weight_dtype, "weight_dtype")), None
    else:
        path = _config_path(model, config)
        if path is not None:
            stored = checkpoint_quantization(json.loads(path.read_text(encoding="utf-8")))
        else:
            from ..model.presets import PRESET_CHECKPOINT_QUANTIZATION

            stored = PRESET_CHECKPOINT_QUANTIZATION.get(spec.name)
    stored = quantization or stored
    if stored == "mxfp4":
        return spec, "mxfp4"
    return (replace(spec, weight_dtype=stored) if stored is not None else spec), None


def checkpoint_vision_params(spec: ModelSpec, model: str | None, config: Path | str | None) -> int:
    """The vision tower's parameters of the config.json behind `config` / org/name (0 for a preset or a text
    model): the first GPU holds them, as `kvcalc size --gpu` counts them."""
    path = _config_path(model, config)
    if path is None:
        return 0
    return config_vision_params(json.loads(path.read_text(encoding="utf-8")), spec.hidden_size)


def _count(n: int) -> str:
    """Thousands separators, or three significant digits for counts too long to read."""
    return f"{n:,}" if n < 10**15 else f"{float(n):.3g}"


def kv_bytes_per_token_per_gpu(spec: ModelSpec, kv_dtype_bits: int, tp: int) -> int:
    """KV bytes of one token on one GPU: equation 1 over the model's layers, each split by its own KV heads
    (core/model/layers.py: tp divides them, or is a multiple of them, replicated); MLA latents on every GPU."""
    return bits_to_bytes(spec.kv_bits(1, kv_dtype_bits, tp))


def default_utilization(vllm_version: str = DEFAULT_VLLM_VERSION) -> float:
    """vLLM `vllm_version`'s default gpu_memory_utilization (0.92 from 0.21 on, 0.9 for 0.19)."""
    return get_version(vllm_version).default_gpu_memory_utilization


def default_max_seqs(gpu: GpuSpec) -> int:
    """`vllm serve`'s default max_num_seqs on `gpu` (vllm_memory.default_max_num_seqs)."""
    return default_max_num_seqs(gpu.memory_bytes, gpu.name)


def plan_memory(
    spec: ModelSpec,
    gpu: GpuSpec,
    *,
    kv_dtype_bits: int,
    block_size: int,
    tp: int = 1,
    memory_utilization: float | None = None,
    quantization: str | None = None,
    weights_bytes: int | None = None,
    workspace_bytes: int | None = None,
    max_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_seqs: int | None = None,
    layout: KVLayout | None = None,
    vllm_version: str = DEFAULT_VLLM_VERSION,
    vision_params: int = 0,
) -> MemoryPlan:
    """The memory plan (module docstring); ValueError when the weights (or weights + the rest) do not fit,
    saying by how much. `memory_utilization` None: the version's default; `max_seqs` None: vLLM's default on
    `gpu`. `layout`: a hybrid model's KV cache groups; the pool then holds the state too (none reserved up
    front), and its block size is the layout's. Weights: `stage_weights` of `spec` (its weight_dtype, or
    `quantization` "mxfp4"; see `checkpoint_weights`) per GPU, or `weights_bytes` per replica split over tp."""
    if tp < 1:
        raise ParameterError(f"tp {tp} must be at least 1", "tp")
    utilization = default_utilization(vllm_version) if memory_utilization is None else memory_utilization
    if not 0 < utilization <= 1:
        raise ParameterError(f"memory_utilization {utilization:g} must be in (0, 1]", "memory_utilization")
    if block_size < 1:
        raise ParameterError(f"block_size {block_size} must be at least 1", "block_size")
    if weights_bytes is not None and weights_bytes <= 0:
        raise ParameterError(f"weights_bytes {weights_bytes} must be positive", "weights_bytes")
    seqs = default_max_seqs(gpu) if max_seqs is None else max_seqs
    for name, value in (("max_batched_tokens", max_batched_tokens), ("max_seqs", seqs)):
        if value < 1:
            raise ParameterError(f"{name} {value} must be at least 1", name)
    try:
        stage = predict_memory(spec, gpu_memory_bytes=gpu.memory_bytes, gpu_memory_utilization=utilization, tp=tp,
                               max_num_batched_tokens=max_batched_tokens, max_num_seqs=seqs, version=vllm_version,
                               quantization=quantization, vision_params=vision_params).stages[0]
    except ParameterError as exc:  # name sim's parameters, not vLLM's
        names = {"max_num_batched_tokens": "max_batched_tokens", "max_num_seqs": "max_seqs",
                 "gpu_memory_utilization": "memory_utilization"}
        raise ParameterError(str(exc), *(names.get(p, p) for p in exc.params)) from None
    plan = MemoryPlan(
        gpu=gpu, tp=tp, memory_utilization=utilization,
        weights_bytes=stage.weights if weights_bytes is None else ceil_div(weights_bytes, tp),
        workspace_bytes=stage.activation if workspace_bytes is None else int(workspace_bytes),
        kv_bytes_per_token=kv_bytes_per_token_per_gpu(spec, kv_dtype_bits, tp),
        block_size=block_size if layout is None else layout.block_size,
        state_bytes=0 if layout is not None else seqs * bits_to_bytes(spec.state_bits(tp)), layout=layout,
        non_torch_bytes=stage.non_torch, cuda_graph_bytes=stage.cuda_graphs,
        vllm_version=get_version(vllm_version).name, max_num_seqs=seqs, max_num_batched_tokens=max_batched_tokens,
    )
    _check_fits(plan, spec, block_size)
    return plan


def _refuse_block(plan: MemoryPlan, spec: ModelSpec, block_size: int) -> None:
    """Room is left for the KV pool, just not for one block: name the largest block size that fits (the pool over
    one token's bytes; a page's bytes are linear in its tokens unless it holds a Mamba state), else what can."""
    gib = 2**30
    where = f"{spec.name} on {plan.gpu.name} x{plan.tp}"
    pool = f"{plan.pool_bytes / gib:.2f} GiB for the KV pool"
    linear = plan.layout is None or not plan.layout.state_groups
    largest = plan.pool_bytes * block_size // plan.block_bytes if linear else 0
    if largest >= 1:
        raise ParameterError(f"block_size {block_size}: one KV block needs {plan.block_bytes / gib:.2f} GiB per GPU "
                             f"but {where} leaves {pool}; use block_size {largest} or smaller", "block_size")
    if plan.layout is not None and not linear:  # a page is at least its largest state page, at any block size
        state = max(g.layer_used_bytes * plan.layout.group_size if plan.layout.layout == "vllm" else g.block_bytes
                    for g in plan.layout.state_groups)
        fix = (f"use a smaller block_size (the Mamba state alone takes {state / gib:.2f} GiB of a block)"
               if state < plan.pool_bytes else "use a larger GPU or more tp")
        raise ParameterError(f"block_size {block_size}: one block with its Mamba state needs "
                             f"{plan.block_bytes / gib:.2f} GiB per GPU but {where} leaves {pool}; {fix}",
                             "block_size", "tp")
    token = plan.block_bytes / block_size
    # Any tp leaves each GPU at least one KV head of every layer: a token's bytes over the most heads of a layer.
    heads = max((g.kv_heads for g in spec.layer_groups if g.keeps_kv), default=1)
    if token / max(heads, 1) > max(g.memory_bytes for g in GPU_PRESETS.values()):
        fix = ("no GPU kvcalc knows holds one token at any tp: check the model's dimensions (layers, KV heads, "
               "head size)")
    else:
        fix = "use a larger GPU or more tp"
    raise ParameterError(f"{where}: one token's KV needs {token / gib:.2f} GiB per GPU but only {pool} is left, so "
                         f"no block_size fits; {fix}", "tp", "block_size")


def _refuse_group_block(plan: MemoryPlan, spec: ModelSpec, block_size: int) -> None:
    """The pool holds a unit of the layout but not one block of its largest group (the ideal layout counts in the
    gcd of the groups' blocks; a block of g takes g.pages_per_block units): name the largest block size at which
    every group's block fits (an attention block's bytes are linear in its tokens, a state's are not), else more
    memory."""
    assert plan.layout is not None
    gib = 2**30
    big = max(plan.layout.groups, key=lambda g: g.pages_per_block)
    need = big.pages_per_block * plan.layout.page_bytes
    kind = big.kind if big.source in ("", big.kind) else f"{big.kind} ({big.source})"
    fits = [plan.pool_bytes * g.block_tokens // (g.pages_per_block * plan.layout.page_bytes)
            for g in plan.layout.attention_groups]
    states_fit = all(g.pages_per_block * plan.layout.page_bytes <= plan.pool_bytes for g in plan.layout.state_groups)
    largest = min(fits, default=0) if plan.layout.layout == "ideal" and states_fit else 0
    fix = (f"use {{block_size}} {largest} or smaller, or more memory per GPU" if largest >= 1 else
           "use more memory per GPU")
    raise ParameterError(
        f"{{block_size}} {block_size}: one block of {spec.name}'s {kind} layers needs "
        f"{need / gib:.2f} GiB per GPU but {spec.name} on {plan.gpu.name} x{plan.tp} leaves "
        f"{plan.pool_bytes / gib:.2f} GiB for the KV pool; {fix} (a larger {{gpu}} or {{gpu_memory}}, more {{tp}})",
        "block_size", "gpu", "gpu_memory", "tp")


def _check_fits(plan: MemoryPlan, spec: ModelSpec, block_size: int) -> None:
    """Refuse a plan without one KV block, naming what takes the memory and the fix."""
    gib = 2**30
    gpu, tp, layout = plan.gpu, plan.tp, plan.layout
    if plan.weights_bytes > plan.budget_bytes:
        raise ParameterError(
            f"{spec.name} weights need {plan.weights_bytes / gib:.2f} GiB per GPU but {gpu.name} x{tp} at "
            f"utilisation {plan.memory_utilization:g} gives {plan.budget_bytes / gib:.2f} GiB: "
            f"{(plan.weights_bytes - plan.budget_bytes) / gib:.2f} GiB short; use a larger GPU or more tp", "tp"
        )
    if plan.num_blocks < 1 and plan.pool_bytes > 0 and layout is not None and layout.block_size != block_size:
        raise ParameterError(
            f"{spec.name} on {gpu.name} x{tp} leaves {plan.pool_bytes / gib:.2f} GiB for the KV pool, less than one "
            f"block of its {layout.layout} layout ({plan.block_bytes / gib:.2f} GiB: {layout.reason}); use a larger "
            "GPU or more tp", "tp", "gpu_memory"
        )
    if plan.num_blocks < 1 and plan.pool_bytes > 0:
        _refuse_block(plan, spec, block_size)
    if plan.num_blocks < 1:
        short = plan.block_bytes - plan.pool_bytes
        raise ParameterError(
            f"{spec.name} on {gpu.name} x{tp}: weights ({plan.weights_bytes / gib:.2f} GiB), activation peak "
            f"({plan.workspace_bytes / gib:.2f} GiB), non-torch memory ({plan.non_torch_bytes / gib:.2f} GiB) and "
            f"CUDA graphs ({plan.cuda_graph_bytes / gib:.2f} GiB) leave no room for one KV block "
            f"({short / gib:.2f} GiB short); use a larger GPU, more tp or a smaller max_batched_tokens",
            "tp", "max_batched_tokens"
        )
    if layout is not None and plan.num_blocks < max(g.pages_per_block for g in layout.groups):
        _refuse_group_block(plan, spec, block_size)
    if (plan.num_blocks if plan.layout is None else pool_ids(plan.layout, plan.num_blocks)) > MAX_POOL_BLOCKS:
        raise ParameterError(
            f"{spec.name} on {gpu.name} x{tp}: the KV pool would hold {_count(plan.num_blocks)} blocks of "
            f"{block_size}, above the simulator's limit of {MAX_POOL_BLOCKS:,}; use a larger block_size or less "
            "gpu_memory", "block_size", "gpu_memory"
        )
