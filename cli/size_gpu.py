"""`kvcalc size --gpu` / `--kv-memory`: the lines vLLM prints at start-up, as a table and `gpu_plan`."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.dtypes import DTYPE_BITS, NOT_VLLM_KV_DTYPES, parse_dtype
from ..core.model.gpu_plan import GpuPlan
from ..core.model.kv_groups import VLLM_BLOCK_SIZES  # one list: frag's best block uses it too
from ..core.model.models import ModelSpec
from ..core.units import format_bytes, format_count, parse_logged_bytes
from .output import Field, Report, quantity_table, record_table, warn_notes
from .size_inputs import SizeInputs, SizeOptions, flagged


def _gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB"


def _log_lines(plan: GpuPlan) -> list[str]:
    """The three lines vLLM logs at start-up, as it words them."""
    return [f"Available KV cache memory: {_gib(plan.kv_cache_bytes)}",
            f"GPU KV cache size: {plan.kv_cache_tokens:,} tokens",
            f"Maximum concurrency for {plan.max_model_len:,} tokens per request: "
            f"{float(plan.max_concurrency):.2f}x"]


def _plan_doc(plan: GpuPlan, log: list[str]) -> dict[str, Any]:
    """The JSON's `gpu_plan`: every figure of the start-up, its groups and pipeline stages."""
    concurrency = float(plan.max_concurrency)
    return {
        "gpu": plan.gpu or None, "memory_bytes": plan.memory_bytes or None, "tp": plan.tp,
        "gpu_memory_utilization": plan.gpu_memory_utilization, "max_model_len": plan.max_model_len,
        "requested_bytes": plan.requested_bytes or None, "weights_bytes": plan.weights_bytes,
        "activation_bytes": plan.activation_bytes, "non_torch_bytes": plan.non_torch_bytes,
        "kv_cache_bytes": plan.kv_cache_bytes, "block_size": plan.block_size, "page_bytes": plan.page_bytes,
        "group_size": plan.group_size, "block_bytes": plan.block_bytes, "num_blocks": plan.num_blocks,
        "blocks_per_request": plan.blocks_per_request, "kv_cache_tokens": plan.kv_cache_tokens,
        "max_concurrency": concurrency,
        "groups": [{"kind": g.kind, "layers": g.layers, "block_size": g.block_size or None,
                    "blocks_per_request": g.blocks_per_request} for g in plan.groups],
        "layout": plan.layout.layout, "block_size_reason": plan.layout.reason,
        "estimates": list(plan.estimates), "log_lines": log,
        "vllm_version": plan.vllm_version or None, "pp": plan.pp, "cuda_graph_bytes": plan.cuda_graph_bytes,
        "stage_slots": plan.stage_slots or None,
        "stages": [{"layers": s.layers, "weights_bytes": s.weights, "activation_bytes": s.activation,
                    "non_torch_bytes": s.non_torch, "cuda_graph_bytes": s.cuda_graphs,
                    "kv_cache_bytes": s.available} for s in plan.stages],
    }


def gpu_report(report: Report, plan: GpuPlan) -> None:
    """Add `gpu_plan` to the document, and its tables and notes."""
    log = _log_lines(plan)
    doc = _plan_doc(plan, log)
    report.doc["gpu_plan"] = doc
    estimated = set(plan.estimates)

    def label(text: str, *names: str) -> str:
        return f"{text} (estimate)" if any(n in e for e in estimated for n in names) else text

    where = f"{plan.gpu} ×{plan.tp}" if plan.gpu else f"one of {plan.tp} GPUs" if plan.tp > 1 else "one GPU"
    if plan.pp > 1:
        where += f", {plan.pp} pipeline stages (the stage with the least KV memory per layer)"
    fields = [
        Field("memory_bytes", "GPU memory" if plan.memory_bytes else None, _gib),
        Field("requested_bytes", f"× {plan.gpu_memory_utilization:g} utilization" if plan.requested_bytes else None,
              _gib),
        Field("weights_bytes", label("weights", "weights") if plan.weights_bytes is not None else None, _gib),
        Field("activation_bytes", label("activation peak", "activation") if plan.activation_bytes else None, _gib),
        Field("non_torch_bytes", label("non-torch memory", "non-torch") if plan.non_torch_bytes else None, _gib),
        Field("cuda_graph_bytes", (label("CUDA graphs", "CUDA graphs") if "CUDA graphs" in estimated else
                                   "CUDA graphs (logged, not subtracted)") if plan.cuda_graph_bytes else None, _gib),
        Field("kv_cache_bytes", "available KV cache memory", _gib),
        Field("block_size", "block size (tokens)", format_count),
        Field("num_blocks", "blocks", format_count),
        Field("kv_cache_tokens", "GPU KV cache size (tokens)", format_count),
        Field("max_concurrency", f"max concurrency at {plan.max_model_len:,} tokens", lambda c: f"{c:.2f}x"),
    ]
    version = f"vLLM {plan.vllm_version} " if plan.vllm_version and plan.stages else "vLLM "
    report.tables.append(quantity_table(f"{version}start-up figures on {where} (per GPU)", ["quantity", "value"],
                                        fields, [doc]))
    if len(plan.groups) > 1:
        report.tables.append(record_table(
            f"KV-cache groups (every group pages {format_bytes(plan.page_bytes)} per layer slot, "
            f"{plan.group_size} slots)", [Field("kind", "kind"), Field("layers", "layers"),
                                          Field("block_size", "tokens per block", format_count),
                                          Field("blocks_per_request", "blocks per request", format_count)],
            doc["groups"]))
    if len(plan.groups) > 1 or plan.layout.block_size != plan.layout.requested_block_size:
        report.notes.append(f"Layout {plan.layout.layout}: {plan.layout.reason} (core/model/kv_groups.py).")
    if plan.stage_slots:
        report.notes.append(f"Pipeline stages: vLLM makes the KV cache groups for the whole model and each stage keeps "
                            f"its own layers of each group; on the stage that sets the blocks a block id pages "
                            f"{plan.stage_slots} layer slots of {format_bytes(plan.page_bytes)} (of the model's "
                            f"{plan.group_size}).")
    report.notes.append("vLLM's lines: " + "; ".join(log) + ". vLLM prints GiB with two decimals.")
    if plan.stages:
        from ..core.model.vllm_memory import get_version

        report.notes.append(f"Memory model: {get_version(plan.vllm_version).about}; see docs/size.md for its "
                            "error against real start-up logs.")
    noted = [e for e in plan.estimates if e != "kv_cache_bytes given"]
    if noted:
        hint = ("" if plan.weights_bytes is None else
                "; give --kv-memory to start from vLLM's own 'Available KV cache memory' line")
        report.notes.append("Estimates: " + ", ".join(noted) + hint + ".")


def start_refusals(plan: GpuPlan, max_positions: int | None, scheduler: tuple[int, int] | None = None) -> list[str]:
    """Why vLLM would refuse to start with these settings (empty when it starts), in its own terms.

    * a token budget below the running-request limit (`scheduler`: max_num_seqs, max_num_batched_tokens):
      SchedulerConfig._verify_args raises ("max_num_batched_tokens ... must be greater than or equal to
      max_num_seqs");
    * a max_model_len above the model's length: vLLM's _get_and_verify_max_len raises unless
      VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (a yarn or dynamic rope_scaling in the config may raise the length it derives);
    * a pool that cannot hold one request of max_model_len tokens: vLLM v1's check_enough_kv_cache_memory raises
      ("... KV cache is needed, which is larger than the available KV cache memory")."""
    refusals = []
    if scheduler is not None and scheduler[1] < scheduler[0]:
        refusals.append(f"max_num_batched_tokens {scheduler[1]:,} is below max_num_seqs {scheduler[0]:,} (vLLM "
                        "needs at least one token a step for every running request); raise --max-num-batched-tokens "
                        "or lower --max-num-seqs")
    if max_positions is not None and plan.max_model_len > max_positions:
        refusals.append(f"--max-model-len {plan.max_model_len:,} is above the model's max_position_embeddings "
                        f"{max_positions:,} (allowed only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, or where the config's "
                        "rope_scaling extends the length)")
    if plan.num_blocks < plan.blocks_per_request:
        refusals.append(f"one request of {plan.max_model_len:,} tokens needs {plan.blocks_per_request:,} blocks and "
                        f"the pool has {plan.num_blocks:,} (not enough KV cache memory for one request at "
                        "max_model_len); lower --max-model-len or give it more memory")
    return refusals


def _add_refusals(report: Report, plan: GpuPlan, max_positions: int | None, spec_tokens: int,
                  scheduler: tuple[int, int]) -> None:
    """start_refusals as warnings on stderr, notes, and the JSON's gpu_plan.start_refusals (only when any); with
    speculative decoding on a recurrent model, the note on its extra state pages."""
    if spec_tokens and any(g.block_size == 0 for g in plan.groups):
        report.notes.append(f"--spec-tokens {spec_tokens}: a request holds 1 + {spec_tokens} pages in each state "
                            "group (vLLM's num_speculative_blocks: the state after each draft position)")
    refusals = start_refusals(plan, max_positions, scheduler)
    if refusals:
        report.doc["gpu_plan"]["start_refusals"] = refusals
        warn_notes([f"vLLM would not start: {r}" for r in refusals])
        report.notes += [f"vLLM would not start: {r}." for r in refusals]


def _max_model_len(o: SizeOptions, spec: ModelSpec) -> int:
    """--max-model-len, else the model's length; a model without one needs the flag."""
    if o.max_model_len is not None:
        return int(o.max_model_len)
    if spec.max_position_embeddings is None:
        flag = "--gpu" if o.gpu is not None else "--kv-memory"
        raise ValueError(f"{flag} plans vLLM's memory for a longest request (max_model_len), and {spec.name}'s "
                         "config names none (no max_position_embeddings): give --max-model-len L, e.g. "
                         "--max-model-len 32768 (without --gpu or --kv-memory, size needs none)")
    return int(spec.max_position_embeddings)


def add_gpu_plan(report: Report, inputs: SizeInputs) -> None:
    """--gpu / --kv-memory: check the start-up flags, plan vLLM's start-up (core/model/gpu_plan), add it."""
    from ..core.gpus import get_gpu
    from ..core.model.gpu_plan import plan_gpu
    from ..core.model.vllm_memory import (
        DEFAULT_MAX_NUM_BATCHED_TOKENS,
        DEFAULT_VLLM_VERSION,
        default_max_num_seqs,
        get_version,
    )

    o, spec, block_size = inputs.opts, inputs.spec, inputs.block_size
    spec_tokens = 0 if inputs.speculation is None else inputs.speculation.spec_tokens
    assert spec is not None  # the GPU plan needs a model: size_inputs refused it without one
    max_model_len = _max_model_len(o, spec)
    device = get_gpu(o.gpu, otherwise="or give --kv-memory SIZE") if o.gpu is not None else None
    seqs = default_max_num_seqs(device.memory_bytes if device else 0, device.name if device else "") if (
        o.max_num_seqs is None) else o.max_num_seqs
    budget = DEFAULT_MAX_NUM_BATCHED_TOKENS if o.max_num_batched_tokens is None else o.max_num_batched_tokens
    if o.weight_dtype is not None:
        spec = dataclasses.replace(spec, weight_dtype=parse_dtype(o.weight_dtype, "weight_dtype"))
    kv_memory_bytes, rounding = (None, None) if o.kv_memory is None else flagged("--kv-memory", parse_logged_bytes,
                                                                                 o.kv_memory)
    quantization, (vision_params, stored) = o.quantization, inputs.checkpoint
    if stored is not None and quantization is None and o.weight_dtype is None:  # the config's quantization_config
        quantization, spec = ("mxfp4", spec) if stored == "mxfp4" else (None, dataclasses.replace(
            spec, weight_dtype=stored))
    version = get_version(DEFAULT_VLLM_VERSION if o.vllm_version is None else o.vllm_version)  # "" is an error
    if quantization is not None and quantization not in ("fp8", "mxfp4"):
        raise ValueError(f"--quantization {quantization!r} is not modelled: give fp8 or mxfp4 (or --weight-dtype "
                         "for a checkpoint stored at one precision)")
    if quantization == "fp8":
        spec, quantization = dataclasses.replace(spec, weight_dtype="fp8"), None
    if inputs.dtype in NOT_VLLM_KV_DTYPES:  # plain int8 / int4 KV: no --kv-cache-dtype of vLLM pages it
        raise ValueError(f"--dtype {inputs.dtype}: vLLM's start-up figures need a KV precision vLLM pages (the "
                         "model's bf16 / fp16 / fp32, fp8, fp8_per_token_head, int8_per_token_head, nvfp4, "
                         "fp8_ds_mla); drop --gpu/--kv-memory for the accounting alone, which takes any precision")
    if block_size not in VLLM_BLOCK_SIZES:
        raise ValueError(f"--block {block_size}: vLLM's start-up figures need a block size vLLM accepts "
                         f"({', '.join(map(str, VLLM_BLOCK_SIZES))}); drop --gpu/--kv-memory for the accounting "
                         "alone, which takes any block size")
    plan = plan_gpu(
        spec, kv_dtype_bits=DTYPE_BITS[inputs.dtype], block_size=block_size, max_model_len=max_model_len,
        tp=inputs.tp, gpu_name=device.name if device else "",
        gpu_memory_bytes=device.memory_bytes if device else None,
        gpu_memory_utilization=version.default_gpu_memory_utilization if o.gpu_memory_utilization is None
        else o.gpu_memory_utilization,
        pp=1 if o.pp is None else o.pp, vllm_version=version.name, quantization=quantization,
        vision_params=vision_params, max_num_seqs=seqs, kv_memory_bytes=kv_memory_bytes,
        max_num_batched_tokens=budget, spec_tokens=spec_tokens,
    )
    gpu_report(report, plan)
    _add_refusals(report, plan, spec.max_position_embeddings, spec_tokens, (seqs, budget))
    if rounding is not None:
        report.notes.append(f"--kv-memory {rounding}.")
