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

KV-cache groups are core/model/kv_groups.py's `kv_layout` (vLLM's hybrid allocator, or the ideal layout), and
the blocks a KV budget holds are its `plan_blocks`: the one memory plan that size, sim, share and frag share.
A group's blocks for one request (vLLM's worst case, for max concurrency) are `request_blocks`: full and MLA
cdiv(max_model_len, block); sliding cdiv(min(W − 1 + max_num_batched_tokens, max_model_len), block) + 1;
chunked cdiv(min(C + max_num_batched_tokens, max_model_len), block); recurrent 1 (2 with mamba_cache_mode
"align").
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..dtypes import dtype_bits
from ..errors import ParameterError
from .kv_groups import KVCacheGroup, KVLayout, kv_layout, layer_types, plan_blocks, request_blocks
from .layers import bits_to_bytes
from .model_spec import ModelSpec
from .weights import param_count

ACTIVATION_BYTES = 2  # bf16/fp16 activations
LOGIT_BYTES = 4  # fp32 logits for sampling
NON_TORCH_BYTES = 512 * 2**20  # CUDA context and communication buffers outside torch's allocator: an estimate
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
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    kv_memory_bytes: int | None = None,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    kv_layout_name: str = "vllm",
    mamba_cache_mode: str = "none",
    pp: int = 1,
    vllm_version: str = "0.21",
    quantization: str | None = None,
    vision_params: int = 0,
) -> GpuPlan:
    """vLLM's start-up figures for `spec` on one GPU of `tp` (memory from the GPU, or `kv_memory_bytes`)."""
    for name, value in (("block_size", block_size), ("max_model_len", max_model_len), ("tp", tp),
                        ("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs)):
        if value <= 0:
            raise ParameterError(f"{name} must be a positive integer, got {value}", name)
    if not 0 < gpu_memory_utilization <= 1:
        raise ParameterError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}",
                             "gpu_memory_utilization")
    layout = attention_free_layout(spec, kv_dtype_bits, tp, max_model_len, block_size, mamba_cache_mode) or kv_layout(
        spec, kv_dtype_bits, block_size, kv_layout_name, tp, mamba_cache_mode)
    groups = _cache_groups(layout, max_model_len, max_num_batched_tokens)
    page, group_size = layout.page_bytes // layout.group_size, layout.group_size
    estimates: list[str] = []
    stages: tuple = ()
    cuda_graphs = None
    stage_layers = slot = 0
    slots: tuple[int, ...] = ()
    if kv_memory_bytes is not None:
        if kv_memory_bytes <= 0:
            raise ParameterError(f"kv_memory_bytes must be positive, got {kv_memory_bytes}", "kv_memory_bytes")
        weights = activation = non_torch = None
        requested = int((gpu_memory_bytes or 0) * gpu_memory_utilization)
        kv = kv_memory_bytes
        estimates.append("kv_cache_bytes given")
        if pp > 1:  # the given memory is one stage's GPU: the stage with the most layers pages the most per block
            from .vllm_memory import check_parallel, pp_layers

            check_parallel(spec, tp, pp)
            stage_layers = max(pp_layers(spec.model_layers, pp))
            slots = stage_slots(spec, layout, kv_dtype_bits, tp, pp) if len(groups) > 1 else ()
            slot = max(slots, default=0)
    else:
        if gpu_memory_bytes is None:
            raise ParameterError("kv_memory_bytes or the GPU's memory (gpu_memory_bytes) is needed for a GPU plan",
                                 "kv_memory_bytes", "gpu_memory_bytes")
        from .vllm_memory import predict_memory

        memory = predict_memory(spec, gpu_memory_bytes=gpu_memory_bytes, gpu_memory_utilization=gpu_memory_utilization,
                                tp=tp, pp=pp, max_num_batched_tokens=max_num_batched_tokens,
                                max_num_seqs=max_num_seqs, version=vllm_version, quantization=quantization,
                                vision_params=vision_params)
        requested = memory.requested
        slots = stage_slots(spec, layout, kv_dtype_bits, tp, pp) if pp > 1 and len(groups) > 1 else ()
        st = memory.stages  # the stage with the fewest blocks: by its slots per block id, or its share of layers
        limit = min(range(len(st)), key=lambda i: st[i].available // (page * max(slots[i], 1)) if slots else
                    st[i].available * spec.model_layers // st[i].layers)
        limiting = st[limit]
        slot = slots[limit] if slots else 0
        weights, activation, non_torch = limiting.weights, limiting.activation, limiting.non_torch
        if param_count(spec).estimated:
            estimates.append("weights: parameters estimated from the dimensions")
        if vision_params:
            estimates.append(f"weights: vision tower of {vision_params / 1e6:,.0f}M parameters from vision_config")
        if spec.weight_dtype is None:
            estimates.append("weights: bf16 assumed (the model names no dtype)")
        elif quantization or dtype_bits(spec.weight_dtype) < 16:
            estimates.append(f"weights: {quantization or spec.weight_dtype} linear layers, 16-bit embeddings and head")
        estimates += ["activation peak", "non-torch memory"] + (
            ["CUDA graphs"] if memory.version.subtracts_cuda_graphs else [])
        kv = limiting.available
        stages, cuda_graphs = memory.stages, memory.cuda_graphs
        if pp > 1:
            stage_layers = limiting.layers
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
                   activation, non_torch, kv, page, group_size, groups, tuple(estimates), layout, pp, vllm_version,
                   cuda_graphs, stages, stage_layers, slot)


def stage_slots(spec: ModelSpec, layout: KVLayout, kv_dtype_bits: int, tp: int, pp: int) -> tuple[int, ...]:
    """Layer slots per block id on each pipeline stage of a model with several KV cache groups, as vLLM 0.19+
    plans them (get_kv_cache_configs): the groups are made once for the whole model (each layer type's layers, in
    model order, cut into runs of G), each stage keeps its own layers of every group, and a stage's block id is
    one page in each of max(its layers in any one group) slots; the engine then takes the least blocks over the
    stages. Needs the layers' order (`spec.layer_order`, from a config.json)."""
    from .vllm_memory import pp_layers

    if layout.layout != "vllm":
        raise ParameterError(f"pp {pp}: pipeline stages are planned for vLLM's layout only; use layout vllm or pp 1",
                             "pp")
    order = spec.layer_order
    if len(order) != spec.model_layers or len(spec.layer_groups) <= max(order, default=-1):
        raise ParameterError(f"{{pp}} {pp}: {spec.name} has several KV-cache groups and kvcalc does not know which "
                             "layer is which (a preset, or layers of two kinds): give its config.json ({config}), or "
                             "use {pp} 1", "pp", "config")
    types = [(t.kind, t.window, t.source, t.bits) for t in layer_types(spec, kv_dtype_bits, tp)]
    keys: list[tuple[str, int | None, str, int] | None] = []
    for g in spec.layer_groups:
        if g.keeps_kv:
            keys.append(("full" if g.kind == "mla" else g.kind, g.window, g.kind, g.bits_per_token(kv_dtype_bits, tp)))
        else:
            keys.append(("state", None, g.state.kind, g.state.bits(tp)) if g.state is not None else None)
    seen = [0] * len(types)
    run_of: list[tuple[int, int] | None] = []  # each layer's (layer type, run of G layers); None: pages nothing
    for i in order:
        key = keys[i]
        if key is None:
            run_of.append(None)
            continue
        t = types.index(key)
        run_of.append((t, seen[t] // layout.group_size))
        seen[t] += 1
    out, start = [], 0
    for n in pp_layers(spec.model_layers, pp):
        runs = [r for r in run_of[start:start + n] if r is not None]
        out.append(max((runs.count(r) for r in set(runs)), default=0))
        start += n
    return tuple(out)


def attention_free_layout(spec: ModelSpec, kv_dtype_bits: int, tp: int, max_model_len: int, block_size: int,
                          mamba_cache_mode: str = "none") -> KVLayout | None:
    """vLLM's pool for a model without attention (Mamba, Mamba-2, FalconMamba), or None when a layer keeps KV.

    vLLM (MambaModelConfig) sets the Mamba block size to max_model_len, so one block holds a whole request; the
    layers' equal state specs make one KV cache group of all L layers, a block id is one state page per layer
    (page = one layer's state on this GPU, unpadded: no attention page to match) and a request takes one:
    blocks = KV memory // (L · page), max concurrency = blocks, "GPU KV cache size" = blocks · max_model_len.
    """
    types = layer_types(spec, kv_dtype_bits, tp)
    if any(t.kind != "state" for t in types):
        return None
    if not types:
        raise ParameterError(f"{spec.name}: no layer keeps a KV cache or a recurrent state", "model")
    if {t.source for t in types} & {"rwkv"}:
        raise ParameterError(f"{spec.name}: RWKV-4 is not among vLLM's models, so there is no vLLM start-up to "
                             "predict; drop {gpu}/{kv_memory_bytes} (its state per sequence is in the table)", "gpu",
                             "kv_memory_bytes")
    if len(types) > 1:
        raise ParameterError(f"{spec.name}: layers with different recurrent states and no attention: vLLM's grouping "
                             "of them is not modelled; drop {gpu}/{kv_memory_bytes}", "model", "gpu",
                             "kv_memory_bytes")
    if mamba_cache_mode != "none":
        raise ParameterError(f"mamba_cache_mode {mamba_cache_mode!r}: an attention-free model's prefix caching is "
                             "not modelled; use 'none'", "mamba_cache_mode")
    t = types[0]
    page = bits_to_bytes(t.bits)
    group = KVCacheGroup("state", None, t.count, t.count, max_model_len, page * t.count, 1, 1, page, page, t.source,
                         t.bits * t.count)
    reason = (f"attention-free: one {t.source} state page of {page:,} B per layer, {t.count} layers in one group; a "
              f"block is one sequence (vLLM's Mamba block size is max_model_len, {max_model_len:,} tokens)")
    return KVLayout("vllm", (group,), max_model_len, reason, page * t.count, t.count, block_size, "none")


def cache_groups(
    spec: ModelSpec, kv_dtype_bits: int, block_size: int, max_model_len: int, tp: int, max_num_batched_tokens: int,
    layout: str = "vllm", mamba_cache_mode: str = "none",
) -> tuple[int, int, tuple[CacheGroup, ...]]:
    """(bytes of one layer slot's page, layer slots per block id, vLLM's groups: one per block table)."""
    kv = kv_layout(spec, kv_dtype_bits, block_size, layout, tp, mamba_cache_mode)
    return kv.page_bytes // kv.group_size, kv.group_size, _cache_groups(kv, max_model_len, max_num_batched_tokens)


def _cache_groups(kv: KVLayout, max_model_len: int, max_num_batched_tokens: int) -> tuple[CacheGroup, ...]:
    """A layer type spans `tables` block tables, each of `group_size` layer slots (the last one padded)."""
    groups = []
    for g in kv.groups:
        kind = g.source if g.kind == "state" or g.source == "mla" else g.kind
        # per block table; under the ideal layout (one table) a block costs pages_per_block units of the plan
        blocks = request_blocks(g, max_model_len, max_num_batched_tokens, kv.mamba_cache_mode) * (
            g.pages_per_block // g.tables)
        slots = g.padded_layers // g.tables
        for table in range(g.tables):
            layers = min(slots, g.layers - table * slots)
            groups.append(CacheGroup(kind, layers, 0 if g.kind == "state" else g.block_tokens, blocks))
    return tuple(groups)
