"""`kvcalc size` and `kvcalc frag` never import torch (start-up time; users without torch); `size --json`
imports none of the heavy modules that it does not use (its start-up ratio is a benchmark in tests/perf)."""

import subprocess
import sys

import pytest

# Runs the app's main in a fresh interpreter with sys.argv set, then reports whether torch got imported.
_PROBE = """
import sys
sys.argv = ["kvcalc", *{args!r}]
from kvcalc.cli.app import main
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
heavy = sorted(m for m in ("torch", "numpy", "rich", "pydantic") if m in sys.modules)
print("\\nPROBE", code, ",".join(heavy) or "-")
"""


def _loaded(*args: str) -> tuple[int, set[str]]:
    """The exit code of `kvcalc *args` and which of torch, numpy, rich and pydantic it imported."""
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(args=list(args))], capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _, code, heavy = proc.stdout.strip().splitlines()[-1].split()
    return int(code), set(heavy.split(",")) - {"-"}


def _probe(*args: str) -> tuple[int, bool]:
    code, heavy = _loaded(*args)
    return code, "torch" in heavy


@pytest.mark.parametrize(
    "args",
    [
        ("size",),
        ("size", "--json"),
        ("size", "--model", "llama-3-8b", "--tokens", "8192", "--seqs", "32", "--memory", "80GiB", "--tp", "2"),
    ],
)
def test_size_does_not_import_torch(args):
    code, torch_loaded = _probe(*args)
    assert code == 0
    assert not torch_loaded


@pytest.mark.parametrize("args", [("frag",), ("frag", "--block", "16", "--json")])
def test_frag_does_not_import_torch(args):
    _, torch_loaded = _probe(*args)  # frag's own tests check its exit codes
    assert not torch_loaded


@pytest.mark.parametrize("args", [("size", "--json"), ("size", "--model", "llama-3-8b", "--format", "csv")])
def test_size_without_a_table_imports_no_heavy_module(args):
    # pydantic: typer >= 0.29 validates every option through it (~25 ms); rich: only tables and stderr lines
    # draw with it; numpy: the equation is integer arithmetic.
    code, heavy = _loaded(*args)
    assert code == 0
    assert heavy == set()
