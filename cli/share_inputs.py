"""`kvcalc share`'s flags as given (`ShareOptions`) and the checked inputs of its three modes (`ShareInputs`):
scenario (forks of one prompt), trace (prefix-cache replay), capacity (--capacity or the tiers); which flags
belong to which mode, and which need a model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..core.blocks import DEFAULT_BLOCK_SIZE
from ..core.dtypes import DEFAULT_DTYPE, DTYPE_BITS, parse_dtype
from .output import Format, resolve_format, warn_notes

if TYPE_CHECKING:
    from ..core.model.models import ModelSpec

DEFAULTS: dict[str, Any] = {"prefix": 1000, "branches": 4, "gen": 200, "block": DEFAULT_BLOCK_SIZE, "mode": "parallel"}


@dataclasses.dataclass(frozen=True)
class ShareOptions:
    """The flags of `kvcalc share` as typed (None: not given)."""

    prefix: int | None
    branches: int | None
    gen: int | None
    mode: str | None
    seed: int | None
    block: int | None
    trace: tuple[str, str] | None
    limit: int | None
    capacity_blocks: int | None
    memory: str | None
    capacity: str | None
    blocks: str | None
    gpu_cache: str | None
    host_cache: str | None
    disk_cache: str | None
    host_bw: str | None
    disk_bw: str | None
    tier_mode: str | None
    gpu: str | None
    tp: int | None
    plot: Path | None
    layout: str | None
    mamba_cache_mode: str | None
    model: str | None
    config: Path | None
    dtype: str | None
    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    json_flag: bool
    fmt: Format

    def given(self, *flags: str) -> list[str]:
        """Those of `flags` given on the command line, in the order named."""
        return [flag for flag in flags if getattr(self, flag.removeprefix("--").replace("-", "_")) is not None]


SCENARIO_FLAGS = ("--prefix", "--branches", "--gen", "--mode", "--seed")
TRACE_FLAGS = ("--limit", "--capacity-blocks", "--memory")
CURVE_FLAGS = ("--capacity", "--blocks", "--gpu-cache", "--host-cache", "--disk-cache", "--host-bw", "--disk-bw",
               "--tier-mode", "--gpu", "--tp", "--plot")
GROUP_FLAGS = ("--layout", "--mamba-cache-mode")


@dataclasses.dataclass(frozen=True)
class ShareInputs:
    """The mode and what it runs on, every combination of flags checked."""

    opts: ShareOptions
    mode: Literal["scenario", "trace", "capacity"]
    fmt: Format
    spec: ModelSpec | None
    dtype: str
    bits: int
    block: int


def share_inputs(o: ShareOptions) -> ShareInputs:
    """Parse and check the flags in the order the command always has (the first problem is the one named)."""
    if o.block is not None and o.blocks is not None:  # --blocks sweeps its own sizes: a --block beside it is unused
        raise ValueError(f"--block {o.block} and --blocks {o.blocks} both give block sizes: give --blocks to sweep "
                         "several, or --block for one")
    block = DEFAULTS["block"] if o.block is None else o.block
    spec = None
    if any(v is not None for v in (o.model, o.config, o.layers, o.kv_heads, o.head_dim)):  # else it is None
        from ..core.model.models import resolve_model

        spec = resolve_model(o.model, o.config, o.layers, o.kv_heads, o.head_dim)
        if spec is not None:
            warn_notes(spec.notes)
    if spec is None and o.dtype is not None:
        raise ValueError("--dtype applies to KV bytes: give a model too (--model, --config or explicit dimensions)")
    dtype = parse_dtype(DEFAULT_DTYPE if o.dtype is None else o.dtype)  # --dtype "" is an error, not the default
    fmt = resolve_format(o.json_flag, o.fmt)
    mode = _mode(o, spec is not None)
    if spec is not None and mode != "capacity" and (o.layout or "vllm").strip().lower() == "vllm":
        from ..core.model.vllm_pool_layout import check_vllm_block_size

        check_vllm_block_size(block)  # the pool is vLLM's (as sim and size --gpu): a block size vLLM takes
    return ShareInputs(o, mode, fmt, spec, dtype, DTYPE_BITS[dtype], block)


def _mode(o: ShareOptions, has_model: bool) -> Literal["scenario", "trace", "capacity"]:
    """The mode the flags ask for; a flag of another mode, or one that needs a model, is refused."""
    scenario_given, trace_given = o.given(*SCENARIO_FLAGS), o.given(*TRACE_FLAGS)
    curve_given, groups_given = o.given(*CURVE_FLAGS), o.given(*GROUP_FLAGS)
    if groups_given and not has_model:
        raise ValueError(f"{groups_given[0]} applies to a model's KV cache groups: give a model too (--model, "
                         "--config or explicit dimensions)")
    if curve_given:
        if "--mamba-cache-mode" in groups_given:  # --layout: how a cached block's bytes are paged
            raise ValueError("--mamba-cache-mode applies to scenario and trace modes, not to --capacity or the "
                             "tiers (a cached block carries a state saved at its boundary): drop it")
        pool_given = scenario_given + [flag for flag in trace_given if flag != "--limit"]
        if pool_given:
            which = "scenario mode" if scenario_given else "the trace replay's pool"
            raise ValueError(f"{', '.join(pool_given)} ({which}) and {', '.join(curve_given)} (the prefix-cache "
                             "size: --capacity and the tiers) are different modes; drop one of them")
        if o.trace is None:  # name the flags given (was always "--capacity and the tier options", even for --plot)
            verb = "applies" if len(curve_given) == 1 else "apply"
            raise ValueError(f"{', '.join(curve_given)} {verb} to a trace's prefix-cache replay (--capacity and the "
                             "tiers): add --trace mooncake FILE")
        return "capacity"
    if o.trace is None:
        if trace_given:
            raise ValueError(f"{', '.join(trace_given)} applies only to trace mode: add --trace KIND FILE")
        return "scenario"
    if scenario_given:
        raise ValueError(f"{', '.join(scenario_given)} applies only to scenario mode: drop --trace or drop them")
    if o.capacity_blocks is not None and o.memory is not None:
        raise ValueError("give either --capacity-blocks or --memory, not both")
    if o.memory is not None and not has_model:
        raise ValueError("--memory needs a model to turn bytes into blocks: add --model (or --config)")
    return "trace"


def run_capacity(inputs: ShareInputs) -> None:
    """--capacity / the tiers (cli/share_capacity.py): the checkpoint's weights, then the sweep and its report."""
    from . import share_capacity

    o, spec, quantization = inputs.opts, inputs.spec, None
    if spec is not None:  # the weights as the checkpoint stores them (fp8 DeepSeek-V3, mxfp4 gpt-oss experts)
        from ..core.sim.hardware import checkpoint_weights

        spec, quantization = checkpoint_weights(spec, o.model, o.config)
    options = share_capacity.parse_options(o.trace, o.limit, inputs.block, o.blocks, o.capacity, o.gpu_cache,
                                           o.host_cache, o.disk_cache, o.host_bw, o.disk_bw, o.tier_mode, o.gpu,
                                           o.tp, o.plot, spec, inputs.bits, quantization, o.layout)
    share_capacity.run(options, spec, inputs.dtype, inputs.bits, inputs.fmt)
