"""`--model org/name`: the config.json of a model in the local Hugging Face hub cache, read offline.

The cache is where the hub client puts it: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`~/.cache/huggingface/hub`; a model lives in `models--org--name/snapshots/<revision>/config.json`, and
`refs/main` names the revision the client last resolved for the main branch. kvcalc never downloads:
when the file is absent the error says where it looked and how to get it there.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ParameterError


def hub_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def cached_config(repo_id: str) -> tuple[Path, str]:
    """(path of the cached config.json, the normalised repo id) for `org/name`; ValueError when absent."""
    given = repo_id
    if given.strip().startswith(("/", "./", "../", "~")) or Path(given).expanduser().is_file():
        # a path, not an id: '/tmp/m/config.json' stripped of its slashes would be looked up as a repo
        raise ParameterError(f"{{repo_id}} {given!r} is a path, not a Hugging Face model id (org/name): give a local "
                             "config.json or the folder that holds it with {config}", "repo_id", "config")
    repo_id = repo_id.strip().strip("/")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise ParameterError(f"{{repo_id}} {given!r}: a Hugging Face model is org/name "
                             "(e.g. meta-llama/Llama-3.1-8B)", "repo_id")
    cache = hub_cache_dir()
    repo = cache / f"models--{parts[0]}--{parts[1]}"
    fetch = (f"fetch it with `hf download {repo_id} config.json` (or give {{config}} DIR); "
             "kvcalc reads the cache offline and never downloads")
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        revision = ref.read_text(encoding="utf-8").strip()
        path = snapshots / revision / "config.json"
        if path.is_file():
            return path, repo_id
        raise ParameterError(f"{{repo_id}} {repo_id}: {ref} names revision {revision}, but {path} is missing; {fetch}",
                             "repo_id", "config")
    found = sorted(snapshots.glob("*/config.json")) if snapshots.is_dir() else []
    if len(found) == 1:
        return found[0], repo_id
    if found:
        revisions = ", ".join(p.parent.name for p in found)
        raise ParameterError(f"{{repo_id}} {repo_id}: {snapshots} holds several revisions ({revisions}) and no "
                             "refs/main says which is current; give {config} with one of those folders",
                             "repo_id", "config")
    raise ParameterError(f"{{repo_id}} {repo_id}: no config.json in the Hugging Face cache (looked in {snapshots}, "
                         f"the cache being {cache}: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub); "
                         f"{fetch}", "repo_id", "config")
