"""`kvcalc size`: equation 1 for a model (preset, config.json, hub cache or explicit dims); capacity; TP
split; with --gpu (or --kv-memory), the KV memory, blocks, tokens and concurrency vLLM prints at start-up."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..core.dtypes import DEFAULT_DTYPE
from ..core.model.models import ModelSpec
from ..core.model.sizing import SizeResult, compute_size
from ..core.model.vllm_memory import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    LARGE_GPU_BYTES,
    MAX_NUM_SEQS_LARGE_GPU,
    MAX_NUM_SEQS_OTHER_GPU,
    VLLM_VERSIONS,
)
from ..core.units import format_count_short
from .flags import with_flags
from .options import (
    BlockOpt,
    ConfigOpt,
    DtypeOpt,
    FormatOpt,
    HeadDimOpt,
    JsonOpt,
    KvHeadsOpt,
    LayersOpt,
    ModelOpt,
    SpecMethodOpt,
    SpecTokensOpt,
    float_option,
    int_option,
)
from .output import Format, Report, emit, err_console
from .size_inputs import SizeInputs, SizeOptions, size_inputs
from .size_presets import presets_report
from .size_report import (
    UNITS_NOTE,
    capacity_notes,
    capacity_table,
    describe,
    exceeds_max_positions,
    kv_table,
    layer_table,
    model_doc,
    no_context_report,
    tp_note,
)

TokensOpt = Annotated[
    int | None, int_option("--tokens", "-n", help="Context tokens per sequence (default: the model's max length).")
]
SeqsOpt = Annotated[int | None, int_option("--seqs", "-s", help="Number of sequences (default: 1).")]
TpOpt = Annotated[int | None, int_option("--tp", help="Tensor-parallel GPUs that split the KV heads (default: 1).")]
MemoryOpt = Annotated[
    str | None, typer.Option("--memory", help="KV budget (per GPU with --tp), e.g. 80GiB, 80GB, 80e9.")
]
GpuOpt = Annotated[str | None, typer.Option(
    "--gpu", help="GPU preset (A100-40GB, A100-80GB, H100-SXM, H200, B200, B300, GB200, MI300X, MI355X, L40S, "
                  "RTX-6000-Pro): the KV memory, blocks, tokens and "
                  "concurrency vLLM reports at start-up.")]
UtilizationOpt = Annotated[float | None, float_option(
    "--gpu-memory-utilization", example="0.9",
    help="With --gpu: the share of GPU memory vLLM may use (default: --vllm-version's, "
         f"{VLLM_VERSIONS['0.21'].default_gpu_memory_utilization:g} from 0.21 on, "
         f"{VLLM_VERSIONS['0.19'].default_gpu_memory_utilization:g} in 0.19).")]
MaxModelLenOpt = Annotated[int | None, int_option(
    "--max-model-len", help="With --gpu: tokens per request (default: the model's max length).")]
KvMemoryOpt = Annotated[str | None, typer.Option(
    "--kv-memory", help="KV memory per GPU (as vLLM logs it, e.g. 34.81GiB) instead of estimating it from --gpu.")]
BatchedTokensOpt = Annotated[int | None, int_option(
    "--max-num-batched-tokens",
    help=f"With --gpu: tokens per step (activation peak, sliding blocks; default {DEFAULT_MAX_NUM_BATCHED_TOKENS}).")]
VllmVersionOpt = Annotated[str | None, typer.Option(
    "--vllm-version", help="With --gpu: the vLLM whose start-up to predict: 0.19 (utilization "
                           f"{VLLM_VERSIONS['0.19'].default_gpu_memory_utilization:g} by default, CUDA graphs not "
                           "subtracted) or 0.21 (0.21 and later: "
                           f"{VLLM_VERSIONS['0.21'].default_gpu_memory_utilization:g}, graphs subtracted; "
                           "the default).")]
PpOpt = Annotated[int | None, int_option("--pp", help="With --gpu: pipeline-parallel stages (layers split across "
                                                     "them; default 1).")]
MaxSeqsOpt = Annotated[int | None, int_option(
    "--max-num-seqs", help="With --gpu: vLLM's max_num_seqs (the sampler warm-up's requests; default "
                           f"{MAX_NUM_SEQS_LARGE_GPU:,} on a GPU of {LARGE_GPU_BYTES // 2**30} GiB or more other than "
                           f"A100, else {MAX_NUM_SEQS_OTHER_GPU}, as vllm serve).")]
QuantizationOpt = Annotated[str | None, typer.Option(
    "--quantization", help="With --gpu: vLLM's --quantization: fp8 (linear layers in fp8, embeddings and head "
                           "16-bit) or mxfp4 (routed experts in 4.25 bits).")]
DraftConfigOpt = Annotated[str | None, typer.Option(
    "--draft-config", help="With --spec-method draft|eagle: the drafter's config.json (or its folder); its layers' "
                           "KV joins the target's.")]
WeightDtypeOpt = Annotated[str | None, typer.Option(
    "--weight-dtype", help="With --gpu: weight precision (default: the config's torch_dtype, else bf16).")]


def command(
    model: ModelOpt = None, config: ConfigOpt = None, layers: LayersOpt = None, kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None, dtype: DtypeOpt = DEFAULT_DTYPE, tokens: TokensOpt = None, seqs: SeqsOpt = None,
    block: BlockOpt = None, tp: TpOpt = None, memory: MemoryOpt = None, gpu: GpuOpt = None,
    gpu_memory_utilization: UtilizationOpt = None, max_model_len: MaxModelLenOpt = None,
    kv_memory_bytes: KvMemoryOpt = None, max_num_batched_tokens: BatchedTokensOpt = None,
    weight_dtype: WeightDtypeOpt = None, vllm_version: VllmVersionOpt = None, pp: PpOpt = None,
    max_num_seqs: MaxSeqsOpt = None, quantization: QuantizationOpt = None, spec_tokens: SpecTokensOpt = None,
    spec_method: SpecMethodOpt = None, draft_config: DraftConfigOpt = None,
    json_flag: JsonOpt = False, fmt: FormatOpt = Format.table,
) -> None:
    """KV-cache bytes (equation 1) per token, block, sequence, batch and GPU; what fits in a memory budget.

    Without a model: every built-in preset's KV per token and per sequence at 4,096, 32,768 and 131,072 tokens.
    The default precision is bf16 (16 bits, the same bytes as fp16). With --gpu (or --kv-memory): what vLLM
    prints at start-up (available KV memory, KV cache size in tokens, maximum concurrency).
    """
    inputs = size_inputs(SizeOptions(
        model=model, config=config, layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, tokens=tokens,
        seqs=seqs, block=block, tp=tp, memory=memory, gpu=gpu, gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len, kv_memory=kv_memory_bytes, max_num_batched_tokens=max_num_batched_tokens,
        weight_dtype=weight_dtype, vllm_version=vllm_version, pp=pp, max_num_seqs=max_num_seqs,
        quantization=quantization, spec_tokens=spec_tokens, spec_method=spec_method, draft_config=draft_config,
        json_flag=json_flag, fmt=fmt))
    emit(size_report(inputs), inputs.fmt)


def size_report(inputs: SizeInputs) -> Report:
    """The one report for checked inputs: the presets (no model), what needs no context (a config that names
    none), or equation 1 with capacity and speculation; then vLLM's start-up with --gpu / --kv-memory."""
    spec, o = inputs.spec, inputs.opts
    if spec is None:
        return presets_report(inputs.dtype, o.tokens, tables=inputs.fmt is not Format.json)
    if inputs.no_context:
        report = no_context_report(spec, inputs.dtype, inputs.tp, inputs.block_size)
    else:
        report = _equation_report(inputs, spec)
    if o.gpu_plan:
        from .size_gpu import add_gpu_plan

        add_gpu_plan(report, inputs)
    return report


def _equation_report(inputs: SizeInputs, spec: ModelSpec) -> Report:
    """compute_size (core/model/sizing) and, with --spec-tokens, the speculative peaks; warnings on stderr."""
    result = compute_size(spec, inputs.dtype, tokens=inputs.tokens, seqs=1 if inputs.opts.seqs is None
                          else inputs.opts.seqs, tp=inputs.tp, block_size=inputs.block_size,
                          memory_bytes=inputs.memory_bytes)
    warnings = _warnings(result)
    for warning in warnings:
        err_console.print(f"warning: {with_flags(warning)}", highlight=False, soft_wrap=True)
    report = _model_report(result, [*spec.notes, *warnings])
    if inputs.speculation is not None:
        from ..core.spec_decode import speculative_size
        from .size_speculative import add_speculative

        add_speculative(report, speculative_size(
            spec.layer_groups, inputs.speculation, result.tokens, inputs.block_size, result.bits_per_scalar,
            result.tp, max_model_len=inputs.opts.max_model_len or spec.max_position_embeddings,
            memory_bytes=None if result.capacity is None else result.capacity.memory_bytes,
        ))
    return report


def _warnings(result: SizeResult) -> list[str]:
    if exceeds_max_positions(result.spec, result.tokens):
        max_len = result.spec.max_position_embeddings
        return [f"--tokens {format_count_short(result.tokens)} is above {result.spec.name}'s "
                f"max_position_embeddings {max_len:,}"]
    return []


def _equation_doc(r: SizeResult, warnings: list[str]) -> dict[str, Any]:
    """The JSON of equation 1's figures (bytes rounded up to whole bytes, bits exact)."""
    return {
        "model": model_doc(r.spec, r.bits_per_scalar),
        "dtype": r.dtype,
        "bits_per_scalar": r.bits_per_scalar,
        "bytes_per_token_per_layer": r.bytes_per_token_per_layer,
        "bytes_per_token": r.bytes_per_token,
        "block_size": r.block_size,
        "bytes_per_block": r.bytes_per_block,
        "tokens": r.tokens,
        "seqs": r.seqs,
        "tp": r.tp,
        "kv_heads_per_gpu": r.kv_heads_per_gpu,
        "bytes_per_seq": r.bytes_per_seq,
        "kv_bytes_per_seq": r.kv_bytes_per_seq,
        "state_bytes_per_seq": r.state_bytes_per_seq,
        "total_bytes": r.total_bytes,
        "per_gpu_bytes": r.per_gpu_bytes,
        "per_gpu_bytes_per_token": r.per_gpu_bytes_per_token,
        "total_bits": r.total_bits,
        "bits_per_token_per_layer": r.bits_per_token_per_layer,
        "bits_per_token": r.bits_per_token,
        "bits_per_block": r.bits_per_block,
        "bits_per_seq": r.bits_per_seq,
        "per_gpu_bits_per_token": r.per_gpu_bits_per_token,
        "per_gpu_bits": r.per_gpu_bits,
        "bytes_rounded_up": not r.exact_bytes,
        "formula": r.formula,
        "warnings": warnings,
    }


def _capacity_doc(r: SizeResult) -> dict[str, Any]:
    """What fits in --memory, and the blocks vLLM's layout pages."""
    spec, cap = r.spec, r.capacity
    assert cap is not None  # only called with --memory
    return {
        "memory_bytes": cap.memory_bytes,
        "per_gpu": cap.per_gpu,
        "max_tokens": cap.max_tokens,
        "max_tokens_is_lower_bound": bool(spec.num_sliding_layers),  # windows not applied to max_tokens
        "max_tokens_counts_state": spec.has_state,  # one sequence's state taken off the budget first
        "max_seqs": cap.max_seqs,
        "num_blocks": cap.num_blocks,
        "block_size": cap.block_size,
        "fits": cap.fits,
        "vllm_num_blocks": cap.layout_blocks,
        "vllm_block_size": None if cap.layout is None else cap.layout.block_size,
        "vllm_layout": None if cap.layout is None else cap.layout.layout,
        "vllm_block_reason": None if cap.layout is None else cap.layout.reason,  # prose: JSON only
    }


def _model_report(r: SizeResult, warnings: list[str]) -> Report:
    spec = r.spec
    doc = _equation_doc(r, warnings)
    notes = [f"Equation 1: {r.formula}"]
    if r.tp > 1:
        notes.append(tp_note(r))
    if spec.num_sliding_layers and r.tokens > (spec.sliding_window or 0):
        notes.append(f"Sliding-window and chunked layers hold at most {spec.sliding_window:,} tokens of a sequence."
                     if spec.is_uniform else "Sliding-window and chunked layers hold at most their window or chunk.")
    if r.state_bits_per_seq:
        notes.append("Recurrent layers keep a constant state per sequence: included in the per-sequence bytes and "
                     "in what fits.")
    if not r.exact_bytes:
        notes.append("An odd number of int4 scalars leaves half a byte: the table shows exact bytes; the JSON's "
                     "*_bytes are rounded up to whole bytes (bytes_rounded_up: true) and its *_bits are exact.")
    tables = [kv_table(r, doc)]
    layers = layer_table(spec, r.bits_per_scalar, r.tokens)
    if layers is not None:
        tables.insert(0, layers)
    if r.capacity is not None:
        doc["capacity"] = _capacity_doc(r)
        tables.append(capacity_table(r, doc["capacity"]))
        notes.extend(capacity_notes(r))
    notes.append(UNITS_NOTE)
    heading = f"{describe(spec)}; {r.dtype} ({r.bits_per_scalar} bits per scalar)"
    return Report(doc=doc, tables=tables, notes=notes, text=[heading])
