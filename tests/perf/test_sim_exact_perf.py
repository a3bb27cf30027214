"""`kvcalc sim` before and after a speed change of its engine: byte-identical JSON on configurations that take
every path of the fast-forward (issue 18: "the same simulated figures, byte for byte, before and after").

The "before" package is this working tree with the engine's files (ENGINE_FILES) taken from git revision
KVCALC_SIM_BEFORE (default: BEFORE, the engine before the issue-18 speed work), so both sides share every
other file; each configuration runs in both, in turn, and the JSON documents must be equal byte for byte.
The ratio of their CPU times is printed (both sides in one run). Run with
`python -m pytest -m perf tests/perf/test_sim_exact_perf.py -s`.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.perf
REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "traces"
BEFORE = "e3c13f3ef4b7aa6e3ee0455f94b193ba2bf6bc7e"
ENGINE_FILES = ("engine.py", "fastforward.py", "scheduler.py", "paged.py", "paged_groups.py", "run.py", "search.py")
CONFIGS = {
    "azure default (OPT-13B, A100-40GB)": ["--trace", "azure", str(TRACES / "azure_llm_2023_conv.csv"),
                                           "--limit", "4000"],
    "mooncake prefix caching": ["--trace", "mooncake", str(TRACES / "mooncake_conversation.jsonl"), "--limit", "800",
                                "--model", "Llama-3-8B", "--gpu", "A100-40GB"],
    "swap preemption, cancellations, timeout": ["--requests", "600", "--rate", "30", "--preempt", "swap",
                                                "--cancel-fraction", "0.2", "--timeout", "30"],
    "recompute storm at rate inf, 4 policies": ["--requests", "400", "--rate", "inf", "--compare",
                                                "paged,reserve-max,reserve-pow2,reserve-oracle"],
    "hybrid sliding window (Gemma-3-27B, H200)": ["--requests", "300", "--rate", "8", "--model", "gemma-3-27b",
                                                  "--gpu", "H200"],
    "hybrid Mamba (Nemotron-H-56B, H200)": ["--requests", "200", "--rate", "4", "--model", "nemotron-h-56b",
                                            "--gpu", "H200"],
}


@pytest.fixture(scope="module")
def before_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package with the engine files of the "before" revision."""
    rev = os.environ.get("KVCALC_SIM_BEFORE", BEFORE)
    root = tmp_path_factory.mktemp("before")
    shutil.copytree(REPO / "kvcalc", root / "kvcalc", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ENGINE_FILES:
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:core/sim/{name}"], check=True,
                              capture_output=True, text=True).stdout
        (root / "kvcalc" / "core" / "sim" / name).write_text(text)
    return root


def run_sim(args: list[str], pythonpath: Path) -> tuple[str, float]:
    """(stdout, child CPU seconds) of `kvcalc sim ARGS --json` importing the package from `pythonpath`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    out = subprocess.run([sys.executable, "-m", "kvcalc", "sim", *args, "--json"], check=True, capture_output=True,
                         text=True, env=env, cwd=pythonpath).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sim_json_is_byte_identical_before_and_after(name: str, before_package: Path) -> None:
    args = CONFIGS[name]
    if any(str(TRACES) in a for a in args) and not TRACES.is_dir():
        pytest.skip(f"the traces are not at {TRACES} (see ../shared/traces/README.md)")
    old, old_s = run_sim(args, before_package)
    new, new_s = run_sim(args, REPO)
    print(f"\n{name}: before {old_s:.2f} s CPU, after {new_s:.2f} s CPU ({old_s / new_s:.2f}x faster)")
    assert new == old
