"""Progress on stderr for work that can take more than a couple of seconds.

Core functions that can run long take an optional `progress: Callable[[int], None]` callback ("n more
units done") and know nothing of terminals; the CLI passes the `advance` that this context manager yields:

    with progress_bar("simulating", total=len(policies) * len(workload)) as advance:
        result = core_function(..., progress=advance)

The bar is drawn only when stderr is a terminal (a log file or a pipe gets nothing), always on stderr, and
is transient (it clears itself), so stdout keeps exactly the data — one JSON document with --json. rich is
imported only when a bar is drawn. `advance(0, description="…")` only changes the text beside the bar
(what is running now), for work whose steps differ (kvcalc bench).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Advance(Protocol):
    """What progress_bar yields: a `Callable[[int], None]` that also takes the text beside the bar."""

    def __call__(self, units: int = 1, description: str | None = None) -> None: ...


def _noop(units: int = 1, description: str | None = None) -> None:
    return None


@contextmanager
def progress_bar(description: str, total: int | None, *, enabled: bool = True) -> Iterator[Advance]:
    """Yields `advance(units=1, description=None)`; `total` None draws a spinner with a count instead of a bar."""
    if not (enabled and sys.stderr.isatty()):
        yield _noop
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    columns += [BarColumn(), MofNCompleteColumn()] if total is not None else [TextColumn("{task.completed:,}")]
    with Progress(*columns, TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)

        def advance(units: int = 1, description: str | None = None) -> None:
            bar.update(task, advance=units, description=description)  # None keeps the text

        yield advance
