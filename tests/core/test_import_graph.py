"""The shape of the package as a tool that reads files sees it: every relative import resolves to a file,
imports go one way (cli -> cuda_ext -> core; core imports neither), no import circle between modules (imports
inside functions and under TYPE_CHECKING included), and no torch, rich or typer anywhere in core."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("cli", "core", "cuda_ext")  # top-level folders, each the subpackage kvcalc.<folder> (kvcalc/ links them)
# Which layers each may import: the one direction docs/architecture.md draws. "kvcalc" is the package itself
# (kvcalc/__init__.py: the version; kvcalc/__main__.py: runs cli.app).
MAY_IMPORT = {
    "kvcalc": {"kvcalc", "cli"},
    "cli": {"kvcalc", "cli", "core", "cuda_ext"},
    "cuda_ext": {"cuda_ext", "core"},
    "core": {"core"},
}
FORBIDDEN_IN_CORE = {"torch", "rich", "typer", "click", "pydantic"}
# No circle is tolerated: verify's two (cli verify <-> verify_hybrid, runner <-> speculative) and the fast-forward's
# (fastforward <-> fastforward_groups) are gone; a new one fails, type-checking imports included.
KNOWN_CIRCLES: list[list[str]] = []


def _files() -> list[Path]:
    files = [ROOT / "kvcalc" / "__init__.py", ROOT / "kvcalc" / "__main__.py"]
    for layer in LAYERS:
        files += sorted(p for p in (ROOT / layer).rglob("*.py") if "__pycache__" not in p.parts)
    return files


def _module_name(path: Path) -> str:
    """kvcalc.core.sim.run for core/sim/run.py; kvcalc for kvcalc/__init__.py."""
    if path.parent == ROOT / "kvcalc":
        return "kvcalc" if path.name == "__init__.py" else "kvcalc.__main__"
    parts = ["kvcalc", *path.relative_to(ROOT).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "kvcalc"


def _exists(module: str) -> bool:
    parts = module.split(".")
    if parts[0] != "kvcalc":
        return False
    if len(parts) == 1:
        return (ROOT / "kvcalc" / "__init__.py").is_file()
    path = ROOT.joinpath(*parts[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@cache
def _imports(path: Path) -> tuple[frozenset[str], frozenset[str]]:
    """(kvcalc modules imported, top-level external packages imported) by one file, at any depth."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    internal, external = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kvcalc":
                    internal.add(alias.name)
                else:
                    external.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").split(".")[0] != "kvcalc":
                external.add((node.module or "").split(".")[0])
                continue
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            for alias in node.names:  # `from . import paging` names a module; `from .x import f` names x
                candidate = f"{target}.{alias.name}"
                internal.add(candidate if _exists(candidate) else target)
    return frozenset(internal), frozenset(external)


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in _files():
        internal, _ = _imports(path)
        graph[_module_name(path)] = {m for m in internal if m != _module_name(path)}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components: any component of more than one module is a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_the_graph_sees_every_layer():
    layers = {_layer(m) for m in _graph()}
    assert layers == {"kvcalc", *LAYERS}
    edges = {(_layer(a), _layer(b)) for a, targets in _graph().items() for b in targets}
    assert {("cli", "core"), ("cli", "cuda_ext"), ("cuda_ext", "core"), ("kvcalc", "cli")} <= edges


def test_every_relative_import_resolves_to_a_file():
    for module, targets in _graph().items():
        missing = [t for t in targets if not _exists(t)]
        assert not missing, f"{module} imports {missing}, which no file of the package defines"


def test_imports_go_one_way_cli_then_cuda_ext_then_core():
    wrong = sorted((module, target) for module, targets in _graph().items() for target in targets
                   if _layer(target) not in MAY_IMPORT[_layer(module)])
    assert not wrong, f"imports against the direction cli -> cuda_ext -> core: {wrong}"


def test_no_import_circle():
    circles = [c for c in _circles(_graph()) if c not in KNOWN_CIRCLES]
    assert not circles, f"import circles: {circles}"


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_core_imports_no_torch_rich_or_typer():
    for path in (ROOT / "core").rglob("*.py"):
        _, external = _imports(path)
        assert not external & FORBIDDEN_IN_CORE, f"{path.relative_to(ROOT)} imports {external & FORBIDDEN_IN_CORE}"


def test_core_has_few_top_level_modules_and_one_folder_per_concept():
    core = ROOT / "core"
    modules = [p.name for p in core.glob("*.py") if p.name != "__init__.py"]
    folders = sorted(p.name for p in core.iterdir() if (p / "__init__.py").is_file())
    assert len(modules) <= 12, modules
    assert folders == ["inputs", "model", "plan", "pool", "share", "sim"]
