"""The two trace formats, parsed from text into numpy columns: Azure LLM inference 2023 (CSV) and Mooncake
FAST'25 (JSON lines, read into lists by trace_text.py). Every field of every line is checked — type, range,
finiteness — and a bad one is a ValueError naming the file, the line, the value and the fix. traces.py turns the
columns into a `Trace`.
"""

from __future__ import annotations

import csv
import io
import warnings
from typing import NamedTuple

import numpy as np

from ..errors import ParameterError
from .trace_text import AZURE_COLUMNS as _AZURE_COLUMNS
from .trace_text import MooncakeLines, parse_count, read_mooncake_lines, shown


class TraceColumns(NamedTuple):
    """arrival_s float64 [N] (from the earliest request), prompt/output int64 [N], Mooncake's flat ids and
    offsets (None for Azure, or for a Mooncake file without hash_ids)."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: np.ndarray | None = None
    hash_offsets: np.ndarray | None = None


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
        prompts.append(parse_count(row[i_ctx], "ContextTokens", where))
        outputs.append(parse_count(row[i_gen], "GeneratedTokens", where))
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
            f"{name}:{lines[i]}: TIMESTAMP {shown(stamps[i])} is not a date and time like 2023-11-16 18:15:46.6805900"
        ) from None
    bad = np.flatnonzero(np.isnat(coarse) | (coarse < _NS_FIRST) | (coarse >= _NS_LAST))
    if bad.size:
        i = int(bad[0])
        problem = "is not a time" if np.isnat(coarse[i]) else "is outside the years 1678–2261 that kvcalc reads"
        raise ValueError(
            f"{name}:{lines[i]}: TIMESTAMP {shown(stamps[i])} {problem}: give a date and time like "
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


def read_mooncake(text: str, name: str) -> TraceColumns:
    """Mooncake trace: JSON lines with timestamp (ms), input_length, output_length, hash_ids (trace_text.py reads
    and checks them), as numpy columns."""
    return mooncake_columns(read_mooncake_lines(text, name))


def mooncake_columns(lines: MooncakeLines) -> TraceColumns:
    """The lists of read_mooncake_lines as numpy columns."""
    arrival_s, prompts, outputs, ids, offsets = lines
    return TraceColumns(np.array(arrival_s, dtype=np.float64), np.array(prompts, np.int64),
                        np.array(outputs, np.int64), None if ids is None else np.array(ids, dtype=np.int64),
                        None if offsets is None else np.array(offsets, dtype=np.int64))
