"""`kvcalc size`: equation 1 for a model (preset, config.json, hub cache or explicit dims); capacity; TP
split; with --gpu (or --kv-memory), the KV memory, blocks, tokens and concurrency vLLM prints at start-up."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from ..core.blocks import DEFAULT_BLOCK_SIZE
from ..core.dtypes import DEFAULT_DTYPE, DTYPE_BITS, parse_dtype
from ..core.model.models import ModelSpec, resolve_model
from ..core.model.sizing import SizeResult, compute_size
from ..core.units import format_count_short, parse_bytes, parse_logged_bytes
from .options import (
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
from .output import Format, Report, emit, err_console, resolve_format
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

T = TypeVar("T")

TokensOpt = Annotated[
    int | None, int_option("--tokens", "-n", help="Context tokens per sequence (default: the model's max length).")
]
SeqsOpt = Annotated[int | None, int_option("--seqs", "-s", help="Number of sequences (default: 1).")]
BlockOpt = Annotated[
    int | None, int_option("--block", "-b", help=f"Block size in tokens (default: {DEFAULT_BLOCK_SIZE}).")
]
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
    help="With --gpu: the share of GPU memory vLLM may use (default: --vllm-version's, 0.92 from 0.21 on, 0.9 in "
         "0.19).")]
MaxModelLenOpt = Annotated[int | None, int_option(
    "--max-model-len", help="With --gpu: tokens per request (default: the model's max length).")]
KvMemoryOpt = Annotated[str | None, typer.Option(
    "--kv-memory", help="KV memory per GPU (as vLLM logs it, e.g. 34.81GiB) instead of estimating it from --gpu.")]
BatchedTokensOpt = Annotated[int | None, int_option(
    "--max-num-batched-tokens", help="With --gpu: tokens per step (activation peak, sliding blocks; default 8192).")]
VllmVersionOpt = Annotated[str | None, typer.Option(
    "--vllm-version", help="With --gpu: the vLLM whose start-up to predict: 0.19 (utilization 0.9 by default, CUDA "
                           "graphs not subtracted) or 0.21 (0.21 and later: 0.92, graphs subtracted; the default).")]
PpOpt = Annotated[int | None, int_option("--pp", help="With --gpu: pipeline-parallel stages (layers split across "
                                                     "them; default 1).")]
MaxSeqsOpt = Annotated[int | None, int_option(
    "--max-num-seqs", help="With --gpu: vLLM's max_num_seqs (the sampler warm-up's requests; default 1,024 on a GPU "
                           "of 70 GiB or more other than A100, else 256, as vllm serve).")]
QuantizationOpt = Annotated[str | None, typer.Option(
    "--quantization", help="With --gpu: vLLM's --quantization: fp8 (linear layers in fp8, embeddings and head "
                           "16-bit) or mxfp4 (routed experts in 4.25 bits).")]
DraftConfigOpt = Annotated[str | None, typer.Option(
    "--draft-config", help="With --spec-method draft|eagle: the drafter's config.json (or its folder); its layers' "
                           "KV joins the target's.")]
WeightDtypeOpt = Annotated[str | None, typer.Option(
    "--weight-dtype", help="With --gpu: weight precision (default: the config's torch_dtype, else bf16).")]


def command(
    model: ModelOpt = None,
    config: ConfigOpt = None,
    layers: LayersOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    dtype: DtypeOpt = DEFAULT_DTYPE,
    tokens: TokensOpt = None,
    seqs: SeqsOpt = None,
    block: BlockOpt = None,
    tp: TpOpt = None,
    memory: MemoryOpt = None,
    gpu: GpuOpt = None,
    gpu_memory_utilization: UtilizationOpt = None,
    max_model_len: MaxModelLenOpt = None,
    kv_memory_bytes: KvMemoryOpt = None,
    max_num_batched_tokens: BatchedTokensOpt = None,
    weight_dtype: WeightDtypeOpt = None,
    vllm_version: VllmVersionOpt = None,
    pp: PpOpt = None,
    max_num_seqs: MaxSeqsOpt = None,
    quantization: QuantizationOpt = None,
    spec_tokens: SpecTokensOpt = None,
    spec_method: SpecMethodOpt = None,
    draft_config: DraftConfigOpt = None,
    json_flag: JsonOpt = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """KV-cache bytes (equation 1) per token, block, sequence, batch and GPU; what fits in a memory budget.

    Without a model: every built-in preset's KV per token and per sequence at 4,096, 32,768 and 131,072 tokens.
    The default precision is bf16 (16 bits, the same bytes as fp16). With --gpu (or --kv-memory): what vLLM
    prints at start-up (available KV memory, KV cache size in tokens, maximum concurrency).
    """
    dtype = parse_dtype(dtype)
    fmt = resolve_format(json_flag, fmt)
    spec = resolve_model(model, config, layers, kv_heads, head_dim, kv_free=True)
    speculation = None
    if spec_tokens is not None or spec_method is not None:  # imported only then: `size --json` starts lean
        from ..core.spec_decode import speculation_from

        speculation = speculation_from(spec_tokens, spec_method)
    spec = _with_drafter(spec, speculation, draft_config)
    gpu_options = {"--gpu-memory-utilization": gpu_memory_utilization, "--max-model-len": max_model_len,
                   "--max-num-batched-tokens": max_num_batched_tokens, "--weight-dtype": weight_dtype,
                   "--vllm-version": vllm_version, "--pp": pp, "--max-num-seqs": max_num_seqs,
                   "--quantization": quantization}
    _check_counts(spec, tp, {"--seqs": seqs, "--tokens": tokens, "--block": block, "--max-model-len": max_model_len,
                             "--max-num-batched-tokens": max_num_batched_tokens, "--max-num-seqs": max_num_seqs,
                             "--pp": pp})
    checkpoint = _checkpoint(model, config, spec) if gpu is not None else (0, None)
    if spec is None:
        given = [name for name, value in (("--seqs", seqs), ("--block", block), ("--tp", tp), ("--memory", memory),
                                          ("--gpu", gpu), ("--kv-memory", kv_memory_bytes),
                                          ("--spec-tokens", spec_tokens)) if value is not None]
        given += [name for name, value in gpu_options.items() if value is not None]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(
                f"{', '.join(given)} {verb} a model: add --model NAME (or org/name), --config DIR, "
                "or --layers/--kv-heads/--head-dim"
            )
        emit(presets_report(dtype, tokens, tables=fmt is not Format.json), fmt)
        return
    if gpu is None and kv_memory_bytes is None:
        stray = [name for name, value in gpu_options.items() if value is not None]
        if stray:
            raise ValueError(f"{', '.join(stray)} applies to the GPU plan: add --gpu NAME (or --kv-memory SIZE)")
    for warning in spec.notes:
        err_console.print(f"warning: {warning}", highlight=False, soft_wrap=True)
    block_size = DEFAULT_BLOCK_SIZE if block is None else block
    if tokens is None and spec.max_position_embeddings is None and max_model_len is not None:
        tokens = max_model_len  # explicit dimensions name no context: the request length stands in for it
    from_config = config is not None or (model is not None and "/" in model)
    if tokens is None and spec.max_position_embeddings is None and from_config:
        # A config that names no context length: what needs none (per token, layer, block; common contexts).
        given = [name for name, value in (("--seqs", seqs), ("--memory", memory), ("--spec-tokens", spec_tokens))
                 if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} needs a context length: {spec.name}'s config names none "
                             "(max_position_embeddings); give --tokens N")
        report = no_context_report(spec, dtype, 1 if tp is None else tp, block_size)
        if gpu is not None or kv_memory_bytes is not None:
            _add_gpu_plan(report, spec, dtype, tp, block_size, gpu, gpu_memory_utilization, max_model_len,
                          kv_memory_bytes, max_num_batched_tokens, weight_dtype,
                      (vllm_version, pp, max_num_seqs, quantization, checkpoint))
        emit(report, fmt)
        return
    result = compute_size(
        spec, dtype, tokens=tokens, seqs=1 if seqs is None else seqs, tp=1 if tp is None else tp,
        block_size=block_size, memory_bytes=None if memory is None else _flagged("--memory", parse_bytes, memory),
    )
    warnings = _warnings(result)
    for warning in warnings:
        err_console.print(f"warning: {warning}", highlight=False, soft_wrap=True)
    report = _model_report(result, [*spec.notes, *warnings])
    if speculation is not None:
        from ..core.spec_decode import speculative_size
        from .size_speculative import add_speculative

        add_speculative(report, speculative_size(
            spec.layer_groups, speculation, result.tokens, block_size, result.bits_per_scalar, result.tp,
            max_model_len=max_model_len or spec.max_position_embeddings,
            memory_bytes=None if result.capacity is None else result.capacity.memory_bytes,
        ))
    if gpu is not None or kv_memory_bytes is not None:
        _add_gpu_plan(report, spec, dtype, tp, block_size, gpu, gpu_memory_utilization, max_model_len,
                      kv_memory_bytes, max_num_batched_tokens, weight_dtype,
                      (vllm_version, pp, max_num_seqs, quantization, checkpoint))
    emit(report, fmt)


def _with_drafter(spec: ModelSpec | None, speculation: Any, draft_config: str | None) -> ModelSpec | None:
    """The model with its drafter's KV under --spec-method eagle|mtp|draft (core/model/models.with_drafter);
    what was added, or that MTP layers exist and are not counted, goes into the spec's notes."""
    if draft_config is not None and (spec is None or speculation is None):
        raise ValueError("--draft-config needs a model and --spec-tokens K --spec-method draft|eagle|mtp")
    if spec is None:
        return None
    from ..core.model.models import with_drafter

    draft = None
    if draft_config is not None:
        from ..core.model.hf_config import load_config

        draft = _flagged("--draft-config", load_config, draft_config)
    spec, note = with_drafter(spec, None if speculation is None else speculation.method, draft)
    return spec if note is None else dataclasses.replace(spec, notes=(*spec.notes, note))


def _add_gpu_plan(report: Report, spec: ModelSpec, dtype: str, tp: int | None, block_size: int, gpu: str | None,
                  utilization: float | None, max_model_len: int | None, kv_memory: str | None,
                  batched_tokens: int | None, weight_dtype: str | None,
                  startup: tuple[str | None, int | None, int | None, str | None, tuple[int, str | None]] = (
                      None, None, None, None, (0, None))) -> None:
    from ..core.gpus import get_gpu
    from ..core.model.gpu_plan import DEFAULT_MAX_NUM_BATCHED_TOKENS, plan_gpu
    from ..core.model.vllm_memory import DEFAULT_VLLM_VERSION, default_max_num_seqs, get_version
    from .size_gpu import gpu_report

    if max_model_len is None:
        if spec.max_position_embeddings is None:
            raise ValueError(f"the GPU plan needs a request length: {spec.name}'s config names none "
                             "(max_position_embeddings); give --max-model-len L")
        max_model_len = spec.max_position_embeddings
    device = get_gpu(gpu, otherwise="or give --kv-memory SIZE") if gpu is not None else None
    if weight_dtype is not None:
        spec = dataclasses.replace(spec, weight_dtype=parse_dtype(weight_dtype, "weight_dtype"))
    kv_memory_bytes, rounding = (None, None) if kv_memory is None else _flagged("--kv-memory", parse_logged_bytes,
                                                                                kv_memory)
    version_name, pp, max_num_seqs, quantization, (vision_params, stored) = startup
    if stored is not None and quantization is None and weight_dtype is None:  # the config's quantization_config
        quantization, spec = ("mxfp4", spec) if stored == "mxfp4" else (None, dataclasses.replace(
            spec, weight_dtype=stored))
    version = get_version(DEFAULT_VLLM_VERSION if version_name is None else version_name)  # "" is an error
    if quantization is not None and quantization not in ("fp8", "mxfp4"):
        raise ValueError(f"--quantization {quantization!r} is not modelled: give fp8 or mxfp4 (or --weight-dtype "
                         "for a checkpoint stored at one precision)")
    if quantization == "fp8":
        spec, quantization = dataclasses.replace(spec, weight_dtype="fp8"), None
    if block_size not in VLLM_BLOCK_SIZES:
        raise ValueError(f"--block {block_size}: vLLM's start-up figures need a block size vLLM accepts "
                         f"({', '.join(map(str, VLLM_BLOCK_SIZES))}); drop --gpu/--kv-memory for the accounting "
                         "alone, which takes any block size")
    plan = plan_gpu(
        spec, kv_dtype_bits=DTYPE_BITS[dtype], block_size=block_size, max_model_len=max_model_len,
        tp=1 if tp is None else tp, gpu_name=device.name if device else "",
        gpu_memory_bytes=device.memory_bytes if device else None,
        gpu_memory_utilization=version.default_gpu_memory_utilization if utilization is None else utilization,
        pp=1 if pp is None else pp, vllm_version=version.name, quantization=quantization, vision_params=vision_params,
        max_num_seqs=default_max_num_seqs(device.memory_bytes if device else 0, device.name if device else "")
        if max_num_seqs is None else max_num_seqs,
        kv_memory_bytes=kv_memory_bytes,
        max_num_batched_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS if batched_tokens is None else batched_tokens,
    )
    gpu_report(report, plan)
    if rounding is not None:
        report.notes.append(f"--kv-memory {rounding}.")


VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)  # vLLM's --block-size choices (CacheConfig.block_size; CUDA: up to 32
#                                            for most attention backends, 64/128 for MLA and FlashInfer ones)
MAX_COUNT = 2**63 - 1  # the largest count option (--seqs, --tokens, --block, ...): a signed 64-bit count


def _checkpoint(model: str | None, config: Any, spec: ModelSpec) -> tuple[int, str | None]:
    """(vision-tower parameters, the weights' quantization) of the config.json behind --config / org/name."""
    import json
    from pathlib import Path

    from ..core.model.weights import checkpoint_quantization, config_vision_params

    path: Path | None = None
    if config is not None:
        path = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
    elif model is not None and "/" in model:
        from ..core.model.hub import cached_config

        path = Path(cached_config(model)[0])
    if path is None:  # a preset: its checkpoint's quantization as its config.json gives it
        from ..core.model.presets import PRESET_CHECKPOINT_QUANTIZATION

        return 0, PRESET_CHECKPOINT_QUANTIZATION.get(spec.name) if model is not None else None
    raw = json.loads(path.read_text(encoding="utf-8"))
    return config_vision_params(raw, spec.hidden_size), checkpoint_quantization(raw)


def _check_counts(spec: ModelSpec | None, tp: int | None, counts: dict[str, int | None]) -> None:
    """One-line refusals for counts beyond what a result can mean (see MAX_COUNT and vllm_memory.MAX_TP)."""
    from ..core.model.vllm_memory import MAX_TP

    for flag, value in counts.items():
        if value is not None and value > MAX_COUNT:
            raise ValueError(f"{flag} {format_count_short(value)} is above 2**63-1, the largest count kvcalc takes; "
                             f"give a smaller {flag}")
    if tp is not None:
        heads = spec.num_attention_heads if spec is not None else 0
        bound = min(MAX_TP, heads) if heads else MAX_TP
        if tp > bound:
            raise ValueError(f"--tp {format_count_short(tp)} is above {bound}: each GPU needs at least one of "
                             f"{spec.name if spec else 'the model'}'s attention heads (and kvcalc takes at most "
                             f"{MAX_TP}); give --tp {bound} or fewer")


def _flagged(flag: str, parse: Callable[[str], T], text: str) -> T:
    """`parse(text)`, its error prefixed with the flag that gave the text."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def _warnings(result: SizeResult) -> list[str]:
    if exceeds_max_positions(result.spec, result.tokens):
        max_len = result.spec.max_position_embeddings
        return [f"--tokens {format_count_short(result.tokens)} is above {result.spec.name}'s "
                f"max_position_embeddings {max_len:,}"]
    return []


def _model_report(r: SizeResult, warnings: list[str]) -> Report:
    spec = r.spec
    doc: dict[str, Any] = {
        "model": model_doc(spec, r.bits_per_scalar),
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
        cap = r.capacity
        doc["capacity"] = {
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
        tables.append(capacity_table(r, doc["capacity"]))
        notes.extend(capacity_notes(r))
    notes.append(UNITS_NOTE)
    heading = f"{describe(spec)}; {r.dtype} ({r.bits_per_scalar} bits per scalar)"
    return Report(doc=doc, tables=tables, notes=notes, text=[heading])
