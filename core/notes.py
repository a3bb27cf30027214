"""Notes core hands to a caller as text (a model's source, a caveat about a figure) that name parameters.

Core is a library: like its errors (kvcalc.core.errors.ParameterError), its notes name the parameters of the
function called, never a command-line flag. A `Note` is a str that reads with the parameters' own names, and
keeps its template, whose `{name}` marks say where it names them, so that the CLI can write each as the flag
that sets it (kvcalc.cli.flags.rendered, in the one output sink):

    Note("{spec_method} draft: the draft model's own KV is not counted", "spec_method")

reads `spec_method draft: ...` from the library and `--spec-method draft: ...` from `kvcalc sim`.
"""

from __future__ import annotations

from typing import Any


class Note(str):
    """Text naming parameters at its `{name}` marks; str() writes each mark as the parameter's own name."""

    template: str
    params: tuple[str, ...]

    def __new__(cls, template: str, *params: str) -> Note:
        note = super().__new__(cls, _fill(template, params, {}))
        note.template = template
        note.params = params
        return note

    def rendered(self, names: dict[str, str]) -> str:
        """The note with each parameter written as `names[param]` (a flag), else as its own name."""
        return _fill(self.template, self.params, names)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.template, *self.params)


def concat(*parts: str) -> str:
    """The parts joined, a Note naming every parameter that one of them names (a plain str if none is a Note)."""
    if not any(isinstance(part, Note) for part in parts):
        return "".join(parts)
    params = tuple(dict.fromkeys(p for part in parts if isinstance(part, Note) for p in part.params))
    return Note("".join(part.template if isinstance(part, Note) else part for part in parts), *params)


def _fill(template: str, params: tuple[str, ...], names: dict[str, str]) -> str:
    for param in params:
        template = template.replace(f"{{{param}}}", names.get(param, param))
    return template
