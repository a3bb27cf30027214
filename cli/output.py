"""The one output sink: rich tables for people, or exactly one JSON document, or csv / markdown.

Data goes to stdout; logs, progress and warnings go to stderr (`err_console`). Commands build a
`Report` (a JSON document plus the tables and notes that show it to people) and call `emit`.

rich is imported only when something is drawn (a table, a line on `err_console`): its ~30 ms of imports
would otherwise be a large part of `kvcalc size --json`'s start-up, which prints plain JSON.

Two audiences, two forms of every table. The rich table and markdown are for people: display strings
("2,560", "248 B", "37.81 %", "—"). CSV is for scripts: each table also carries a `RawTable` whose
columns are snake_case names that say their unit (the JSON key where the JSON has one: `allocated`,
`utilization`, `block_table_bytes_exact`, `ttft_p99_s`) and whose cells are the values of the --json
document (exact int bytes and tokens, fractions 0..1, seconds), empty for "not applicable", true/false for
flags. Build both forms from one list of records with `record_table` or `quantity_table`, so that they cannot
drift; a table without a raw form cannot be written as CSV (a TypeError, an internal bug). A CSV of several
tables separates them with a blank line and a `# title` line before each table.

The JSON document's text is json_doc.to_json's.
"""

from __future__ import annotations

import dataclasses
import io
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from .flags import current_flags, rendered
from .json_doc import to_json

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table as RichTable


class _StderrConsole:
    """rich's Console on stderr, made on first use (an attribute of it read, a method called)."""

    def __init__(self) -> None:
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, markup=False)  # a message's text is never rich markup
        return getattr(self._console, name)


err_console: Any = _StderrConsole()


def warn_notes(notes: Sequence[str]) -> None:
    """A model's notes (config fields defaulted or ignored, the checkpoint's KV format, MTP layers not counted) as
    `warning:` lines on stderr, written with the running command's flags; every command that reads a model calls
    it (size, frag and share did not print them the same way: frag and share printed none)."""
    for note in notes:
        err_console.print(f"warning: {rendered(note, current_flags())}", highlight=False, soft_wrap=True)


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


NOT_APPLICABLE = "—"  # the display of a None cell; CSV writes an empty cell


@dataclass
class RawTable:
    """A table's machine-readable form for --format csv.

    `columns`: snake_case names that say their unit; `rows`: cells that are None (not applicable), bool,
    int, float (non-finite -> empty, as JSON's null) or a plain identifier/label string.
    """

    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)


@dataclass
class Table:
    """A titled table; `rows` hold display values (str or numbers), one list per row; `raw` the same
    quantities as raw values for CSV (required there)."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    caption: str | None = None
    raw: RawTable | None = None


@dataclass(frozen=True)
class Field:
    """One quantity of a table built from records (dicts).

    key: its CSV column and the record's key (None: a display-only cell combining several quantities, which
    then each have a CSV-only field). label: its display header (None: CSV only). show: the display cell
    from record[key], or from the whole record when key is None; a None value displays as `missing`.
    """

    key: str | None
    label: str | None = None
    show: Callable[[Any], Any] | None = None
    missing: str = NOT_APPLICABLE

    def display(self, record: Mapping[str, Any]) -> Any:
        value = record if self.key is None else record[self.key]
        if value is None:
            return self.missing
        return value if self.show is None else self.show(value)


def _raw(fields: Sequence[Field], records: Sequence[Mapping[str, Any]]) -> RawTable:
    keys = [f.key for f in fields if f.key is not None]
    return RawTable(keys, [[record[key] for key in keys] for record in records])


def record_table(
    title: str, fields: Sequence[Field], records: Sequence[Mapping[str, Any]], caption: str | None = None
) -> Table:
    """One row per record in both forms; display columns are the labelled fields, CSV columns the keyed ones."""
    shown = [f for f in fields if f.label is not None]
    rows = [[f.display(record) for f in shown] for record in records]
    return Table(title, [f.label for f in shown if f.label is not None], rows, caption, _raw(fields, records))


def quantity_table(
    title: str, header: Sequence[str], fields: Sequence[Field], records: Sequence[Mapping[str, Any]]
) -> Table:
    """People see one row per labelled field and one column per record (`header`: the label column's header,
    then the records' headers; a `show` may return several cells, e.g. bytes and IEC); CSV is tidy: one row
    per record, one column per keyed field, so that each column has one unit."""
    rows = []
    for f in fields:
        if f.label is None:
            continue
        cells: list[Any] = [f.label]
        for record in records:
            cell = f.display(record)
            cells.extend(cell if isinstance(cell, (list, tuple)) else [cell])
        rows.append(cells)
    return Table(title, list(header), rows, raw=_raw(fields, records))


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


def check_one_format(json_flag: bool, fmt: str, given: bool = False) -> None:
    """`--json` with `--format csv` or `markdown` asks for two formats, and so does `--format table` when the
    command line `given` says so (a parsed `table` is also the default, which cannot be told from no --format)."""
    others = (Format.csv.value, Format.markdown.value) + ((Format.table.value,) if given else ())
    if json_flag and fmt.lower() in others:
        raise ValueError(f"--json and --format {fmt} ask for two formats: give one of them")


def resolve_format(json_flag: bool, fmt: Format) -> Format:
    """`--json` is `--format json`."""
    check_one_format(json_flag, fmt.value)
    return Format.json if json_flag else fmt


def csv_cell(value: Any) -> str:
    """A raw value as one CSV cell: empty for None and non-finite floats, true/false, plain numbers."""
    if type(value) is int or type(value) is str:  # the common cells first (a million-row table)
        return str(value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        value = value.item()
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Fraction):
        value = float(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    if isinstance(value, (int, str)):
        return str(value)
    raise TypeError(f"CSV cell {value!r} is a {type(value).__name__}, not None, bool, int, float or str")


def _write_csv(table: Table, title_line: bool) -> str:
    if table.raw is None:
        raise TypeError(f"table {table.title!r} has no raw form: --format csv writes values, not display strings")
    import csv

    buffer = io.StringIO()
    if title_line:
        buffer.write(f"# {table.title}\n")
    writer = csv.writer(buffer, lineterminator="\n")
    columns = table.raw.columns
    writer.writerow(columns)
    for row in table.raw.rows:
        if len(row) != len(columns):
            raise TypeError(f"table {table.title!r}: a raw row of {len(row)} cells for {len(columns)} columns")
        writer.writerow([csv_cell(v) for v in row])
    return buffer.getvalue()


def _rich_table(table: Table) -> tuple[RichTable, int]:
    """The rich table, and the width it needs so that no cell is cut: every column at least as wide as its
    widest cell and its header's longest word (headers wrap between words)."""
    from rich.cells import cell_len
    from rich.markup import escape  # a title or cell holds names and paths ("[x]/t.jsonl"), never markup
    from rich.table import Table as RichTable

    cells = [[str(v) for v in row] for row in table.rows]
    caption = None if table.caption is None else escape(table.caption)
    rich_table = RichTable(title=escape(table.title), caption=caption, title_justify="left")
    widths = []
    for j, column in enumerate(table.columns):
        width = max([cell_len(row[j]) for row in cells if j < len(row)] + [cell_len(w) for w in column.split()] + [1])
        widths.append(width)
        rich_table.add_column(escape(column), justify="left" if j == 0 else "right", min_width=width)
    for row in cells:
        rich_table.add_row(*map(escape, row))
    return rich_table, sum(widths) + 3 * len(widths) + 1  # "│ " before each cell, " " after, "│" at the end


def _markdown(report: Report) -> str:
    """The report for people as markdown: its text lines, the tables (github style), a chart as a code block,
    and the notes — which say where figures come from, so they travel with the tables."""
    from tabulate import tabulate

    parts = [line + "\n" for line in report.text]
    for table in report.tables:
        # The display strings as they are (no re-parsing "3.00e-03" into 0.003), aligned as the rich table.
        align = ["left"] + ["right"] * (len(table.columns) - 1)
        # A "|" inside a cell (verify's "max |Δlogit|") would end the cell: markdown escapes it.
        cell = lambda v: str(v).replace("|", "\\|")  # noqa: E731
        body = tabulate([[cell(v) for v in row] for row in table.rows], headers=[cell(c) for c in table.columns],
                        tablefmt="github", disable_numparse=True, colalign=align)
        parts.append(f"### {table.title}\n\n{body}\n" + (f"\n{table.caption}\n" if table.caption else ""))
    parts += [f"```\n{block.rstrip()}\n```\n" for block in report.footer]
    if report.notes:
        parts.append("".join(f"* {note}\n" for note in report.notes))
    return "\n".join(parts)


def _with_flags(report: Report, flags: dict[str, str]) -> Report:
    """The report with every core Note (kvcalc.core.notes) in it written with the command's flags."""
    tables = [dataclasses.replace(
        table, rows=rendered(table.rows, flags), caption=rendered(table.caption, flags),
        raw=None if table.raw is None else dataclasses.replace(table.raw, rows=rendered(table.raw.rows, flags)))
        for table in report.tables]
    return Report(rendered(report.doc, flags), tables, rendered(report.notes, flags), rendered(report.text, flags),
                  report.footer)


def emit(report: Report, fmt: Format, console: Console | None = None) -> None:
    """Writes the report to stdout (or to `console`'s file) in `fmt`; only the table format loads rich."""
    stream = console.file if console is not None else sys.stdout
    report = _with_flags(report, current_flags())
    if fmt is Format.json:
        stream.write(to_json(report.doc) + "\n")
        return
    if fmt is Format.csv:  # every table converted before the first byte is written
        stream.write("\n".join(_write_csv(table, title_line=len(report.tables) > 1) for table in report.tables))
        return
    if fmt is Format.markdown:
        stream.write(_markdown(report))
        return
    if console is None:
        from rich.console import Console

        console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    out = console
    for line in report.text:
        out.print(line, highlight=False, markup=False)
    for table in report.tables:
        rich_table, needed = _rich_table(table)
        # Never crop a number: a table that needs more than the terminal's width prints wider (the terminal
        # wraps or scrolls) instead of cutting "6,417,027,318" to "6,417,0…".
        out.print(rich_table, width=max(out.width, needed), crop=False)
    for block in report.footer:
        out.print(block, highlight=False, markup=False)
    for note in report.notes:
        out.print(note, style="dim", highlight=False, markup=False)
