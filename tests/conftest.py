"""Shared test helpers: run the CLI in-process and split its stdout from its stderr."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from lru_reference import HAND
from typer.testing import CliRunner

from kvcalc.cli.app import app

# NOTE: the default run draws the same hypothesis examples on every machine, so CI on a fresh clone is
# reproducible; `KVCALC_HYPOTHESIS=explore python -m pytest` draws new ones (a failure it finds is a real bug:
# pin it with @example). Each property still runs its full max_examples.
settings.register_profile("reproducible", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("KVCALC_HYPOTHESIS", "reproducible"))


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


@pytest.fixture
def run_cli() -> Callable[..., CliResult]:
    """`run_cli("frag", "--block", "16")` -> CliResult; never raises for a non-zero exit."""
    runner = CliRunner()

    def run(*args: str) -> CliResult:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        return CliResult(result.exit_code, result.stdout, result.stderr)

    return run


def _cuda_skip_reason() -> str | None:
    """Why tests marked `cuda` cannot run here, or None: torch sees no GPU, or nvcc cannot be found."""
    import shutil

    import torch

    if not torch.cuda.is_available():
        return f"no CUDA device visible to torch {torch.__version__}"
    if shutil.which("nvcc") is None:
        from kvcalc.core.errors import CudaUnavailableError
        from kvcalc.cuda_ext.build import find_nvcc

        try:
            find_nvcc()
        except CudaUnavailableError:
            return "nvcc is not installed"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test marked `cuda` is skipped, with the reason, where there is no GPU (one rule for all files)."""
    marked = [item for item in items if item.get_closest_marker("cuda")]
    reason = _cuda_skip_reason() if marked else None
    if reason is not None:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))


# The hand-worked trace of tests/lru_reference.py as a Mooncake JSONL file (share --capacity / tiers tests).
@pytest.fixture
def hand_trace(tmp_path: Path) -> Path:
    path = tmp_path / "hand.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 1000 * i, "input_length": p, "output_length": 1, "hash_ids": ids})
                            + "\n" for i, (p, ids) in enumerate(HAND)))
    return path
