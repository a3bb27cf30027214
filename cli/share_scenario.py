"""`kvcalc share`'s scenario mode: K branches forked from one P-token prompt, each generating G tokens, through
the real block pool (core/share/forks.py): logical vs physical blocks, copy-on-write copies, bytes saved."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.units import format_bytes, format_count, format_percent, plural
from .output import Field, RawTable, Report, Table, quantity_table
from .progress import progress_bar
from .share_inputs import DEFAULTS, ShareInputs

if TYPE_CHECKING:
    from ..core.model.kv_groups import KVLayout
    from ..core.model.models import ModelSpec
    from ..core.share.forks import ScenarioResult
    from ..core.share.memory import PoolBytes

PROGRESS_FROM_APPENDS = 500_000  # decode appends that take about a second on a 2-core machine: a progress bar


def scenario_report(inputs: ShareInputs) -> Report:
    """Check the scenario (--seed needs --mode beam), run it (with a model: through its KV cache groups)."""
    from ..core.share.forks import ScenarioSpec, run_scenario
    from ..core.share.memory import model_groups, pool_bytes

    o, spec, block = inputs.opts, inputs.spec, inputs.block
    kv_layout, groups = model_groups(spec, inputs.bits, block, o.layout, o.mamba_cache_mode)
    layout = kv_layout if groups else None  # several block tables: the branches page through the layout's groups
    scenario = ScenarioSpec(
        prefix_tokens=DEFAULTS["prefix"] if o.prefix is None else o.prefix,
        branches=DEFAULTS["branches"] if o.branches is None else o.branches,
        gen_tokens=DEFAULTS["gen"] if o.gen is None else o.gen,
        block_size=block if layout is None else layout.block_size,
        mode=DEFAULTS["mode"] if o.mode is None else o.mode.strip().lower(),
        seed=0 if o.seed is None else o.seed,
    )
    if o.seed is not None and scenario.mode != "beam":
        # parallel branches draw nothing at random: a seed there would be accepted and change nothing
        raise ValueError(f"--seed applies to --mode beam ({scenario.mode} mode draws nothing at random): "
                         "add --mode beam or drop --seed")
    kv = None if spec is None else pool_bytes(spec, inputs.dtype, inputs.bits, block, scenario.tokens_per_branch,
                                              layout)
    with progress_bar(f"{scenario.mode} decoding", total=scenario.gen_tokens,
                      enabled=scenario.decode_appends * len(groups or (1,)) >= PROGRESS_FROM_APPENDS) as advance:
        result = run_scenario(scenario, progress=advance, groups=groups,
                              state_mode="none" if layout is None else layout.mamba_cache_mode)
    return _scenario_report(result, spec, kv, layout)


def pool_model_doc(kv: PoolBytes | None) -> dict[str, Any]:
    """The model part of the JSON; `bytes_upper_bound` is true when a sequence outgrows a window (see
    _window_note)."""
    if kv is None:
        return {}
    return {"model": kv.model, "dtype": kv.dtype, "block_bytes": kv.bytes_per_block,
            "bytes_upper_bound": kv.upper_bound}


def window_note(spec: ModelSpec | None, kv: PoolBytes | None) -> list[str]:
    """The pool keeps every layer's KV for every block of a sequence. A windowed layer needs only the blocks
    of its last `window` tokens, so once a sequence is longer than the window every byte figure here is an
    upper bound."""
    if spec is None or kv is None or not kv.upper_bound:
        return []
    if spec.num_sliding_layers:
        assert spec.sliding_window is not None  # sliding layers name their window
        held = (f"{spec.num_sliding_layers} of {spec.layers} layers keep only the last "
                f"{format_count(spec.sliding_window)} tokens")
    else:
        held = "some layers keep only a window or chunk of the tokens"
    return [f"{spec.name}: {held}, but the pool holds every layer for every block: bytes are an upper bound (an "
            "engine that frees blocks outside the window holds less; kvcalc size and frag apply the window)"]


def _scenario_report(result: ScenarioResult, spec: ModelSpec | None, kv: PoolBytes | None,
                     layout: KVLayout | None = None) -> Report:
    from ..core.share.forks import closed_form_physical_blocks
    from ..core.share.memory import group_doc, units_phrase

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
    doc.update(pool_model_doc(kv))
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
                f"types' block bytes) and {units_phrase(layout, doc['kv_cache_groups'])}")
        state = (f"; each branch holds its own recurrent state (mamba_cache_mode {layout.mamba_cache_mode})"
                 if layout.state_groups else "")
        report.notes.append(f"{kv.model}: {layout.layout} layout, {layout.reason}; {unit}{state}")
    elif s.mode == "parallel" and s.gen_tokens >= 2:  # G − 1 written: the last token is sampled, never written
        report.notes.append(
            f"closed form: floor(P/B) + K·ceil((P mod B + G − 1)/B) = "
            f"{closed_form_physical_blocks(s.prefix_tokens, s.branches, s.gen_tokens, s.block_size)} physical blocks"
        )
    if s.mode == "beam":
        report.notes.append(f"beam selection seeded with {s.seed}; {plural(result.dropped_branches, 'beam')} dropped")
    if kv is not None:
        report.notes.append(f"bytes: {kv.model}, {kv.dtype}, {format_bytes(kv.bytes_per_block)} per block (IEC units)")
    report.notes += window_note(spec, kv)
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
