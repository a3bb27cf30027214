"""The one output sink: rich tables for people, or exactly one JSON document, or csv / markdown.

Data goes to stdout; logs, progress and warnings go to stderr (`err_console`). Commands build a
`Report` (a JSON document plus the tables and notes that show it to people) and call `emit`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable

err_console = Console(stderr=True)


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


@dataclass
class Table:
    """A titled table; `rows` hold display values (str or numbers), one list per row."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    caption: str | None = None


@dataclass
class Report:
    """What a command prints: `doc` for --json, `tables`/`notes`/`text` for people.

    `text` prints before the tables, `footer` (e.g. a chart) after them; both only in table format.
    """

    doc: dict[str, Any]
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    footer: list[str] = field(default_factory=list)


def resolve_format(json_flag: bool, fmt: Format) -> Format:
    return Format.json if json_flag else fmt


def _json_default(value: Any) -> Any:
    if isinstance(value, Fraction):
        return float(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def to_json(doc: dict[str, Any]) -> str:
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(doc), indent=2, default=_json_default)


def emit(report: Report, fmt: Format, console: Console | None = None) -> None:
    out = console or Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    if fmt is Format.json:
        out.file.write(to_json(report.doc) + "\n")
        return
    if fmt in (Format.csv, Format.markdown):
        from tabulate import tabulate

        for i, table in enumerate(report.tables):
            if fmt is Format.csv:
                buffer = io.StringIO()
                writer = csv.writer(buffer, lineterminator="\n")
                if len(report.tables) > 1:
                    buffer.write(f"# {table.title}\n")
                writer.writerow(table.columns)
                writer.writerows(table.rows)
                out.file.write(buffer.getvalue())
            else:
                out.file.write(f"### {table.title}\n\n")
                out.file.write(tabulate(table.rows, headers=table.columns, tablefmt="github") + "\n")
            if i < len(report.tables) - 1:
                out.file.write("\n")
        return
    for line in report.text:
        out.print(line, highlight=False)
    for table in report.tables:
        rich_table = RichTable(title=table.title, caption=table.caption, title_justify="left")
        for j, column in enumerate(table.columns):
            rich_table.add_column(column, justify="left" if j == 0 else "right")
        for row in table.rows:
            rich_table.add_row(*(str(v) for v in row))
        out.print(rich_table)
    for block in report.footer:
        out.print(block, highlight=False, markup=False)
    for note in report.notes:
        out.print(f"[dim]{note}[/dim]", highlight=False)
