"""Which flag sets each core parameter, per command, and core's notes written with those flags.

Core names parameters, never flags (kvcalc.core.errors.ParameterError for errors, kvcalc.core.notes.Note for
notes); the CLI writes them as the flags the user typed: a command's own options by their names (`block_size`
of `kvcalc bench` is its `--block`), then `PARAMETER_FLAGS`. kvcalc.cli.app renders errors with
`command_flags`; kvcalc.cli.output.emit renders every Note of a report (table, --json, csv, markdown) with
`rendered` before the first byte is written.
"""

from __future__ import annotations

from typing import Any

from ..core.notes import Note

# command -> {core parameter: flag}, for the core parameters whose names differ from the command's options.
# repo_id: the org/name of core.model.hub.cached_config, which every --model reaches.
PARAMETER_FLAGS: dict[str, dict[str, str]] = {
    "size": {"block_size": "--block", "num_tokens": "--tokens", "num_seqs": "--seqs", "memory_bytes": "--memory",
             "repo_id": "--model", "method": "--spec-method", "draft": "--draft-config"},
    "frag": {"block_size": "--block", "block_sizes": "--block", "per_sequence": "--per-seq", "repo_id": "--model"},
    "share": {"block_size": "--block", "prefix_tokens": "--prefix", "gen_tokens": "--gen", "memory_bytes": "--memory",
              "repo_id": "--model"},
    "sim": {"block_size": "--block", "rate_per_s": "--rate", "repo_id": "--model", "memory_bytes": "--gpu-memory",
            "bandwidth_bytes_per_s": "--bandwidth", "peak_flops": "--flops"},
    "plan": {"block_size": "--block", "rate_per_s": "--rate", "kv_dtype": "--dtype", "ray_address": "--ray",
             "repo_id": "--model", "root": "--cache-dir"},
    "bench": {"num_q_heads": "--q-heads", "num_kv_heads": "--kv-heads", "num_splits": "--splits"},
}



def command_flags(name: str | None, command: Any) -> dict[str, str]:
    """{parameter: flag} of `command` (a click command called `name`): its own options' names, then
    PARAMETER_FLAGS."""
    flags = {}
    for param in getattr(command, "params", ()):
        long_flags = [opt for opt in param.opts if opt.startswith("--")]
        if param.name and long_flags:
            flags[param.name] = long_flags[0]
    return flags | PARAMETER_FLAGS.get(name or "", {})


def current_flags() -> dict[str, str]:
    """command_flags of the command running now ({} outside a command: a library call, a test of a builder)."""
    from typer._click.globals import get_current_context

    ctx = get_current_context(silent=True)
    return {} if ctx is None else command_flags(ctx.info_name, ctx.command)


def rendered(value: Any, flags: dict[str, str]) -> Any:
    """`value` (a str, or lists, tuples and dicts of them) with every Note written with `flags`."""
    if isinstance(value, Note):
        return value.rendered(flags)
    if isinstance(value, dict):
        return {key: rendered(item, flags) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(rendered(item, flags) for item in value)
    return value


def with_flags(text: str) -> str:
    """`text` as the running command prints it: a Note with its parameters written as the command's flags (for a
    line that does not pass through output.emit, such as a warning on stderr)."""
    return rendered(text, current_flags())
