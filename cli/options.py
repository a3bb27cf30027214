"""Options shared by several commands, declared once as `Annotated` aliases."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvcalc.cli.output import Format

JsonOpt = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")]
FormatOpt = Annotated[
    Format, typer.Option("--format", case_sensitive=False, help="Output format: table, json, csv, markdown.")
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="A built-in model preset (kvcalc size lists them).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="A Hugging Face config.json, read offline.")
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="KV precision: fp32, fp16, bf16, fp8, int8, int4.")]
LayersOpt = Annotated[int | None, typer.Option("--layers", help="Number of layers (overrides the model's).")]
KvHeadsOpt = Annotated[int | None, typer.Option("--kv-heads", help="Number of KV heads (overrides the model's).")]
HeadDimOpt = Annotated[int | None, typer.Option("--head-dim", help="Head dimension (overrides the model's).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for constructed samples (runs are reproducible).")]
