"""The two trace formats, parsed from text into columns: Azure LLM inference 2023 (CSV) and Mooncake
FAST'25 (JSON lines). Every field of every line is checked — type, range, finiteness — and a bad one is a
ValueError naming the file, the line, the value and the fix. traces.py turns the columns into a `Trace`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import warnings
from typing import NamedTuple

import numpy as np

from ..errors import ParameterError
from ..paging import MAX_LENGTH
from ..units import format_int_short, plural

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
MOONCAKE_BLOCK_TOKENS = 512  # prompt tokens covered by one Mooncake hash id


class TraceColumns(NamedTuple):
    """arrival_s float64 [N] (from the earliest request), prompt/output int64 [N], Mooncake's flat ids and
    offsets (None for Azure, or for a Mooncake file without hash_ids)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: np.ndarray | None = None
    hash_offsets: np.ndarray | None = None


def _shown(value: object) -> str:
    """A value as a message shows it: its repr, cut short (a line may hold thousands of ids)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _parse_count(text: object, what: str, where: str) -> int:
    """A length from a CSV cell (str) or a JSON value (int; an integral float such as 512.0 is accepted).
    3.7, true, null or a list are errors, never truncated to 3 or read as 1."""
    try:
        if (isinstance(text, bool) or not isinstance(text, (str, int, float))
                or (isinstance(text, float) and not text.is_integer())):
            raise ValueError
        value = int(text)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where}: {what} {_shown(text)} is not an integer; fix or remove that line") from None
    if value < 0:
        raise ValueError(f"{where}: {what} is negative ({value}); lengths must be >= 0")
    if value > MAX_LENGTH:
        raise ValueError(f"{where}: {what} {format_int_short(value)} is too large (lengths must be <= 2^62); fix or "
                         "remove that line")
    return value


def read_azure(text: str, name: str) -> TraceColumns:
    """Azure LLM inference trace 2023: CSV with TIMESTAMP, ContextTokens, GeneratedTokens."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None:
        raise ValueError(f"{name} is empty: an Azure trace starts with the header {','.join(_AZURE_COLUMNS)}")
    header = [h.strip() for h in header]
    missing = [c for c in _AZURE_COLUMNS if c not in header]
    if missing:
        if header and header[0].startswith("{"):
            raise ParameterError(f"{name} is JSON lines, not an Azure CSV: read it with {{trace}} mooncake {name}",
                                 "trace")
        shown = ", ".join(header)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        raise ValueError(
            f"{name}: no column {', '.join(missing)} in the header (it has {shown}); "
            f"an Azure trace has {', '.join(_AZURE_COLUMNS)}"
        )
    twice = [c for c in _AZURE_COLUMNS if header.count(c) > 1]
    if twice:
        raise ValueError(f"{name}: the header names {', '.join(twice)} more than once, so kvcalc cannot tell which "
                         "column to read; keep one of each")
    i_time, i_ctx, i_gen = (header.index(c) for c in _AZURE_COLUMNS)
    stamps: list[str] = []
    stamp_lines: list[int] = []
    prompts: list[int] = []
    outputs: list[int] = []
    for row in reader:
        if not row or all(not cell.strip() for cell in row):
            continue
        where = f"{name}:{reader.line_num}"
        if len(row) != len(header):  # a field too many is as ambiguous as one too few (an unquoted comma?)
            raise ValueError(f"{where}: expected {len(header)} columns, found {len(row)}")
        stamps.append(row[i_time].strip())
        stamp_lines.append(reader.line_num)
        prompts.append(_parse_count(row[i_ctx], "ContextTokens", where))
        outputs.append(_parse_count(row[i_gen], "GeneratedTokens", where))
    arrival_s = _azure_arrivals(stamps, stamp_lines, name)
    return TraceColumns(arrival_s, np.array(prompts, np.int64), np.array(outputs, np.int64))


# Azure TIMESTAMPs are dates and times; arrivals are nanoseconds after the earliest. numpy's datetime64[ns]
# spans only the years 1678–2262 and silently wraps a date outside them (3000-01-01 reads as 1830), and it
# reads "NaT" or an empty cell as not-a-time: so each stamp is read at one-second resolution first (which
# spans far more years), checked, and only then read in ns.
_NS_FIRST, _NS_LAST = np.datetime64("1678-01-01", "s"), np.datetime64("2262-01-01", "s")
_MAX_SPAN_S = (2**63 - 1) // 10**9  # about 292 years: the widest span whose ns differences fit int64


def _azure_arrivals(stamps: list[str], lines: list[int], name: str) -> np.ndarray:
    """float64 [N]: seconds after the earliest request; a stamp that is no date and time names its line."""
    if not stamps:
        return np.zeros(0)
    try:
        coarse = _datetimes(stamps, "s")
    except (ValueError, OverflowError):
        i = next(i for i, s in enumerate(stamps) if not _is_timestamp(s))
        raise ValueError(
            f"{name}:{lines[i]}: TIMESTAMP {_shown(stamps[i])} is not a date and time like 2023-11-16 18:15:46.6805900"
        ) from None
    bad = np.flatnonzero(np.isnat(coarse) | (coarse < _NS_FIRST) | (coarse >= _NS_LAST))
    if bad.size:
        i = int(bad[0])
        problem = "is not a time" if np.isnat(coarse[i]) else "is outside the years 1678–2261 that kvcalc reads"
        raise ValueError(
            f"{name}:{lines[i]}: TIMESTAMP {_shown(stamps[i])} {problem}: give a date and time like "
            "2023-11-16 18:15:46.6805900"
        )
    if int((coarse.max() - coarse.min()).astype(np.int64)) >= _MAX_SPAN_S:  # ns differences would wrap
        raise ValueError(f"{name}: the TIMESTAMPs span {_span_years(coarse):,} years, more than the 292 years "
                         "kvcalc can time in nanoseconds; check the dates")
    times = _datetimes(stamps, "ns")
    return (times - times.min()).astype(np.int64) / 1e9


def _datetimes(stamps: list[str], unit: str) -> np.ndarray:
    """The stamps as datetime64[unit]. A stamp with a UTC offset (`2024-05-10 00:00:00.009930+00:00`, as the
    2024 Azure traces write them, or a trailing `Z`) is converted to UTC, which is what arrivals need; numpy warns
    that it keeps no time zone, a warning on stderr that says nothing wrong about the trace, so it is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*time ?zone", category=Warning)
        return np.array(stamps, dtype=f"datetime64[{unit}]")


def _span_years(coarse: np.ndarray) -> int:
    return int((coarse.max() - coarse.min()).astype(np.int64)) // (365 * 86_400)


def _is_timestamp(text: str) -> bool:
    try:
        _datetimes([text], "s")
    except (ValueError, OverflowError):
        return False
    return True


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
        raise ValueError(f"{where}: timestamp {_shown(value)} is not a number of ms; {fix}") from None
    if not math.isfinite(ms):
        raise ValueError(f"{where}: timestamp {_shown(value)} is not finite; {fix}")
    if ms < 0:
        raise ValueError(f"{where}: timestamp {_shown(value)} is negative; {fix}")
    if ms > _MAX_TIMESTAMP_MS:
        raise ValueError(f"{where}: timestamp {_shown(value)} is past 2^53 ms (285,000 years); {fix}")
    return float(ms)


def _hash_ids(value: object, where: str) -> list[int]:
    """A request's prefix-block ids: a list of integers in 0..2^63 - 1 (int64, as every id array holds them)."""
    if not isinstance(value, list):
        raise ValueError(f"{where}: hash_ids {_shown(value)} must be a list of integers (prefix-block ids >= 0)")
    for h in value:
        if type(h) is not int:  # bool is not an id, nor is 3.0
            raise ValueError(f"{where}: hash_ids holds {_shown(h)}; hash_ids must be a list of integers "
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
        raise ValueError(f"{where}: {field} {_shown(value)} is not {kind} but a string; write it as a JSON number, "
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


def read_mooncake(text: str, name: str) -> TraceColumns:
    """Mooncake trace: JSON lines with timestamp (ms), input_length, output_length, hash_ids."""
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
            record = json.loads(line)
        except RecursionError:
            raise ValueError(f"{where}: JSON nested too deeply to read; each line must be one JSON object") from None
        except json.JSONDecodeError as exc:
            if line_no == 1 and all(c in line for c in _AZURE_COLUMNS):
                raise ParameterError(f"{name} is an Azure CSV, not JSON lines: read it with {{trace}} azure {name}",
                                     "trace") from None
            raise ValueError(f"{where}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
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
            column.append(_parse_count(_json_number(record, field, "an integer", where), field, where))
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
    arrival = np.array(arrivals, dtype=np.float64)
    if len(arrival):
        arrival -= arrival.min()
    any_ids = with_ids > 0
    hash_ids = np.array(ids, dtype=np.int64) if any_ids else None
    hash_offsets = np.array(offsets, dtype=np.int64) if any_ids else None
    return TraceColumns(arrival, np.array(prompts, np.int64), np.array(outputs, np.int64), hash_ids, hash_offsets)
