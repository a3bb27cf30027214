"""`kvcalc share`'s trace mode: a real trace's prefix-cache replay in arrival order through the block pool, with
and without prefix caching (core/share/replay.py), or per KV cache group for a hybrid model
(core/share/replay_groups.py). A small Mooncake trace with nothing to evict is replayed on plain lists
(core/share/id_replay_lists.py: the same results, and numpy never imported); numpy is imported only past it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..core.blocks import VLLM_NULL_BLOCKS
from ..core.inputs.trace_text import read_mooncake_lines, read_trace_text
from ..core.share.id_replay_lists import share_trace_lists
from ..core.share.replay_result import ReplayResult, TraceShareResult, check_block_size
from ..core.units import format_bytes, format_count, format_percent, memory_flag_at_least, parse_bytes, plural
from .output import Field, Format, RawTable, Report, Table, err_console, quantity_table
from .progress import progress_bar
from .share_inputs import ShareInputs
from .share_scenario import pool_model_doc, window_note

if TYPE_CHECKING:
    from ..core.model.kv_groups import KVLayout
    from ..core.model.models import ModelSpec
    from ..core.share.memory import PoolBytes
    from ..core.share.replay_groups import GroupReplayResult

PROGRESS_FROM_REQUESTS = 2_000  # requests that take about a second to replay on a 2-core machine: a progress bar
# NOTE: a Mooncake trace of at most this many hash ids, replayed without a model and with nothing evicted, runs on
# plain lists (core/share/id_replay_lists.py) and never imports numpy (~0.1 s CPU: more than the replay of either
# real trace takes). Past 0.35-2.2 M ids (measured: tests/perf/test_share_lists_perf.py) numpy pays for its import.
LIST_REPLAY_MAX_IDS = 1_000_000


def trace_report(inputs: ShareInputs) -> Report:
    """Replay the trace: through a hybrid model's KV cache groups, or one pool (sized by --capacity-blocks or
    --memory), with and without prefix caching; every input error before any progress line."""
    o, spec, block, bits, dtype = inputs.opts, inputs.spec, inputs.block, inputs.bits, inputs.dtype
    assert o.trace is not None  # trace mode is the mode of --trace
    trace, memory, capacity_blocks = o.trace, o.memory, o.capacity_blocks
    if spec is not None:  # a model's memory and KV cache groups (--layout without a model was refused)
        from ..core.share.memory import block_bytes, blocks_in_memory, model_groups, pool_bytes

        kv_layout, groups = model_groups(spec, bits, block, o.layout, o.mamba_cache_mode)
        if groups is not None:
            assert kv_layout is not None  # groups come from the model's layout
            return _trace_groups(trace, o.limit, capacity_blocks, memory, spec, dtype, kv_layout, groups, inputs.fmt)
    if trace[0].strip().lower() == "mooncake":
        check_block_size(block)  # before reading a large file
    memory_bytes = None if memory is None else _memory_bytes(memory)
    bytes_per_block = None if spec is None else block_bytes(spec, bits, block)
    capacity, null = capacity_blocks, 0
    if memory_bytes is not None and bytes_per_block is not None:  # vLLM's pool: all but its null block
        null = 0 if (o.layout or "vllm").strip().lower() == "ideal" else VLLM_NULL_BLOCKS
        capacity = blocks_in_memory(memory_bytes, bytes_per_block, 1 + null, "blocks of a pool (with vLLM's null "
                                    "block)" if null else "") - null  # before reading, too
    kind, name, text = read_trace_text(trace[0], trace[1])
    lines = read_mooncake_lines(text, name) if kind == "mooncake" else None
    if lines is not None and spec is None and lines.hash_ids is not None and len(lines.hash_ids) <= LIST_REPLAY_MAX_IDS:
        listed = share_trace_lists(lines, kind, name, block, capacity, o.limit)
        if listed is not None:  # else the replay below names the error, or evicts through the pool
            _announce(listed.trace_description, block, inputs.fmt)
            return _trace_report(listed, None, None, None)
    from ..core.inputs.trace_formats import read_azure
    from ..core.inputs.traces import trace_of
    from ..core.share.replay import share_trace
    from ..core.share.trace_blocks import check_trace, largest_request_blocks

    loaded = trace_of(kind, name, lines if lines is not None else read_azure(text, name))
    if o.limit is not None:
        loaded = loaded.head(o.limit)
    if memory_bytes is not None and bytes_per_block is not None:
        blocks_in_memory(memory_bytes, bytes_per_block, largest_request_blocks(loaded, block) + null,
                         "the largest request of the trace needs" + (" with vLLM's null block" if null else ""))
    checked = check_trace(loaded, block, capacity)  # every input error before any progress line
    _announce(loaded.description, block, inputs.fmt)
    with progress_bar("replaying", total=len(loaded), enabled=len(loaded) >= PROGRESS_FROM_REQUESTS) as advance:
        result = share_trace(loaded, block, capacity, progress=advance, checked=checked)
    kv = None if spec is None else pool_bytes(spec, dtype, bits, block, result.cached.longest_request_tokens)
    return _null_block(_trace_report(result, spec, kv, memory_bytes), null, capacity)


def _null_block(report: Report, null: int, capacity: int | None) -> Report:
    """A pool sized by --memory as vLLM's: its null block said (JSON null_blocks), the capacity being the rest."""
    if null:
        report.doc["null_blocks"] = null
        report.notes.append(f"capacity: the blocks --memory holds less vLLM's null block (block 0, never handed out), "
                            f"{format_count(capacity or 0)} free")
    return report


def _announce(description: str, block: int, fmt: Format) -> None:
    if fmt is Format.table:
        err_console.print(f"replaying {description} at block size {block} …", highlight=False)


def _memory_bytes(memory: str) -> int:
    """--memory in bytes; a value parse_bytes cannot read is one error naming --memory."""
    try:
        return parse_bytes(memory)
    except ValueError as exc:
        raise ValueError(f"--memory {memory!r}: {exc}") from None


def _trace_groups(trace: tuple[str, str], limit: int | None, capacity_blocks: int | None, memory: str | None,
                  spec: ModelSpec, dtype: str, layout: KVLayout, groups: tuple, fmt: Format) -> Report:
    """Trace mode on a hybrid model: the replay through a pool of its KV cache groups, sized per group."""
    from ..core.inputs.traces import read_trace
    from ..core.model.kv_groups import plan_blocks
    from ..core.share.replay_groups import DEFAULT_CHUNK_TOKENS, largest_request_peak, replay_groups, replay_pool

    memory_bytes = None if memory is None else _memory_bytes(memory)
    pool_null = 0 if layout.layout == "ideal" else VLLM_NULL_BLOCKS  # vLLM's null block: a --memory pool's block 0
    null = pool_null if memory_bytes is not None else 0
    if memory_bytes is not None:
        capacity = plan_blocks(layout, memory_bytes) - null
    elif capacity_blocks is not None:
        capacity = capacity_blocks
    else:
        raise ValueError(f"{spec.name} pages several KV cache groups: its replay needs a pool size, give --memory "
                         "(e.g. 40GiB) or --capacity-blocks")
    loaded = read_trace(trace[0], trace[1])
    if limit is not None:
        loaded = loaded.head(limit)
    need = largest_request_peak(loaded, groups, layout.block_size, layout.mamba_cache_mode)
    if capacity < need:
        free = max(capacity, 0)  # (a pool below one block id holds none, not -1 past the null block)
        given = f"--memory {format_bytes(memory_bytes)} holds {free:,} free" if memory_bytes is not None else (
            f"--capacity-blocks {capacity:,} is {capacity:,}")
        raise ValueError(f"{given} blocks of {format_bytes(layout.page_bytes)}, fewer than the {need:,} the largest "
                         f"request holds at its peak ({layout.layout} layout, prompts computed in chunks of "
                         f"{DEFAULT_CHUNK_TOKENS:,} tokens): give --capacity-blocks {need:,} or --memory "
                         f"{memory_flag_at_least((need + pool_null) * layout.page_bytes)} or more")
    # A pool past what the whole trace ever allocates evicts nothing: replay in that many (--memory 1PiB was
    # 858,993,459 blocks of arrays, a MemoryError) and report the capacity asked for.
    never_full = len(groups) * max(g.weight for g in groups) * sum(
        -(-(p + o) // layout.block_size) + 2 for p, o in zip(loaded.prompt_tokens.tolist(),
                                                            loaded.output_tokens.tolist(), strict=True))
    blocks, mode = min(capacity, never_full), layout.mamba_cache_mode
    pool = replay_pool(loaded, groups, layout.block_size, blocks, mode)  # every refusal before the progress line
    if fmt is Format.table:
        err_console.print(f"replaying {loaded.description} at block {layout.block_size} over "
                          f"{plural(len(groups), 'block table')} …", highlight=False)
    with progress_bar("replaying", total=len(loaded), enabled=len(loaded) >= PROGRESS_FROM_REQUESTS) as advance:
        result = replay_groups(loaded, groups, layout.block_size, blocks, mode, progress=advance, pool=pool)
    result = dataclasses.replace(result, capacity_blocks=capacity)
    return _null_block(_trace_groups_report(loaded.description, result, spec, dtype, layout, memory_bytes), null,
                       capacity)


def _trace_groups_report(description: str, r: GroupReplayResult, spec: ModelSpec, dtype: str, layout: KVLayout,
                         memory_bytes: int | None) -> Report:
    from ..core.share.replay_groups import DEFAULT_CHUNK_TOKENS

    rows: list[dict[str, Any]] = []
    at, weighted = 0, len(r.group_hit_tokens) == len(layout.groups) < sum(g.pages_per_block for g in layout.groups)
    for g in layout.groups:
        hits = r.group_hit_tokens[at] if r.group_hit_tokens else 0  # a type's tables hit alike
        at += 1 if weighted else g.pages_per_block  # weighted tables (core/pool/weighted.py): one table a type
        name = g.kind if g.window is None else f"{g.kind} {g.window:,}"
        rows.append({"group": f"{name} ({g.layers} {g.source} layers)", "kind": g.kind, "window": g.window,
                     "block_tables": 1 if weighted else g.pages_per_block, "hit_tokens": hits,
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
    doc.update(pool_model_doc(kv))
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
    report.notes += window_note(spec, kv)
    return report
