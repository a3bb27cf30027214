"""`kvcalc size` and `kvcalc frag` never import torch (start-up time; users without torch)."""

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
print("\\nPROBE", code, "torch" in sys.modules)
"""


def _probe(*args: str) -> tuple[int, bool]:
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(args=list(args))], capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _, code, torch_loaded = proc.stdout.strip().splitlines()[-1].split()
    return int(code), torch_loaded == "True"


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
