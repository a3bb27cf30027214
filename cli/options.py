"""Options shared by several commands, declared once as `Annotated` aliases.

Integer counts go through `integer(flag)`: besides what `int()` reads (`4096`, `1_000_000`) it takes exact
scientific spellings (`1e12`), and a non-integer is refused in one line that names the option and the value
(`error: --tokens 'abc' is not an integer: …`) instead of typer's "is not a valid integer".

`--seed` is one option for every command (`SeedOpt`, or `seed_option(help)` where a command words its help
itself): a whole number in 0..2**63-1, which numpy's and torch's generators all take; a negative one is
refused here, naming --seed, before any work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from typer._click.exceptions import UsageError  # typer vendors click from 0.26 on (pyproject.toml)

from ..core.blocks import DEFAULT_BLOCK_SIZE
from ..core.units import format_int_short, parse_int
from .output import Format


def integer(flag: str) -> Callable[[Any], int]:
    """A typer `parser=` for an integer option `flag`: exact integers only, one-line error otherwise.

    It raises a usage error, which the root app prints as it is (`error: …`, exit 2); a ValueError would be
    reworded by typer.
    """

    def parse(value: Any) -> int:
        try:
            return parse_int(value, flag)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    return parse


MAX_SEED = 2**63 - 1


def _parse_seed(value: Any) -> int:
    seed = integer("--seed")(value)
    if not 0 <= seed <= MAX_SEED:
        problem = "is negative" if seed < 0 else "is too large"
        raise UsageError(f"--seed {format_int_short(seed)} {problem}: give a whole number from 0 to 2**63-1 "
                         "(e.g. --seed 0)")
    return seed


def seed_option(help: str | None) -> Any:
    """`typer.Option("--seed")` with this help; see the module docstring for what it accepts."""
    return typer.Option("--seed", parser=_parse_seed, metavar="<int>", help=help)


def check_output_path(flag: str, path: Path, what: str = "the file") -> None:
    """Fail before any work when `flag`'s output file cannot be created: its directory is missing, is not a
    directory, or the path is itself a directory, or it is `-` (which would make a file named '-': stdout
    carries the report), or opening it for writing fails (tried: an existing file is opened to append and left
    as it was, a new one is created and removed), or it is an option's name (`--timeline --json` would write a
    file named --json). Raises ValueError (one `error:` line, exit 2)."""
    if str(path) == "-":
        raise ValueError(f"{flag} -: give a file name; {what} is not written to standard output, which carries "
                         "the report")
    if str(path).startswith("--"):  # `--timeline --json` takes --json as the file name
        raise ValueError(f"{flag} {path}: that is an option, not a file name; give the file right after {flag} "
                         f"(e.g. {flag} out.csv)")
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a directory: give a file name inside it")
    if not path.parent.is_dir():
        problem = "is not a directory" if path.parent.exists() else "does not exist"
        raise ValueError(f"{flag} {path}: the directory {path.parent} {problem}; create it or write {what} elsewhere")
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise ValueError(f"{flag} {path}: cannot be written ({reason}); give a path where {what} can be written"
                         ) from None
    if not existed:
        path.unlink()


def number(flag: str, example: str) -> Callable[[Any], float]:
    """A typer `parser=` for a float option `flag`: what `float()` reads (nan and inf too: the command checks
    the range), and one line naming the flag, the text and an `example` otherwise (typer's "is not a valid
    float" gives no fix)."""

    def parse(value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise UsageError(f"{flag} {str(value)!r} is not a number: write e.g. {flag} {example}") from None
        text = str(value).strip().lower().lstrip("+-")
        if math.isinf(number) and text not in ("inf", "infinity"):  # 1e400: not the inf it would silently become
            raise UsageError(f"{flag} {str(value).strip()}: give a finite number ({str(value).strip()} overflows "
                             f"a float), e.g. {flag} {example}")
        return number

    return parse


def float_option(*param_decls: str, example: str, help: str | None, metavar: str = "<float>") -> Any:
    """`typer.Option` for a float with `number`'s one-line error."""
    return typer.Option(*param_decls, parser=number(param_decls[0], example), metavar=metavar, help=help)


def int_option(*param_decls: str, help: str | None) -> Any:
    """`typer.Option` for an integer count that accepts `1e12` and `1_000_000` (see `integer`)."""
    return typer.Option(*param_decls, parser=integer(param_decls[0]), metavar="<int>", help=help)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")]
FormatOpt = Annotated[
    Format, typer.Option("--format", case_sensitive=False, help="Output format: table, json, csv, markdown.")
]
ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="A built-in model preset (kvcalc size lists them), or org/name "
                                         "read offline from the local Hugging Face hub cache.")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="A Hugging Face config.json, or the folder that holds it.")
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help=(
    "KV precision: fp32, fp16, bf16, fp8, int8, int4; as vLLM pages them: fp8_per_token_head, int8_per_token_head "
    "(+ a float32 scale per KV head for K and V), nvfp4 (d/2 + d/16 B a head), fp8_ds_mla (656 B a MLA token)."))]
BlockOpt = Annotated[
    int | None, int_option("--block", "-b", help=f"Block size in tokens (default: {DEFAULT_BLOCK_SIZE}).")
]  # one block size (size, share); frag takes several (--block repeated)
LayersOpt = Annotated[int | None, int_option("--layers", help="Number of layers (overrides the model's).")]
KvHeadsOpt = Annotated[int | None, int_option("--kv-heads", help="Number of KV heads (overrides the model's).")]
HeadDimOpt = Annotated[int | None, int_option("--head-dim", help="Head dimension (overrides the model's).")]
SeedOpt = Annotated[int | None, seed_option("Seed for constructed samples (runs are reproducible).")]
SpecTokensOpt = Annotated[int | None, int_option(
    "--spec-tokens", help="Speculative decoding: K drafts per step; adds each sequence's peak blocks (its last "
                          "step reserves n + K drafts + lookahead slots).")]
SpecMethodOpt = Annotated[str | None, typer.Option(
    "--spec-method", help="With --spec-tokens: draft (a draft model; default), eagle (an EAGLE head) or mtp (the "
                          "model's multi-token-prediction layers): K lookahead slots, as vLLM reserves; in size, "
                          "their KV too; or ngram (no lookahead, no drafter KV).")]
