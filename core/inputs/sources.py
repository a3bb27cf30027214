"""Where an input file comes from: a path, `-` for standard input, or an open binary stream.

Every reader of lengths and traces takes its bytes and the name its messages use from here, so a missing
file, a directory, a binary file or text that is not UTF-8 is reported the same way for every input, and
`-` works wherever a file does (`kvcalc frag --lengths-file -`, `--trace mooncake -`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO

__all__ = ["STDIN", "STDIN_NAME", "InputSource", "decode_text", "is_stdin", "read_source", "source_name"]

STDIN = "-"
STDIN_NAME = "<stdin>"
InputSource = str | Path | BinaryIO


def is_stdin(source: InputSource) -> bool:
    return isinstance(source, (str, Path)) and str(source) == STDIN


def source_name(source: InputSource) -> str:
    """The name messages and descriptions use: the path as given, `<stdin>`, or a stream's own name."""
    if is_stdin(source):
        return STDIN_NAME
    if isinstance(source, (str, Path)):
        return str(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else "<stream>"


def read_source(source: InputSource, expected: str) -> tuple[str, bytes]:
    """(name, every byte) of `source`; `expected` says what the reader wants ("a Mooncake trace: JSON lines
    …"), for the messages about a directory or a terminal. A missing path raises FileNotFoundError."""
    if is_stdin(source):
        stream = sys.stdin
        if stream is None:
            raise ValueError(f"'-' reads standard input, and there is none: give the path of the file ({expected})")
        if stream.isatty():  # reading would wait for typing that nobody means to do
            raise ValueError(f"'-' reads standard input, which is a terminal: pipe the file in (… - < FILE) or give "
                             f"its path ({expected})")
        return STDIN_NAME, _as_bytes(getattr(stream, "buffer", stream).read())
    if not isinstance(source, (str, Path)):
        return source_name(source), _as_bytes(source.read())
    if isinstance(source, str) and not source:  # Path("") is ".", which would be reported as a directory
        raise ValueError(f"the path is empty: give the path of the file ({expected})")
    path = Path(source)
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a file: give the path of the file itself ({expected})")
    if not path.exists():
        raise FileNotFoundError(2, "No such file", str(path))
    return str(path), path.read_bytes()


def _as_bytes(data: bytes | str) -> bytes:
    """What a stream gave, as bytes: a text stream (a StringIO standing in for stdin) gives str, which the
    readers that look at bytes (the .npy magic, the fast lengths parser) cannot take. surrogateescape turns
    bytes its decoder could not read back into those bytes, so decode_text still names the bad byte."""
    return data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data


def decode_text(data: bytes | str, name: str, expected: str) -> str:
    """UTF-8 text (a leading byte-order mark, as some editors write, is dropped); a binary file or another
    encoding is a ValueError naming the file, the first bad byte and the format that was expected."""
    if isinstance(data, str):  # a text stream
        text = data
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            bad = data[exc.start : exc.start + 1].hex()
            raise ValueError(
                f"{name}: not a text file (not UTF-8), byte 0x{bad} at offset {exc.start:,}; expected {expected}"
            ) from None
    if "\x00" in text:
        raise ValueError(f"{name}: not a text file (it holds NUL bytes, as binary files do); expected {expected}")
    return text.removeprefix("\ufeff")
