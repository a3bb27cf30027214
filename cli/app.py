"""The root `kvcalc` app: one module per command, errors mapped to exit codes in one place.

Exit codes: 0 ok, 1 runtime failure, 2 bad input (one line `error: …`), 3 CUDA unavailable.

Core errors name the parameters of core functions (kvcalc.core.errors.ParameterError); users typed flags.
`PARAMETER_FLAGS` (kvcalc.cli.flags) maps, per command, each core parameter name to the flag that sets it; a
command's own option names need no entry (`block_size` of `kvcalc bench` is its `--block`), they are read from the
command. `flag_message` rewrites an error with them, so that every message names the flag the user typed.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer._click import exceptions as click_exc  # typer vendors click from 0.26 on (pyproject.toml)
from typer.core import TyperGroup

from ..core.errors import CudaUnavailableError, ParameterError
from .commands import COMMANDS
from .flags import command_flags

EXIT_RUNTIME = 1
EXIT_BAD_INPUT = 2
EXIT_NO_CUDA = 3


def _fail(message: str, code: int) -> None:
    message = " ".join(str(message).split())  # one line, always
    typer.echo(f"error: {message}", err=True)
    sys.exit(code)


class KvcalcGroup(TyperGroup):
    """Loads each command's module on first use, and turns every error into one line.

    NOTE: commands are imported lazily so that `kvcalc size` pays for neither numpy-heavy modules of other
    commands nor torch; `kvcalc --help` imports them all to show their one-line help.
    """

    def list_commands(self, ctx: Any) -> list[str]:
        return [name for name, _ in COMMANDS]  # registry order, not alphabetical

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands:
            module_name = dict(COMMANDS).get(cmd_name)
            if module_name is None:
                return None
            self.commands[cmd_name] = _load_command(cmd_name, module_name)
        return self.commands[cmd_name]

    def get_params(self, ctx: Any) -> list[Any]:
        return [_no_flag_metavar(param) for param in super().get_params(ctx)]

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        """click's entry point, always run not standalone (`standalone_mode` is ignored): every error ends here
        as one line and our exit code."""
        extra.update(complete_var=complete_var, windows_expand_args=windows_expand_args)
        try:
            _check_one_format(list(sys.argv[1:] if args is None else args))
            check_output_paths(list(sys.argv[1:] if args is None else args))
            result = super().main(args=args, prog_name=prog_name or "kvcalc", standalone_mode=False, **extra)
        except click_exc.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # bare `kvcalc`: help on stdout, exit 0
                typer.echo(exc.ctx.get_help() if exc.ctx else str(exc))
                sys.exit(0)
            hint = ""
            if exc.ctx is not None:
                hint = f" (see '{exc.ctx.command_path} --help')"
            _fail(exc.format_message() + hint, EXIT_BAD_INPUT)
        except (typer.Abort, KeyboardInterrupt):
            _fail("aborted", EXIT_RUNTIME)
        except CudaUnavailableError as exc:
            _fail(str(exc), EXIT_NO_CUDA)
        except ParameterError as exc:
            _fail(flag_message(exc, self._flags(list(sys.argv[1:] if args is None else args))), EXIT_BAD_INPUT)
        except (ValueError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            _fail(_describe(exc), EXIT_BAD_INPUT)
        except click_exc.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except BrokenPipeError:
            sys.exit(0)
        sys.exit(result if isinstance(result, int) else 0)

    def _flags(self, args: list[str]) -> dict[str, str]:
        """{parameter: flag} of the command in `args` (the first word; the root's options take no value):
        its own options' names, then PARAMETER_FLAGS."""
        name = next((arg for arg in args if not arg.startswith("-")), None)
        return command_flags(name, self.commands.get(name) if name is not None else None)


def flag_message(exc: ParameterError, flags: dict[str, str]) -> str:
    """The error's message with each parameter it names written as its flag: at the places the message marks
    (`{name}`, see kvcalc.core.errors), else wherever the parameter's name is a whole word."""
    if exc.marked:
        return exc.rendered(flags)
    import re

    message = str(exc)
    for param in exc.params:
        if param in flags:
            message = re.sub(rf"(?<![\w-]){re.escape(param)}(?![\w-])", flags[param], message)
    return message


def _check_one_format(args: list[str]) -> None:
    """`--json` with `--format table|csv|markdown` asks for two formats: refuse before any work is done (the
    commands check csv and markdown again when they print)."""
    if "--json" not in args:
        return
    from .output import check_one_format

    for i, arg in enumerate(args):
        value = arg.partition("=")[2] if arg.startswith("--format=") else (
            args[i + 1] if arg == "--format" and i + 1 < len(args) else None)
        if value is not None:
            check_one_format(True, value, given=True)


# Every option naming a file a command writes, and what it writes: checked by check_output_paths before any
# command runs (tests/cli/test_app.py holds every Path option of every command to this list or to INPUT_PATHS).
OUTPUT_PATHS = {"--plot": "the figure", "--timeline": "the file", "--save": "the file"}
INPUT_PATHS = {"--config", "--hf-model", "--lengths-file", "--calibrate", "--cache-dir"}  # read; cache: filled


def check_output_paths(args: list[str]) -> None:
    """`--plot out.png` or `--plot=out.png` anywhere in `args`: the file can be written, or one `error:` line
    naming the option, before the command does any work (a run of minutes, a report already printed)."""
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in OUTPUT_PATHS and (eq or i + 1 < len(args)):
            from pathlib import Path

            from .options import check_output_path

            check_output_path(flag, Path(value if eq else args[i + 1]), OUTPUT_PATHS[flag])


def _describe(exc: Exception) -> str:
    if isinstance(exc, (FileNotFoundError, IsADirectoryError, PermissionError)) and exc.filename:
        reason = {
            FileNotFoundError: "no such file",
            IsADirectoryError: "is a directory, not a file",
            PermissionError: "cannot be read (permission denied)",
        }[type(exc)]
        name = str(exc.filename)
        shown = name if name and name == name.strip() else repr(name)  # a blank or padded path is seen quoted
        return f"{shown}: {reason}; check the path"
    return str(exc)


_CONTEXT = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    cls=KvcalcGroup,
    name="kvcalc",
    help="Exact KV-cache accounting and paged-attention benchmarks for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings=_CONTEXT,
)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"kvcalc {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """Exact KV-cache accounting and paged-attention benchmarks for LLM serving."""


def _load_command(name: str, module_name: str) -> Any:
    """The click command for `kvcalc.cli.<module_name>.command`; importing it must never import torch."""
    module = importlib.import_module(f"kvcalc.cli.{module_name}")
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    doc = module.command.__doc__ or ""
    short_help = " ".join(doc.strip().split("\n\n")[0].split())  # the first paragraph, on one line in the list
    single.command(name=name, help=doc, short_help=short_help, context_settings=_CONTEXT)(module.command)
    command = typer.main.get_command(single)
    command.name = name
    parse_args = command.parse_args

    def parse_once(ctx: Any, args: list[str]) -> Any:
        check_given_once(command.params, args)
        return parse_args(ctx, args)

    command.parse_args = parse_once  # type: ignore[method-assign]  # wraps this one instance's method (typer builds it)
    for param in command.params:
        _no_flag_metavar(param)
    get_help_option = command.get_help_option
    # the ignore below: it wraps this one instance's method (typer builds the command and its class)
    command.get_help_option = lambda ctx: _no_flag_metavar(get_help_option(ctx))  # type: ignore[method-assign]
    return command


def check_given_once(params: list[Any], args: list[str]) -> None:
    """A value option given twice (`--tokens 10 --tokens 20`) is a usage error naming both values: click would
    keep the last one silently, and which one was meant is a guess. Options that take several (`frag --block`)
    and flags (`--json`) may repeat."""
    options = {opt: p for p in params if getattr(p, "opts", None) is not None for opt in (*p.opts, *p.secondary_opts)}
    seen: dict[Any, tuple[str, str]] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return
        name, eq, attached = arg.partition("=") if arg.startswith("--") else (arg[:2], "", arg[2:])
        param = options.get(name) if arg.startswith("-") else None
        i += 1
        if param is None or getattr(param, "is_flag", False) or getattr(param, "count", False):
            continue
        nargs = max(param.nargs, 1)
        value = attached if (eq or attached) else " ".join(args[i : i + nargs])
        i += 0 if (eq or attached) else nargs
        if getattr(param, "multiple", False):
            continue
        if param in seen:
            flag, first = seen[param]
            raise click_exc.UsageError(f"{flag} is given twice ({first!r} and {value!r}): give it once")
        seen[param] = (next((opt for opt in param.opts if opt.startswith("--")), name), value)


def _no_flag_metavar(param: Any) -> Any:
    """A flag takes no value: typer's help would show `--json <bool>`, which reads as `--json true`."""
    if param is not None and getattr(param, "is_flag", False):
        param.display_type_rich = lambda ctx: None
    return param


def main() -> None:
    app()
