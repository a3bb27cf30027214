"""Exceptions that the CLI maps to exit codes, and how core words a message about bad input.

Exit codes: a `ValueError` (and a missing or unreadable file) is bad input, exit 2; `CudaUnavailableError`
is exit 3.

Core is a library first: its messages name the parameters of the function that was called, never a
command-line flag. A `ParameterError` is a ValueError that also says which parameters its message names;
the message starts with the parameter at fault and its value, then says what is wrong and what would be
right:

    raise ParameterError(f"block_size {block_size} must be a power of two in 1..256", "block_size")
    raise ParameterError(f"num_q_heads {q} must be 1 to 16 times num_kv_heads {kv}", "num_q_heads", "num_kv_heads")

A library user reads `block_size 12 must be a power of two in 1..256`. The CLI rewrites every parameter
that the error names (as a whole word of the message) into the flag that sets it, from one table per
command in kvcalc.cli.app, and prints `error: --block 12 must be a power of two in 1..256`. A parameter
that no flag of the command sets (a field of a config file, say) is left as it is, so the message still
names it. Values are written as the user would type them: `{value!r}` for strings, plain numbers.

Where a parameter's name is also an everyday word of the message (`model`, `config`), the message marks each
place that names the parameter as `{name}` (in an f-string, `{{model}}`) and nothing else is rewritten:

    raise ParameterError(f"{{model}} {repo!r}: a Hugging Face model is org/name", "model")

reads `model 'x': a Hugging Face model is org/name` from the library and `--model 'x': a Hugging Face model is
org/name` from the CLI (`rendered`, with the same table). A message with no mark keeps the whole-word rule.
"""

from __future__ import annotations


class ParameterError(ValueError):
    """Bad input that names parameters: `params[0]` is the one at fault, the others are named alongside it."""

    def __init__(self, message: str, *params: str) -> None:
        if not params:
            raise TypeError("ParameterError needs the name of the parameter at fault")
        self.params: tuple[str, ...] = params
        self.template = message  # `{name}` marks the places that name a parameter, if any
        super().__init__(self.rendered({}))

    @property
    def param(self) -> str:
        return self.params[0]

    @property
    def marked(self) -> bool:
        """Whether the message marks where it names its parameters (`{name}`), rather than the whole-word rule."""
        return any(f"{{{param}}}" in self.template for param in self.params)

    def rendered(self, names: dict[str, str]) -> str:
        """The message with each marked parameter written as `names[param]` (a flag), else as its own name."""
        message = self.template
        for param in self.params:
            message = message.replace(f"{{{param}}}", names.get(param, param))
        return message

    def __reduce__(self) -> tuple:
        """Pickled with its parameters (a worker process's error reaches the parent whole)."""
        return type(self), (self.template, *self.params)


class CudaUnavailableError(RuntimeError):
    """CUDA was asked for but there is no GPU, no driver, no nvcc or no torch (exit code 3)."""
