"""A trace file's text, and the Mooncake FAST'25 format (JSON lines) parsed into plain Python lists — without
numpy, whose import costs more than a small trace's whole replay (`kvcalc share --trace mooncake` on a small trace
runs on these lists: core/share/id_replay_lists.py). Every field of every line is checked — type, range,
finiteness — and a bad one is a ValueError naming the file, the line, the value and the fix; trace_formats.py turns
the lists into numpy columns, traces.py into a `Trace`.

Mooncake's content keys: one hash id per 512 prompt tokens (equal ids = equal content). A block of B tokens tiles
one id (B divides 512) or covers whole ids (B a multiple of 512); any other B cannot be keyed.
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple

from ..blocks import MAX_LENGTH
from ..errors import ParameterError
from ..units import format_int_short, plural
from .sources import InputSource, decode_text, read_source

TRACE_KINDS = ("azure", "mooncake")
_EXPECTED = {
    "azure": "an Azure trace: a CSV with the columns TIMESTAMP, ContextTokens, GeneratedTokens",
    "mooncake": "a Mooncake trace: JSON lines with timestamp, input_length, output_length, hash_ids",
}
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
MOONCAKE_BLOCK_TOKENS = 512  # prompt tokens covered by one Mooncake hash id


class MooncakeLines(NamedTuple):
    """A Mooncake trace in file order: arrival seconds from the earliest request, prompt and output lengths, and
    the flat hash ids with offsets (request i's are ids[offsets[i]:offsets[i + 1]]; None without hash_ids)."""

    arrival_s: list[float]
    prompt_tokens: list[int]
    output_tokens: list[int]
    hash_ids: list[int] | None
    hash_offsets: list[int] | None


def trace_description(kind: str, path: str, requests: int) -> str:
    """How reports name a trace: `real trace: mooncake F (3,993 requests)`."""
    return f"real trace: {kind} {path} ({plural(requests, 'request')})"


def read_trace_text(kind: str, source: InputSource) -> tuple[str, str, str]:
    """(kind, name, text) of a trace of `kind` ('azure' or 'mooncake', any case) from a path, `-` (standard input)
    or a binary stream; an unknown kind, a missing or binary file is an error naming it."""
    kind = kind.strip().lower()
    if kind not in TRACE_KINDS:
        raise ValueError(f"unknown trace kind {kind!r}: choose one of {', '.join(TRACE_KINDS)}")
    expected = _EXPECTED[kind]
    name, data = read_source(source, expected)
    return kind, name, decode_text(data, name, expected)


def mooncake_block_size_error(block_size: int) -> str | None:
    """Why Mooncake's prefix ids cannot key blocks of `block_size` tokens (None when they can): a block must tile
    one 512-token hash id exactly (B divides 512) or cover whole ids (B a multiple of 512)."""
    if block_size >= 1 and (MOONCAKE_BLOCK_TOKENS % block_size == 0 or block_size % MOONCAKE_BLOCK_TOKENS == 0):
        return None
    return (f"block_size {format_int_short(block_size)} does not divide {MOONCAKE_BLOCK_TOKENS} and is not a "
            f"multiple of it ({MOONCAKE_BLOCK_TOKENS} tokens per Mooncake hash id): use a divisor such as 16, 32, 64 "
            "or a multiple such as 1,024, 2,048, 4,096")


def mooncake_blocks_per_id(block_size: int) -> int:
    """S: blocks of `block_size` tokens in one 512-token hash id (1 when a block covers whole ids)."""
    return max(1, MOONCAKE_BLOCK_TOKENS // block_size)


def mooncake_ids_per_block(block_size: int) -> int:
    """m: hash ids one block of `block_size` tokens covers (1 when a block divides 512)."""
    return max(1, block_size // MOONCAKE_BLOCK_TOKENS)


def shown(value: object) -> str:
    """A value as a message shows it: its repr, cut short (a line may hold thousands of ids)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_count(text: object, what: str, where: str) -> int:
    """A length from a CSV cell (str) or a JSON value (int; an integral float such as 512.0 is accepted).
    3.7, true, null or a list are errors, never truncated to 3 or read as 1."""
    try:
        if (isinstance(text, bool) or not isinstance(text, (str, int, float))
                or (isinstance(text, float) and not text.is_integer())):
            raise ValueError
        value = int(text)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where}: {what} {shown(text)} is not an integer; fix or remove that line") from None
    if value < 0:
        raise ValueError(f"{where}: {what} is negative ({value}); lengths must be >= 0")
    if value > MAX_LENGTH:
        raise ValueError(f"{where}: {what} {format_int_short(value)} is too large (lengths must be <= 2^62); fix or "
                         "remove that line")
    return value



# Mooncake timestamps are milliseconds from the start of the trace: a finite number >= 0. A negative one
# is refused rather than read as an earlier arrival (arrivals are relative to the earliest request, so it
# would shift every other request), and so is one past 2^53 ms (285,000 years), where float64 no longer
# holds whole milliseconds. Requests may come in any order: replays sort them by arrival.
_MAX_TIMESTAMP_MS = 2**53
_INT64_MAX = 2**63 - 1


def _timestamp_ms(value: object, where: str) -> float:
    fix = "a Mooncake timestamp is a number of ms >= 0 from the start of the trace; fix or remove that line"
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        ms = min(value, _MAX_TIMESTAMP_MS + 1) if isinstance(value, int) else float(value)  # 10^400 overflows float
    except (TypeError, ValueError):
        raise ValueError(f"{where}: timestamp {shown(value)} is not a number of ms; {fix}") from None
    if not math.isfinite(ms):
        raise ValueError(f"{where}: timestamp {shown(value)} is not finite; {fix}")
    if ms < 0:
        raise ValueError(f"{where}: timestamp {shown(value)} is negative; {fix}")
    if ms > _MAX_TIMESTAMP_MS:
        raise ValueError(f"{where}: timestamp {shown(value)} is past 2^53 ms (285,000 years); {fix}")
    return float(ms)


def _hash_ids(value: object, where: str) -> list[int]:
    """A request's prefix-block ids: a list of integers in 0..2^63 - 1 (int64, as every id array holds them)."""
    if not isinstance(value, list):
        raise ValueError(f"{where}: hash_ids {shown(value)} must be a list of integers (prefix-block ids >= 0)")
    if not set(map(type, value)) <= {int}:  # bool is not an id, nor is 3.0 (one pass in C; the loop names the first)
        h = next(h for h in value if type(h) is not int)
        raise ValueError(f"{where}: hash_ids holds {shown(h)}; hash_ids must be a list of integers "
                         "(prefix-block ids >= 0)")
    if value and (min(value) < 0 or max(value) > _INT64_MAX):
        h = next(h for h in value if not 0 <= h <= _INT64_MAX)
        bound = "negative" if h < 0 else "past 2^63 - 1, the largest id kvcalc holds (int64)"
        raise ValueError(f"{where}: hash_ids holds {h}, which is {bound}; ids are integers in 0..2^63 - 1")
    return value


def _json_number(record: dict, field: str, kind: str, where: str) -> object:
    """A numeric field of a JSON line as written: a quoted number ("100") is refused, not read as 100, for the
    same reason 100.5 and true are: the file is not what the writer meant, and guessing hides it."""
    value = record[field]
    if isinstance(value, str):
        raise ValueError(f"{where}: {field} {shown(value)} is not {kind} but a string; write it as a JSON number, "
                         "without quotes")
    return value


def _check_id_count(ids: list[int], prompt: int, where: str) -> None:
    """Mooncake's hash ids cover the prompt, one per 512 tokens: more than that would key blocks that hold
    no prompt token (and grow the pool needed without limit). Fewer is accepted, as the readers of the
    blocks refuse a prompt block that no id covers."""
    need = -(-prompt // MOONCAKE_BLOCK_TOKENS)
    if len(ids) > need:
        raise ValueError(
            f"{where}: {len(ids):,} hash_ids for input_length {prompt:,}, which needs {need:,} (one per "
            f"{MOONCAKE_BLOCK_TOKENS} prompt tokens); drop the ids past the prompt or fix input_length"
        )


_decode = json.JSONDecoder().raw_decode  # what json.loads runs, from index 0 (no leading white space)


def _loads(line: str, line_no: int, name: str) -> object:
    """json.loads(line), or the error naming the line (or saying that the file is an Azure CSV)."""
    where = f"{name}:{line_no}"
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply to read; each line must be one JSON object") from None
    except json.JSONDecodeError as exc:
        if line_no == 1 and all(c in line for c in AZURE_COLUMNS):
            raise ParameterError(f"{name} is an Azure CSV, not JSON lines: read it with {{trace}} azure {name}",
                                 "trace") from None
        raise ValueError(f"{where}: not valid JSON ({exc.msg}); each line must be one JSON object") from None


def read_mooncake_lines(text: str, name: str) -> MooncakeLines:
    """Mooncake trace: JSON lines with timestamp (ms), input_length, output_length, hash_ids; every field of every
    line checked (see the module docstring)."""
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    ids: list[int] = []
    offsets = [0]
    with_ids = 0
    first_without: str | None = None
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}:{line_no}"
        try:
            record, end = _decode(line)  # json.loads less its checks, which decide only when this fails
            if end != len(line):  # trailing white space, or more after the object: json.loads reads or refuses it
                record = _loads(line, line_no, name)
        except (json.JSONDecodeError, RecursionError):
            record = _loads(line, line_no, name)
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object per line, found {type(record).__name__}")
        missing = [f for f in _MOONCAKE_FIELDS if f not in record]
        if missing:
            raise ValueError(
                f"{where}: missing field {', '.join(missing)}; a Mooncake line has "
                "timestamp, input_length, output_length and hash_ids"
            )
        arrivals.append(_timestamp_ms(_json_number(record, "timestamp", "a number", where), where) / 1000.0)
        for field, column in (("input_length", prompts), ("output_length", outputs)):
            column.append(parse_count(_json_number(record, field, "an integer", where), field, where))
        hashes = record.get("hash_ids")
        if hashes is None:
            first_without = first_without or where
        else:
            request_ids = _hash_ids(hashes, where)
            _check_id_count(request_ids, prompts[-1], where)
            ids.extend(request_ids)
            with_ids += 1
        offsets.append(len(ids))
        if with_ids and first_without is not None:  # a mix would drop every line's ids, or invent empty ones
            verb = "has" if with_ids == 1 else "have"
            raise ValueError(
                f"{first_without}: no hash_ids, but {plural(with_ids, 'other line')} {verb} them; give every request "
                "its hash_ids (prefix-block ids), or remove them from every line for a trace without prefix ids"
            )
    if arrivals:
        earliest = min(arrivals)
        arrivals = [a - earliest for a in arrivals]  # float64 subtraction, as numpy's: the same values
    if not with_ids:
        return MooncakeLines(arrivals, prompts, outputs, None, None)
    return MooncakeLines(arrivals, prompts, outputs, ids, offsets)
