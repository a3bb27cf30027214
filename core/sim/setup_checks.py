"""Checks of `kvcalc sim`'s options against each other, the model's KV layout, the policies and the workload
(setup.build calls them): options that would change nothing are refused, what the hybrid pool does not run yet
is refused by name, and what vLLM would refuse at start-up is named.

Each raises a ParameterError naming the options (SimOptions fields) and the fix, or returns the start-up refusals
that the simulation still runs (warned on stderr and noted, as `kvcalc size --gpu` does)."""

from __future__ import annotations

import math
import re

from ..dtypes import NOT_VLLM_KV_DTYPES
from ..errors import ParameterError
from ..inputs.traces import Trace
from ..model.gpu_plan import request_cache_groups
from ..model.kv_groups import KVLayout
from ..model.models import ModelSpec
from ..model.vllm_pool_layout import check_vllm_block_size
from ..notes import Note, concat
from ..pool.groups import weighted_layout
from .checks import finite_float
from .options import SimOptions
from .workload import Workload


def check_preempt_policies(o: SimOptions, policies: list[str]) -> None:
    """Swap moves a preempted request's blocks; a reservation holds the request's whole length from admission,
    so without the paged policy nothing is ever preempted (reserve.py: growth never needs memory)."""
    if o.preempt.strip().lower() == "swap" and "paged" not in policies:
        flag = "compare" if o.compare is not None else "policy"
        raise ParameterError(f"preempt swap moves a preempted request's blocks, and {flag} {','.join(policies)} "
                             "reserves each request's whole length at admission, so nothing is ever preempted: add "
                             "paged or drop preempt", "preempt", flag)


def check_rate_inf_arrival(o: SimOptions, rate: float) -> None:
    """At rate inf every request arrives at time 0: an arrival process spaces nothing (a max-rate search still
    divides its seeded unit-rate gaps by each rate it tries, so there it counts)."""
    if rate == math.inf and o.arrival is not None and not o.find_max_rate:
        raise ParameterError(f"arrival {o.arrival} with rate inf: every request arrives at time 0, so nothing is "
                             "spaced by it (only a max-rate search divides its unit-rate gaps): drop arrival, or give "
                             "a finite rate", "arrival", "rate")


def check_workload_options(o: SimOptions, workload: Workload, policies: list[str]) -> None:
    """Before any run: swap without the paged policy, prefix caching turned off where no block could hit, a
    max-rate search on one arrival (search.max_rate refuses it too, but only after the first run)."""
    check_preempt_policies(o, policies)
    if not o.prefix_caching and not workload.has_prefix_ids and workload.prompt_token_ids is None:
        raise ParameterError("no_prefix_caching: the workload has no prefix ids (constructed requests and Azure traces "
                             "say nothing of their content), so no block can hit and turning the cache off changes "
                             "nothing: drop no_prefix_caching, or give trace mooncake FILE", "no_prefix_caching",
                             "trace")
    if o.find_max_rate and len(workload) < 2:
        raise ParameterError(f"find_max_rate needs at least 2 arrivals (a rate is defined by inter-arrival gaps) and "
                             f"the workload has {len(workload)}: give requests 2 or more, or a trace of 2 or more",
                             "find_max_rate", "requests")


def start_refusals(o: SimOptions, spec: ModelSpec, notes: list[str]) -> list[str]:
    """What vLLM refuses at start-up that the simulation can still run (kvcalc size --gpu warns of the same), each
    also added to `notes`: a max_model_len above the model's max_position_embeddings (vLLM's
    _get_and_verify_max_len, unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)."""
    limit = spec.max_position_embeddings
    if o.max_model_len is None or limit is None or o.max_model_len <= limit:
        return []
    refusals: list[str] = [Note(f"{{max_model_len}} {o.max_model_len:,} is above the model's max_position_embeddings "
                                f"{limit:,} (allowed only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, or where the config's "
                                "rope_scaling extends the length)", "max_model_len")]
    notes += [concat("vLLM would not start: ", r, "; simulated as given") for r in refusals]
    return refusals


def check_ignored(o: SimOptions) -> None:
    """Refuse options that were given but would change nothing (their defaults are None so a given value shows)."""
    if o.swap_bandwidth is not None and o.preempt.strip().lower() != "swap":
        raise ParameterError(f"swap_bandwidth applies to preempt swap (preempt {o.preempt} never swaps): "
                             "add preempt swap or drop swap_bandwidth", "swap_bandwidth", "preempt")
    if o.seed is not None and o.trace is not None and o.cancel_fraction == 0:
        raise ParameterError("seed with trace only picks the cancelled requests, and there are none: the file "
                             "fixes arrivals and lengths; add cancel_fraction or drop seed", "seed", "trace",
                             "cancel_fraction")


def check_hybrid(o: SimOptions, spec: ModelSpec, policies: list[str]) -> None:
    """What the hybrid pool does not run yet is refused by name."""
    others = [p for p in policies if p != "paged"]
    if others:
        raise ParameterError(f"{'compare' if o.compare else 'policy'} {others[0]}: the reservation policies reserve "
                             "one region of full-attention "
                             f"KV; {spec.name} has several KV cache groups (windows, chunks or a recurrent state): "
                             "use policy paged", "policy", "compare")
    if o.spec_tokens is not None:
        raise ParameterError(f"spec_tokens: speculative decoding is not simulated on a hybrid pool yet ({spec.name} "
                             "has several KV cache groups): drop spec_tokens", "spec_tokens")


def check_weighted_tables(o: SimOptions, layout: KVLayout) -> None:
    """A hybrid pool on weighted tables (core/pool/weighted.py: layout ideal, a state of thousands of units) does
    not swap yet (a swap's bytes are counted per block id): refused by name, before the memory plan. Its state
    groups keep align's pages as on unit tables (weighted.state_jump: the page a step resumes from and its last
    one, a saved state cached whole at its weight), so align runs there."""
    if weighted_layout(layout) and o.preempt == "swap":
        raise ParameterError("preempt swap on weighted tables (layout ideal, a state of thousands of units) is not "
                             "done yet: use preempt recompute, or layout vllm", "preempt", "layout")


def served_state_mode(o: SimOptions, mode: str, notes: list[str]) -> str:
    """The mamba_cache_mode vLLM serves for the given `mode` (checked): with prefix caching off it is none
    whatever was asked (MambaModelConfig.verify_and_update_config, vLLM v1: "Mamba cache mode is set to 'none'
    when prefix caching is disabled", before the block size is chosen), so align's second page, its
    block-aligned prefill split and all's chunk-aligned block are gone too. Said in a note when it changes."""
    if o.prefix_caching or mode == "none":
        return mode
    notes.append(Note(f"{{mamba_cache_mode}} {mode} with {{no_prefix_caching}}: vLLM sets mamba_cache_mode to none "
                      "when prefix caching is off (one state page a running request, no state saved, prefill not "
                      "split at block boundaries): simulated as none", "mamba_cache_mode", "no_prefix_caching"))
    return "none"


def check_align_block_fits(o: SimOptions, layout: KVLayout, block_size: int) -> None:
    """On a hybrid pool align saves a state where a step ends, at a block boundary, and vLLM's scheduler splits
    every prefill there (prompt keys or not: _mamba_block_aligned_split cuts a chunk under a block to nothing, so
    it would never be scheduled): a step must be able to reach one (max_batched_tokens ≥ the block)."""
    if layout.state_groups and layout.mamba_cache_mode == "align" and o.max_batched_tokens < block_size:
        raise ParameterError(
            f"mamba_cache_mode align splits prefill at block boundaries (a state is saved where a step ends), so "
            f"the block of {block_size:,} tokens must fit the step's max_batched_tokens "
            f"{o.max_batched_tokens:,}: raise max_batched_tokens or use mamba_cache_mode none",
            "mamba_cache_mode", "max_batched_tokens")


def check_trace_ids(o: SimOptions, trace: Trace, block_size: int) -> Trace:
    """A Mooncake trace served with prefix caching has the hash id of each full block's last token: checked before
    the requests are put in arrival order, so that a short one is named by its line in the file (as share names
    it), not by its place in arrival order. The trace, unchanged."""
    if o.prefix_caching and trace.hash_offsets is not None:
        from ..share.replay_groups import check_ids_cover_prompts  # prefix caching only (start-up)

        check_ids_cover_prompts(trace if o.limit is None else trace.head(o.limit), block_size)
    return trace


def check_vllm_paging(o: SimOptions, layout: KVLayout, kv_dtype: str) -> None:
    """vLLM's layout is vLLM's pool: a block size its block_size takes (CacheConfig's BlockSize: share's check) and a
    KV precision its kv_cache_dtype pages (not plain int8 / int4: NOT_VLLM_KV_DTYPES), as `kvcalc size --gpu` checks
    both. The ideal layout is kvcalc's own pool: any block size and precision."""
    if layout.layout == "ideal":
        return
    if kv_dtype in NOT_VLLM_KV_DTYPES:
        raise ParameterError(f"dtype {o.dtype}: vLLM pages no plain {kv_dtype} KV (its kv_cache_dtype is auto, i.e. "
                             "the model's bf16 / fp16 / fp32, or fp8, fp8_e4m3, fp8_e5m2, fp8_per_token_head, "
                             "int8_per_token_head, nvfp4, fp8_ds_mla): give one of those, or layout ideal for kvcalc's "
                             "own pool at any precision", "dtype", "layout")
    check_vllm_block_size(o.block_size)  # share's check too


def unservable(layout: KVLayout, num_blocks: int, max_model_len: int, max_batched_tokens: int,
               spec: ModelSpec) -> ParameterError | None:
    """vLLM v1 refuses to start when its KV memory cannot hold one request of max_model_len (kv_cache_utils'
    check_enough_kv_cache_memory: "To serve at least one request with the model's max seq len ... KV cache is
    needed, which is larger than the available KV cache memory"): the refusal, naming the longest request the
    pool holds, or None. A request's blocks per group are `kvcalc size --gpu`'s (gpu_plan.request_cache_groups:
    a full table ceil(L / B), a sliding one its window's, a state group its pages, a window vLLM registers on full
    layers as plan_gpu counts it); the pool's are vLLM's
    num_gpu_blocks, its null block included (the check compares bytes). The ideal layout is kvcalc's own pool, which
    starts anyway (a request it cannot hold is rejected, as the scheduler rejects any)."""
    if layout.layout == "ideal":
        return None

    def need(length: int) -> int:
        return sum(g.blocks_per_request for g in request_cache_groups(layout, length, max_batched_tokens, spec))

    if need(max_model_len) <= num_blocks:
        return None
    low, high = 0, max_model_len  # need(low) fits (0: nothing), need(high) does not; blocks grow with the length
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if need(mid) <= num_blocks else (low, mid)
    tables: dict[tuple[str, int], int] = {}  # (kind, blocks a table) -> tables
    for g in request_cache_groups(layout, max_model_len, max_batched_tokens, spec):
        tables[g.kind, g.blocks_per_request] = tables.get((g.kind, g.blocks_per_request), 0) + 1
    per_group = " + ".join(f"{n} × {blocks:,} {kind}" if n > 1 else f"{blocks:,} {kind}"
                           for (kind, blocks), n in tables.items())
    fix = (f"give max_model_len {low:,} or less (the longest request it holds), or more KV memory" if low else
           "no request fits: give more KV memory")
    return ParameterError(
        f"vLLM would not start: max_model_len {max_model_len:,}: one request of that length needs "
        f"{need(max_model_len):,} blocks{f' ({per_group})' if len(tables) > 1 or '×' in per_group else ''} and the "
        f"pool has {num_blocks:,} (not enough KV cache memory for one request at the max length); {fix} (a larger "
        "gpu, a higher memory_utilization, more tp)", "max_model_len", "gpu", "memory_utilization", "tp")


def parse_timeout(text: str | float) -> float:
    """timeout_s as slo writes a time: seconds, unless it ends in s or ms (`30`, `30s`, `500ms`); inf: none. A
    number (scripts) is seconds."""
    if not isinstance(text, str):
        return finite_float("timeout_s", text, allow_inf=True, inf_meaning="no timeout (the default)")
    match = re.fullmatch(r"\s*(.*?)\s*(ms|s)?\s*", text, re.IGNORECASE)
    number, unit = match.groups() if match else (text, None)
    if unit is not None and number.lower().lstrip("+") in ("inf", "infinity"):
        raise ParameterError(f"timeout_s {text!r}: inf takes no unit (it means no timeout): give inf", "timeout_s")
    try:
        value = finite_float("timeout_s", number, allow_inf=True, inf_meaning="no timeout (the default)")
    except ParameterError as exc:
        raise ParameterError(f"{exc}; write seconds, e.g. 30, 30s or 500ms", "timeout_s") from None
    return value / 1000 if unit is not None and unit.lower() == "ms" else value
