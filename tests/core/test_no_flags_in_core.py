"""Core is a library: its messages name its own parameters, never a command-line flag (issue 23).

Every string literal in core/ (f-strings included, docstrings and comments not: they document the CLI
that drives a function, and reach no user) is searched for a flag, `--word`. An error names the parameter
(`ParameterError("tp 3 does not divide ...", "tp")`, or `{name}` where the name is also an everyday word)
and kvcalc.cli.app maps it to the command's flag. The allow-list below holds the strings that still show a
flag, each with why: it is meant to shrink, and a string that leaves core must leave it too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "core"
FLAG = re.compile(r"(?<![\w-])--[a-z]")  # `--tp`, and `--{name}` built in an f-string (read as `--x`)

# (file under core/, the start of the string as the scan reads it: an f-string's values read as `x`) -> why it
# may still name a flag. Meant to shrink: each is a TODO unless it says why the flag belongs there.
ALLOWED = {
    # The sim options dataclass declares the CLI's options (cli/sim.py builds them from it): flags and help text
    # are its job until issue 23's "declare options in cli/options.py" moves them (not done).
    ("sim/options.py", ""): "the CLI's option declarations",
    # Pointers to another command (`kvcalc bench --json`, `kvcalc size --draft-config`): no parameter of the
    # function called sets them, so there is nothing for the CLI to map.
    ("sim/steptime.py", ""): "names `kvcalc bench --json`, another command's output",
    ("spec_decode.py", "spec_method x: "): "names `kvcalc size --draft-config`, another command",
    ("spec_decode.py", "{spec_method} draft: "): "names `kvcalc size --draft-config`, another command",
    ("model/weights.py", "model x has no"): "names `size --kv-memory`, another command, also from sim's plan",
    # vLLM's own flag, said as vLLM's (`vLLM's --kv-cache-dtype`); kvcalc's own is the Note's {dtype} mark.
    ("model/hf_config.py", "x: vLLM"): "vLLM's --kv-cache-dtype, another program's flag",
    ("model/hf_groups.py", "torch_dtype float32: vLLM"): "vLLM's --dtype, another program's flag",
}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, (ast.Constant, ast.JoinedStr)):
                ids.add(id(first.value))
    return ids


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "x" for part in node.values)  # a value
    return None


def flag_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every non-docstring string literal of `path` that shows a flag."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    inner = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    found = []
    for node in ast.walk(tree):
        text = _text(node)
        if text is not None and id(node) not in skip and id(node) not in inner and FLAG.search(text):
            found.append((node.lineno, text))
    return sorted(found)


def _allowed(relative: str, text: str) -> bool:
    return any(relative == file and text.startswith(start) for file, start in ALLOWED)


def test_every_allowed_string_is_still_there():
    """An entry whose string has left core leaves the list too (else the list only grows)."""
    found = {(path.relative_to(CORE).as_posix(), text) for path in CORE.rglob("*.py") for _, text in flag_strings(path)}
    stale = [key for key in ALLOWED if not any(f == key[0] and s.startswith(key[1]) for f, s in found)]
    assert not stale, f"allow-list entries that match nothing any more: {stale}"


def test_no_string_in_core_names_a_flag():
    offenders = [
        f"core/{path.relative_to(CORE).as_posix()}:{line}: {text!r}"
        for path in sorted(CORE.rglob("*.py"))
        for line, text in flag_strings(path)
        if not _allowed(path.relative_to(CORE).as_posix(), text)
    ]
    assert not offenders, "core names flags (raise ParameterError naming the parameter):\n" + "\n".join(offenders)


@pytest.mark.parametrize("source, expected", [
    ('raise ValueError(f"--tp {tp} does not divide")', 1),  # an f-string
    ('raise ValueError(f"--{name} must be positive")', 1),  # a flag built from a name
    ('X = "use a tp that divides"', 0),
    ('def f():\n    """`kvcalc size --tp 2` in a docstring."""\n', 0),
    ('X = "a -- b, x--y, 2^62"', 0),  # dashes that are not a flag
    ('X = f"models--{org}--{name}"', 0),  # the hub cache's folder names
])
def test_the_scan_finds_flags_and_only_flags(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source, encoding="utf-8")
    assert len(flag_strings(path)) == expected
