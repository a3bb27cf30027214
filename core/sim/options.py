"""The options of `kvcalc sim`, declared once: each field of `SimOptions` carries its default and its help;
cli/sim_flags.py declares one flag per field (an `Annotated` alias reading the help here; a test checks that every
field has exactly one, with this flag and default), and scripts and tests construct them directly.

A field's flag is `--` + its name with dashes, unless its metadata names another (`flag`); `negate` marks a
flag that turns a default-True field off (`--no-prefix-caching`). `None` means "not given" where an option
that does not apply is refused rather than ignored (constructed-workload options with a trace,
--swap-bandwidth without swapping, --seed with a trace and no cancellations): the help states the default
that applies otherwise (the DEFAULT_* constants, which the code applies too).

Kept free of numpy so that building the command line costs no import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..blocks import DEFAULT_BLOCK_SIZE
from ..dtypes import DEFAULT_DTYPE
from ..model.layers import MAX_TP
from ..model.vllm_memory import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_VLLM_VERSION,
    LARGE_GPU_BYTES,
    MAX_NUM_SEQS_LARGE_GPU,
    MAX_NUM_SEQS_OTHER_GPU,
    VLLM_VERSIONS,
)
from ..share.tier_links import DEFAULT_DISK_BANDWIDTH, DEFAULT_HOST_BANDWIDTH
from .checks import INT32_MAX, MAX_REQUESTS

DEFAULT_MODEL = "OPT-13B"
DEFAULT_GPU = "A100-40GB"
DEFAULT_RATE = 1.0
DEFAULT_REQUESTS = 1000
DEFAULT_ARRIVAL = "poisson"
DEFAULT_PROMPT_DIST = "lognormal:mean=161,sigma=1.0"  # ShareGPT-like (vLLM paper, Fig. 11)
DEFAULT_OUTPUT_DIST = "lognormal:mean=338,sigma=1.0"
DEFAULT_POLICY = "paged"
DEFAULT_SWAP_BANDWIDTH_BYTES_PER_S = DEFAULT_HOST_BANDWIDTH  # the host link's (share's tier link, one definition)
DEFAULT_SWAP_BANDWIDTH = f"{DEFAULT_SWAP_BANDWIDTH_BYTES_PER_S / 1e9:g}GB"  # as the help writes it
DEFAULT_SEED = 0
DEFAULT_ATTAINMENT = 0.9
DEFAULT_KV_DTYPE = DEFAULT_DTYPE


def option(default: Any, help: str | None = None, **cli: Any) -> Any:
    """A field with its default and, for the command line, its help (None: the shared option's) and any of
    `flag`, `short`, `metavar`, `negate`, `example` (a float option's value in its error message; else the
    default)."""
    return field(default=default, metadata={"help": help, **cli})


@dataclass(frozen=True)
class SimOptions:
    # workload: a trace, or a constructed one
    # The path as text: typer would turn an empty one into Path(""), which is "." (a directory).
    trace: tuple[str, str] | None = option(
        None, "A trace file: 'azure F' or 'mooncake F' (prefix ids); its own arrivals and lengths.",
        metavar="KIND FILE")
    time_scale: float = option(1.0, "With --trace: arrivals x times faster (0.5 = slower).")
    limit: int | None = option(None, "With --trace: only its first N requests.")
    rate: str | None = option(None, "Constructed (no --trace): mean arrival rate, requests/s; inf = all at time 0 "
                                    f"(an offline batch; default: {DEFAULT_RATE:g}).", metavar="REQ/S")
    arrival: str | None = option(None, f"Constructed: poisson or gamma arrivals (default: {DEFAULT_ARRIVAL}).")
    burstiness: float | None = option(None, "With --arrival gamma: shape b (1 = Poisson, < 1 burstier).", example="0.5")
    requests: int | None = option(
        None, f"Constructed: number of requests, at most {MAX_REQUESTS:,} (default: {DEFAULT_REQUESTS:,}).")
    prompt_dist: str | None = option(
        None, f"Constructed prompt lengths (as frag --dist; default: {DEFAULT_PROMPT_DIST}).")
    output_dist: str | None = option(
        None, f"Constructed output lengths (as frag --dist; default: {DEFAULT_OUTPUT_DIST}).")
    # model (the shared options of every command)
    model: str | None = option(None)
    config: Path | None = field(default=None, metadata={"help": None})
    layers: int | None = option(None)
    kv_heads: int | None = option(None)
    head_dim: int | None = option(None)
    dtype: str = option(DEFAULT_DTYPE, "KV precision: fp32, fp16, bf16, fp8, int8, int4.")
    weight_dtype: str | None = option(
        None, "Weight precision (default: the checkpoint's, as size --gpu: e.g. fp8 for DeepSeek-V3, bf16 if none).")
    weights_bytes: str | None = option(None, "Weights per replica, e.g. 26GB (overrides).")
    # hardware and memory
    gpu: str | None = option(None, f"A100-40GB, A100-80GB, H100-SXM or H200 (default: {DEFAULT_GPU}).")
    gpu_memory: str | None = option(None, "Custom GPU: memory, e.g. 80GiB.")
    bandwidth: str | None = option(None, "Custom GPU: HBM bytes/s, e.g. 3.35e12.")
    flops: float | None = option(None, "Custom GPU: dense bf16 FLOP/s, e.g. 989e12 (finite).", example="989e12")
    tp: int = option(1, "Tensor-parallel GPUs per replica: divides the KV heads or is a multiple of them "
                        f"(as kvcalc size); at most {MAX_TP:,}.")
    memory_utilization: float | None = option(
        None, "Share of GPU memory vLLM requests (gpu_memory_utilization; default: the vLLM version's, "
              + ", ".join(f"{v.default_gpu_memory_utilization:g} for {name}" for name, v in VLLM_VERSIONS.items())
              + ").", example="0.9")
    vllm_version: str | None = option(
        None, "The vLLM whose start-up memory is planned, as size --gpu --vllm-version: "
              f"{', '.join(VLLM_VERSIONS)} (default: {DEFAULT_VLLM_VERSION}, standing for it and later).")
    quantization: str | None = option(
        None, "vLLM's --quantization, as size --gpu: fp8 (linear layers in fp8, embeddings and head in 16 bits) or "
              "mxfp4 (routed experts in mxfp4); default: the checkpoint's.")
    workspace_bytes: str | None = option(None, "Activation peak of vLLM's profiling run (overrides the estimate).")
    block_size: int = option(DEFAULT_BLOCK_SIZE, f"Paged: block size in tokens, at most {INT32_MAX:,}.",
                                  flag="--block", short="-b")
    layout: str | None = option(
        None, "How a hybrid model's KV cache groups are paged: vllm (default; vLLM v1's hybrid allocator: groups "
              "padded to one size, one page size, a Mamba hybrid's block raised to hold a state) or ideal (each "
              "layer type on its own at the block size given).", metavar="vllm|ideal")
    mamba_cache_mode: str | None = option(
        None, "A Mamba / linear-attention hybrid's prefix caching of the state (vLLM's mamba_cache_mode): none "
              "(the default: one state page per running request, no prefix-cache hits), align (two pages: the "
              "running state and the last one saved at a block boundary, which hits can restore), all (Mamba-2: "
              "a state at every block, the block aligned to the kernel's chunk).",
        metavar="none|align|all")
    # policies and scheduling
    policy: str | None = option(
        None, f"paged, reserve-max, reserve-pow2 or reserve-oracle (default: {DEFAULT_POLICY}).")
    compare: str | None = option(
        None, "Instead of --policy: several distinct policies side by side, comma-separated.")
    max_batched_tokens: int = option(DEFAULT_MAX_NUM_BATCHED_TOKENS,
                                     f"Token budget per step (max_num_batched_tokens), at most {INT32_MAX:,}.")
    max_seqs: int | None = option(
        None, "Most running requests, and the sampler warm-up's (vLLM's max_num_seqs; default: "
              f"{MAX_NUM_SEQS_LARGE_GPU:,} on a GPU of {LARGE_GPU_BYTES // 2**30} GiB or more other than an A100, else "
              f"{MAX_NUM_SEQS_OTHER_GPU}, as vllm serve); at most {INT32_MAX:,}.")
    max_model_len: int | None = option(
        None, "Longest request, prompt + output tokens (default: the model's max_position_embeddings); "
              f"at most {INT32_MAX:,}.")
    preempt: str = option("recompute", "recompute or swap.")
    swap_bandwidth: str | None = option(
        None, f"With --preempt swap: swap bytes/s over the host link (default: {DEFAULT_SWAP_BANDWIDTH}).")
    cancel_fraction: float = option(0.0, "Share of requests cancelled midway.")
    # Text, as rate: a float would read an overflowing 1e400 as inf, the documented "no timeout".
    timeout_s: str | None = option(
        None, "Drop requests without a first token after s seconds (inf = no timeout, the default).", flag="--timeout")
    seed: int | None = option(None, "Seed of the constructed samples and of --cancel-fraction's picks (default: "
                                    f"{DEFAULT_SEED}); runs are reproducible.")
    # the step-time model
    compute_eff: float = option(0.6, "Share of peak FLOP/s reached.")
    weight_eff: float = option(0.8, "Share of bandwidth when reading weights.")
    attn_eff: float = option(0.8, "Share of bandwidth when reading KV.")
    step_overhead_ms: float = option(0.5, "Fixed time per step, ms.")
    calibrate: Path | None = field(default=None, metadata={"help": "kvcalc bench --json output: sets --attn-eff."})
    # targets
    slo: str | None = option(None, "Targets, each once, e.g. ttft=2,tpot=100ms,e2e=60 (seconds).")
    find_max_rate: bool = option(False, "Search each policy's highest rate under --slo.", flag="--max-rate")
    target_attainment: float | None = option(
        None, f"With --max-rate: share of requests that must meet the SLO (default: {DEFAULT_ATTAINMENT:g}).",
        flag="--attainment", example=f"{DEFAULT_ATTAINMENT:g}")
    prefix_caching: bool = option(True, "Ignore Mooncake prefix ids.", flag="--no-prefix-caching", negate=True)
    fast_forward: bool = option(True, "Simulate every step one by one.", flag="--no-fast-forward", negate=True)
    # prefix-cache tiers below the GPU pool (core/sim/tiers.py), read as kvcalc share's tier options
    host_cache: str | None = option(
        None, "Host (CPU) prefix-cache tier below the GPU pool, tokens or bytes per GPU (3M, 100GiB): GPU evictions "
              "demote to it (exclusive), a lower-tier prefix is loaded when that beats recomputing it.")
    disk_cache: str | None = option(None, "Disk tier below --host-cache: host evictions demote to it.")
    host_bw: str | None = option(
        None, f"With --host-cache: host link per GPU, bytes/s (default: {DEFAULT_HOST_BANDWIDTH / 1e9:g}GB/s).")
    disk_bw: str | None = option(
        None, f"With --disk-cache: disk read per GPU, bytes/s (default: {DEFAULT_DISK_BANDWIDTH / 1e9:g}GB/s).")
    # speculative decoding
    spec_tokens: int | None = option(
        None, f"Speculative decoding: K drafts verified per decode step (1 + K query tokens), at most {INT32_MAX:,}; "
              "off by default.",
        metavar="K")
    spec_acceptance: float | None = option(
        None, "With --spec-tokens: probability A that a draft is accepted (independently, until the first "
              "rejection; seeded).", metavar="A", example="0.7")
    spec_method: str | None = option(
        None, "With --spec-tokens: draft (a draft model: K lookahead slots per step, its KV not counted; the "
              "default), mtp or eagle (the model's multi-token-prediction layers draft: K lookahead slots, their KV "
              "in the pool as size counts it) or ngram (no drafter model, no lookahead).")
    draft_cost: float | None = option(
        None, "With --spec-method draft: one draft pass as a share of the target's decode step (default: 0.1).",
        metavar="F", example="0.1")
    rollback_policy: str | None = option(
        None, "With --spec-tokens and the paged policy: keep (vLLM v1: rejected slots' blocks stay, the default) "
              "or free (SGLang: blocks past the accepted tokens are freed).")
