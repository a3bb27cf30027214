"""The on-disk cache of finished points: one JSON file per point, keyed by everything that decides it.

    key = sha256(kvcalc version and a digest of core's sources, the model (its resolved spec), the
                 workload's fingerprint (the bytes of its arrivals, lengths and prefix ids), the GPU (its
                 datasheet figures), and the point's `kvcalc sim` options field by field)

A file is written whole (to a temporary name, then renamed) as soon as its point finishes, so an
interrupted plan keeps every point it finished and the next run resumes from them. A file that cannot be
read back as a result of this key (truncated, edited, another format) is ignored and recomputed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ParameterError
from ..gpus import get_gpu
from ..sim.options import SimOptions
from ..sim.workload import Workload

FORMAT = 1  # bumped when a cached result's fields change meaning


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/kvcalc/plan, or ~/.cache/kvcalc/plan."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "kvcalc" / "plan"


def code_fingerprint(root: Path | None = None) -> str:
    """sha256 of every source file of kvcalc's core (`root`; what computes a point): a development install
    whose version string has not changed still never reads a point that other code computed."""
    root = Path(__file__).resolve().parents[1] if root is None else root
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def workload_fingerprint(workload: Workload) -> str:
    """sha256 of the workload's kind, arrivals, lengths and prefix ids (their exact bytes)."""
    digest = hashlib.sha256(workload.kind.encode())
    for array in (workload.arrival_s, workload.prompt_tokens, workload.output_tokens, workload.hash_ids,
                  workload.hash_offsets, workload.unit_arrival_s):
        digest.update(b"|" if array is None else np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def point_key(version: str, model: str, workload: str, options: SimOptions) -> str:
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(SimOptions)}
    assert options.gpu is not None  # space.point_options names every point's GPU
    doc = {"format": FORMAT, "version": version, "model": model, "workload": workload,
           "gpu": repr(get_gpu(options.gpu)), "options": {k: repr(v) for k, v in fields.items()}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class PointCache:
    """Results by key under `root` (created on first write)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise ParameterError(f"{{root}} {self.root} is not a directory: give a directory (it is created if "
                                 "missing)", "root")

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            doc = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("result"), dict):
            return None
        return doc["result"]

    def put(self, key: str, result: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"key": key, "result": result}, handle)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
