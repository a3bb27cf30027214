"""Options shared by several commands, declared once as `Annotated` aliases.

Integer counts go through `integer(flag)`: besides what `int()` reads (`4096`, `1_000_000`) it takes exact
scientific spellings (`1e12`), and a non-integer is refused in one line that names the option and the value
(`error: --tokens 'abc' is not an integer: …`) instead of typer's "is not a valid integer".

`--seed` is one option for every command (`SeedOpt`, or `seed_option(help)` where a command words its help
itself): a whole number in 0..2**63-1, which numpy's and torch's generators all take; a negative one is
refused here, naming --seed, before any work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import typer
from typer._click.exceptions import UsageError  # typer vendors click from 0.26 on (pyproject.toml)

from ..core.blocks import DEFAULT_BLOCK_SIZE
from ..core.sim.options import SimOptions
from ..core.units import format_int_short, parse_int
from .output import Format


def integer(flag: str) -> Callable[[Any], int]:
    """A typer `parser=` for an integer option `flag`: exact integers only, one-line error otherwise.

    It raises a usage error, which the root app prints as it is (`error: …`, exit 2); a ValueError would be
    reworded by typer.
    """

    def parse(value: Any) -> int:
        try:
            return parse_int(value, flag)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    return parse


MAX_SEED = 2**63 - 1


def _parse_seed(value: Any) -> int:
    seed = integer("--seed")(value)
    if not 0 <= seed <= MAX_SEED:
        problem = "is negative" if seed < 0 else "is too large"
        raise UsageError(f"--seed {format_int_short(seed)} {problem}: give a whole number from 0 to 2**63-1 "
                         "(e.g. --seed 0)")
    return seed


def seed_option(help: str) -> Any:
    """`typer.Option("--seed")` with this help; see the module docstring for what it accepts."""
    return typer.Option("--seed", parser=_parse_seed, metavar="<int>", help=help)


def check_output_path(flag: str, path: Path, what: str = "the file") -> None:
    """Fail before any work when `flag`'s output file cannot be created: its directory is missing, is not a
    directory, or the path is itself a directory, or it is `-` (which would make a file named '-': stdout
    carries the report), or opening it for writing fails (tried: an existing file is opened to append and left
    as it was, a new one is created and removed). Raises ValueError (one `error:` line, exit 2)."""
    if str(path) == "-":
        raise ValueError(f"{flag} -: give a file name; {what} is not written to standard output, which carries "
                         "the report")
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a directory: give a file name inside it")
    if not path.parent.is_dir():
        problem = "is not a directory" if path.parent.exists() else "does not exist"
        raise ValueError(f"{flag} {path}: the directory {path.parent} {problem}; create it or write {what} elsewhere")
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise ValueError(f"{flag} {path}: cannot be written ({reason}); give a path where {what} can be written"
                         ) from None
    if not existed:
        path.unlink()


def number(flag: str, example: str) -> Callable[[Any], float]:
    """A typer `parser=` for a float option `flag`: what `float()` reads (nan and inf too: the command checks
    the range), and one line naming the flag, the text and an `example` otherwise (typer's "is not a valid
    float" gives no fix)."""

    def parse(value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"{flag} {str(value)!r} is not a number: write e.g. {flag} {example}") from None
        text = str(value).strip().lower().lstrip("+-")
        if math.isinf(number) and text not in ("inf", "infinity"):  # 1e400: not the inf it would silently become
            raise UsageError(f"{flag} {str(value).strip()}: give a finite number ({str(value).strip()} overflows "
                             f"a float), e.g. {flag} {example}")
        return number

    return parse


def float_option(*param_decls: str, example: str, help: str | None, metavar: str = "<float>") -> Any:
    """`typer.Option` for a float with `number`'s one-line error."""
    return typer.Option(*param_decls, parser=number(param_decls[0], example), metavar=metavar, help=help)


def int_option(*param_decls: str, help: str) -> Any:
    """`typer.Option` for an integer count that accepts `1e12` and `1_000_000` (see `integer`)."""
    return typer.Option(*param_decls, parser=integer(param_decls[0]), metavar="<int>", help=help)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")]
FormatOpt = Annotated[
    Format, typer.Option("--format", case_sensitive=False, help="Output format: table, json, csv, markdown.")
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="A built-in model preset (kvcalc size lists them), or org/name "
                                         "read offline from the local Hugging Face hub cache.")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="A Hugging Face config.json, or the folder that holds it.")
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help=(
    "KV precision: fp32, fp16, bf16, fp8, int8, int4; as vLLM pages them: fp8_per_token_head, int8_per_token_head "
    "(+ a float32 scale per KV head for K and V), nvfp4 (d/2 + d/16 B a head), fp8_ds_mla (656 B a MLA token)."))]
BlockOpt = Annotated[
    int | None, int_option("--block", "-b", help=f"Block size in tokens (default: {DEFAULT_BLOCK_SIZE}).")
]  # one block size (size, share); frag takes several (--block repeated)
LayersOpt = Annotated[int | None, int_option("--layers", help="Number of layers (overrides the model's).")]
KvHeadsOpt = Annotated[int | None, int_option("--kv-heads", help="Number of KV heads (overrides the model's).")]
HeadDimOpt = Annotated[int | None, int_option("--head-dim", help="Head dimension (overrides the model's).")]
SeedOpt = Annotated[int | None, seed_option("Seed for constructed samples (runs are reproducible).")]
SpecTokensOpt = Annotated[int | None, int_option(
    "--spec-tokens", help="Speculative decoding: K drafts per step; adds each sequence's peak blocks (its last "
                          "step reserves n + K drafts + lookahead slots).")]
SpecMethodOpt = Annotated[str | None, typer.Option(
    "--spec-method", help="With --spec-tokens: draft (a draft model; default), eagle (an EAGLE head) or mtp (the "
                          "model's multi-token-prediction layers): K lookahead slots, as vLLM reserves; in size, "
                          "their KV too; or ngram (no lookahead, no drafter KV).")]


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
