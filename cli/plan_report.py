"""The report of `kvcalc plan`: its JSON document, the tables that show it (display and CSV forms from one
record per point), and the --plot figure."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ..core.model.models import get_preset, resolve_model
from ..core.plan.evaluate import SERVES, VERDICTS
from ..core.plan.planner import PlanResult, without_point
from ..core.sim.options import DEFAULT_MODEL
from ..core.units import format_percent
from .output import NOT_APPLICABLE, Field, Report, record_table


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1e3:,.2f}"


def _max_rate(record: dict, key: str = "max_rate_rps", missing: str = "–") -> str:
    """The max rate per replica (or per GPU, `key`); '≥ R' when the search stopped doubling before any rate
    failed."""
    if record[key] is None:
        return missing
    bracket = record["bracket_rps"]
    return ("≥ " if bracket[1] is None else "") + f"{record[key]:.4g}"


def _headroom(record: dict) -> str:
    """max rate / load, '≥' when the search stopped doubling before any rate failed."""
    if record["headroom"] is None:
        return "–"
    return ("≥ " if record["bracket_rps"][1] is None else "") + f"{record['headroom']:.2f}x"


def _metric_label(metric: str) -> str:
    """'ttft_p99_s' -> 'TTFT p99'."""
    name, stat, _ = metric.split("_")
    return f"{name.upper()} {stat}"


def _money(value: float) -> str:
    return f"{value:,.2f}"


def sim_command(result: PlanResult, index: int) -> str:
    return shlex.join(["kvcalc", "sim", *result.sim_argv(index)])


def _fields(result: PlanResult) -> list[Field]:
    """Every quantity in CSV; on screen the settings that the space varies (the text names the others)."""
    metric = result.metric
    metric_label = _metric_label(metric)
    space = result.request.space
    shown = {"replicas": len(space.replicas) > 1, "block_size": len(space.block_sizes) > 1,
             "max_batched_tokens": len(space.max_batched_tokens) > 1, "kv_dtype": len(space.kv_dtypes) > 1}
    return [
        Field("index", "#"),
        Field("gpu", "GPU"),
        Field("tp", "TP"),
        Field("replicas", "replicas" if shown["replicas"] else None),
        Field("gpus"),
        Field("block_size", "block" if shown["block_size"] else None),
        Field("max_batched_tokens", "max batched" if shown["max_batched_tokens"] else None),
        Field("kv_dtype", "KV" if shown["kv_dtype"] else None),
        Field("price_per_gpu_hour"),
        Field("cost_per_hour", "$/hour", _money),
        Field("verdict_text", "verdict"),
        Field("verdict"),
        Field("rate_per_replica_rps", "load (req/s)", "{:.4g}".format),
        Field("slo_attainment", "attainment", format_percent),
        Field(metric, f"{metric_label} (ms)", _ms),
        Field(None, "max (req/s)", lambda r: _max_rate(r)),
        Field("max_rate_rps"),
        Field(None, "req/s/GPU", lambda r: _max_rate(r, "max_rps_per_gpu", NOT_APPLICABLE)),
        Field("max_rps_per_gpu"),
        Field(None, "headroom", lambda r: _headroom(r)),
        Field("headroom"),
        Field("front_text", "front"),
        Field("on_cost_front"),
        Field("on_efficiency_front"),
        Field("preemptions"),
        Field("rejected"),
        Field("reason", "why it lost"),
    ]


def _table_records(result: PlanResult) -> list[dict[str, Any]]:
    records = []
    front, efficiency = set(result.front), set(result.efficiency_front)
    for record in without_point(result):
        row = {field.key: None for field in _fields(result) if field.key is not None} | record
        row["verdict_text"] = VERDICTS[record["verdict"]] + (" (chosen)" if record["index"] == result.chosen else "")
        row["on_cost_front"] = record["index"] in front
        row["on_efficiency_front"] = record["index"] in efficiency
        marks = [name for name, on in (("cost", row["on_cost_front"]), ("req/s/GPU", row["on_efficiency_front"]))
                 if on]
        row["front_text"] = ", ".join(marks) if marks else None
        records.append(row)
    return records


def model_name(result: PlanResult) -> str:
    """The model every point simulates: sim's own choice (its default preset when none is given)."""
    o = result.request.base
    return (resolve_model(o.model, o.config, o.layers, o.kv_heads, o.head_dim) or get_preset(DEFAULT_MODEL)).name


def build_report(result: PlanResult) -> Report:
    slo = result.slo
    model = model_name(result)
    records = _table_records(result)
    fields = _fields(result)
    doc: dict[str, Any] = {
        "model": model,
        "workload": {"description": result.workload_description, "target_rate_rps": result.target_rate_rps},
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s},
        "target_attainment": result.target_attainment,
        "metric": result.metric,
        "prices_per_gpu_hour": dict(result.request.prices),
        "points": without_point(result),
        "cost_front": result.front,
        "efficiency_front": result.efficiency_front,
        "chosen": result.chosen,
        "sim_command": None if result.chosen is None else sim_command(result, result.chosen),
        "cached_points": result.cached,
    }
    front_records = [r for r in records if r["on_cost_front"]]
    front_fields = [f for f in fields if f.key not in ("verdict_text", "verdict", "reason", "front_text",
                                                         "preemptions", "rejected")]
    tables = [
        record_table(f"Pareto front: cost per hour against {_metric_label(result.metric)} (serving points)",
                     front_fields, front_records),
        record_table("Every point", fields, records),
    ]
    return Report(doc=doc, tables=tables, notes=_notes(result), text=_text(result, model, doc["sim_command"]))


def _text(result: PlanResult, model: str, command: str | None) -> list[str]:
    """The lines above the tables: the model, the workload and SLO, the verdicts, the chosen point."""
    slo, space = result.slo, result.request.space
    counts: dict[str, int] = {}
    for record in result.points:
        counts[record["verdict"]] = counts.get(record["verdict"], 0) + 1
    text = [
        f"model: {model}" + (" (sim's default: no --model given)" if result.request.base.model is None
                             and result.request.base.config is None and result.request.base.layers is None else ""),
        f"workload: {result.workload_description}; the deployment must serve {result.target_rate_rps:.4g} req/s "
        f"with ≥ {format_percent(result.target_attainment)} of requests meeting {slo.describe()}",
        f"{len(result.points)} points: " + ", ".join(f"{n} {VERDICTS[v]}" for v, n in counts.items()),
    ]
    fixed = [f"{name} {values[0]}" for name, values in (
        ("replicas", space.replicas), ("block", space.block_sizes), ("max batched tokens", space.max_batched_tokens),
        ("KV", space.kv_dtypes)) if len(values) == 1]
    if fixed:
        text.append("every point: " + ", ".join(fixed))
    if result.chosen is None:
        text.append("no point serves the workload under the SLO: see why each lost below")
    else:
        chosen = result.points[result.chosen]
        text += [
            f"chosen: #{chosen['index']} {chosen['point'].label()} at {_money(chosen['cost_per_hour'])} per hour "
            f"({chosen['gpus']} GPU{'s' if chosen['gpus'] > 1 else ''}), {_metric_label(result.metric)} "
            f"{_ms(chosen[result.metric])} ms, max "
            f"{_max_rate(chosen)} req/s per replica (headroom {_headroom(chosen)})",
            f"reproduce it: {command}",
        ]
    return text


def _notes(result: PlanResult) -> list[str]:
    notes = [
        "each point is one `kvcalc sim --max-rate` run of one replica at 1/replicas of the workload's rate "
        "(an even split; the load balancer is not modelled); latencies come from sim's step-time model",
        "a point whose run at its own load misses the attainment target is not searched further (its SLO is lost)",
        "cost = price per GPU-hour × tp × replicas (prices from --gpu-cost only)",
    ]
    unbounded = [r for r in result.points if r.get("bracket_rps") and r["bracket_rps"][1] is None
                 and r.get("max_rate_rps") and r.get("requests")]
    if unbounded:  # as sim's note: the search doubled up to its limit without a failure
        slowest = min(unbounded, key=lambda r: r["max_rate_rps"])
        rate, requests = slowest["max_rate_rps"], slowest["requests"]
        notes.append(f"{len(unbounded)} point{'s' if len(unbounded) > 1 else ''} never saw a rate fail (max rate "
                     f"'≥'): at {rate:,.6g} req/s the {requests:,} requests arrive within about "
                     f"{requests / rate:.3g} s, one batch that the GPU serves within the SLO, not a sustained rate; "
                     "give more requests (--requests, --limit) to find where each point saturates")
    raised = sorted({(r["block_size"], r["memory"]["block_size"]) for r in result.points
                     if "memory" in r and r["memory"]["block_size"] != r["block_size"]})
    if raised:
        notes.append("the pool's block differs from the point's --block (a hybrid model's KV cache layout sets its "
                     "page size): " + ", ".join(f"{a} → {b:,} tokens" for a, b in raised)
                     + "; the JSON's memory.block_size is the one simulated")
    return notes


def write_plan_plot(path: Path, result: PlanResult) -> None:
    """Cost per hour against the SLO metric for every serving point; the cost front as a line, the chosen
    point ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    serving = [r for r in result.points if r["verdict"] == SERVES]
    fig, ax = plt.subplots(figsize=(8, 5))
    for gpu in dict.fromkeys(r["gpu"] for r in serving):
        mine = [r for r in serving if r["gpu"] == gpu]
        ax.scatter([r["cost_per_hour"] for r in mine], [r[result.metric] * 1e3 for r in mine], label=gpu)
    front = [result.points[i] for i in result.front]
    if front:
        ax.plot([r["cost_per_hour"] for r in front], [r[result.metric] * 1e3 for r in front], "k--", lw=1,
                label="cost front")
    if result.chosen is not None:
        chosen = result.points[result.chosen]
        ax.scatter([chosen["cost_per_hour"]], [chosen[result.metric] * 1e3], s=200, facecolors="none",
                   edgecolors="red", label="chosen")
    ax.set_xlabel("cost per hour")
    ax.set_ylabel(f"{result.metric.removesuffix('_s')} (ms)")
    ax.set_title(f"kvcalc plan: {len(serving)} of {len(result.points)} points serve")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
