"""The kvcalc package as it was at a git revision, and a `kvcalc` child process timed in CPU seconds: what the
before/after benchmarks (tests/perf/test_share_perf.py, test_sim_exact_perf.py) compare."""

from __future__ import annotations

import io
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def unpack_package(rev: str, root: Path) -> Path:
    """The package at `rev` under root/kvcalc (every file of core, cli and cuda_ext from git: the two sides share
    nothing; the kvcalc/ entry points of this tree); returns root, the folder to put on PYTHONPATH."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "core", "cli", "cuda_ext"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root / "kvcalc", filter="data")
    for name in ("__init__.py", "__main__.py"):
        (root / "kvcalc" / name).write_bytes((REPO / "kvcalc" / name).read_bytes())
    return root


def run_kvcalc(args: list[str], pythonpath: Path, cwd: Path, env: dict[str, str]) -> tuple[str, float]:
    """(stdout, child CPU seconds, user + system) of `kvcalc ARGS` importing the package from `pythonpath`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "kvcalc", *args], check=True, capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(pythonpath)}, cwd=cwd).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
