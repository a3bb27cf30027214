"""Shared test helpers: run the CLI in-process and split its stdout from its stderr."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from typer.testing import CliRunner

from kvcalc.cli.app import app


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
