"""From `kvcalc sim`'s options to a ready setup: workload, model, memory plan, step-time model, scheduler.

Every option is checked here (ValueError naming the value and the fix), so the command stays thin.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvcalc.core.distributions import LengthDistribution
from kvcalc.core.dtypes import dtype_bits, parse_dtype
from kvcalc.core.models import ModelSpec, get_preset, resolve_model
from kvcalc.core.sim_hardware import MemoryPlan, custom_gpu, get_gpu, plan_memory
from kvcalc.core.sim_run import SimSetup
from kvcalc.core.sim_scheduler import SchedulerConfig
from kvcalc.core.sim_steptime import Efficiencies, build_model, calibrated_attention_eff
from kvcalc.core.sim_workload import Workload, constructed, from_trace, length_streams
from kvcalc.core.traces import read_trace
from kvcalc.core.units import parse_bytes

DEFAULT_MODEL = "OPT-13B"
DEFAULT_GPU = "A100-40GB"
FALLBACK_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class Options:
    trace: tuple[str, Path] | None = None
    time_scale: float = 1.0
    limit: int | None = None
    rate: float = 1.0
    arrival: str = "poisson"
    burstiness: float = 1.0
    requests: int = 1000
    prompt_dist: str = "lognormal:mean=161,sigma=1.0"
    output_dist: str = "lognormal:mean=338,sigma=1.0"
    model: str | None = None
    config: Path | None = None
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str = "fp16"
    weight_dtype: str = "bf16"
    weights_bytes: str | None = None
    gpu: str | None = None
    gpu_memory: str | None = None
    bandwidth: str | None = None
    flops: float | None = None
    tp: int = 1
    memory_utilization: float = 0.9
    workspace_bytes: str | None = None
    block: int = 16
    max_batched_tokens: int = 8192
    max_seqs: int = 256
    max_model_len: int | None = None
    preempt: str = "recompute"
    swap_bandwidth: str = "25GB"
    cancel_fraction: float = 0.0
    timeout: float | None = None
    seed: int = 0
    compute_eff: float = 0.6
    weight_eff: float = 0.8
    attn_eff: float = 0.8
    step_overhead_ms: float = 0.5
    calibrate: Path | None = None
    prefix_caching: bool = True
    fast_forward: bool = True


@dataclass(frozen=True, eq=False)
class Setup:
    workload: Workload
    spec: ModelSpec
    plan: MemoryPlan
    sim: SimSetup
    latency_source: str
    notes: tuple[str, ...]


def _workload(o: Options) -> Workload:
    if o.trace is not None:
        kind, path = o.trace
        return from_trace(read_trace(kind, path), o.time_scale, o.limit)
    if not o.rate > 0:
        raise ValueError(f"--rate must be a positive number of requests per second (or inf), got {o.rate}")
    prompt_rng, output_rng, _ = length_streams(o.seed)
    prompt_dist = LengthDistribution.parse(o.prompt_dist)
    output_dist = LengthDistribution.parse(o.output_dist)
    prompts = prompt_dist.sample(o.requests, prompt_rng) if o.requests >= 1 else np.zeros(0, np.int64)
    outputs = output_dist.sample(o.requests, output_rng) if o.requests >= 1 else np.zeros(0, np.int64)
    lengths_text = f"prompts {prompt_dist.describe()}, outputs {output_dist.describe()}"
    return constructed(o.requests, o.rate, prompts, outputs, arrival=o.arrival, burstiness=o.burstiness,
                       seed=o.seed, lengths_text=lengths_text)


def _gpu(o: Options):
    custom = (o.gpu_memory, o.bandwidth, o.flops)
    if any(v is not None for v in custom):
        if o.gpu is not None:
            raise ValueError("give either --gpu or --gpu-memory/--bandwidth/--flops, not both")
        if any(v is None for v in custom):
            raise ValueError("a custom GPU needs --gpu-memory, --bandwidth and --flops together")
        return custom_gpu(parse_bytes(o.gpu_memory), float(parse_bytes(o.bandwidth)), float(o.flops))
    return get_gpu(o.gpu or DEFAULT_GPU)


def build(o: Options) -> Setup:
    if o.trace is None and o.time_scale != 1.0:
        raise ValueError("--time-scale applies to --trace; for a constructed workload change --rate")
    spec = resolve_model(o.model, o.config, o.layers, o.kv_heads, o.head_dim) or get_preset(DEFAULT_MODEL)
    gpu = _gpu(o)
    kv_bits = dtype_bits(parse_dtype(o.dtype))
    weight_bits = dtype_bits(parse_dtype(o.weight_dtype))
    max_model_len = o.max_model_len or spec.max_position_embeddings or FALLBACK_MAX_MODEL_LEN
    notes: list[str] = []
    if not (o.max_model_len or spec.max_position_embeddings):
        notes.append(f"{spec.name} has no max length; using {FALLBACK_MAX_MODEL_LEN} (set --max-model-len)")
    if max_model_len < 1:
        raise ValueError(f"--max-model-len must be at least 1, got {max_model_len}")
    plan = plan_memory(
        spec, gpu, kv_dtype_bits=kv_bits, block_size=o.block, tp=o.tp, memory_utilization=o.memory_utilization,
        weight_bytes_per_param=weight_bits / 8,
        weights_bytes=parse_bytes(o.weights_bytes) if o.weights_bytes is not None else None,
        workspace_bytes=parse_bytes(o.workspace_bytes) if o.workspace_bytes is not None else None,
        max_batched_tokens=o.max_batched_tokens, max_seqs=o.max_seqs,
    )
    attn_eff = o.attn_eff
    source = (f"roofline on {gpu.name} x{o.tp}, efficiencies compute {o.compute_eff:g}, weights {o.weight_eff:g}, "
              f"attention {{attn:g}}, overhead {o.step_overhead_ms:g} ms/step")
    if o.calibrate is not None:
        attn_eff, calibration = calibrated_attention_eff(o.calibrate, gpu)
        notes.append(calibration)
    eff = Efficiencies(o.compute_eff, o.weight_eff, attn_eff, o.step_overhead_ms / 1e3)
    steptime = build_model(spec, plan, eff, swap_bandwidth_bytes_per_s=float(parse_bytes(o.swap_bandwidth)))
    scheduler = SchedulerConfig(o.max_batched_tokens, o.max_seqs, max_model_len, o.preempt.strip().lower(),
                                o.timeout, o.fast_forward)
    if not 0 <= o.cancel_fraction <= 1:
        raise ValueError(f"--cancel-fraction must be between 0 and 1, got {o.cancel_fraction}")
    workload = _workload(o)
    sim = SimSetup.from_plan(plan, steptime, scheduler, cancel_fraction=o.cancel_fraction, seed=o.seed,
                             prefix_caching=o.prefix_caching)
    if workload.has_prefix_ids and o.prefix_caching:
        if 512 % o.block:
            raise ValueError(f"--block {o.block} does not divide Mooncake's 512-token hash blocks; use a power of two")
        notes.append("prefix caching on: Mooncake hash_ids give each prompt block's content (paged policy only)")
    return Setup(workload, spec, plan, sim, source.format(attn=attn_eff), tuple(notes))
