"""`kvcalc share`: prefix sharing, forks and copy-on-write through the real block pool.

The command parses the flags (the options below), checks them and picks the mode (cli/share_inputs.py), then
runs it and hands the result to its report: scenario (cli/share_scenario.py), trace (cli/share_trace.py) or
capacity and tiers (cli/share_capacity.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..core.dtypes import DEFAULT_DTYPE
from .options import (
    BlockOpt,
    ConfigOpt,
    FormatOpt,
    HeadDimOpt,
    JsonOpt,
    KvHeadsOpt,
    LayersOpt,
    ModelOpt,
    int_option,
    seed_option,
)
from .output import Format, emit
from .share_inputs import DEFAULTS, ShareOptions, run_capacity, share_inputs

# NOTE: each mode imports what only it uses (forks, the hybrid groups, the capacity sweep, a model and its
# memory) inside its branch: a plain trace replay (`share --trace mooncake F`) then starts ~0.15 s CPU sooner.

PrefixOpt = Annotated[
    int | None,
    int_option("--prefix", help=f"Prompt tokens shared by all branches (default: {DEFAULTS['prefix']:,})."),
]
BranchesOpt = Annotated[
    int | None, int_option("--branches", help=f"Branches K (samples or beams; default: {DEFAULTS['branches']}).")
]
GenOpt = Annotated[
    int | None, int_option("--gen", help=f"Tokens each branch generates (default: {DEFAULTS['gen']}).")
]
ModeOpt = Annotated[
    str | None, typer.Option("--mode", help="parallel (K samples) or beam (seeded beam selection).")
]
ShareSeedOpt = Annotated[int | None, seed_option("With --mode beam: seed of the beam selection (default: 0).")]
TraceOpt = Annotated[
    tuple[str, str] | None,
    typer.Option("--trace", metavar="KIND FILE", help="Replay a real trace: 'mooncake F' (or 'azure F')."),
]
LimitOpt = Annotated[int | None, int_option("--limit", help="With --trace: only the first N requests.")]
CapacityBlocksOpt = Annotated[
    int | None, int_option("--capacity-blocks", help="With --trace: pool size in blocks (default unlimited).")
]
MemoryOpt = Annotated[
    str | None, typer.Option("--memory", help="With --trace and a model: KV memory for the pool, e.g. 40GiB.")
]
CapacityOpt = Annotated[str | None, typer.Option("--capacity", help=(
    "With --trace: prefix-cache sizes to sweep, tokens (3M) or bytes with a model (4GiB): a list 1M,4M or a "
    "log range 1M:64M[:POINTS]; hit rate per size, the unbounded ceiling, the sizes reaching 50/90/99 %."))]
BlocksOpt = Annotated[
    str | None, typer.Option("--blocks", help="With --capacity: block sizes to sweep, e.g. 16,64,512.")
]
GpuCacheOpt = Annotated[str | None, typer.Option("--gpu-cache", help=(
    "With --trace: GPU prefix cache (tokens or bytes); with --host-cache/--disk-cache, a tiered cache."))]
HostCacheOpt = Annotated[str | None, typer.Option("--host-cache", help="Host (CPU) tier below --gpu-cache.")]
DiskCacheOpt = Annotated[str | None, typer.Option("--disk-cache", help="Disk tier below --host-cache.")]
HostBwOpt = Annotated[str | None, typer.Option("--host-bw", help="Host link per GPU (default 25GB/s).")]
DiskBwOpt = Annotated[str | None, typer.Option("--disk-bw", help="Disk read per GPU (default 5GB/s).")]
TierModeOpt = Annotated[str | None, typer.Option("--tier-mode", metavar="exclusive|inclusive", help=(
    "exclusive (default): evictions demote a tier down; inclusive: write-through (vLLM offload, LMCache)."))
]
GpuOpt = Annotated[str | None, typer.Option("--gpu", help="With tiers and a model: GPU of the load-or-recompute "
                                                      "rule (default H100-SXM).")]
TpOpt = Annotated[int | None, int_option("--tp", help="With --capacity or tiers and a model: tensor parallel.")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="With --capacity: write hit rate vs capacity (.png/.svg).")
                ]
LayoutOpt = Annotated[str | None, typer.Option("--layout", metavar="vllm|ideal", help=(
    "With a model: how its KV cache groups are paged, vllm (default) or ideal (as kvcalc frag)."))]
MambaCacheModeOpt = Annotated[str | None, typer.Option("--mamba-cache-mode", metavar="none|align|all", help=(
    "With a Mamba / linear-attention hybrid: vLLM's state prefix caching, none (default), align or all (Mamba-2: "
    "a state at every block, the block aligned to the kernel's chunk)."))]
ShareDtypeOpt = Annotated[
    str | None, typer.Option("--dtype", help=f"With a model: KV precision (default {DEFAULT_DTYPE}).")
]


def command(
    prefix: PrefixOpt = None, branches: BranchesOpt = None, gen: GenOpt = None, mode: ModeOpt = None,
    seed: ShareSeedOpt = None, block: BlockOpt = None, trace: TraceOpt = None, limit: LimitOpt = None,
    capacity_blocks: CapacityBlocksOpt = None, memory: MemoryOpt = None, capacity: CapacityOpt = None,
    blocks: BlocksOpt = None, gpu_cache: GpuCacheOpt = None, host_cache: HostCacheOpt = None,
    disk_cache: DiskCacheOpt = None, host_bw: HostBwOpt = None, disk_bw: DiskBwOpt = None,
    tier_mode: TierModeOpt = None, gpu: GpuOpt = None, tp: TpOpt = None, plot: PlotOpt = None,
    layout: LayoutOpt = None, mamba_cache_mode: MambaCacheModeOpt = None, model: ModelOpt = None,
    config: ConfigOpt = None, dtype: ShareDtypeOpt = None, layers: LayersOpt = None, kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None, json_flag: JsonOpt = False, fmt: FormatOpt = Format.table,
) -> None:
    """Sharing through the real block pool. Scenario mode (default): K branches forked from one P-token
    prompt each generate G tokens — logical vs physical blocks, copy-on-write copies, blocks and bytes
    saved, peak blocks. Trace mode (--trace mooncake F): prefix-cache replay in arrival order — hit tokens,
    token hit rate, peak blocks, LRU evictions, with and without prefix caching. Capacity mode (--trace with
    --capacity SIZES, or --gpu-cache/--host-cache/--disk-cache): hit rate against prefix-cache size from one
    LRU stack pass, and a GPU → host → disk cache's hits, traffic and load-or-recompute verdict."""
    inputs = share_inputs(ShareOptions(
        prefix=prefix, branches=branches, gen=gen, mode=mode, seed=seed, block=block, trace=trace, limit=limit,
        capacity_blocks=capacity_blocks, memory=memory, capacity=capacity, blocks=blocks, gpu_cache=gpu_cache,
        host_cache=host_cache, disk_cache=disk_cache, host_bw=host_bw, disk_bw=disk_bw, tier_mode=tier_mode, gpu=gpu,
        tp=tp, plot=plot, layout=layout, mamba_cache_mode=mamba_cache_mode, model=model, config=config, dtype=dtype,
        layers=layers, kv_heads=kv_heads, head_dim=head_dim, json_flag=json_flag, fmt=fmt))
    if inputs.mode == "capacity":
        run_capacity(inputs)  # the sweep prints its own report (cli/share_capacity.py)
        return
    if inputs.mode == "scenario":
        from .share_scenario import scenario_report

        emit(scenario_report(inputs), inputs.fmt)
        return
    from .share_trace import trace_report

    emit(trace_report(inputs), inputs.fmt)
