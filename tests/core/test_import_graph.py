"""The shape of core/ as a tool that reads files sees it: relative imports that resolve by path, no import
circle between modules (TYPE_CHECKING imports included), and no torch, rich or typer anywhere in core."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "core"
FORBIDDEN = {"torch", "rich", "typer", "click", "pydantic"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(CORE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(core modules imported, top-level external packages imported) by one file."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    internal, external = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            external |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                external.add((node.module or "").split(".")[0])
                continue
            base = package[: len(package) - node.level + 1]
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            for alias in node.names:  # `from . import paging` names a module; `from .x import f` names x
                candidate = f"{target}.{alias.name}"
                internal.add(candidate if _exists(candidate) else target)
    return internal, external


def _exists(module: str) -> bool:
    path = CORE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in CORE.rglob("*.py"):
        internal, _ = _imports(path)
        graph[_module_name(path)] = {m for m in internal if m != _module_name(path)}
    return graph


def test_every_relative_import_resolves_to_a_file():
    for module, targets in _graph().items():
        missing = [t for t in targets if not _exists(t)]
        assert not missing, f"{module} imports {missing}, which no file under core/ defines"


def test_no_import_circle_in_core():
    graph = _graph()
    # Tarjan's strongly connected components: any component of more than one module is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
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
    assert not circles, f"import circles in core/: {circles}"


def test_core_imports_no_torch_rich_or_typer():
    for path in CORE.rglob("*.py"):
        _, external = _imports(path)
        assert not external & FORBIDDEN, f"{path.relative_to(CORE.parent)} imports {external & FORBIDDEN}"


def test_core_has_few_top_level_modules_and_one_folder_per_concept():
    modules = [p.name for p in CORE.glob("*.py") if p.name != "__init__.py"]
    folders = sorted(p.name for p in CORE.iterdir() if (p / "__init__.py").is_file())
    assert len(modules) <= 12, modules
    assert folders == ["inputs", "model", "plan", "pool", "share", "sim"]
