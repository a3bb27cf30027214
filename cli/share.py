"""`kvcalc share`: prefix sharing, forks and copy-on-write through the real block pool."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..core.blocks import DEFAULT_BLOCK_SIZE
from ..core.dtypes import DEFAULT_DTYPE, DTYPE_BITS, parse_dtype
from ..core.inputs.traces import read_trace
from ..core.share.replay import ReplayResult, TraceShareResult, share_trace
from ..core.share.trace_blocks import check_block_size, check_trace, largest_request_blocks
from ..core.units import format_bytes, format_count, format_percent, parse_bytes, plural
from .options import (
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
from .output import Field, Format, RawTable, Report, Table, emit, err_console, quantity_table, resolve_format
from .progress import progress_bar

if TYPE_CHECKING:
    from ..core.model.kv_groups import KVLayout
    from ..core.model.models import ModelSpec
    from ..core.share.forks import ScenarioResult
    from ..core.share.memory import PoolBytes
    from ..core.share.replay_groups import GroupReplayResult

# NOTE: each mode imports what only it uses (forks, the hybrid groups, the capacity sweep, a model and its
# memory) inside its branch: a plain trace replay (`share --trace mooncake F`) then starts ~0.15 s CPU sooner.

DEFAULTS = {"prefix": 1000, "branches": 4, "gen": 200, "block": DEFAULT_BLOCK_SIZE, "mode": "parallel"}
# work that takes about a second or more on a 2-core machine gets a progress bar (on a terminal)
PROGRESS_FROM_APPENDS = 500_000
PROGRESS_FROM_REQUESTS = 2_000


def command(
    prefix: Annotated[
        int | None,
        int_option("--prefix", help=f"Prompt tokens shared by all branches (default: {DEFAULTS['prefix']:,})."),
    ] = None,
    branches: Annotated[
        int | None, int_option("--branches", help=f"Branches K (samples or beams; default: {DEFAULTS['branches']}).")
    ] = None,
    gen: Annotated[
        int | None, int_option("--gen", help=f"Tokens each branch generates (default: {DEFAULTS['gen']}).")
    ] = None,
    mode: Annotated[
        str | None, typer.Option("--mode", help="parallel (K samples) or beam (seeded beam selection).")
    ] = None,
    seed: Annotated[int | None, seed_option("With --mode beam: seed of the beam selection (default: 0).")] = None,
    block: Annotated[int | None, int_option(
        "--block", "-b", help=f"Block size in tokens (default: {DEFAULTS['block']}).")] = None,
    trace: Annotated[
        tuple[str, str] | None,
        typer.Option("--trace", metavar="KIND FILE", help="Replay a real trace: 'mooncake F' (or 'azure F')."),
    ] = None,
    limit: Annotated[int | None, int_option("--limit", help="With --trace: only the first N requests.")] = None,
    capacity_blocks: Annotated[
        int | None, int_option("--capacity-blocks", help="With --trace: pool size in blocks (default unlimited).")
    ] = None,
    memory: Annotated[
        str | None, typer.Option("--memory", help="With --trace and a model: KV memory for the pool, e.g. 40GiB.")
    ] = None,
    capacity: Annotated[str | None, typer.Option("--capacity", help=(
        "With --trace: prefix-cache sizes to sweep, tokens (3M) or bytes with a model (4GiB): a list 1M,4M or a "
        "log range 1M:64M[:POINTS]; hit rate per size, the unbounded ceiling, the sizes reaching 50/90/99 %."))] = None,
    blocks: Annotated[
        str | None, typer.Option("--blocks", help="With --capacity: block sizes to sweep, e.g. 16,64,512.")
    ] = None,
    gpu_cache: Annotated[str | None, typer.Option("--gpu-cache", help=(
        "With --trace: GPU prefix cache (tokens or bytes); with --host-cache/--disk-cache, a tiered cache."))] = None,
    host_cache: Annotated[str | None, typer.Option("--host-cache", help="Host (CPU) tier below --gpu-cache.")] = None,
    disk_cache: Annotated[str | None, typer.Option("--disk-cache", help="Disk tier below --host-cache.")] = None,
    host_bw: Annotated[str | None, typer.Option("--host-bw", help="Host link per GPU (default 25GB/s).")] = None,
    disk_bw: Annotated[str | None, typer.Option("--disk-bw", help="Disk read per GPU (default 5GB/s).")] = None,
    tier_mode: Annotated[str | None, typer.Option("--tier-mode", metavar="exclusive|inclusive", help=(
        "exclusive (default): evictions demote a tier down; inclusive: write-through (vLLM offload, LMCache)."))
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="With tiers and a model: GPU of the load-or-recompute "
                                                          "rule (default H100-SXM).")] = None,
    tp: Annotated[int | None, int_option("--tp", help="With --capacity or tiers and a model: tensor parallel.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="With --capacity: write hit rate vs capacity (.png/.svg).")
                    ] = None,
    layout: Annotated[str | None, typer.Option("--layout", metavar="vllm|ideal", help=(
        "With a model: how its KV cache groups are paged, vllm (default) or ideal (as kvcalc frag)."))] = None,
    mamba_cache_mode: Annotated[str | None, typer.Option("--mamba-cache-mode", metavar="none|align", help=(
        "With a Mamba / linear-attention hybrid: vLLM's state prefix caching, none (default) or align."))] = None,
    model: ModelOpt = None,
    config: ConfigOpt = None,
    dtype: Annotated[
        str | None, typer.Option("--dtype", help=f"With a model: KV precision (default {DEFAULT_DTYPE}).")
    ] = None,
    layers: LayersOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    json_flag: JsonOpt = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """Sharing through the real block pool. Scenario mode (default): K branches forked from one P-token
    prompt each generate G tokens — logical vs physical blocks, copy-on-write copies, blocks and bytes
    saved, peak blocks. Trace mode (--trace mooncake F): prefix-cache replay in arrival order — hit tokens,
    token hit rate, peak blocks, LRU evictions, with and without prefix caching. Capacity mode (--trace with
    --capacity SIZES, or --gpu-cache/--host-cache/--disk-cache): hit rate against prefix-cache size from one
    LRU stack pass, and a GPU → host → disk cache's hits, traffic and load-or-recompute verdict."""
    if block is not None and blocks is not None:  # --blocks sweeps its own sizes: a --block beside it is unused
        raise ValueError(f"--block {block} and --blocks {blocks} both give block sizes: give --blocks to sweep "
                         "several, or --block for one")
    block = DEFAULTS["block"] if block is None else block
    spec = None
    if any(v is not None for v in (model, config, layers, kv_heads, head_dim)):  # else resolve_model gives None
        from ..core.model.models import resolve_model

        spec = resolve_model(model, config, layers, kv_heads, head_dim)
    if spec is None and dtype is not None:
        raise ValueError("--dtype applies to KV bytes: give a model too (--model, --config or explicit dimensions)")
    dtype = parse_dtype(DEFAULT_DTYPE if dtype is None else dtype)  # --dtype "" is an error, not the default
    bits = DTYPE_BITS[dtype]
    scenario_given = [o for o, v in (("--prefix", prefix), ("--branches", branches), ("--gen", gen),
                                      ("--mode", mode), ("--seed", seed)) if v is not None]
    trace_given = [o for o, v in (("--limit", limit), ("--capacity-blocks", capacity_blocks),
                                   ("--memory", memory)) if v is not None]
    fmt = resolve_format(json_flag, fmt)
    curve_given = [o for o, v in (("--capacity", capacity), ("--blocks", blocks), ("--gpu-cache", gpu_cache),
                                   ("--host-cache", host_cache), ("--disk-cache", disk_cache), ("--host-bw", host_bw),
                                   ("--disk-bw", disk_bw), ("--tier-mode", tier_mode), ("--gpu", gpu), ("--tp", tp),
                                   ("--plot", plot)) if v is not None]
    groups_given = [o for o, v in (("--layout", layout), ("--mamba-cache-mode", mamba_cache_mode)) if v is not None]
    if groups_given and spec is None:
        raise ValueError(f"{groups_given[0]} applies to a model's KV cache groups: give a model too (--model, "
                         "--config or explicit dimensions)")
    if curve_given:
        if groups_given:
            raise ValueError(f"{groups_given[0]} applies to scenario and trace modes, not to --capacity or the "
                             "tiers: drop it")
        pool_given = scenario_given + [o for o in trace_given if o != "--limit"]
        if pool_given:
            raise ValueError(f"{', '.join(pool_given)} and {', '.join(curve_given)} are different modes: "
                             "--capacity and the tiers size a prefix cache; drop one of them")
        from . import share_capacity

        quantization = None
        if spec is not None:  # the weights as the checkpoint stores them (fp8 DeepSeek-V3, mxfp4 gpt-oss experts)
            from ..core.sim.hardware import checkpoint_weights

            spec, quantization = checkpoint_weights(spec, model, config)
        options = share_capacity.parse_options(trace, limit, block, blocks, capacity, gpu_cache, host_cache,
                                               disk_cache, host_bw, disk_bw, tier_mode, gpu, tp, plot, spec, bits,
                                               quantization)
        share_capacity.run(options, spec, dtype, bits, fmt)
        return
    if trace is None:
        if trace_given:
            raise ValueError(f"{', '.join(trace_given)} applies only to trace mode: add --trace KIND FILE")
        from ..core.share.forks import ScenarioSpec, run_scenario
        from ..core.share.memory import model_groups, pool_bytes

        kv_layout_, groups = model_groups(spec, bits, block, layout, mamba_cache_mode)
        scenario = ScenarioSpec(
            prefix_tokens=DEFAULTS["prefix"] if prefix is None else prefix,
            branches=DEFAULTS["branches"] if branches is None else branches,
            gen_tokens=DEFAULTS["gen"] if gen is None else gen,
            block_size=block if groups is None else kv_layout_.block_size,
            mode=DEFAULTS["mode"] if mode is None else mode.strip().lower(),
            seed=0 if seed is None else seed,
        )
        if seed is not None and scenario.mode != "beam":
            # parallel branches draw nothing at random: a seed there would be accepted and change nothing
            raise ValueError(f"--seed applies to --mode beam ({scenario.mode} mode draws nothing at random): "
                             "add --mode beam or drop --seed")
        kv = None if spec is None else pool_bytes(spec, dtype, bits, block, scenario.tokens_per_branch,
                                                  kv_layout_ if groups else None)
        with progress_bar(f"{scenario.mode} decoding", total=scenario.gen_tokens,
                          enabled=scenario.decode_appends * len(groups or (1,)) >= PROGRESS_FROM_APPENDS) as advance:
            result = run_scenario(scenario, progress=advance, groups=groups,
                                  state_mode=kv_layout_.mamba_cache_mode if groups else "none")
        emit(_scenario_report(result, spec, kv, kv_layout_ if groups else None), fmt)
        return
    if scenario_given:
        raise ValueError(f"{', '.join(scenario_given)} applies only to scenario mode: drop --trace or drop them")
    if capacity_blocks is not None and memory is not None:
        raise ValueError("give either --capacity-blocks or --memory, not both")
    if memory is not None and spec is None:
        raise ValueError("--memory needs a model to turn bytes into blocks: add --model (or --config)")
    if spec is not None:  # a model's memory and KV cache groups (groups_given without a model was refused above)
        from ..core.share.memory import block_bytes, blocks_in_memory, model_groups, pool_bytes

        kv_layout_, groups = model_groups(spec, bits, block, layout, mamba_cache_mode)
    else:
        kv_layout_, groups = None, None
    if groups is not None:
        _trace_groups(trace, limit, capacity_blocks, memory, spec, dtype, kv_layout_, groups, json_flag, fmt)
        return
    if trace[0].strip().lower() == "mooncake":
        check_block_size(block)  # before reading a large file
    memory_bytes = None if memory is None else _memory_bytes(memory)
    bytes_per_block = None if spec is None else block_bytes(spec, bits, block)
    capacity = capacity_blocks
    if memory_bytes is not None and bytes_per_block is not None:
        capacity = blocks_in_memory(memory_bytes, bytes_per_block)  # before reading, too
    loaded = read_trace(trace[0], trace[1])
    if limit is not None:
        loaded = loaded.head(limit)
    if memory_bytes is not None and bytes_per_block is not None:
        blocks_in_memory(memory_bytes, bytes_per_block, largest_request_blocks(loaded, block),
                         "the largest request of the trace needs")
    checked = check_trace(loaded, block, capacity)  # every input error before any progress line
    if not json_flag and fmt is Format.table:
        err_console.print(f"replaying {loaded.description} at block size {block} …", highlight=False)
    with progress_bar("replaying", total=len(loaded), enabled=len(loaded) >= PROGRESS_FROM_REQUESTS) as advance:
        result = share_trace(loaded, block, capacity, progress=advance, checked=checked)
    kv = None if spec is None else pool_bytes(spec, dtype, bits, block, result.cached.longest_request_tokens)
    emit(_trace_report(result, spec, kv, memory_bytes), fmt)


def _memory_bytes(memory: str) -> int:
    """--memory in bytes; a value parse_bytes cannot read is one error naming --memory."""
    try:
        return parse_bytes(memory)
    except ValueError as exc:
        raise ValueError(f"--memory {memory!r}: {exc}") from None


def _trace_groups(trace: tuple[str, str], limit: int | None, capacity_blocks: int | None, memory: str | None,
                  spec: ModelSpec, dtype: str, layout: KVLayout, groups: tuple, json_flag: bool, fmt: Format) -> None:
    """Trace mode on a hybrid model: the replay through a pool of its KV cache groups, sized per group."""
    from ..core.model.kv_groups import plan_blocks
    from ..core.share.replay_groups import DEFAULT_CHUNK_TOKENS, largest_request_peak, replay_groups

    memory_bytes = None if memory is None else _memory_bytes(memory)
    if memory_bytes is None and capacity_blocks is None:
        raise ValueError(f"{spec.name} pages several KV cache groups: its replay needs a pool size, give --memory "
                         "(e.g. 40GiB) or --capacity-blocks")
    capacity = capacity_blocks if memory_bytes is None else plan_blocks(layout, memory_bytes)
    loaded = read_trace(trace[0], trace[1])
    if limit is not None:
        loaded = loaded.head(limit)
    need = largest_request_peak(loaded, groups, layout.block_size, layout.mamba_cache_mode)
    if capacity < need:
        given = f"--memory {format_bytes(memory_bytes)} holds {capacity:,}" if memory_bytes is not None else (
            f"--capacity-blocks {capacity:,} is")
        raise ValueError(f"{given} blocks of {format_bytes(layout.page_bytes)}, fewer than the {need:,} the largest "
                         f"request holds at its peak ({layout.layout} layout, chunks of {DEFAULT_CHUNK_TOKENS:,}): "
                         f"give at least {format_bytes(need * layout.page_bytes)}")
    if not json_flag and fmt is Format.table:
        err_console.print(f"replaying {loaded.description} at block {layout.block_size} over "
                          f"{plural(len(groups), 'block table')} …", highlight=False)
    with progress_bar("replaying", total=len(loaded), enabled=len(loaded) >= PROGRESS_FROM_REQUESTS) as advance:
        result = replay_groups(loaded, groups, layout.block_size, capacity, layout.mamba_cache_mode,
                               progress=advance)
    emit(_trace_groups_report(loaded.description, result, spec, dtype, layout, memory_bytes), fmt)


def _trace_groups_report(description: str, r: GroupReplayResult, spec: ModelSpec, dtype: str, layout: KVLayout,
                         memory_bytes: int | None) -> Report:
    from ..core.share.replay_groups import DEFAULT_CHUNK_TOKENS

    rows, at = [], 0
    for g in layout.groups:
        hits = r.group_hit_tokens[at] if r.group_hit_tokens else 0  # a type's tables hit alike
        at += g.pages_per_block
        name = g.kind if g.window is None else f"{g.kind} {g.window:,}"
        rows.append({"group": f"{name} ({g.layers} {g.source} layers)", "kind": g.kind, "window": g.window,
                     "block_tables": g.pages_per_block, "hit_tokens": hits,
                     "token_hit_rate": hits / r.prompt_tokens if r.prompt_tokens else 0.0})
    doc: dict[str, Any] = {
        "trace": description, "model": spec.name, "dtype": dtype, "layout": layout.layout,
        "block_size": r.block_size, "block_bytes": layout.page_bytes, "reason": layout.reason,
        "mamba_cache_mode": layout.mamba_cache_mode, "capacity_blocks": r.capacity_blocks,
        "memory_bytes": memory_bytes, "requests": r.requests, "prompt_tokens": r.prompt_tokens,
        "hit_tokens": r.hit_tokens, "token_hit_rate": r.token_hit_rate, "peak_used_blocks": r.peak_used_blocks,
        "peak_cached_blocks": r.peak_cached_blocks, "evictions": r.evictions,
        "largest_request_blocks": r.largest_request_blocks, "hits_lower_bound": r.keys_lower_bound, "groups": rows,
    }
    fields = [Field("requests", "requests", format_count), Field("prompt_tokens", "prompt tokens", format_count),
              Field("hit_tokens", "hit tokens (every group)", format_count),
              Field("token_hit_rate", "token hit rate", format_percent),
              Field("peak_used_blocks", "peak used blocks", format_count),
              Field("peak_cached_blocks", "peak cached free blocks", format_count),
              Field("evictions", "LRU evictions", format_count),
              Field("largest_request_blocks", "largest request's peak blocks", format_count)]
    main = quantity_table(f"prefix-cache replay, {layout.layout} layout, block {r.block_size}, capacity "
                          f"{format_count(r.capacity_blocks)} blocks of {format_bytes(layout.page_bytes)}",
                          ["quantity", "value"], fields, [doc])
    per_group = Table("each group's own longest hits (the hit is the shortest of them)",
                      ["group", "block tables", "hit tokens", "token hit rate"],
                      [[g["group"], g["block_tables"], format_count(g["hit_tokens"]),
                        format_percent(g["token_hit_rate"])] for g in rows],
                      raw=RawTable(["group", "block_tables", "hit_tokens", "token_hit_rate"],
                                   [[g["kind"], g["block_tables"], g["hit_tokens"], g["token_hit_rate"]]
                                    for g in rows]))
    report = Report(doc=doc, tables=[main, per_group], text=[description])
    report.notes.append(f"{spec.name}, {dtype}: {layout.layout} layout, {layout.reason}; requests replay one at a "
                        f"time in arrival order, prompt and output {DEFAULT_CHUNK_TOKENS:,} tokens a chunk; each group "
                        "keeps only what its layers read, a hashed block that leaves a window stays cached (LRU)")
    if layout.state_groups:
        saves = {"all": "every block boundary saves one", "none": "this mode saves none, so nothing hits",
                 "align": "this mode saves one where a step ends, prompts chunked at block boundaries as vLLM's "
                          "scheduler splits them (and at the prompt's last full block)"}[layout.mamba_cache_mode]
        report.notes.append(f"mamba_cache_mode {layout.mamba_cache_mode}: a hit needs a state saved at exactly that "
                            f"boundary; {saves}")
    if r.keys_lower_bound:
        report.notes.append(f"block {r.block_size:,} does not tile the trace's 512-token ids: each block is keyed by "
                            "the id holding its last token, so prompts sharing a block but not that whole id miss: "
                            "the hits are a lower bound")
    if not r.keyed and not layout.state_groups:
        report.notes.append("no hits are possible: the trace has no prefix ids (hash_ids)")
    return report


def _model_doc(kv: PoolBytes | None) -> dict[str, Any]:
    """The model part of the JSON; `bytes_upper_bound` is true when a sequence outgrows a window (see
    _window_note)."""
    if kv is None:
        return {}
    return {"model": kv.model, "dtype": kv.dtype, "block_bytes": kv.bytes_per_block,
            "bytes_upper_bound": kv.upper_bound}


def _window_note(spec: ModelSpec | None, kv: PoolBytes | None) -> list[str]:
    """The pool keeps every layer's KV for every block of a sequence. A windowed layer needs only the blocks
    of its last `window` tokens, so once a sequence is longer than the window every byte figure here is an
    upper bound."""
    if spec is None or kv is None or not kv.upper_bound:
        return []
    if spec.num_sliding_layers:
        held = (f"{spec.num_sliding_layers} of {spec.layers} layers keep only the last "
                f"{format_count(spec.sliding_window)} tokens")
    else:
        held = "some layers keep only a window or chunk of the tokens"
    return [f"{spec.name}: {held}, but the pool holds every layer for every block: bytes are an upper bound (an "
            "engine that frees blocks outside the window holds less; kvcalc size and frag apply the window)"]


def _scenario_report(result: ScenarioResult, spec: ModelSpec | None, kv: PoolBytes | None,
                     layout: KVLayout | None = None) -> Report:
    from ..core.share.forks import closed_form_physical_blocks
    from ..core.share.memory import group_doc

    s = result.spec
    doc: dict[str, Any] = {
        "mode": s.mode,
        "prefix_tokens": s.prefix_tokens,
        "branches": s.branches,
        "gen_tokens": s.gen_tokens,
        "block_size": s.block_size,
        "logical_blocks": result.logical_blocks,
        "physical_blocks": result.physical_blocks,
        "cow_copies": result.cow_copies,
        "saved_blocks": result.saved_blocks,
        "saved_fraction": result.saved_fraction,
        "peak_blocks": result.peak_blocks,
        "forks": result.forks,
    }
    if s.mode == "beam":
        doc["seed"] = s.seed
        doc["dropped_branches"] = result.dropped_branches
    doc.update(_model_doc(kv))
    if kv is not None:
        for key, blocks in (("logical_bytes", result.logical_blocks), ("physical_bytes", result.physical_blocks),
                            ("saved_bytes", result.saved_blocks), ("peak_bytes", result.peak_blocks)):
            doc[key] = kv.of_blocks(blocks)
    title = (f"{s.mode}: {plural(s.branches, 'branch', 'branches')} × ({format_count(s.prefix_tokens)} shared + "
             f"{format_count(s.gen_tokens)} generated tokens), block {s.block_size}")
    report = Report(doc=doc, tables=[_scenario_table(title, doc)])
    if layout is not None and kv is not None:
        doc["kv_cache_groups"] = group_doc(layout, result.group_blocks, kv.bytes_per_block)
        report.tables.append(_groups_table(doc["kv_cache_groups"]))
        unit = (f"a block id is one page in each layer slot of a group ({format_bytes(kv.bytes_per_block)})"
                if layout.layout == "vllm" else f"a unit is {format_bytes(kv.bytes_per_block)} (the gcd of the "
                "types' block bytes) and a type's block of B tokens takes 'block tables' units")
        state = (f"; each branch holds its own recurrent state (mamba_cache_mode {layout.mamba_cache_mode})"
                 if layout.state_groups else "")
        report.notes.append(f"{kv.model}: {layout.layout} layout, {layout.reason}; {unit}{state}")
    elif s.mode == "parallel" and s.gen_tokens >= 1:
        report.notes.append(
            f"closed form: floor(P/B) + K·ceil((P mod B + G)/B) = "
            f"{closed_form_physical_blocks(s.prefix_tokens, s.branches, s.gen_tokens, s.block_size)} physical blocks"
        )
    if s.mode == "beam":
        report.notes.append(f"beam selection seeded with {s.seed}; {plural(result.dropped_branches, 'beam')} dropped")
    if kv is not None:
        report.notes.append(f"bytes: {kv.model}, {kv.dtype}, {format_bytes(kv.bytes_per_block)} per block (IEC units)")
    report.notes += _window_note(spec, kv)
    return report


def _groups_table(groups_doc: dict[str, Any]) -> Table:
    """Each KV cache group's physical blocks and bytes at the end of the run."""
    rows = groups_doc["groups"]
    return Table(
        f"KV cache groups ({groups_doc['layout']} layout, block {groups_doc['block_size']})",
        ["group", "block tables", "physical blocks", "physical bytes"],
        [[g["group"], format_count(g["block_tables"]), format_count(g["physical_blocks"]),
          format_bytes(g["physical_bytes"])] for g in rows],
        raw=RawTable(["group", "block_tables", "physical_blocks", "physical_bytes"],
                     [[g["kind"], g["block_tables"], g["physical_blocks"], g["physical_bytes"]] for g in rows]),
    )


def _scenario_table(title: str, doc: dict[str, Any]) -> Table:
    """The scenario's JSON as one CSV row with every column (seed and dropped branches empty in parallel
    mode, model and bytes empty without a model); people see the counts and, with a model, the bytes."""
    with_bytes = doc.get("block_bytes") is not None
    fields = [
        *(Field(key) for key in ("mode", "prefix_tokens", "branches", "gen_tokens", "block_size", "seed")),
        Field("logical_blocks", "logical blocks (= without sharing)", format_count),
        Field("physical_blocks", "physical blocks", format_count),
        Field("cow_copies", "copy-on-write copies", format_count),
        Field("saved_blocks"),
        Field("saved_fraction"),
        Field(None, "blocks saved",
              lambda r: f"{format_count(r['saved_blocks'])} ({format_percent(r['saved_fraction'])})"),
        Field("peak_blocks", "peak blocks during the run", format_count),
        *(Field(key) for key in ("forks", "dropped_branches", "model", "dtype", "block_bytes", "bytes_upper_bound")),
        *(Field(key, key.replace("_", " ") if with_bytes else None, format_bytes)
          for key in ("logical_bytes", "physical_bytes", "saved_bytes", "peak_bytes")),
    ]
    record = {f.key: doc.get(f.key) for f in fields if f.key is not None}
    return quantity_table(title, ["quantity", "value"], fields, [record])


_TRACE_KEYS = ("requests", "prompt_tokens", "output_tokens", "hit_tokens", "token_hit_rate", "hit_blocks",
               "prefill_tokens_saved", "peak_used_blocks", "peak_cached_blocks", "evictions", "pool_blocks")


def _replay_doc(r: ReplayResult) -> dict[str, Any]:
    return {key: getattr(r, key) for key in _TRACE_KEYS}


def _trace_report(
    result: TraceShareResult, spec: ModelSpec | None, kv: PoolBytes | None, memory_bytes: int | None
) -> Report:
    on, off = result.cached, result.uncached
    doc: dict[str, Any] = {
        "trace": result.trace_description,
        "has_prefix_ids": result.has_prefix_ids,
        "block_size": on.block_size,
        "capacity_blocks": on.capacity_blocks,
        **_replay_doc(on),
        "without_prefix_caching": _replay_doc(off),
    }
    if memory_bytes is not None:
        doc["memory_bytes"] = memory_bytes
    doc.update(_model_doc(kv))
    records = [{"prefix_caching": True, **_replay_doc(on)}, {"prefix_caching": False, **_replay_doc(off)}]
    for record in records:
        record.update(block_size=on.block_size, capacity_blocks=on.capacity_blocks)
    fields = [Field("prefix_caching"), Field("block_size"), Field("capacity_blocks")]
    shown = {"requests": ("requests", format_count), "prompt_tokens": ("prompt tokens", format_count),
             "hit_tokens": ("hit tokens (prefill saved)", format_count),
             "token_hit_rate": ("token hit rate", format_percent), "hit_blocks": ("hit blocks", format_count),
             "peak_used_blocks": ("peak used blocks", format_count),
             "peak_cached_blocks": ("peak cached free blocks", format_count),
             "evictions": ("LRU evictions", format_count)}
    fields += [Field(key, *shown.get(key, (None, None))) for key in _TRACE_KEYS]
    capacity = "unlimited" if on.capacity_blocks is None else f"{format_count(on.capacity_blocks)} blocks"
    table = quantity_table(f"prefix-cache replay, block {on.block_size}, capacity {capacity}",
                           ["quantity", "prefix caching", "no prefix caching"], fields, records)
    report = Report(doc=doc, tables=[table], text=[result.trace_description])
    report.notes.append("requests replay one at a time in arrival order; a finished request's blocks stay "
                        "cached (LRU) until evicted; a hit never covers a prompt's last token.")
    if not result.has_prefix_ids:
        report.notes.append("this trace has no prefix ids (hash_ids): no sharing information, so no hits "
                            "are possible — use a Mooncake trace for prefix caching.")
    if kv is not None:
        report.notes.append(f"{kv.model}, {kv.dtype}: {format_bytes(kv.bytes_per_block)} per block; "
                            f"prefill saved {format_bytes(kv.of_blocks(on.hit_blocks))} of KV writes")
    report.notes += _window_note(spec, kv)
    return report
