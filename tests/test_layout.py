"""The package layout as tools see it (issue 23): the import package is the folder kvcalc/, whose cli, core and
cuda_ext are relative links to the top-level folders, so a plain checkout resolves `kvcalc.*` for python,
jedi, pyright and mypy, and the wheel holds each module once (docs/architecture.md, "Layout")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINKED = ("cli", "core", "cuda_ext")


def _package_dirs() -> set[str]:
    """kvcalc's subpackages as the top-level folders hold them: every folder with an __init__.py."""
    found = {"kvcalc"}
    for top in LINKED:
        for init in (ROOT / top).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(".".join(("kvcalc", *init.parent.relative_to(ROOT).parts)))
    return found


def test_the_links_are_relative_and_point_at_the_top_level_folders():
    for name in LINKED:
        link = ROOT / "kvcalc" / name
        assert link.is_symlink(), f"kvcalc/{name} must be a link to ../{name}"
        assert os.readlink(link) == f"../{name}"
        assert link.resolve() == (ROOT / name).resolve()


def test_a_plain_checkout_imports_kvcalc_without_site_packages():
    # -S: no site-packages, so no editable install's import hook: only the checkout's kvcalc/ folder can answer.
    probe = "import kvcalc, kvcalc.core.units as u; print(kvcalc.__version__, u.__file__)"
    proc = subprocess.run([sys.executable, "-S", "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    version, path = proc.stdout.split()
    assert Path(path).resolve() == ROOT / "core" / "units.py"
    run = subprocess.run([sys.executable, "-m", "kvcalc", "--version"], cwd=ROOT, capture_output=True, text=True,
                         check=False, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == f"kvcalc {version}", run.stderr


def test_setuptools_finds_every_subpackage_once():
    tomllib = pytest.importorskip("tomllib")
    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    found = find_packages(where=str(ROOT / config["where"][0]), include=config["include"])
    assert len(found) == len(set(found))
    assert set(found) == _package_dirs()


def test_go_to_definition_from_a_test_into_core_with_jedi():
    jedi = pytest.importorskip("jedi")
    test_file = ROOT / "tests" / "core" / "test_units.py"
    source = test_file.read_text()
    line_no, line = next((i, text) for i, text in enumerate(source.splitlines(), start=1)
                         if text.startswith("from kvcalc.core.units import"))
    column = line.index("parse_bytes")
    script = jedi.Script(source, path=str(test_file), project=jedi.Project(str(ROOT)))
    (definition,) = script.goto(line_no, column, follow_imports=True)
    assert Path(definition.module_path).resolve() == ROOT / "core" / "units.py"
    target = (ROOT / "core" / "units.py").read_text().splitlines()[definition.line - 1]
    assert target.startswith("def parse_bytes("), target


def test_the_wheel_holds_each_module_once_and_the_cuda_sources(tmp_path):
    """`pip wheel` of a copy of the package's files (links kept as links), in pip's isolated build environment
    (the setuptools pyproject.toml asks for, whatever the test environment has)."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    for name in LINKED:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "kvcalc", source / "kvcalc", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                           str(source)], capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("kvcalc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert len(names) == len(set(names))
    modules = {n for n in names if n.endswith(".py")}
    expected = {"kvcalc/__init__.py", "kvcalc/__main__.py"} | {
        "kvcalc/" + p.relative_to(source).as_posix() for top in LINKED for p in (source / top).rglob("*.py")
        if "__pycache__" not in p.parts}
    assert modules == expected
    csrc = {"kvcalc/cuda_ext/csrc/" + p.name for p in (source / "cuda_ext" / "csrc").iterdir() if p.is_file()}
    assert csrc and csrc <= set(names)
    assert not any(n.startswith(("cli/", "core/", "cuda_ext/", "tests/")) for n in names)


def _architecture_names() -> set[str]:
    """Every `name.py` docs/architecture.md names (backticked; a path names its last part)."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    return {name.rsplit("/", 1)[-1] for name in re.findall(r"`([\w/]+\.py)`", text)}


def test_every_module_is_named_in_docs_architecture():
    """A module added to cli/, core/ or cuda_ext/ gets its line in docs/architecture.md (what it is, beside its
    neighbours); __init__.py files are the packages' own, named by their folders."""
    named = _architecture_names()
    missing = sorted(str(p.relative_to(ROOT)) for top in LINKED for p in (ROOT / top).rglob("*.py")
                     if "__pycache__" not in p.parts and p.name != "__init__.py" and p.name not in named)
    assert not missing, f"name these in docs/architecture.md (`name.py` and what it is): {missing}"


def test_every_module_docs_architecture_names_exists():
    """A module renamed or deleted leaves no line behind in docs/architecture.md."""
    present = {p.name for top in (*LINKED, "tests", "examples") for p in (ROOT / top).rglob("*.py")}
    gone = sorted(_architecture_names() - present - {"__init__.py", "__main__.py"})
    assert not gone, f"docs/architecture.md names modules that no longer exist: {gone}"


MAX_FUNCTION_LINES = 60  # issue 23: no function over 60 lines (its def line to its last, decorators aside)
ON_PURPOSE = "# Over 60 lines on purpose"  # issue 23's allowed exception: a comment at the top of the body saying why


def test_no_function_over_60_lines_in_the_package_and_examples():
    import ast

    long = []
    for top in (*LINKED, "examples"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            source = path.read_text(encoding="utf-8")
            lines = source.splitlines()
            for node in ast.walk(ast.parse(source)):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                assert node.end_lineno is not None  # set by ast.parse
                length = node.end_lineno - node.lineno + 1
                body = "\n".join(lines[node.lineno - 1:node.body[0].lineno + 3])
                if length > MAX_FUNCTION_LINES and ON_PURPOSE not in body:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, f"split these (or say why at the top of the body, '{ON_PURPOSE}: ...'): {long}"
