"""sim's prefix-cache report (core/sim/prefix_stats.py counts it): the hit rate of the admissions, each KV cache
group's own hit rate for a hybrid model, and what preemption by recompute dropped and computed again."""

from __future__ import annotations

from typing import Any

from ..core.units import format_count, format_percent
from .output import Field, Table, quantity_table


def group_prefix_hits(layout: Any, prefix: dict) -> None:
    """A hybrid pool's `group_hit_tokens` (one per KV cache group, in the layout's order) as one entry per group
    in `prefix["groups"]`; None for a single group of full attention."""
    hits = prefix.pop("group_hit_tokens", None)
    if layout is None or hits is None:
        prefix["groups"] = None
        return
    assert len(hits) == len(layout.groups), f"{len(hits)} groups' hits for {len(layout.groups)} groups"
    looked_up = prefix["prompt_tokens"]
    prefix["groups"] = [{"kind": g.kind, "window": g.window, "layers": g.layers, "source": g.source,
                         "mamba_cache_mode": layout.mamba_cache_mode if g.kind == "state" else None,
                         "hit_tokens": own, "hit_rate": own / looked_up if looked_up else 0.0}
                        for g, own in zip(layout.groups, hits, strict=True)]


def _group_label(group: dict) -> str:
    kind = group["kind"] + ("" if group["window"] is None else f" {group['window']:,}")
    mode = f", mamba_cache_mode {group['mamba_cache_mode']}" if group["mamba_cache_mode"] else ""
    return f"  {kind} group alone ({group['layers']} {group['source']} layers{mode})"


def prefix_table(layout: Any, policies: list[str], summaries: dict, why_none: str = "the workload has no prefix ids"
                 ) -> Table:
    """One column per policy: tokens looked up, hits, hit rate (each group's own for a hybrid model; – for a policy
    without a prefix cache), then the readmissions after a preemption by recompute and the tokens it dropped and
    computed again. Without any prefix cache, only the preemption rows, the title saying why (`why_none`)."""
    records = []
    for policy in policies:
        p = summaries[policy]["prefix_cache"]
        record = {"policy": policy, **{k: p[k] for k in _KEYS}}
        if not p["enabled"]:
            record.update(dict.fromkeys(("prompt_tokens", "hit_tokens", "hit_rate")))
        for i, g in enumerate(p["groups"] or ()):
            record[f"group{i}_{g['kind']}_hit_rate"] = g["hit_rate"]
        records.append(record)
    count, fields = format_count, [Field("policy")]
    caching = any(summaries[policy]["prefix_cache"]["enabled"] for policy in policies)
    if caching:
        fields += [Field("prompt_tokens", "prompt tokens looked up", count, missing="–"),
                   Field("hit_tokens", "hit tokens", count, missing="–"),
                   Field("hit_rate", "hit rate", format_percent, missing="–")]
        for i, g in enumerate(summaries[policies[0]]["prefix_cache"]["groups"] or ()):
            fields.append(Field(f"group{i}_{g['kind']}_hit_rate", _group_label(g), format_percent, missing="–"))
    fields += [Field("readmissions", "readmissions after a preemption", count),
               *([Field("readmitted_hit_tokens", "  their hit tokens", count)] if caching else []),
               Field("dropped_tokens", "KV tokens dropped by preemption", count),
               Field("recomputed_tokens", "  computed again", count)]
    if not caching:
        title = f"Preemption by recompute (no prefix cache: {why_none})"
    elif layout is not None:
        title = "Prefix cache (looked up at each admission; a group alone: its own longest hit)"
    else:
        title = "Prefix cache (looked up at each admission)"
    return quantity_table(title, ["", *policies], fields, records)


_KEYS = ("prompt_tokens", "hit_tokens", "hit_rate", "readmissions", "readmitted_hit_tokens", "dropped_tokens",
         "recomputed_tokens")
