"""Every `$ kvcalc …` example in README.md and docs/*.md runs, and prints what the page shows.

The format, written for people first (docs/architecture.md says the same to contributors):

* An example is a fenced ```` ```console ```` block. A line starting with `$ kvcalc` is a command (a
  trailing `\\` continues it on the next line); the lines after it, up to the next command or the end of
  the block, are its expected stdout. A failing command also shows the `error: …` line it prints on
  stderr, then a last line `(exit N)`; without that line the command must exit 0.
* A line that is just `...` matches any number of lines (the rest of a long table, say); `...` inside a
  line matches any run of characters there, and the spaces around it (a CPU timing in a table cell, kept
  aligned). Nothing else varies: the commands run in-process through typer's CliRunner, in the
  repository root, at the 160 columns that kvcalc prints to a pipe or file.
* An HTML comment on the line before the fence marks an example that cannot run everywhere:
  `<!-- docs-test: cuda -->` needs a CUDA GPU, `<!-- docs-test: no-cuda -->` shows what happens without
  one, `<!-- docs-test: skip REASON -->` never runs. A command that reads `../shared/traces/…` is skipped
  when that file is absent (CI has no traces). Skips give their reason.

`python tests/update_docs_examples.py` rewrites the expected output of every example that runs here
from the current program, keeping the `...` lines and the lines with `...` that still match.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WILDCARD = "..."
COLUMNS = 160  # kvcalc's width when stdout is not a terminal (cli/output.py); the pages document it
PROMPT = "$ kvcalc"
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<kind>[\w-]+)\s*(?P<reason>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,})(?P<info>.*)$")
EXIT_LINE = re.compile(r"^\(exit (?P<code>\d+)\)$")
TRACE_PREFIX = "../shared/traces/"
UPDATE_COMMAND = "python tests/update_docs_examples.py"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass
class Example:
    """One `$ kvcalc` command of a console block and the output the page shows for it."""

    path: Path
    line: int  # 1-based line of the `$ kvcalc` line in `path`
    command_lines: list[str]  # as written (continuations included), without the block's indent
    expected: list[str]  # output lines as written; a last `(exit N)` line included
    marker: tuple[str, str] | None  # (kind, reason) from a docs-test comment

    @property
    def argv(self) -> list[str]:
        command = " ".join(line.rstrip().removesuffix("\\") for line in self.command_lines)
        return shlex.split(command.removeprefix("$ "))[1:]  # drop "kvcalc"

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


@dataclass
class Block:
    """A ```console block: its body's line range in the file, its indent, and its examples."""

    path: Path
    body_start: int  # 0-based index of the first line after the opening fence
    body_end: int  # 0-based index of the closing fence
    indent: str
    examples: list[Example] = field(default_factory=list)


def parse(path: Path) -> tuple[list[str], list[Block]]:
    """The file's lines and its console blocks; a malformed block is a ValueError naming its line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks = fence["indent"], fence["ticks"]
        end = next((k for k in range(i + 1, len(lines)) if lines[k].strip() == ticks), None)
        if end is None:
            raise ValueError(f"{path.name}:{i + 1}: fence {ticks} is never closed")
        if fence["info"].strip() == "console":
            blocks.append(_console_block(path, lines, i, end, indent))
        i = end + 1
    return lines, blocks


def _console_block(path: Path, lines: list[str], fence: int, end: int, indent: str) -> Block:
    marker = None
    before = fence - 1
    while before >= 0 and not lines[before].strip():
        before -= 1
    if before >= 0 and (found := MARKER.match(lines[before])):
        kind, reason = found["kind"], found["reason"]
        if kind not in ("cuda", "no-cuda", "skip") or (kind == "skip" and not reason):
            raise ValueError(f"{path.name}:{before + 1}: unknown docs-test marker {lines[before].strip()!r} "
                             "(use cuda, no-cuda or 'skip REASON')")
        marker = (kind, reason)
    block = Block(path, fence + 1, end, indent)
    k = fence + 1
    while k < end:
        text = lines[k].removeprefix(indent)
        if not text.startswith("$ "):
            raise ValueError(f"{path.name}:{k + 1}: a console block holds `$ kvcalc` commands and their output; "
                             f"found {text!r} before any command")
        if not text.startswith(PROMPT + " ") and text != PROMPT:
            raise ValueError(f"{path.name}:{k + 1}: only `$ kvcalc` commands run in a console block: {text!r} "
                             "(use a ```text block for other recorded output)")
        command = [text]
        start = k
        while command[-1].rstrip().endswith("\\") and k + 1 < end:
            k += 1
            command.append(lines[k].removeprefix(indent))
        k += 1
        expected = []
        while k < end and not lines[k].removeprefix(indent).startswith("$ "):
            expected.append(lines[k].removeprefix(indent).rstrip())
            k += 1
        block.examples.append(Example(path, start + 1, command, _trim(expected), marker))
    return block


def _trim(lines: Sequence[str]) -> list[str]:
    out = [line.rstrip() for line in lines]
    while out and not out[-1]:
        out.pop()
    return out


def collect() -> list[Example]:
    return [example for path in doc_files() for block in parse(path)[1] for example in block.examples]


# ---- matching ---------------------------------------------------------------------------------------


def line_matches(pattern: str, line: str) -> bool:
    """`...` in a line matches any characters, the spaces around it too (so a table cell can stay aligned)."""
    if WILDCARD not in pattern:
        return pattern == line
    parts = pattern.split(WILDCARD)
    parts = [part if i == 0 else part.lstrip(" ") for i, part in enumerate(parts)]
    parts = [part if i == len(parts) - 1 else part.rstrip(" ") for i, part in enumerate(parts)]
    return re.fullmatch(".*".join(re.escape(part) for part in parts), line) is not None


def block_matches(expected: Sequence[str], actual: Sequence[str]) -> bool:
    """doctest's ELLIPSIS by lines: a `...` line absorbs any number of actual lines."""

    @cache
    def match(i: int, j: int) -> bool:
        if i == len(expected):
            return j == len(actual)
        if expected[i] == WILDCARD:
            return match(i + 1, j) or (j < len(actual) and match(i, j + 1))
        return j < len(actual) and line_matches(expected[i], actual[j]) and match(i + 1, j + 1)

    return match(0, 0)


def merge(expected: Sequence[str], actual: Sequence[str]) -> list[str]:
    """New expected lines for `actual`: the old ones that still match (wildcards kept), the rest from `actual`.

    An edit-distance alignment of old lines to actual lines: keeping a line that still matches, or letting a
    `...` line absorb actual lines, is free; replacing an old line by an actual line, dropping an old line or
    adding an actual line costs 1. On a tie a `...` line absorbs as little as it can, so that the lines after
    it keep their place (a changed last table stays shown, not swallowed). The result matches `actual`.
    """
    n, m = len(expected), len(actual)
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    for j in range(m + 1):
        cost[n][j] = m - j
    for i in range(n - 1, -1, -1):
        cost[i][m] = cost[i + 1][m] + (0 if expected[i] == WILDCARD else 1)
        for j in range(m - 1, -1, -1):
            if expected[i] == WILDCARD:
                cost[i][j] = min(cost[i + 1][j], cost[i][j + 1])
            else:
                keep = 0 if line_matches(expected[i], actual[j]) else 1
                cost[i][j] = min(keep + cost[i + 1][j + 1], 1 + cost[i + 1][j], 1 + cost[i][j + 1])
    merged: list[str] = []
    i = j = 0
    while i < n or j < m:
        if i == n:
            merged.append(actual[j])  # a new line at the end
            j += 1
        elif expected[i] == WILDCARD:
            if j < m and cost[i][j] < cost[i + 1][j]:
                j += 1  # absorbed by the `...` line
            else:
                merged.append(WILDCARD)
                i += 1
        elif j < m and line_matches(expected[i], actual[j]) and cost[i][j] == cost[i + 1][j + 1]:
            merged.append(expected[i])  # still matches: kept, wildcards and all
            i, j = i + 1, j + 1
        elif j < m and cost[i][j] == 1 + cost[i + 1][j + 1]:
            merged.append(actual[j])  # changed in place
            i, j = i + 1, j + 1
        elif cost[i][j] == 1 + cost[i + 1][j]:
            i += 1  # the old line is gone
        else:
            merged.append(actual[j])  # a new line
            j += 1
    return merged


# ---- running ----------------------------------------------------------------------------------------


@contextmanager
def _in_root() -> Iterator[None]:
    previous = Path.cwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(previous)


def run(example: Example) -> list[str]:
    """What the page should show for `example`: stdout, plus stderr and `(exit N)` when it fails.

    The same command on two pages (the README's examples return in docs/) runs once per session."""
    return list(_run(tuple(example.argv)))


@contextmanager
def _one_torch_thread(needed: bool) -> Iterator[None]:
    """The CPU bench on one torch thread: on a busy 2-core machine OpenMP's waiting threads spin and made it
    4x slower. Only its timings (marked `...` on the pages) depend on the thread count."""
    if not needed:
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@cache
def _run(argv: tuple[str, ...]) -> tuple[str, ...]:
    from typer.testing import CliRunner

    from kvcalc.cli.app import app

    # Unset what would make rich colour its output or think it writes to a terminal.
    env = {"COLUMNS": str(COLUMNS), "LINES": "50", "FORCE_COLOR": None, "TTY_COMPATIBLE": None,
           "TTY_INTERACTIVE": None, "CLICOLOR_FORCE": None}
    with _in_root(), _one_torch_thread(argv[0] == "bench"):
        result = CliRunner(env=env).invoke(app, list(argv), catch_exceptions=False)
    if result.exit_code == 0:
        return tuple(_trim(result.stdout.splitlines()))
    return (*_trim((result.stdout + result.stderr).splitlines()), f"(exit {result.exit_code})")


@cache
def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def skip_reason(example: Example) -> str | None:
    if example.marker is not None:
        kind, reason = example.marker
        if kind == "skip":
            return reason
        if kind == "cuda" and not _cuda_available():
            return "needs a CUDA GPU (marked docs-test: cuda)"
        if kind == "no-cuda" and _cuda_available():
            return "shows the output without a CUDA GPU, and one is visible (marked docs-test: no-cuda)"
    for arg in example.argv:
        if arg.startswith(TRACE_PREFIX) and not (ROOT / arg).exists():
            return f"needs the trace {arg} (not shipped; docs/data.md says where to get it)"
    return None


# ---- the tests --------------------------------------------------------------------------------------

EXAMPLES = collect()


@pytest.mark.parametrize("example", EXAMPLES, ids=[example.name for example in EXAMPLES])
def test_example_prints_what_the_page_shows(example: Example) -> None:
    reason = skip_reason(example)
    if reason:
        pytest.skip(reason)
    actual = run(example)
    if not block_matches(example.expected, actual):
        diff = "\n".join(difflib.unified_diff(example.expected, actual, "page", "program", lineterm=""))
        pytest.fail(f"{example.name}: `{' '.join(example.command_lines)}` prints something else:\n{diff}\n"
                    f"If the new output is right, regenerate the pages: {UPDATE_COMMAND}", pytrace=False)


def test_every_kvcalc_command_in_the_pages_is_an_example() -> None:
    """No `$ kvcalc` line hides outside a console block, where this test would not run it."""
    run_lines = {(example.path, example.line) for example in EXAMPLES}
    stray = [f"{path.relative_to(ROOT)}:{n}" for path in doc_files()
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if line.lstrip().startswith(PROMPT) and (path, n) not in run_lines]
    assert not stray, f"`$ kvcalc` outside a ```console block (not run): {stray}"


def test_the_wildcards_match_as_documented() -> None:
    assert line_matches("│ 1 │ ... │ 8.02 MiB │", "│ 1 │ 125744.1 │ 8.02 MiB │")
    assert line_matches("│ 1 │      ... │ 8.02 MiB │", "│ 1 │ 125744.1 │ 8.02 MiB │")  # aligned
    assert not line_matches("│ 1 │ ... │ 8.02 MiB │", "│ 2 │ 125744.1 │ 8.02 MiB │")
    assert block_matches(["a", "...", "z"], ["a", "z"])
    assert block_matches(["a", "...", "z"], ["a", "b", "c", "z"])
    assert not block_matches(["a", "z"], ["a", "b", "z"])
    assert not block_matches(["a", "..."], ["b"])


def test_update_keeps_wildcards_and_rewrites_the_rest() -> None:
    expected = ["title", "row 1: ... µs", "...", "old note"]
    actual = ["title", "row 1: 12.5 µs", "row 2", "row 3", "new note", "another"]
    merged = merge(expected, actual)
    assert merged == ["title", "row 1: ... µs", "...", "another"]  # the last line stays the last line
    assert block_matches(merged, actual)
    # a changed table after the `...` stays shown, line for line
    assert merge(["a", "...", "t1", "t2"], ["a", "x", "y", "t1 new", "t2"]) == ["a", "...", "t1 new", "t2"]
    assert merge(["a", "b"], ["a", "c"]) == ["a", "c"]
    assert merge(["a", "b", "c"], ["a", "c"]) == ["a", "c"]
    assert merge(["a"], ["a", "b"]) == ["a", "b"]
    assert merge([], ["x"]) == ["x"]
    assert merge(["x"], []) == []


_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {_slug(line.lstrip("#")) for line in _outside_fences(lines) if line.startswith("#")}


def _outside_fences(lines: list[str]) -> Iterator[str]:
    fence = None
    for line in lines:
        found = FENCE.match(line)
        if found and fence is None:
            fence = found["ticks"]
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            yield line


def test_links_between_the_pages_resolve() -> None:
    broken = []
    for path in doc_files():
        for line in _outside_fences(path.read_text(encoding="utf-8").splitlines()):
            for found in _LINK.finditer(line):
                target = found["target"]
                if re.match(r"^[a-z]+:", target):
                    continue  # http(s), mailto: not checked here
                file_part, _, anchor = target.partition("#")
                linked = (path.parent / file_part).resolve() if file_part else path
                if not linked.exists():
                    broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
                elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                    broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_the_readme_shows_the_test_command_that_ci_runs() -> None:
    ci = ROOT / ".ci" / "run"
    if not ci.exists():
        pytest.skip("no .ci/run in this checkout")
    lines = ci.read_text(encoding="utf-8").splitlines()
    marker = lines.index("# README test command:")
    command = lines[marker + 1].strip()
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert any(command in line for line in readme), f"README.md must show CI's test command verbatim: {command}"


def test_the_comparison_with_the_vllm_paper_quotes_the_run_above_it() -> None:
    """docs/sim.md's table of `token states of occupied` is prose, which the update does not rewrite."""
    sim = ROOT / "docs" / "sim.md"
    example = next(e for e in EXAMPLES if e.path == sim and "--requests" in e.argv and "2000" in e.argv)
    row = next(line for line in example.expected if line.startswith("│ token states of occupied"))
    shown = [cell.strip() for cell in row.strip("│").split("│")[1:]]  # paged, max, pow2, oracle
    text = sim.read_text(encoding="utf-8")
    quoted = [re.search(rf"^\| {re.escape(name)} \| ([\d.]+ %) \|", text, re.MULTILINE)
              for name in ("paged (B = 16)", "reserve-max", "reserve-pow2", "reserve-oracle")]
    assert [q[1] if q else None for q in quoted] == shown, "docs/sim.md: update the table under the run"


# ---- the update mode (tests/update_docs_examples.py) ------------------------------------------------


def update(paths: Sequence[Path] | None = None) -> list[str]:
    """Rewrite the expected output of every example that runs here; returns one line per change or skip."""
    report = []
    for path in paths or doc_files():
        lines, blocks = parse(path)
        changed = False
        for block in reversed(blocks):  # from the end, so earlier line numbers stay valid
            body: list[str] = []
            for example in block.examples:
                reason = skip_reason(example)
                if reason:
                    report.append(f"skipped {example.name}: {reason}")
                else:
                    actual = run(example)
                    if not block_matches(example.expected, actual):
                        example.expected = merge(example.expected, actual)
                        report.append(f"updated {example.name}: {' '.join(example.command_lines)}")
                        changed = True
                body += example.command_lines + example.expected
            lines[block.body_start:block.body_end] = [block.indent + line if line else line for line in body]
        if changed:
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return report
