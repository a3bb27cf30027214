"""Reading sequence lengths from files and text: one integer per line, a CSV column, a JSON list, .npy.

Every reader returns a validated int64 array (each length in 1..2^62) or raises ValueError naming the file
and the line or item. core/lengths.py wraps the arrays into `Lengths` with their provenance. The input is
a path, `-` (standard input) or a binary stream (see sources.py).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import PurePath

import numpy as np

from ..errors import ParameterError
from ..paging import MAX_LENGTH
from ..units import format_int_short, parse_int
from .sources import InputSource, decode_text, read_source

__all__ = ["LENGTHS_FORMATS", "ints_from_text", "read_lengths_array", "validated"]

# {column} marks the parameter (ParameterError): a library user reads `column`, the CLI its flag
LENGTHS_FORMATS = "one integer per line, a CSV with {column}, a JSON list (.json) or a NumPy array (.npy)"
_NPY_MAGIC = b"\x93NUMPY"


def validated(values: np.ndarray, where: Callable[[int], str] | None, what: str) -> np.ndarray:
    """Check that every length is in 1..MAX_LENGTH; `where(i)` locates item i (0-based) in error messages."""
    if values.size == 0:
        raise ValueError(f"{what} holds no lengths: give at least one positive integer")
    problem = None
    if int(values.min()) < 1:
        bad, problem = values < 1, "is not positive; every sequence holds at least 1 token"
    elif int(values.max()) > MAX_LENGTH:
        bad, problem = values > MAX_LENGTH, "is too large (lengths must be <= 2^62)"
    if problem is not None:
        i = int(np.argmax(bad))
        place = where(i) if where is not None else f"{what}, item {i + 1}"
        raise ValueError(f"{place}: length {int(values[i])} {problem}")
    return values


def ints_from_text(items: list[str], where: Callable[[int], str], hint: str = "",
                   option_spellings: bool = False) -> np.ndarray:
    """Parse integer strings; the fast path is vectorised, the slow one finds and names the first bad item.

    A file's lengths are whole numbers written as such (4096, +4096, 1_000), as its JSON and .npy forms must
    be; `option_spellings` (a list typed on the command line) also takes what every count option takes (1e3,
    4096.0 when exactly whole)."""
    try:
        return np.array(items).astype(np.int64) if items else np.zeros(0, np.int64)
    except (ValueError, OverflowError):
        pass
    values = []
    for i, text in enumerate(items):
        try:
            value = parse_int(text, "length") if option_spellings else int(text)
        except ValueError:
            fix = "; write whole numbers without a decimal point or exponent" if _numeric(text) else ""
            raise ValueError(f"{where(i)}: {text!r} is not an integer length{fix or hint}") from None
        if value > MAX_LENGTH:
            raise ValueError(f"{where(i)}: length {format_int_short(value)} is too large (lengths must be <= 2^62)")
        if value < -MAX_LENGTH:  # would not fit int64; smaller negatives are named by the range check
            raise ValueError(f"{where(i)}: length {format_int_short(value)} is not positive; every sequence holds at "
                             "least 1 token")
        values.append(value)
    return np.array(values, dtype=np.int64)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_lengths_array(source: InputSource, column: str | None = None) -> np.ndarray:
    """int64 [N] from a lengths file, validated: one integer per line; a CSV column (`column` given); a JSON
    list; a NumPy array. A .json or .npy name, or content that starts as one (a `[`, the .npy magic), picks
    JSON or NumPy, so standard input (`-`) can carry every format."""
    try:
        name, data = read_source(source, f"lengths: {LENGTHS_FORMATS}")
    except ValueError as exc:
        raise _column_marked(exc) from None
    suffix = PurePath(name).suffix.lower()
    if column is not None:
        return _read_csv_column(_text(data, name), name, column)
    if suffix == ".npy" or data.startswith(_NPY_MAGIC):
        return _read_npy(data, name)
    if suffix == ".json" or data.lstrip()[:1] == b"[":
        return _read_json(_text(data, name), name)
    return _read_lines(data, name)


def _text(data: bytes, name: str) -> str:
    try:
        return decode_text(data, name, f"lengths: {LENGTHS_FORMATS}")
    except ValueError as exc:
        raise _column_marked(exc) from None


def _column_marked(exc: ValueError) -> ValueError:
    """`exc` as the lengths file's ParameterError when its message marks {column} (LENGTHS_FORMATS, the CSV hint),
    so that the CLI writes the mark as its flag; else `exc` itself."""
    message = str(exc)
    return ParameterError(message, "lengths_file", "column") if "{column}" in message else exc


_PLAIN_BYTES = np.zeros(256, dtype=bool)  # what the fast path of _read_lines accepts: digits and whitespace
_PLAIN_BYTES[[ord(c) for c in "0123456789 \t\r\n"]] = True
_FAST_MAX_DIGITS = 18  # 10^18 - 1 < 2^62 = MAX_LENGTH: no overflow, no range surprise in the fast parser


def _read_lines(data: bytes, name: str) -> np.ndarray:
    """One integer per line (blank lines skipped, spaces around a number allowed).

    The common file — only digits and whitespace, one number per line, at most 18 digits, no leading
    zeros — is parsed by numpy on the raw bytes (10^7 lines in about a second, no Python object per line).
    Anything else (signs, commas, bad lines, non-ASCII) takes the line-by-line path, which names the first
    bad line; the fast path also reads the lines only to name a bad value.
    """
    tokens = _parse_plain_lines(data)
    if tokens is None:
        items, where, hint = _split_lines(data, name)
        try:
            tokens = ints_from_text(items, where, hint)
        except ValueError as exc:
            raise _column_marked(exc) from None
        return validated(tokens, where, name)
    return validated(tokens, lambda i: _split_lines(data, name)[1](i), name)


def _split_lines(data: bytes, name: str) -> tuple[list[str], Callable[[int], str], str]:
    """The non-blank lines (stripped), a function naming item i as `name:line`, and a hint for CSV files."""
    numbered = [(i, s.strip()) for i, s in enumerate(_text(data, name).splitlines(), 1)]
    numbered = [(i, s) for i, s in numbered if s]
    if not numbered:
        raise ValueError(f"{name} is empty: write one positive integer per line")

    def where(i: int) -> str:
        return f"{name}:{numbered[i][0]}"

    hint = ""
    if "," in numbered[0][1]:
        hint = f"; for a CSV give {{column}} NAME (the first line has {numbered[0][1]})"
    return [s for _, s in numbered], where, hint


def _parse_plain_lines(data: bytes) -> np.ndarray | None:
    """int64 [N] from lines of plain decimal digits, or None when `data` needs the line-by-line path.

    numpy's text parser reads whitespace-separated integers; the checks around it make that the same as
    one integer per line: only digits and whitespace, never two numbers on a line (digits, blanks, digits),
    and as many digits in the file as the parsed values have (no overflow, no leading zeros, nothing skipped).
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    if not _PLAIN_BYTES[raw].all():
        return None
    num_digits = np.count_nonzero(raw - np.uint8(ord("0")) < 10)  # uint8 wraps below '0'
    if num_digits == 0:
        return None
    blanks = np.flatnonzero((raw == ord(" ")) | (raw == ord("\t")))
    if blanks.size:
        run_starts = blanks[np.r_[True, np.diff(blanks) > 1]]
        run_ends = blanks[np.r_[np.diff(blanks) > 1, True]] + 1
        inside = (run_starts > 0) & (run_ends < raw.size)
        before, after = raw[run_starts[inside] - 1], raw[run_ends[inside]]
        if np.any((before - np.uint8(ord("0")) < 10) & (after - np.uint8(ord("0")) < 10)):
            return None  # "37 91" on one line
    tokens = np.fromstring(data, dtype=np.int64, sep=" ")  # text mode: any whitespace separates
    digits_of_values = tokens.size
    for k in range(1, _FAST_MAX_DIGITS + 1):
        longer = np.count_nonzero(tokens >= 10**k)
        if longer == 0:
            break
        digits_of_values += longer
    if digits_of_values != num_digits or np.any(tokens >= 10**_FAST_MAX_DIGITS):
        return None
    return tokens


def _read_csv_column(text: str, name: str, column: str) -> np.ndarray:
    import csv

    reader = csv.reader(io.StringIO(text, newline=""))
    header = [h.strip() for h in next(reader, [])]
    if not header:
        raise ValueError(f"{name} is empty: a CSV needs a header line with the column {column}")
    if column not in header:
        raise ParameterError(
            f"{name} has no column {column!r}: its columns are {', '.join(header)}; pick one with {{column}}", "column"
        )
    index = header.index(column)
    items: list[str] = []
    line_numbers: list[int] = []
    for row in reader:
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) <= index:
            raise ValueError(f"{name}:{reader.line_num} (column {column}): the row has {len(row)} cells, "
                             f"fewer than the header's {len(header)}")
        items.append(row[index].strip())
        line_numbers.append(reader.line_num)
    if not items:
        raise ValueError(f"{name} has a header but no rows: give at least one length")

    def where(i: int) -> str:
        return f"{name}:{line_numbers[i]} (column {column})"

    return validated(ints_from_text(items, where), where, name)


def _read_json(text: str, name: str) -> np.ndarray:
    import json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON ({exc.msg}, line {exc.lineno}): write a list [37, 91]") from None
    except RecursionError:
        raise ValueError(f"{name} nests JSON lists too deeply to read: write one flat list [37, 91]") from None
    if not isinstance(data, list):
        raise ValueError(f"{name} holds a JSON {type(data).__name__}, not a list: write a list like [37, 91, 128]")
    if not data:
        raise ValueError(f"{name} is an empty list: give at least one length")
    for i, value in enumerate(data):
        if isinstance(value, bool) or not isinstance(value, int):
            fix = "; write whole numbers without a decimal point" if isinstance(value, float) else ""
            raise ValueError(f"{name}, item {i + 1}: {value!r} is not an integer length{fix}")
        if value > MAX_LENGTH:
            raise ValueError(
                f"{name}, item {i + 1}: length {format_int_short(value)} is too large (lengths must be <= 2^62)"
            )
        if value < 1:  # before int64 conversion, which a very negative value would overflow
            raise ValueError(f"{name}, item {i + 1}: length {format_int_short(value)} is not positive; every sequence "
                             "holds at least 1 token")
    return validated(np.array(data, dtype=np.int64), None, name)


def _read_npy(data: bytes, name: str) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, EOFError, OSError) as exc:
        raise ValueError(f"{name} is not a readable .npy array ({exc}); save it with numpy.save") from None
    if not isinstance(array, np.ndarray):  # np.load reads an .npz archive as a mapping of arrays
        raise ValueError(f"{name} is an .npz archive, not an .npy array: save one array with numpy.save")
    if array.ndim != 1:
        raise ValueError(f"{name} holds an array of shape {array.shape}: give a 1-D array of lengths")
    if array.dtype.kind not in "iu":  # a float array too, whole or not, as a JSON list refuses 2.0
        raise ValueError(f"{name}: {array.dtype} values are not integer lengths; save an integer array, e.g. "
                         "numpy.save(path, lengths.astype(numpy.int64)) once they are whole")
    if array.dtype.kind == "u" and array.size and int(array.max()) > 2**62:
        raise ValueError(f"{name}: a length above 2^62 is too large")
    return validated(np.asarray(array, dtype=np.int64), None, name)
