"""`kvcalc sim`: continuous batching over the KV block pool under an arrival process.

The options are those of `core.sim.options.SimOptions`, one flag per field, built here into the command's
signature (typer reads it like a written one); only the output options are the command's own.
"""

from __future__ import annotations

import csv
import inspect
import typing
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any

import typer

from ..core.sim.options import SimOptions
from .options import (
    ConfigOpt,
    FormatOpt,
    HeadDimOpt,
    JsonOpt,
    KvHeadsOpt,
    LayersOpt,
    ModelOpt,
    check_output_path,
    int_option,
    number,
    seed_option,
)
from .output import Format, emit, err_console, resolve_format

PROGRESS_FROM = 5_000  # arrivals over all policies: about 2 s of simulation on a 2-core machine

_SHARED = {"model": ModelOpt, "config": ConfigOpt, "layers": LayersOpt, "kv_heads": KvHeadsOpt,
           "head_dim": HeadDimOpt}
_OUTPUT = [
    ("timeline", Annotated[Path | None, typer.Option("--timeline", help="Write the memory/queue timeline as CSV.")],
     None),
    ("plot", Annotated[Path | None, typer.Option("--plot", help="Memory over time and latency CDFs (.png/.svg).")],
     None),
    ("json_flag", JsonOpt, False),
    ("fmt", FormatOpt, Format.table),
]


def _parameter_name(name: str, negate: bool) -> str:
    return f"no_{name}" if negate else name


def _parameters() -> list[inspect.Parameter]:
    """One typer option per SimOptions field (its default, help and flag), then the output options."""
    hints = typing.get_type_hints(SimOptions)
    params = []
    for f in fields(SimOptions):
        meta, negate = f.metadata, f.metadata.get("negate", False)
        if f.name in _SHARED:
            annotation = _SHARED[f.name]
        else:
            decls = (meta.get("flag", "--" + f.name.replace("_", "-")), *([meta["short"]] if "short" in meta else []))
            kind = bool if negate else hints[f.name]
            if f.name == "seed":
                option = seed_option(meta["help"])
            elif int in typing.get_args(kind) or kind is int:
                option = int_option(*decls, help=meta["help"])
            elif float in typing.get_args(kind) or kind is float:  # one `error:` line naming the flag, with a fix
                example = meta.get("example", f"{f.default:g}" if f.default is not None else "1")
                option = typer.Option(*decls, parser=number(decls[0], example), help=meta["help"],
                                      metavar=meta.get("metavar", "<float>"))
            else:
                option = typer.Option(*decls, help=meta["help"], metavar=meta.get("metavar"))
            annotation = Annotated[kind, option]
        params.append(inspect.Parameter(_parameter_name(f.name, negate), inspect.Parameter.KEYWORD_ONLY,
                                        default=not f.default if negate else f.default, annotation=annotation))
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
               for name, annotation, default in _OUTPUT]
    return params


def command(**values: Any) -> None:
    """Simulate serving: continuous batching over the KV pool; TTFT, TPOT, E2E, goodput, memory, max rate.

    Latencies come from a roofline step-time model, not a measurement.
    Default: OPT-13B on one A100-40GB, 1,000 ShareGPT-like constructed requests at 1 request/s.
    """
    from ..core.sim.setup import build
    from ..core.sim.simulate import Simulation, available_cpus, run_policies, search_max_rates, work_units
    from .progress import progress_bar
    from .sim_report import build_report

    timeline, plot, json_flag, fmt = (values.pop(name) for name, _, _ in _OUTPUT)
    options = SimOptions(**{
        f.name: not values[f"no_{f.name}"] if f.metadata.get("negate") else values[f.name] for f in fields(SimOptions)})
    if plot is not None:
        from .chart import check_plot_target

        check_plot_target(plot)
    if timeline is not None:
        check_output_path("--timeline", timeline)
    setup = build(options)
    workers = available_cpus()
    units = work_units(setup)
    with progress_bar(f"simulating {', '.join(setup.policies)} (arrivals)", total=units,
                      enabled=units >= PROGRESS_FROM) as advance:
        records = run_policies(setup, record_timeline=timeline is not None or plot is not None, progress=advance,
                               workers=workers)
    searches = {}
    if setup.find_max_rate:
        for name in setup.policies:
            err_console.print(f"searching the max rate of {name} …", highlight=False)
        with progress_bar("max-rate search (simulated runs)", total=None) as advance:
            searches = search_max_rates(setup, progress=advance, workers=workers, records=records)
    tier_comparison = None
    if setup.sim.tiers is not None:  # the same runs with and without each tier (core/sim/tiers_compare.py)
        from ..core.sim.tiers_compare import compare_tiers

        with progress_bar("the same workload with and without each tier (arrivals)", total=None) as advance:
            tier_comparison = compare_tiers(setup, records, searches, progress=advance)
    result = Simulation.from_runs(setup, records, searches)
    plain = None
    if setup.sim.speculation is not None:
        from ..core.sim.setup import without_speculation

        plain_setup = without_speculation(setup)
        with progress_bar("the same runs without speculation (arrivals)", total=units,
                          enabled=units >= PROGRESS_FROM) as advance:
            plain_records = run_policies(plain_setup, progress=advance, workers=workers)
        plain = Simulation.from_runs(plain_setup, plain_records, {}).summaries
    if timeline is not None:
        _write_timeline(timeline, result.records)
        err_console.print(f"wrote {timeline}", highlight=False)
    if plot is not None:
        from .sim_plot import write_sim_plot

        write_sim_plot(plot, result.records, f"{setup.workload.kind} workload: {setup.workload.description}")
        err_console.print(f"wrote {plot}", highlight=False)
    report = build_report(result, plain)
    if tier_comparison is not None:
        from .sim_tiers_report import add_tier_comparison

        add_tier_comparison(report, tier_comparison)
    emit(report, resolve_format(json_flag, fmt))


command.__signature__ = inspect.Signature(_parameters())  # type: ignore[attr-defined]


def _write_timeline(path: Path, records: dict) -> None:
    from ..core.sim.metrics import TIMELINE_COLUMNS, timeline_rows

    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        groups = max((len(r.group_block_s) for r in records.values() if r.group_block_s is not None), default=0)
        writer.writerow(["policy", *TIMELINE_COLUMNS, *(f"group{g}_blocks" for g in range(groups))])
        for name, record in records.items():
            for row in timeline_rows(record):
                writer.writerow([name, *row])
