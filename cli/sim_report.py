"""The report of `kvcalc sim`: its JSON document, and the tables that show it (display and CSV forms from
one record per policy)."""

from __future__ import annotations

import math

from ..core.pool.groups import weighted_layout
from ..core.sim.metrics import STATS
from ..core.sim.policies import MEMORY_PARTS
from ..core.sim.simulate import Simulation
from ..core.units import format_bytes, format_percent
from .output import Field, RawTable, Report, Table, quantity_table, record_table
from .sim_prefix_report import group_prefix_hits, prefix_table


def _ms(value: float | None) -> str:
    return "–" if value is None or value != value else f"{value * 1e3:,.1f}"


def _groups_doc(plan, hits_lower_bound: bool) -> dict | None:
    """The hybrid pool's KV cache groups (None: one group of full attention, the plain pool); whether its prefix
    hits are a lower bound (a block keyed by the one Mooncake id holding its last token)."""
    layout = plan.layout
    if layout is None:
        return None
    return {
        "layout": layout.layout, "block_size": layout.block_size, "requested_block_size": layout.requested_block_size,
        "reason": layout.reason, "block_bytes": layout.page_bytes, "mamba_cache_mode": layout.mamba_cache_mode,
        "prefix_hits_lower_bound": hits_lower_bound,
        "groups": [{"kind": g.kind, "window": g.window, "layers": g.layers, "padded_layers": g.padded_layers,
                    "block_tables": 1 if weighted_layout(layout) else g.pages_per_block, "source": g.source}
                   for g in layout.groups],
    }


def _groups_table(plan, policies: list[str], summaries: dict) -> Table:
    """Each layer type's time-averaged blocks (its block tables together) and its share of the pool."""
    layout, raw = plan.layout, []
    for policy in policies:
        means = summaries[policy].get("group_blocks_mean") or []
        at, weighted = 0, weighted_layout(layout)  # weighted tables: one a type, its blocks cost their units
        for g in layout.groups:
            tables = 1 if weighted else g.pages_per_block
            blocks = float(sum(means[at : at + tables]))
            at += tables
            label = g.kind if g.window is None else f"{g.kind}_{g.window}"
            units = blocks * g.pages_per_block if weighted else blocks
            raw.append([policy, label, g.layers, tables, blocks, units / max(plan.num_blocks, 1)])
    rows = [[policy, f"{label.replace('_', ' ')} ({layers} layers)", tables, f"{blocks:,.1f}", format_percent(share)]
            for policy, label, layers, tables, blocks, share in raw]
    return Table(f"KV cache groups over time ({layout.layout} layout, block {layout.block_size}, time-averaged)",
                 ["policy", "group", "block tables", "blocks held", "share of the pool"], rows,
                 raw=RawTable(["policy", "group", "layers", "block_tables", "blocks_held_mean", "pool_share"], raw))


def _policy_record(policy: str, summary: dict) -> dict:
    """One policy's summary flattened for CSV: ttft_s.p99 -> ttft_p99_s, memory.free -> free (a share of the pool)."""
    record = {key: value for key, value in summary.items() if not isinstance(value, dict)}
    record["policy"] = policy
    for key in _LATENCY_KEYS:
        record.update({f"{key.removesuffix('_s')}_{stat}_s": summary[key][stat] for stat in STATS})
    record.update(summary["memory"])
    return record


_LATENCY_KEYS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
_COUNT_LABELS = {"requests": "requests", "completed": "completed", "rejected": "rejected (OOM / too long)",
                 "timed_out": "timed out", "cancelled": "cancelled", "preemptions": "preemptions"}


def _latency_fields(slo_spec) -> list[Field]:
    """Counts, latency statistics (people: ms; CSV: seconds, as the JSON), throughput, goodput under the SLO."""
    fields = [Field("policy"), *(Field(key, label, "{:,}".format) for key, label in _COUNT_LABELS.items())]
    for key, label in zip(_LATENCY_KEYS, ("TTFT", "TPOT", "ITL", "E2E"), strict=True):
        name = key.removesuffix("_s")
        fields += [Field(f"{name}_{stat}_s", f"{label} {stat} (ms)", _ms, missing=_ms(None)) for stat in STATS]
    with_slo = not slo_spec.is_empty
    fields += [
        Field("duration_s"),
        Field("throughput_rps", "throughput (req/s)", "{:.3f}".format),
        Field("output_tokens_per_s", "output tokens/s", "{:,.0f}".format),
        Field("generated_tokens"),
        Field("steps"),
        Field("mean_running"),
        Field("peak_running"),
        Field(None, "mean / peak running", lambda r: f"{r['mean_running']:.1f} / {r['peak_running']}"),
        Field("goodput_rps", "goodput (req/s)" if with_slo else None, "{:.3f}".format),
        Field("slo_attainment", "SLO attainment" if with_slo else None, format_percent),
        # CSV only: what the text and the notes say to people travels with the numbers (see _CONTEXT_KEYS)
        *(Field(key) for key in _CONTEXT_KEYS),
    ]
    return fields


_CONTEXT_KEYS = ("kv_dtype", "latency_source", "workload_kind", "sliding_window_pool_modelled", "moe_weight_reads")


_MEMORY_FIELDS = [
    Field("policy"),
    *(Field(part, part.replace("_", " "), format_percent) for part in MEMORY_PARTS),
    Field("useful_of_occupied", "token states of occupied", format_percent),
    Field("block_tables"),
    Field("block_table_bytes_mean", "block tables, mean bytes (beside the pool)", lambda v: format_bytes(int(v))),
]


def _max_rate_table(searches: dict, slo_spec, target: float) -> Table:
    records = [
        {"policy": p, "attainment_target": target, "max_rate_rps": s.max_rate_rps, "bracket_low_rps": s.bracket_rps[0],
         "bracket_high_rps": s.bracket_rps[1], "runs": len(s.evaluations)}
        for p, s in searches.items()
    ]
    fields = [
        Field("policy", "policy"),
        Field("attainment_target"),
        Field("max_rate_rps", "max rate (req/s)", "{:.3f}".format),
        Field("bracket_low_rps"),
        Field("bracket_high_rps"),
        Field(None, "bracket (req/s)", lambda r: f"{r['bracket_low_rps']:.3f} – {r['bracket_high_rps']:.3f}"),
        Field("runs", "runs"),
    ]
    title = f"Requests supported: highest rate with ≥ {format_percent(target)} meeting {slo_spec.describe()}"
    return record_table(title, fields, records)


_SPEC_FIELDS = [
    Field("run"),
    Field("ttft_mean_s", "TTFT mean (ms)", _ms),
    Field("tpot_mean_s", "TPOT mean (ms)", _ms),
    Field("tpot_p99_s", "TPOT p99 (ms)", _ms),
    Field("itl_mean_s", "ITL mean (ms)", _ms),
    Field("throughput_rps", "throughput (req/s)", "{:.3f}".format),
    Field("output_tokens_per_s", "output tokens/s", "{:,.0f}".format),
    Field("mean_tokens_per_step", "tokens per decode step", "{:.3f}".format, missing="1 (plain)"),
    Field("speculative_share", "speculative slots (of the pool)", format_percent, missing="–"),
]


def _speculative_doc(result: Simulation, summaries: dict, plain: dict) -> dict:
    """The `speculative` JSON object: the settings, the first policy's measured means, each policy without it."""
    spec = result.job.sim.speculation
    assert spec is not None  # build_report calls this only when speculating
    first = summaries[result.job.policies[0]]["speculative"]
    return {
        "spec_tokens": spec.spec_tokens, "acceptance": spec.acceptance, "method": spec.method,
        "draft_cost": spec.draft_cost, "rollback_policy": spec.rollback_policy,
        "lookahead_slots": spec.lookahead_slots, "slots_per_step": spec.speculation.slots_per_step,
        "closed_form_tokens_per_step": spec.closed_form_tokens_per_step,
        "mean_accepted_per_step": first["mean_accepted_per_step"],
        "mean_tokens_per_step": first["mean_tokens_per_step"],
        "fast_forward": False,
        "without_speculation": {name: {key: s[key] for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "throughput_rps",
                                                               "output_tokens_per_s", "steps")}
                                for name, s in plain.items()},
    }


def _speculative_table(result: Simulation, summaries: dict, plain: dict) -> Table:
    spec = result.job.sim.speculation
    assert spec is not None  # build_report calls this only when speculating
    records = []
    for name in result.job.policies:
        for label, s in ((f"{name}, K = {spec.spec_tokens}", summaries[name]), (f"{name}, plain", plain[name])):
            measured = s.get("speculative")
            records.append({
                "run": label, "policy": name, "spec_tokens": spec.spec_tokens if measured else 0,
                "ttft_mean_s": s["ttft_s"]["mean"], "tpot_mean_s": s["tpot_s"]["mean"],
                "tpot_p99_s": s["tpot_s"]["p99"], "itl_mean_s": s["itl_s"]["mean"],
                "throughput_rps": s["throughput_rps"], "output_tokens_per_s": s["output_tokens_per_s"],
                "mean_tokens_per_step": measured["mean_tokens_per_step"] if measured else None,
                "speculative_share": s["memory"]["speculative"] if measured else None,
            })
    title = (f"Speculative (K = {spec.spec_tokens}, A = {spec.acceptance:g}; closed form "
             f"{spec.closed_form_tokens_per_step:.3f} tokens per step) vs plain decoding, same workload")
    return quantity_table(title, ["", *(r["run"] for r in records)], _SPEC_FIELDS, records)


def build_report(result: Simulation, plain: dict | None = None) -> Report:
    """`plain`: with speculation, each policy's summary of the same run without it (RunSummary objects)."""
    job = result.job
    policies, slo_spec, target, searches = list(job.policies), job.slo, job.target_attainment, result.searches
    summaries = {name: summary.to_dict() for name, summary in result.summaries.items()}
    plan = job.plan
    for summary in summaries.values():
        if "prefix_cache" in summary:  # absent only from a record made without the scheduler's counts
            group_prefix_hits(plan.layout, summary["prefix_cache"])
    doc = _job_doc(job, summaries)
    speculating = job.sim.speculation is not None
    if speculating:
        plain_docs = {name: summary.to_dict() for name, summary in (plain or {}).items()}
        doc["speculative"] = _speculative_doc(result, summaries, plain_docs)
    if searches:
        doc["max_rate_rps"] = {name: s.max_rate_rps for name, s in searches.items()}
        doc["max_rate_search"] = _search_doc(searches, target)
    records = [_policy_record(p, summaries[p]) for p in policies]
    window = doc["sliding_window"]
    context = {"kv_dtype": job.kv_dtype, "latency_source": "step_time_model", "workload_kind": job.workload.kind,
               "sliding_window_pool_modelled": window["pool_modelled"] if window else None,
               "moe_weight_reads": doc["moe_weight_reads"]}
    for record in records:
        record.update(context)
    tables = [
        quantity_table("Latency and throughput (step-time model)", ["", *policies], _latency_fields(slo_spec), records),
        quantity_table("KV pool over time (time-averaged share of the pool)", ["", *policies],
                       _MEMORY_FIELDS + ([Field("speculative", "speculative slots (drafts, lookahead, kept)",
                                                format_percent)] if speculating else []), records),
    ]
    if plan.layout is not None:
        tables.append(_groups_table(plan, policies, summaries))
    if any(p["enabled"] or p["dropped_tokens"] for s in summaries.values() if (p := s.get("prefix_cache"))):
        tables.append(prefix_table(plan.layout, policies, summaries, _why_no_prefix_cache(job)))
    if speculating and plain:
        tables.append(_speculative_table(result, summaries, plain_docs))
    if searches:
        tables.append(_max_rate_table(searches, slo_spec, target))
    return Report(doc=doc, tables=tables, notes=_notes(job, searches), text=_text(job))


def _job_doc(job, summaries: dict[str, dict]) -> dict:
    """The JSON document's top: the first policy's summary, then what was simulated (workload, model, GPU,
    memory plan, KV groups, SLO) and every policy's summary."""
    plan, slo_spec = job.plan, job.slo
    return {
        **summaries[job.policies[0]],
        "workload": {
            "kind": job.workload.kind,
            "description": job.workload.description,
            "requests": len(job.workload),
            "mean_rate_rps": job.workload.mean_rate_per_s,
        },
        "latency_source": job.latency_source,
        "model": job.spec.name,
        "gpu": plan.gpu.name,
        "tp": plan.tp,
        "kv_dtype": job.kv_dtype,
        "memory_plan": _memory_plan_doc(plan, job.sim),
        "sliding_window": None if not job.spec.num_sliding_layers else {
            "kind": job.sim.steptime.window_kind,  # "sliding" (min(q, W) positions) or "chunked" (its own chunk)
            "window_tokens": job.spec.sliding_window, "sliding_layers": job.spec.num_sliding_layers,
            "layers": job.spec.layers, "attention_modelled": True, "pool_modelled": job.sim.groups is not None,
        },
        "kv_cache_groups": _groups_doc(plan, job.prefix_hits_lower_bound),
        "moe_weight_reads": "uniform_routing_expectation" if job.sim.steptime.num_experts else None,
        "slo": None
        if slo_spec.is_empty
        else {"ttft_s": slo_spec.ttft_s, "tpot_s": slo_spec.tpot_s, "e2e_s": slo_spec.e2e_s},
        "policies": summaries,
    }


def _why_no_prefix_cache(job) -> str:
    """Why no policy of the run had a prefix cache (the preemption table's title says it)."""
    if job.workload.has_prefix_ids and not job.sim.prefix_caching:
        return "prefix caching off, --no-prefix-caching"
    if job.workload.has_prefix_ids:
        return "only the paged policy has one"
    return "the workload has no prefix ids"


def _memory_plan_doc(plan, sim) -> dict:
    """The memory plan; num_blocks is vLLM's num_gpu_blocks, of which null_blocks are never handed out (vLLM's
    null block; none under the ideal layout) and free_blocks are the pool's ids."""
    return {
        "vllm_version": plan.vllm_version,
        "memory_utilization": plan.memory_utilization,
        "requested_bytes": plan.budget_bytes,
        "weights_bytes": plan.weights_bytes,
        "workspace_bytes": plan.workspace_bytes,
        "non_torch_bytes": plan.non_torch_bytes,
        "cuda_graph_bytes": plan.cuda_graph_bytes,
        "max_num_seqs": plan.max_num_seqs,
        "kv_pool_bytes": plan.pool_bytes,
        "num_blocks": plan.num_blocks,
        "null_blocks": sim.null_blocks,
        "free_blocks": sim.capacity_blocks,
        "block_size": plan.block_size,
        "capacity_tokens": plan.capacity_tokens,
        "kv_bytes_per_token": plan.kv_bytes_per_token,
    }


def _search_doc(searches: dict, target: float) -> dict:
    return {
        name: {
            "attainment_target": target,
            "bracket_rps": list(s.bracket_rps),
            "evaluations": [list(e) for e in s.evaluations],  # (rate, attainment) — a bound where decided early
            "decided_early": list(s.decided_early),  # rates whose run stopped once its verdict was certain
            "resolution": s.resolution,  # the bracket's relative width at the end
            "unattainable": s.unattainable,
        }
        for name, s in searches.items()
    }


def _text(job) -> list[str]:
    """The workload and memory-plan lines above the tables."""
    plan = job.plan
    text = [
        f"workload ({job.workload.kind}): {job.workload.description}",
        f"model: {job.spec.name} on {plan.gpu.name} x{plan.tp}, vLLM {plan.vllm_version} memory plan at "
        f"utilisation {plan.memory_utilization:g}, max_num_seqs {plan.max_num_seqs:,}: weights "
        f"{format_bytes(plan.weights_bytes)}, activation peak "
        f"{format_bytes(plan.workspace_bytes)}, non-torch {format_bytes(plan.non_torch_bytes)}"
        + (f", CUDA graphs {format_bytes(plan.cuda_graph_bytes)}" if plan.cuda_graph_bytes else "")
        + f", KV pool {format_bytes(plan.pool_bytes)} = "
        f"{plan.num_blocks:,} blocks of {plan.block_size} ("
        + (f"{job.sim.null_blocks} null block, {job.sim.capacity_blocks:,} free; " if job.sim.null_blocks else "")
        + f"{plan.capacity_tokens:,} token slots"
        + (" in every attention group" if plan.layout is not None else "")
        + f", {format_bytes(plan.kv_bytes_per_token)} per token in {job.kv_dtype}) per GPU",
    ]
    if plan.layout is not None:
        text.append(f"KV cache groups ({plan.layout.layout} layout, block {plan.block_size}, a block "
                    f"{format_bytes(plan.block_bytes)}): " + "; ".join(
                        f"{g.kind}{'' if g.window is None else f' {g.window:,}'} x{g.pages_per_block}"
                        f"{' units' if weighted_layout(plan.layout) else ''} "
                        f"({g.layers} {g.source} layers)" for g in plan.layout.groups))
    return text


def _notes(job, searches: dict) -> list[str]:
    notes = [
        f"latencies come from the step-time model, not a measurement: {job.latency_source}",
        f"workload is {job.workload.kind}: {job.workload.description}",
        *job.workload.notes,
        *job.notes,
        *(f"max rate of {name}: the target is out of reach at any rate: {s.unattainable}"
          for name, s in searches.items() if s.unattainable),
        *(_unbounded_note(name, s.max_rate_rps, len(job.workload))
          for name, s in searches.items() if not s.unattainable and math.isinf(s.bracket_rps[1])),
    ]
    return notes


def _unbounded_note(policy: str, rate: float, requests: int) -> str:
    """A search that never saw a rate fail: the workload is too small to load the GPU, so its rate says little."""
    where = ("the requests all arrive at one instant" if math.isinf(rate) else
             f"up to {rate:,.6g} req/s, where the {requests:,} requests arrive within about {requests / rate:.3g} s")
    return (f"max rate of {policy}: every rate tried passed ({where}): one batch that the GPU serves within the SLO, "
            "not a sustained rate; give more requests (--requests, --limit) to find where it saturates")
