"""The whole-GPU answer as vLLM prints it at start-up: KV memory, blocks, tokens, maximum concurrency.

    requested        = total memory × gpu_memory_utilization                                   (per GPU)
    kv_cache_bytes   = requested − weights / tp − activation peak − non-torch memory  (or given directly)
    num_blocks       = kv_cache_bytes // (page bytes × layers per KV-cache group)
    max_concurrency  = num_blocks / Σ_groups blocks one request of max_model_len needs
    kv_cache_tokens  = int(max_concurrency × max_model_len)                 (vLLM's current log line)

Weights, the activation peak and non-torch memory are core/model/vllm_memory.py's `predict_memory` (each term
and where it comes from is said there, per pipeline stage); the last two are estimates and labelled so;
`kv_memory_bytes` skips all three.

KV-cache groups are core/model/kv_groups.py's `kv_layout` (vLLM's hybrid allocator, or the ideal layout), and
the blocks a KV budget holds are its `plan_blocks`: the one memory plan that size, sim, share and frag share.
A group's blocks for one request (vLLM's worst case, for max concurrency) are `request_blocks`: full and MLA
cdiv(max_model_len, block); sliding cdiv(min(W − 1 + max_num_batched_tokens, max_model_len), block) + 1;
chunked cdiv(min(C + max_num_batched_tokens, max_model_len), block); recurrent 1 (2 with mamba_cache_mode
"align").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, NamedTuple

from ..dtypes import dtype_bits
from ..errors import ParameterError
from .kv_groups import KVLayout, kv_layout, plan_blocks, request_blocks
from .model_spec import ModelSpec
from .vllm_memory import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_VLLM_VERSION, default_max_num_seqs, get_version
from .vllm_pool_layout import attention_free_layout, stage_slots
from .weights import param_count

if TYPE_CHECKING:
    from .vllm_memory import MemoryPrediction

# vLLM's defaults are defined once, in vllm_memory.py: max_num_batched_tokens, the version and its
# gpu_memory_utilization, max_num_seqs by GPU; this one is max_num_seqs where no large GPU is named (256).
DEFAULT_MAX_NUM_SEQS = default_max_num_seqs(0)


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
    layout: KVLayout
    pp: int = 1
    vllm_version: str = ""
    cuda_graph_bytes: int | None = None  # the estimate; subtracted only by versions that do
    stages: tuple = ()  # vllm_memory.StageMemory per pipeline stage (empty when kv_cache_bytes was given)
    stage_layers: int = 0  # with pp > 1: the layers of the stage whose memory sets the blocks
    stage_slots: int = 0  # with pp > 1 and several groups: that stage's layer slots per block id (see stage_slots)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block id: a page in each of the `group_size` layer slots that groups share."""
        return self.page_bytes * self.group_size

    @property
    def num_blocks(self) -> int:
        if self.stage_slots:  # several groups split across stages: a block id is one page in each slot
            return self.kv_cache_bytes // (self.page_bytes * self.stage_slots)
        if self.stage_layers:  # one group split across stages: this stage pages stage_layers of its layers
            total = sum(g.layers for g in self.groups)
            return plan_blocks(self.layout, self.kv_cache_bytes * total // self.stage_layers)
        return plan_blocks(self.layout, self.kv_cache_bytes)

    @property
    def blocks_per_request(self) -> int:
        return sum(g.blocks_per_request for g in self.groups)

    @property
    def max_concurrency(self) -> Fraction:
        return Fraction(self.num_blocks, self.blocks_per_request)

    @property
    def kv_cache_tokens(self) -> int:
        """vLLM 0.19 prints num_blocks // groups × block size; later versions int(concurrency × max_model_len)."""
        if self.vllm_version == "0.19":
            return self.num_blocks // len(self.groups) * self.block_size
        return int(self.max_concurrency * self.max_model_len)

    @property
    def block_size(self) -> int:
        """Tokens per block of the attention groups (the smallest, as vLLM logs one block size); an attention-free
        model's block is vLLM's mamba block size, max_model_len (one block holds one sequence's state)."""
        return min((g.block_size for g in self.groups if g.block_size), default=self.layout.block_size)


def plan_gpu(
    spec: ModelSpec,
    *,
    kv_dtype_bits: int,
    block_size: int,
    max_model_len: int,
    tp: int = 1,
    gpu_name: str = "",
    gpu_memory_bytes: int | None = None,
    gpu_memory_utilization: float | None = None,
    kv_memory_bytes: int | None = None,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int | None = None,
    kv_layout_name: str = "vllm",
    mamba_cache_mode: str = "none",
    pp: int = 1,
    vllm_version: str = DEFAULT_VLLM_VERSION,
    quantization: str | None = None,
    vision_params: int = 0,
    spec_tokens: int = 0,
) -> GpuPlan:
    """vLLM's start-up figures for `spec` on one GPU of `tp` (memory from the GPU, or `kv_memory_bytes`).
    `gpu_memory_utilization` and `max_num_seqs` default as vLLM `vllm_version` does on that GPU. With
    speculative decoding (`spec_tokens` K drafts a step) a request holds K more pages in every state group."""
    if gpu_memory_utilization is None:
        gpu_memory_utilization = get_version(vllm_version).default_gpu_memory_utilization
    if max_num_seqs is None:
        max_num_seqs = default_max_num_seqs(gpu_memory_bytes or 0, gpu_name)
    _check_plan_inputs(block_size, max_model_len, tp, max_num_batched_tokens, max_num_seqs, gpu_memory_utilization)
    layout = attention_free_layout(spec, kv_dtype_bits, tp, max_model_len, block_size, mamba_cache_mode) or kv_layout(
        spec, kv_dtype_bits, block_size, kv_layout_name, tp, mamba_cache_mode)
    groups = _cache_groups(layout, max_model_len, max_num_batched_tokens, spec_tokens, _vllm_window(spec, layout))
    page, group_size = layout.page_bytes // layout.group_size, layout.group_size
    estimates: list[str] = []
    if kv_memory_bytes is not None:
        budget = _given_budget(spec, layout, groups, kv_dtype_bits, tp, pp, kv_memory_bytes,
                               int((gpu_memory_bytes or 0) * gpu_memory_utilization))
        estimates.append("kv_cache_bytes given")
    else:
        if gpu_memory_bytes is None:
            raise ParameterError("kv_memory_bytes or the GPU's memory (gpu_memory_bytes) is needed for a GPU plan",
                                 "kv_memory_bytes", "gpu_memory_bytes")
        from .vllm_memory import predict_memory

        memory = predict_memory(spec, gpu_memory_bytes=gpu_memory_bytes, gpu_memory_utilization=gpu_memory_utilization,
                                tp=tp, pp=pp, max_num_batched_tokens=max_num_batched_tokens,
                                max_num_seqs=max_num_seqs, version=vllm_version, quantization=quantization,
                                vision_params=vision_params)
        budget = _predicted_budget(spec, layout, groups, kv_dtype_bits, tp, pp, memory, gpu_name)
        estimates += _memory_estimates(spec, memory, quantization, vision_params)
    if len(groups) > 1:
        estimates.append("hybrid KV-cache groups: vLLM's hybrid allocator rules")
    b = budget
    return GpuPlan(gpu_name, gpu_memory_bytes or 0, tp, gpu_memory_utilization, max_model_len, b.requested,
                   b.weights, b.activation, b.non_torch, b.kv, page, group_size, groups, tuple(estimates), layout, pp,
                   vllm_version, b.cuda_graphs, b.stages, b.stage_layers, b.slot)


class _Budget(NamedTuple):
    """Where a plan's KV memory comes from: the memory requested, the limiting stage's weights, activation peak
    and non-torch memory (None when the KV memory is given), its KV bytes, the stages and CUDA graphs vLLM's
    start-up predicts, and with pp > 1 the limiting stage's layers and layer slots per block id."""

    requested: int
    weights: int | None
    activation: int | None
    non_torch: int | None
    kv: int
    stages: tuple = ()
    cuda_graphs: int | None = None
    stage_layers: int = 0
    slot: int = 0


def _check_plan_inputs(block_size: int, max_model_len: int, tp: int, max_num_batched_tokens: int, max_num_seqs: int,
                       gpu_memory_utilization: float) -> None:
    for name, value in (("block_size", block_size), ("max_model_len", max_model_len), ("tp", tp),
                        ("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs)):
        if value <= 0:
            raise ParameterError(f"{name} must be a positive integer, got {value}", name)
    if not 0 < gpu_memory_utilization <= 1:
        raise ParameterError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}",
                             "gpu_memory_utilization")


def _given_budget(spec: ModelSpec, layout: KVLayout, groups: tuple[CacheGroup, ...], kv_dtype_bits: int, tp: int,
                  pp: int, kv_memory_bytes: int, requested: int) -> _Budget:
    """The KV memory given (`kv_memory_bytes`): with pp > 1 it is one stage's GPU, and the stage with the most
    layers pages the most per block."""
    if kv_memory_bytes <= 0:
        raise ParameterError(f"kv_memory_bytes must be positive, got {kv_memory_bytes}", "kv_memory_bytes")
    stage_layers = slot = 0
    if pp > 1:
        from .vllm_memory import check_parallel, pp_layers

        check_parallel(spec, tp, pp)
        stage_layers = max(pp_layers(spec.model_layers, pp))
        slots = stage_slots(spec, layout, kv_dtype_bits, tp, pp) if len(groups) > 1 else ()
        slot = max(slots, default=0)
    return _Budget(requested, None, None, None, kv_memory_bytes, stage_layers=stage_layers, slot=slot)


def _predicted_budget(spec: ModelSpec, layout: KVLayout, groups: tuple[CacheGroup, ...], kv_dtype_bits: int,
                      tp: int, pp: int, memory: MemoryPrediction, gpu_name: str) -> _Budget:
    """The KV memory of vLLM's start-up (`memory`) on the stage with the fewest blocks: by its slots per block
    id, or its share of layers."""
    page = layout.page_bytes // layout.group_size
    slots = stage_slots(spec, layout, kv_dtype_bits, tp, pp) if pp > 1 and len(groups) > 1 else ()
    st = memory.stages
    limit = min(range(len(st)), key=lambda i: st[i].available // (page * max(slots[i], 1)) if slots else
                st[i].available * spec.model_layers // st[i].layers)
    limiting = st[limit]
    weights, activation, non_torch, kv = limiting.weights, limiting.activation, limiting.non_torch, limiting.available
    if kv <= 0:
        raise ParameterError(
            f"tp {tp}: {spec.name} on {gpu_name or 'the GPU'}: weights {weights / 2**30:.2f} GiB, activations "
            f"{activation / 2**30:.2f} GiB and non-torch {non_torch / 2**30:.2f} GiB leave no KV memory of "
            f"the {memory.requested / 2**30:.2f} GiB requested; use more tp, a larger GPU or a higher "
            "gpu_memory_utilization", "tp", "gpu_memory_utilization"
        )
    return _Budget(memory.requested, weights, activation, non_torch, kv, memory.stages, memory.cuda_graphs,
                   limiting.layers if pp > 1 else 0, slots[limit] if slots else 0)


def _memory_estimates(spec: ModelSpec, memory: MemoryPrediction, quantization: str | None,
                      vision_params: int) -> list[str]:
    """What in vLLM's start-up figures is estimated rather than read."""
    estimates = []
    if param_count(spec).estimated:
        estimates.append("weights: parameters estimated from the dimensions")
    if vision_params:
        estimates.append(f"weights: vision tower (and any audio tower) of {vision_params / 1e6:,.0f}M parameters from "
                         "vision_config / audio_config")
    if spec.weight_dtype is None:
        estimates.append("weights: bf16 assumed (the model names no dtype)")
    elif quantization or dtype_bits(spec.weight_dtype) < 16:
        estimates.append(f"weights: {quantization or spec.weight_dtype} linear layers, 16-bit embeddings and head")
    return estimates + ["activation peak", "non-torch memory"] + (
        ["CUDA graphs"] if memory.version.subtracts_cuda_graphs else [])


def cache_groups(
    spec: ModelSpec, kv_dtype_bits: int, block_size: int, max_model_len: int, tp: int, max_num_batched_tokens: int,
    layout: str = "vllm", mamba_cache_mode: str = "none",
) -> tuple[int, int, tuple[CacheGroup, ...]]:
    """(bytes of one layer slot's page, layer slots per block id, vLLM's groups: one per block table)."""
    kv = kv_layout(spec, kv_dtype_bits, block_size, layout, tp, mamba_cache_mode)
    return kv.page_bytes // kv.group_size, kv.group_size, _cache_groups(kv, max_model_len, max_num_batched_tokens, 0,
                                                                         _vllm_window(spec, kv))


def _vllm_window(spec: ModelSpec, layout: KVLayout) -> int | None:
    """The sliding window vLLM registers on every attention layer of `spec` though no token leaves it (the
    config's model-level `sliding_window` W ≥ the model's positions: Phi-4-mini, Phi-3.5-MoE; layers.LayerGroup's
    `vllm_window`), else None. vLLM's Attention takes cache_config.sliding_window (the config's) when a model
    passes no per-layer window, and get_kv_cache_spec makes a SlidingWindowSpec of it."""
    windows = {g.vllm_window for g in spec.layer_groups if g.keeps_kv}
    return windows.pop() if layout.layout == "vllm" and len(windows) == 1 else None


def request_cache_groups(kv: KVLayout, max_model_len: int, max_num_batched_tokens: int,
                         spec: ModelSpec | None = None) -> tuple[CacheGroup, ...]:
    """vLLM's groups of `kv` with the blocks one request of max_model_len holds in each (`kvcalc sim` checks its
    pool against them, as start_refusals does a GpuPlan's); with `spec`, a window vLLM registers on full-attention
    layers counts as plan_gpu counts it (`_vllm_window`: Phi-4-mini's one block more)."""
    return _cache_groups(kv, max_model_len, max_num_batched_tokens, 0, None if spec is None else _vllm_window(spec, kv))


def _cache_groups(kv: KVLayout, max_model_len: int, max_num_batched_tokens: int,
                  spec_tokens: int = 0, vllm_window: int | None = None) -> tuple[CacheGroup, ...]:
    """A layer type spans `tables` block tables, each of `group_size` layer slots (the last one padded). With
    `spec_tokens` K a state group's request holds K more pages (vLLM's MambaSpec.num_speculative_blocks = K, one
    state per draft position; none in mamba_cache_mode all, whose pages already cover every block). With
    `vllm_window` W (`_vllm_window`) the full group's worst case is a sliding window's, as vLLM counts it:
    cdiv(min(W − 1 + max_num_batched_tokens, max_model_len), B) + 1, one block more than full attention's."""
    groups = []
    for g in kv.groups:
        kind = g.source if g.kind == "state" or g.source == "mla" else g.kind
        extra = spec_tokens if g.kind == "state" and kv.mamba_cache_mode != "all" else 0
        worst = replace(g, kind="sliding", window=vllm_window) if vllm_window and g.kind == "full" else g
        # per block table; under the ideal layout (one table) a block costs pages_per_block units of the plan
        blocks = (request_blocks(worst, max_model_len, max_num_batched_tokens, kv.mamba_cache_mode) + extra) * (
            g.pages_per_block // g.tables)
        slots = g.padded_layers // g.tables
        for table in range(g.tables):
            layers = min(slots, g.layers - table * slots)
            groups.append(CacheGroup(kind, layers, 0 if g.kind == "state" else g.block_tokens, blocks))
    return tuple(groups)
