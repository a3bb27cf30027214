"""From `kvcalc sim`'s options to a ready job: workload, model, memory plan, step-time model, scheduler,
the policies to run and the targets.

Every option is checked here (a ParameterError naming the option, its value and the fix), so the command
stays thin.

The configuration a sim run passes through, one object per level, each built from the one above:

    SimOptions       (options.py)   what was asked: every option as given, None where not given
        | build() here: every option checked, defaults applied
    SimJob           (here)         one `kvcalc sim` call: workload, model, memory plan, the policies to run,
                                    the targets (SLO, attainment) and, as `.sim`, the SimSetup of its runs
    SimSetup         (settings.py)  what every run of a job shares: pool capacity and groups, step-time model,
                                    scheduler, speculation, tiers (run.py, search.py run a policy on it)
    SchedulerConfig  (scheduler.py) the scheduler's part: token budget, sequences, max length, preemption

Each default is defined once: options.py's DEFAULT_* and, for vLLM's (batched tokens, sequences, utilisation),
core/model's, read by the CLI's flags and by this module alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..blocks import VLLM_NULL_BLOCKS
from ..dtypes import dtype_bits, parse_dtype
from ..errors import ParameterError
from ..inputs.distributions import LengthDistribution
from ..inputs.traces import read_trace
from ..model.kv_groups import DEFAULT_LAYOUT, KVLayout, kv_layout
from ..model.layers import check_tp
from ..model.models import ModelSpec, get_preset, resolve_model
from ..model.vllm_memory import DEFAULT_VLLM_VERSION, get_version
from ..notes import Note, concat
from ..pool.groups import check_state_mode_given, pool_groups
from ..spec_decode import with_config_drafter
from .checks import (
    CONSTRUCTED_ONLY,
    INT_BOUNDS,
    byte_count,
    check_int_bounds,
    check_mode_options,
    check_requests,
    finite_float,
)
from .hardware import MemoryPlan, checkpoint_vision_params, checkpoint_weights, custom_gpu, get_gpu, plan_memory
from .metrics import Slo, parse_slo
from .options import (
    DEFAULT_ARRIVAL,
    DEFAULT_GPU,
    DEFAULT_MODEL,
    DEFAULT_OUTPUT_DIST,
    DEFAULT_PROMPT_DIST,
    DEFAULT_RATE,
    DEFAULT_REQUESTS,
    DEFAULT_SEED,
    DEFAULT_SWAP_BANDWIDTH_BYTES_PER_S,
    SimOptions,
)
from .run import choose_policies
from .scheduler import SchedulerConfig
from .search import check_attainment, check_search
from .settings import SimSetup
from .setup_checks import (
    check_align_block_fits,
    check_hybrid,
    check_ignored,
    check_rate_inf_arrival,
    check_trace_ids,
    check_vllm_paging,
    check_weighted_tables,
    check_workload_options,
    parse_timeout,
    served_state_mode,
    start_refusals,
    unservable,
)
from .setup_notes import groups_note, keys_lower_bound, model_notes, mooncake_keys_note
from .speculative import SimSpeculation, check_speculative_setup, speculation_from_options
from .steptime import Efficiencies, StepTimeModel, build_model, calibrated_attention_eff
from .tiers_options import sim_tiers
from .workload import Workload, constructed, from_trace, length_streams

FALLBACK_MAX_MODEL_LEN = SchedulerConfig.max_model_len  # the scheduler's own default, 8,192


@dataclass(frozen=True, eq=False)
class SimJob:
    """One `kvcalc sim` call, checked: what simulate.py runs (every policy, and their max-rate searches)."""

    workload: Workload
    spec: ModelSpec
    plan: MemoryPlan
    sim: SimSetup
    latency_source: str
    notes: tuple[str, ...]
    kv_dtype: str
    policies: tuple[str, ...]
    slo: Slo
    find_max_rate: bool
    target_attainment: float
    prefix_hits_lower_bound: bool = False  # a hybrid pool's blocks keyed by one Mooncake id each (mooncake_keys_note)
    start_refusals: tuple[str, ...] = ()  # why vLLM would not start with these settings (simulated anyway; warned)
    # vLLM's refusal to start when one request of max_model_len does not fit the pool (setup_checks.unservable):
    # `kvcalc sim` raises it; `kvcalc plan` gives such a point its own verdict
    unservable: ParameterError | None = None


def _workload(o: SimOptions, seed: int, block_size: int) -> Workload:
    given = {name: getattr(o, name) is not None for name in CONSTRUCTED_ONLY}
    check_mode_options(trace=o.trace is not None, given=given, limit=o.limit is not None,
                       time_scale=o.time_scale != 1.0)
    if o.trace is not None:
        kind, path = o.trace
        trace = check_trace_ids(o, read_trace(kind, path), block_size)
        return from_trace(trace, finite_float("time_scale", o.time_scale), o.limit)
    arrival = (DEFAULT_ARRIVAL if o.arrival is None else o.arrival).strip().lower()
    if o.burstiness is not None and arrival != "gamma":
        raise ParameterError(f"burstiness {o.burstiness:g} applies to arrival gamma (Poisson arrivals have none); "
                             "add arrival gamma or drop burstiness", "burstiness", "arrival")
    rate = DEFAULT_RATE if o.rate is None else finite_float(
        "rate", o.rate, allow_inf=True, inf_meaning="every request at time 0 (an offline batch)")
    if not rate > 0:
        raise ParameterError(f"rate {o.rate} must be a positive number of requests per second (or inf)", "rate")
    check_rate_inf_arrival(o, rate)
    requests = DEFAULT_REQUESTS if o.requests is None else o.requests
    check_requests(requests)
    burstiness = 1.0 if o.burstiness is None else finite_float("burstiness", o.burstiness)
    prompt_rng, output_rng, _ = length_streams(seed)
    prompt_dist = _length_dist("prompt_dist", DEFAULT_PROMPT_DIST if o.prompt_dist is None else o.prompt_dist)
    output_dist = _length_dist("output_dist", DEFAULT_OUTPUT_DIST if o.output_dist is None else o.output_dist)
    prompts = prompt_dist.sample(requests, prompt_rng) if requests >= 1 else np.zeros(0, np.int64)
    outputs = output_dist.sample(requests, output_rng) if requests >= 1 else np.zeros(0, np.int64)
    lengths_text = f"prompts {prompt_dist.describe()}, outputs {output_dist.describe()}"
    return constructed(requests, rate, prompts, outputs, arrival=arrival, burstiness=burstiness,
                       seed=seed, lengths_text=lengths_text)


def _length_dist(param: str, spec: str) -> LengthDistribution:
    """`spec` parsed; a mistake is a ParameterError naming `param` (prompt_dist or output_dist: with both given,
    the message says which one is wrong)."""
    try:
        return LengthDistribution.parse(spec)
    except ParameterError as exc:  # marks the option as {dist}: write it as ours
        marked = exc.template.replace("{dist}", f"{{{param}}}")
        raise ParameterError(f"{{{param}}} {spec!r}: {marked}", param) from None
    except ValueError as exc:
        raise ParameterError(f"{{{param}}} {spec!r}: {exc}", param) from None


def _gpu(o: SimOptions):
    custom = (o.gpu_memory, o.bandwidth, o.flops)
    if any(v is not None for v in custom):
        if o.gpu is not None:
            raise ParameterError("give either gpu or gpu_memory/bandwidth/flops, not both", "gpu", "gpu_memory",
                                 "bandwidth", "flops")
        if o.gpu_memory is None or o.bandwidth is None or o.flops is None:
            raise ParameterError("a custom GPU needs gpu_memory, bandwidth and flops together", "gpu_memory",
                                 "bandwidth", "flops")
        bandwidth = float(byte_count("bandwidth", o.bandwidth, "bytes/s"))
        return custom_gpu(byte_count("gpu_memory", o.gpu_memory), bandwidth, finite_float("flops", o.flops))
    return get_gpu(DEFAULT_GPU if o.gpu is None else o.gpu)


def build(o: SimOptions) -> SimJob:
    check_tp(o.tp)
    check_int_bounds({name: getattr(o, name) for name in INT_BOUNDS})
    check_ignored(o)
    policies = choose_policies(o.policy, o.compare)
    slo = parse_slo(o.slo)
    target_attainment = check_attainment(o.find_max_rate, o.target_attainment)
    if o.find_max_rate:
        check_search(slo, target_attainment)
    seed = DEFAULT_SEED if o.seed is None else o.seed
    spec = resolve_model(o.model, o.config, o.layers, o.kv_heads, o.head_dim) or get_preset(DEFAULT_MODEL)
    gpu = _gpu(o)
    kv_dtype = parse_dtype(o.dtype)
    kv_bits = dtype_bits(kv_dtype)
    spec, quantization, notes = _checkpoint_and_drafter(o, spec)
    max_model_len = _max_model_len(o, spec, notes)
    layout = _layout(o, spec, kv_bits, notes)
    check_vllm_paging(o, layout, kv_dtype)
    hybrid = pool_groups(layout, weighted=True) is not None  # weighted tables: core/pool/weighted.py
    if hybrid:
        check_weighted_tables(o, layout)
    plan = _memory_plan(o, spec, gpu, kv_bits, quantization, layout if hybrid else None)
    if hybrid:
        check_hybrid(o, spec, policies)
        check_align_block_fits(o, layout, plan.block_size)  # vLLM splits prefill under align, keys or not
        notes.append(groups_note(layout))
    steptime, source = _steptime(o, spec, plan, notes)
    scheduler = _scheduler(o, plan, max_model_len)
    workload = _workload(o, seed, plan.block_size)
    check_workload_options(o, workload, policies)
    speculation = _speculation(o, max_model_len, policies, seed, notes)
    sim = SimSetup.from_plan(plan, steptime, scheduler, null_blocks=0 if layout.layout == "ideal" else
                             VLLM_NULL_BLOCKS, cancel_fraction=o.cancel_fraction, seed=seed,
                             prefix_caching=o.prefix_caching, speculation=speculation)
    tiers = sim_tiers(o, spec, kv_dtype, kv_bits, sim, workload, policies)  # host and disk tiers (tiers.py)
    if tiers is not None:
        sim = replace(sim, tiers=tiers)
    if workload.has_prefix_ids and o.prefix_caching:
        notes.append(mooncake_keys_note(plan.block_size, hybrid))
    notes += model_notes(spec, steptime)
    lower_bound = hybrid and workload.has_prefix_ids and o.prefix_caching and keys_lower_bound(plan.block_size)
    refusals = start_refusals(o, spec, notes)
    return SimJob(workload, spec, plan, sim, source, tuple(notes), kv_dtype, tuple(policies), slo, o.find_max_rate,
                  target_attainment, lower_bound, tuple(refusals),
                  unservable(layout, plan.num_blocks, max_model_len, o.max_batched_tokens, spec))


def _checkpoint_and_drafter(o: SimOptions, spec: ModelSpec) -> tuple[ModelSpec, str | None, list[str]]:
    """The model with its checkpoint's weights and, for spec_tokens with a config's MTP layers, its drafter; the
    quantization it names; the notes begun (the drafter's, said once its layers join the target's)."""
    spec, quantization = checkpoint_weights(spec, o.model, o.config, o.weight_dtype, o.quantization)
    target_layers = spec.layers
    spec, drafter = with_config_drafter(spec, o.spec_tokens, o.spec_method, "sim")
    notes: list[str] = [] if drafter is None else [drafter]
    if spec.layers != target_layers:  # the drafter's layers joined the target's
        notes[-1] = concat(notes[-1], f"; the step time reads their KV once per step (as {spec.layers} layers)")
    return spec, quantization, notes


def _scheduler(o: SimOptions, plan: MemoryPlan, max_model_len: int) -> SchedulerConfig:
    """The scheduler's limits, preemption mode and timeout (inf: none); cancel_fraction checked with them."""
    timeout = None if o.timeout_s is None else parse_timeout(o.timeout_s)
    scheduler = SchedulerConfig(o.max_batched_tokens, plan.max_num_seqs, max_model_len, o.preempt.strip().lower(),
                                None if timeout == math.inf else timeout, o.fast_forward)
    if not 0 <= o.cancel_fraction <= 1:
        raise ParameterError(f"cancel_fraction {o.cancel_fraction:g} must be between 0 and 1", "cancel_fraction")
    return scheduler


def _speculation(o: SimOptions, max_model_len: int, policies: list[str], seed: int,
                 notes: list[str]) -> SimSpeculation | None:
    """Speculative decoding as the spec_* options ask (None without spec_tokens), checked and said in a note."""
    speculation = speculation_from_options(o.spec_tokens, o.spec_acceptance, o.spec_method, o.draft_cost,
                                           o.rollback_policy, seed)
    if speculation is not None:
        check_speculative_setup(speculation, o.max_batched_tokens, max_model_len, policies,
                                rollback_given=o.rollback_policy is not None)
        notes.append(speculation.describe())
    return speculation


def _memory_plan(o: SimOptions, spec: ModelSpec, gpu, kv_bits: int, quantization: str | None,
                 layout: KVLayout | None) -> MemoryPlan:
    """The plan `kvcalc size --gpu` makes for the same options (hardware.plan_memory); the options it reads
    are checked here first, so that plan_memory's own refusals are about the fit (core/plan reads them so)."""
    version = get_version(DEFAULT_VLLM_VERSION if o.vllm_version is None else o.vllm_version).name
    for name in ("max_batched_tokens", "max_seqs"):
        if getattr(o, name) is not None and getattr(o, name) < 1:
            raise ParameterError(f"{name} {getattr(o, name)} must be at least 1", name)
    return plan_memory(
        spec, gpu, kv_dtype_bits=kv_bits, block_size=o.block_size, tp=o.tp, memory_utilization=o.memory_utilization,
        quantization=quantization,  # with weights_bytes no weight is estimated: no vision tower is asked for
        vision_params=0 if o.weights_bytes is not None else checkpoint_vision_params(spec, o.model, o.config),
        weights_bytes=byte_count("weights_bytes", o.weights_bytes) if o.weights_bytes is not None else None,
        workspace_bytes=byte_count("workspace_bytes", o.workspace_bytes) if o.workspace_bytes is not None else None,
        max_batched_tokens=o.max_batched_tokens, max_seqs=o.max_seqs, layout=layout, vllm_version=version,
    )


def _max_model_len(o: SimOptions, spec: ModelSpec, notes: list[str]) -> int:
    """max_model_len, else the model's max_position_embeddings, else the scheduler's default (said in a note)."""
    if o.max_model_len is not None:
        max_model_len = o.max_model_len
    elif spec.max_position_embeddings is not None:
        max_model_len = spec.max_position_embeddings
    else:
        max_model_len = FALLBACK_MAX_MODEL_LEN
        notes.append(Note(f"{spec.name} has no max length; using {FALLBACK_MAX_MODEL_LEN} (set {{max_model_len}})",
                          "max_model_len"))
    if max_model_len < 1:
        raise ParameterError(f"max_model_len {max_model_len} must be at least 1", "max_model_len")
    return max_model_len


def _steptime(o: SimOptions, spec: ModelSpec, plan: MemoryPlan, notes: list[str]) -> tuple[StepTimeModel, str]:
    """The roofline step-time model of the options' efficiencies (attention calibrated by a bench run, if
    given) and swap bandwidth, and the sentence that says where latencies come from."""
    attn_eff = o.attn_eff
    if o.calibrate is not None:
        attn_eff, calibration = calibrated_attention_eff(o.calibrate, plan.gpu)
        notes.append(calibration)
    overhead_ms = finite_float("step_overhead_ms", o.step_overhead_ms)
    if overhead_ms < 0:
        raise ParameterError(f"step_overhead_ms {overhead_ms:g} must be >= 0", "step_overhead_ms")
    eff = Efficiencies(o.compute_eff, o.weight_eff, attn_eff, overhead_ms / 1e3)
    swap_bandwidth = DEFAULT_SWAP_BANDWIDTH_BYTES_PER_S if o.swap_bandwidth is None else float(
        byte_count("swap_bandwidth", o.swap_bandwidth, "bytes/s"))
    source = (f"roofline on {plan.gpu.name} x{o.tp}, efficiencies compute {o.compute_eff:g}, weights "
              f"{o.weight_eff:g}, attention {attn_eff:g}, overhead {o.step_overhead_ms:g} ms/step")
    return build_model(spec, plan, eff, swap_bandwidth_bytes_per_s=swap_bandwidth), source


def _layout(o: SimOptions, spec: ModelSpec, kv_bits: int, notes: list[str]) -> KVLayout:
    """The model's KV cache groups under layout / mamba_cache_mode as vLLM serves it (core/model/kv_groups.py)."""
    if o.block_size < 1:
        raise ParameterError(f"block_size {o.block_size} must be at least 1", "block_size")
    name = DEFAULT_LAYOUT if o.layout is None else o.layout.strip().lower()
    has_state = any(g.state is not None for g in spec.layer_groups)
    if o.mamba_cache_mode is not None and not has_state:
        raise ParameterError(f"mamba_cache_mode {o.mamba_cache_mode} applies to a model with recurrent layers "
                             f"(Mamba, linear attention); {spec.name} has none: drop mamba_cache_mode",
                             "mamba_cache_mode")
    mode = "none" if o.mamba_cache_mode is None else o.mamba_cache_mode.strip().lower()
    check_state_mode_given(mode)
    if o.tp != 1:
        spec.kv_heads_per_gpu(o.tp)  # an uneven split is refused naming the model and its layers
    return kv_layout(spec, kv_bits, o.block_size, name, o.tp, served_state_mode(o, mode, notes))


def without_speculation(job: SimJob) -> SimJob:
    """The same job with plain decoding: the side of the comparison that speculation is measured against."""
    return replace(job, sim=replace(job.sim, speculation=None))
