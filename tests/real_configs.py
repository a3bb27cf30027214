"""The public config.json files quoted (with their sources) in tests/core/model/test_real_configs.py and
test_architecture_configs.py, for tests anywhere: one loader, instead of each test importing those files by path."""

from __future__ import annotations

import importlib.util
import json
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

MODEL_TESTS = Path(__file__).resolve().parent / "core" / "model"


@cache
def _module(module: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"configs_of_{module}", MODEL_TESTS / f"{module}.py")
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def real_config(name: str, module: str = "test_real_configs") -> dict[str, Any]:
    """The config dict `name` of tests/core/model/<module>.py (e.g. NEMOTRON_H_56B)."""
    return getattr(_module(module), name)


def write_config(folder: Path, name: str, module: str = "test_real_configs") -> Path:
    """`folder` with config `name` written as its config.json, where `--config` (and load_config) reads it."""
    (folder / "config.json").write_text(json.dumps(real_config(name, module)))
    return folder
