"""What vLLM subtracts from a GPU at start-up before its KV cache, version by version, per pipeline stage.

vLLM's worker (`gpu_worker.py`, `determine_available_memory`) measures, on each GPU:

    requested     = total memory the engine sees × gpu_memory_utilization
    available KV  = requested − (weights + activation peak + non-torch memory [+ CUDA graphs])

"weights" is what loading the checkpoint allocated; "activation peak" the torch allocator's peak above the
weights during `profile_run` (one forward pass over `max_num_batched_tokens` tokens split into
min(max_num_seqs, tokens) dummy requests, then the sampler over one row of logits per request); "non-torch"
what the CUDA context, cuBLAS and the communicators grew to outside torch's allocator. vLLM 0.19 logs the
CUDA graphs' estimate but does not subtract it; from 0.21 on it does (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1
by default: "CUDA graph memory profiling is enabled (default since v0.21.0)", as vLLM 0.27.1 logs it).

Each term here, and where it comes from (0.19.0's logs on H100 80GB in the llm-d planner's accuracy study,
Apache-2.0, read by tests/core/model/test_vllm_startup.py):

* weights: parameters (the preset's count or core/model/weights.py's estimate) × the checkpoint's bytes; a
  quantized checkpoint stores its linear layers at its precision (int4 with a 16-bit scale and a 4-bit zero
  point per 128 weights; mxfp4 only the routed experts, at 4.25 bits) and keeps the embeddings and the LM head
  in 16 bits; a multimodal one adds its vision tower (weights.vision_tower_params); every GPU also holds the
  rotary cos/sin cache (max positions × rotated width × dtype; MLA rotates only qk_rope_head_dim). Llama-3.1-8B:
  14.99 GiB bf16, 8.49 fp8 and int8, 5.37 int4 (logged 14.99, 8.49, 8.49, 5.38). The vocabulary is padded to a
  multiple of 64 (VocabParallelEmbedding). vLLM measures the torch allocator's allocated bytes, which charges a
  tensor 1 MiB or less short of a multiple of 2 MiB the whole multiple (core/model/weight_tensors.py): Qwen2.5-7B
  +57 MiB at tp 1 (14.25 GiB, as logged), Qwen2.5-72B +80 MiB at tp 2 (67.80). Tensor parallelism divides all
  but the rotary cache; pipeline parallelism gives
  each stage its layers (vLLM's `get_pp_indices`: ⌊L / pp⌋ each, the remainder one by one to the stages
  before the last), the embeddings (and a vision tower) to the first and the LM head to the last
  (Llama-3.1-8B at pp 4: 4.26, 3.28, 3.28, 4.26 GiB, as logged).
* activation peak (per stage): the larger of the forward pass and, on the last stage, the sampler, plus the
  fused-MoE workspace, which stays allocated:
  - forward: 5 intermediate-wide buffers per token in the model dtype over tp (gate and up, their product and
    the compiled graph's temporaries): 8,192 × 5 × 14,336 × 2 B = 1.09 GiB for Llama-3.1-8B, logged 1.10
    (its first pipeline stage, which samples nothing) and 2.21 at fp32 (1.09 × 2);
  - sampler: the 1,024 dummy requests' logits, not divided by tp (each GPU gathers the whole vocabulary):
    14.4 B per request per vocabulary entry (the 16-bit logits, then about 3.1 fp32 copies: the float logits,
    the probabilities and the exponential noise of the random sample), plus the forward pass's hidden states
    (tokens × hidden × dtype), which are still held, plus 64 MiB; a later pipeline stage also holds the
    hidden states and residual it received (2 × tokens × hidden × dtype). Fitted once on the logs' sampler-
    bound runs: Llama-3.1-8B 1.89 GiB (predicted 1.89), Gemma-2-2B 3.62 (3.61), Qwen2.5-7B 2.21 (2.21),
    gpt-oss-20b 2.87 (2.87), phi-2 0.79 (0.80);
  - fused-MoE workspace (16-bit experts): tokens × experts per token × (max(2N / tp, hidden) + N / tp) × 2 B,
    N the expert width (DeepSeek-V2-Lite 1.93 GiB logged, 1.89 predicted; Qwen1.5-MoE 2.47, 2.44); mxfp4 /
    int4 experts run kernels without it (gpt-oss-20b's peak is its sampler's).
* non-torch memory: 0.25 GiB on one GPU, 0.07 GiB per stage of a pipeline on one GPU per stage, 2.07 GiB at
  tp 2 and 2.15 GiB at tp 4 or more (custom all-reduce and NCCL buffers); the logs: 0.24–0.26 (two Granite
  runs 0.46), 0.07, 2.06–2.10, 2.13–2.21.
* CUDA graphs (0.21 and later only): 0.84 GiB, the median "Estimated CUDA graph memory" of the 0.19 logs
  (0.49–1.82 GiB); no log of a later version was available to check it.

The KV cache gets the same number of blocks on every GPU: the least available memory over the stages counts.
Every term is an estimate; `kv_memory_bytes` (vLLM's own line) skips them all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from math import ceil

from ..blocks import ceil_div
from ..dtypes import dtype_bits
from ..errors import ParameterError
from .layers import FfnGroup, check_tp
from .model_spec import ModelSpec
from .weight_tensors import layer_rounding, table_rounding
from .weights import param_count

GIB = 2**30
MIB = 2**20
VOCAB_PADDING = 64  # vLLM's VocabParallelEmbedding pads the vocabulary to a multiple of 64
INT4_GROUP = 128  # weights per group of an int4 checkpoint (GPTQ / AWQ / compressed-tensors w4a16)
INT4_GROUP_BITS = 20  # per group: a 16-bit scale and a 4-bit zero point (GPTQ and AWQ store both)
FORWARD_BUFFERS = 5  # intermediate-wide buffers per token at the forward pass's peak (see the docstring)
SAMPLER_FP32_BYTES = Fraction(62, 5)  # 12.4 B per request per vocabulary entry, plus the logits in model dtype
SAMPLER_FIXED_BYTES = 64 * MIB
NON_TORCH_ONE_GPU = 256 * MIB  # 0.25 GiB
NON_TORCH_PIPELINE = 72 * MIB  # 0.07 GiB
NON_TORCH_TP2 = 2120 * MIB  # 2.07 GiB
NON_TORCH_TP4 = 2202 * MIB  # 2.15 GiB
CUDA_GRAPH_ESTIMATE = 860 * MIB  # 0.84 GiB
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class VllmVersion:
    name: str
    default_gpu_memory_utilization: float
    subtracts_cuda_graphs: bool
    about: str


VLLM_VERSIONS: dict[str, VllmVersion] = {
    "0.19": VllmVersion("0.19", 0.9, False, "vLLM 0.19: utilization 0.9 by default; CUDA graphs estimated, not "
                                            "subtracted (checked against 0.19.0's start-up logs)"),
    "0.21": VllmVersion("0.21", 0.92, True, "vLLM 0.21 and later: utilization 0.92 by default (docs.vllm.ai); "
                                            "the CUDA graphs' estimate subtracted"),
}
DEFAULT_VLLM_VERSION = "0.21"


def get_version(name: str) -> VllmVersion:
    key = name.strip().lstrip("v")
    key = {"0.19.0": "0.19", "0.21.0": "0.21", "current": "0.21"}.get(key, key)
    if key not in VLLM_VERSIONS:
        raise ParameterError(f"vllm_version {name!r} is not modelled: choose one of {', '.join(VLLM_VERSIONS)} "
                             "(0.21 stands for 0.21 and later)", "vllm_version")
    return VLLM_VERSIONS[key]


# `vllm serve`'s default max_num_seqs (arg_utils.py): on a GPU of at least LARGE_GPU_BYTES other than an A100, else
MAX_NUM_SEQS_LARGE_GPU, MAX_NUM_SEQS_OTHER_GPU, LARGE_GPU_BYTES = 1024, 256, 70 * GIB


def default_max_num_seqs(gpu_memory_bytes: int, gpu_name: str = "") -> int:
    """`vllm serve`'s default: 1,024 on a GPU of at least 70 GiB other than an A100, else 256 (arg_utils.py)."""
    large = gpu_memory_bytes >= LARGE_GPU_BYTES and "a100" not in gpu_name.lower()
    return MAX_NUM_SEQS_LARGE_GPU if large else MAX_NUM_SEQS_OTHER_GPU


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's GPU (every GPU of a stage holds the same): the terms vLLM subtracts, in bytes."""

    layers: int
    weights: int
    activation: int
    non_torch: int
    cuda_graphs: int  # subtracted only by versions that do (0 otherwise, see MemoryPrediction.cuda_graphs)
    available: int


@dataclass(frozen=True)
class MemoryPrediction:
    version: VllmVersion
    requested: int
    stages: tuple[StageMemory, ...]
    cuda_graphs: int  # the estimate (logged by 0.19, subtracted from 0.21)

    @property
    def available(self) -> int:
        """What every GPU's KV cache gets: the least over the stages."""
        return min(s.available for s in self.stages)


def pp_layers(layers: int, pp: int) -> tuple[int, ...]:
    """Layers per pipeline stage as vLLM's get_pp_indices splits them."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return tuple(parts)


def check_parallel(spec: ModelSpec, tp: int, pp: int) -> None:
    """vLLM's rules: attention heads divisible by tp, at least one layer per pipeline stage."""
    check_tp(tp)
    heads = spec.num_attention_heads
    if heads and heads % tp:
        raise ParameterError(f"tp {tp}: vLLM needs {spec.name}'s {heads} attention heads divisible by the tensor-"
                             f"parallel size; use a divisor of {heads}", "tp")
    if pp < 1 or pp > spec.model_layers:
        raise ParameterError(f"pp {pp}: {spec.name} has {spec.model_layers} layers to split into pipeline stages; "
                             f"give 1..{spec.model_layers}", "pp")


def activation_dtype_bytes(spec: ModelSpec) -> int:
    """The model dtype's bytes: fp32 checkpoints run in fp32, everything else (quantized included) in 16 bits."""
    return 4 if spec.weight_dtype in ("fp32", "float32") else 2


def expert_params(spec: ModelSpec) -> int:
    """Parameters of the routed experts (what an mxfp4 checkpoint such as gpt-oss quantizes)."""
    return sum(f.count * f.experts * (3 if f.gated else 2) * spec.hidden_size * f.expert_intermediate
               for f in _ffn(spec) if f.experts)


def stage_weights(spec: ModelSpec, tp: int, pp: int, quantization: str | None = None,
                  vision_params: int = 0) -> tuple[int, ...]:
    """Weight bytes on one GPU of each pipeline stage (see the module docstring).

    `quantization` "mxfp4" stores only the routed experts in 4.25 bits (4-bit values, one e8m0 scale per 32)
    and the rest in 16 bits; otherwise the spec's weight_dtype applies to everything but the embeddings and
    the LM head. Each stage also holds the rotary cos/sin cache: max positions × head dim in the model dtype.
    A multimodal checkpoint's vision tower (`vision_params`, weights.vision_tower_params) sits on the first
    stage in the model dtype (quantized checkpoints leave it unquantized), split by tp.
    """
    params = param_count(spec).total
    vocab = spec.vocab_size or 0
    padded = ceil_div(vocab, VOCAB_PADDING) * VOCAB_PADDING
    tables = 1 if spec.tie_word_embeddings else 2
    body = max(params - tables * vocab * spec.hidden_size, 0)
    b = activation_dtype_bytes(spec)
    if quantization == "mxfp4":
        experts = min(expert_params(spec), body)
        bits, body_bits = 16, experts * 17 // 4 + (body - experts) * 16
    else:
        bits = dtype_bits(spec.weight_dtype or "bf16")
        body_bits = body * bits + (body * INT4_GROUP_BITS // INT4_GROUP if bits == 4 else 0)
    entry = b if bits < 16 else bits // 8
    table_bytes = padded * spec.hidden_size * entry
    rotary = (spec.max_position_embeddings or 0) * rotary_dim(spec) * b
    layers = pp_layers(spec.model_layers, pp)
    # what the caching allocator charges beyond the bytes (core/model/weight_tensors.py)
    # experts' shapes only from explicit FFN groups (a preset's intermediate_size may be the dense width)
    ffn = spec.ffn_groups or (_ffn(spec) if not spec.num_experts else ())
    if quantization == "mxfp4":
        ffn = tuple(replace(f, experts=0, experts_per_token=0, expert_intermediate=0) for f in ffn
                    if f.dense_intermediate)
    layer_extra = layer_rounding(spec, tp, 16 if quantization == "mxfp4" else bits, 8 * b, ffn)
    table_extra = table_rounding(padded, spec.hidden_size, tp, entry)
    out = []
    for stage, n in enumerate(layers):
        total = body_bits * n // (8 * spec.model_layers)
        extra = layer_extra * n // spec.model_layers
        if stage == 0:
            total += table_bytes + vision_params * b
            extra += table_extra
        if stage == pp - 1 and (pp > 1 or tables == 2):
            total += table_bytes
            extra += table_extra
        out.append(ceil_div(total, tp) + extra + rotary)
    return tuple(out)


def rotary_dim(spec: ModelSpec) -> int:
    """Width of one position's cos/sin row: MLA rotates only its rope part (qk_rope_head_dim), others the head."""
    return spec.qk_rope_head_dim if spec.kv_lora_rank and spec.qk_rope_head_dim else spec.head_dim


def _ffn(spec: ModelSpec) -> tuple[FfnGroup, ...]:
    if spec.ffn_groups:
        return spec.ffn_groups
    if spec.intermediate_size is None:
        return ()
    if spec.num_experts:
        assert spec.experts_per_token is not None
        return (FfnGroup(spec.model_layers, experts=spec.num_experts, experts_per_token=spec.experts_per_token,
                         expert_intermediate=spec.intermediate_size),)
    return (FfnGroup(spec.model_layers, dense_intermediate=spec.intermediate_size),)


def forward_peak(spec: ModelSpec, tokens: int, tp: int) -> int:
    """The profiling forward pass's peak: FORWARD_BUFFERS dense-MLP-wide buffers per token over tp."""
    dense = max((f.dense_intermediate for f in _ffn(spec)), default=0) or 4 * spec.hidden_size
    return tokens * FORWARD_BUFFERS * ceil_div(dense, tp) * activation_dtype_bytes(spec)


def moe_workspace(spec: ModelSpec, tokens: int, tp: int, quantization: str | None = None) -> int:
    """The fused-MoE kernel's workspace for 16-bit experts (0 for mxfp4/int4 experts; see the docstring)."""
    if quantization == "mxfp4" or dtype_bits(spec.weight_dtype or "bf16") <= 4:
        return 0
    moe = [f for f in _ffn(spec) if f.experts]
    if not moe:
        return 0
    width = ceil_div(max(f.expert_intermediate for f in moe), tp)
    per_token = max(f.experts_per_token for f in moe)
    return tokens * per_token * (max(2 * width, spec.hidden_size) + width) * activation_dtype_bytes(spec)


def sampler_peak(spec: ModelSpec, tokens: int, requests: int) -> int:
    """The sampler warm-up over `requests` rows of logits (whole vocabulary on every GPU) and what it holds."""
    b = activation_dtype_bytes(spec)
    per_entry = SAMPLER_FP32_BYTES + (b if b < 4 else 0)
    return ceil(per_entry * requests * (spec.vocab_size or 0)) + tokens * spec.hidden_size * b + SAMPLER_FIXED_BYTES


def non_torch_bytes(tp: int, pp: int) -> int:
    if tp == 1:
        return NON_TORCH_ONE_GPU if pp == 1 else NON_TORCH_PIPELINE
    return NON_TORCH_TP2 if tp == 2 else NON_TORCH_TP4


def predict_memory(
    spec: ModelSpec,
    *,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    tp: int = 1,
    pp: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = MAX_NUM_SEQS_LARGE_GPU,
    version: str = DEFAULT_VLLM_VERSION,
    quantization: str | None = None,
    vision_params: int = 0,
) -> MemoryPrediction:
    """The memory profile vLLM `version` measures on each pipeline stage, and the KV memory it leaves."""
    v = get_version(version)
    check_parallel(spec, tp, pp)
    for name, value in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs)):
        if value <= 0:
            raise ParameterError(f"{name} must be a positive integer, got {value}", name)
    if not 0 < gpu_memory_utilization <= 1:
        raise ParameterError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}",
                             "gpu_memory_utilization")
    requested = int(gpu_memory_bytes * gpu_memory_utilization)
    tokens = max_num_batched_tokens
    requests = min(max_num_seqs, tokens)
    graphs = CUDA_GRAPH_ESTIMATE
    forward = forward_peak(spec, tokens, tp)
    workspace = moe_workspace(spec, tokens, tp, quantization)
    sampler = sampler_peak(spec, tokens, requests)
    if pp > 1:
        sampler += 2 * tokens * spec.hidden_size * activation_dtype_bytes(spec)  # the received hidden + residual
    non_torch = non_torch_bytes(tp, pp)
    stages = []
    for stage, (layers, weights) in enumerate(zip(pp_layers(spec.model_layers, pp),
                                                         stage_weights(spec, tp, pp, quantization, vision_params),
                                                         strict=True)):
        activation = max(forward, sampler if stage == pp - 1 else 0) + workspace
        subtracted = graphs if v.subtracts_cuda_graphs else 0
        available = requested - weights - activation - non_torch - subtracted
        stages.append(StageMemory(layers, weights, activation, non_torch, subtracted, available))
    return MemoryPrediction(v, requested, tuple(stages), graphs)
