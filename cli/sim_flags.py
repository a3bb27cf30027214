"""`kvcalc sim`'s options, one flag per field of core.sim.options.SimOptions, declared once as `Annotated` aliases
(`kvcalc plan` reuses those it shares), and the SimOptions a command's parameters give. Apart from cli/options.py
(the options every command shares) so that the other commands start without SimOptions and the model modules its
defaults come from (~0.03 s CPU)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.sim.options import SimOptions
from .options import ConfigOpt as ConfigOpt  # these seven re-exported: sim.py and plan.py read every flag here
from .options import FormatOpt as FormatOpt
from .options import HeadDimOpt as HeadDimOpt
from .options import JsonOpt as JsonOpt
from .options import KvHeadsOpt as KvHeadsOpt
from .options import LayersOpt as LayersOpt
from .options import ModelOpt as ModelOpt
from .options import float_option, int_option, seed_option

# `kvcalc sim`'s options (and `plan`'s where the flag means the same): one per field of
# core.sim.options.SimOptions, whose metadata holds each help text (tests/cli/test_sim_options.py checks that every
# field has exactly one flag, the flag its metadata names, and the field's default).
_SIM_FIELDS = {f.name: f for f in fields(SimOptions)}


def _sim(name: str) -> str | None:
    help_text: str | None = _SIM_FIELDS[name].metadata["help"]
    return help_text


def sim_options(values: dict[str, Any]) -> SimOptions:
    """SimOptions from a command's parameters (`no_X` for a negated field X); fields not among them keep their
    defaults."""
    given: dict[str, Any] = {}
    for name, f in _SIM_FIELDS.items():
        negate = f.metadata.get("negate", False)
        key = f"no_{name}" if negate else name
        if key in values:
            given[name] = not values[key] if negate else values[key]
    return SimOptions(**given)


TraceOpt = Annotated[tuple[str, str] | None, typer.Option("--trace", metavar="KIND FILE", help=_sim("trace"))]
TimeScaleOpt = Annotated[float, float_option("--time-scale", example="1", help=_sim("time_scale"))]
LimitOpt = Annotated[int | None, int_option("--limit", help=_sim("limit"))]
RateOpt = Annotated[str | None, typer.Option("--rate", metavar="REQ/S", help=_sim("rate"))]
ArrivalOpt = Annotated[str | None, typer.Option("--arrival", help=_sim("arrival"))]
BurstinessOpt = Annotated[float | None, float_option("--burstiness", example="0.5", help=_sim("burstiness"))]
RequestsOpt = Annotated[int | None, int_option("--requests", help=_sim("requests"))]
PromptDistOpt = Annotated[str | None, typer.Option("--prompt-dist", help=_sim("prompt_dist"))]
OutputDistOpt = Annotated[str | None, typer.Option("--output-dist", help=_sim("output_dist"))]
KvDtypeOpt = Annotated[str, typer.Option("--dtype", help=_sim("dtype"))]
WeightDtypeOpt = Annotated[str | None, typer.Option("--weight-dtype", help=_sim("weight_dtype"))]
WeightsBytesOpt = Annotated[str | None, typer.Option("--weights-bytes", help=_sim("weights_bytes"))]
GpuOpt = Annotated[str | None, typer.Option("--gpu", help=_sim("gpu"))]
GpuMemoryOpt = Annotated[str | None, typer.Option("--gpu-memory", help=_sim("gpu_memory"))]
BandwidthOpt = Annotated[str | None, typer.Option("--bandwidth", help=_sim("bandwidth"))]
FlopsOpt = Annotated[float | None, float_option("--flops", example="989e12", help=_sim("flops"))]
TpOpt = Annotated[int, int_option("--tp", help=_sim("tp"))]
MemoryUtilizationOpt = Annotated[
    float | None, float_option("--memory-utilization", example="0.9", help=_sim("memory_utilization"))]
VllmVersionOpt = Annotated[str | None, typer.Option("--vllm-version", help=_sim("vllm_version"))]
QuantizationOpt = Annotated[str | None, typer.Option("--quantization", help=_sim("quantization"))]
WorkspaceBytesOpt = Annotated[str | None, typer.Option("--workspace-bytes", help=_sim("workspace_bytes"))]
SimBlockOpt = Annotated[int, int_option("--block", "-b", help=_sim("block_size"))]
LayoutOpt = Annotated[str | None, typer.Option("--layout", metavar="vllm|ideal", help=_sim("layout"))]
MambaCacheModeOpt = Annotated[
    str | None, typer.Option("--mamba-cache-mode", metavar="none|align|all", help=_sim("mamba_cache_mode"))]
PolicyOpt = Annotated[str | None, typer.Option("--policy", help=_sim("policy"))]
CompareOpt = Annotated[str | None, typer.Option("--compare", help=_sim("compare"))]
MaxBatchedTokensOpt = Annotated[int, int_option("--max-batched-tokens", help=_sim("max_batched_tokens"))]
MaxSeqsOpt = Annotated[int | None, int_option("--max-seqs", help=_sim("max_seqs"))]
MaxModelLenOpt = Annotated[int | None, int_option("--max-model-len", help=_sim("max_model_len"))]
PreemptOpt = Annotated[str, typer.Option("--preempt", help=_sim("preempt"))]
SwapBandwidthOpt = Annotated[str | None, typer.Option("--swap-bandwidth", help=_sim("swap_bandwidth"))]
CancelFractionOpt = Annotated[float, float_option("--cancel-fraction", example="0", help=_sim("cancel_fraction"))]
TimeoutOpt = Annotated[str | None, typer.Option("--timeout", help=_sim("timeout_s"))]
SimSeedOpt = Annotated[int | None, seed_option(_sim("seed"))]
ComputeEffOpt = Annotated[float, float_option("--compute-eff", example="0.6", help=_sim("compute_eff"))]
WeightEffOpt = Annotated[float, float_option("--weight-eff", example="0.8", help=_sim("weight_eff"))]
AttnEffOpt = Annotated[float, float_option("--attn-eff", example="0.8", help=_sim("attn_eff"))]
StepOverheadMsOpt = Annotated[float, float_option("--step-overhead-ms", example="0.5", help=_sim("step_overhead_ms"))]
CalibrateOpt = Annotated[Path | None, typer.Option("--calibrate", help=_sim("calibrate"))]
SloOpt = Annotated[str | None, typer.Option("--slo", help=_sim("slo"))]
MaxRateOpt = Annotated[bool, typer.Option("--max-rate", help=_sim("find_max_rate"))]
AttainmentOpt = Annotated[float | None, float_option("--attainment", example="0.9", help=_sim("target_attainment"))]
NoPrefixCachingOpt = Annotated[bool, typer.Option("--no-prefix-caching", help=_sim("prefix_caching"))]
NoFastForwardOpt = Annotated[bool, typer.Option("--no-fast-forward", help=_sim("fast_forward"))]
HostCacheOpt = Annotated[str | None, typer.Option("--host-cache", help=_sim("host_cache"))]
DiskCacheOpt = Annotated[str | None, typer.Option("--disk-cache", help=_sim("disk_cache"))]
HostBwOpt = Annotated[str | None, typer.Option("--host-bw", help=_sim("host_bw"))]
DiskBwOpt = Annotated[str | None, typer.Option("--disk-bw", help=_sim("disk_bw"))]
SimSpecTokensOpt = Annotated[int | None, int_option("--spec-tokens", help=_sim("spec_tokens"))]
SpecAcceptanceOpt = Annotated[
    float | None, float_option("--spec-acceptance", example="0.7", metavar="A", help=_sim("spec_acceptance"))]
SimSpecMethodOpt = Annotated[str | None, typer.Option("--spec-method", help=_sim("spec_method"))]
DraftCostOpt = Annotated[
    float | None, float_option("--draft-cost", example="0.1", metavar="F", help=_sim("draft_cost"))]
RollbackPolicyOpt = Annotated[str | None, typer.Option("--rollback-policy", help=_sim("rollback_policy"))]
