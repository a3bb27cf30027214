"""Readers for real request traces (Azure LLM inference 2023, Mooncake FAST'25).

Both become one `Trace`: arrival times in seconds from the first request, prompt and output lengths,
and — for Mooncake — the prefix-block ids (`hash_ids`, one per 512-token block; equal ids = equal
content). Requests keep file order. Every problem in a file is a ValueError naming the line and the fix.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..blocks import ceil_div

TRACE_KINDS = ("azure", "mooncake")
MOONCAKE_BLOCK_TOKENS = 512  # tokens covered by one Mooncake hash id
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


class RequestArrays:
    """What traces and simulation workloads share: N requests as parallel arrays, and for Mooncake the
    prefix-block ids of each request (flat `hash_ids`, request i's are hash_ids[hash_offsets[i]:hash_offsets[i+1]]).
    Subclasses are dataclasses with the fields `prompt_tokens`, `hash_ids` and `hash_offsets` and a
    `description` (a field or a property)."""

    prompt_tokens: np.ndarray
    hash_ids: np.ndarray | None
    hash_offsets: np.ndarray | None

    def __len__(self) -> int:
        return int(self.prompt_tokens.shape[0])

    @property
    def has_prefix_ids(self) -> bool:
        return self.hash_ids is not None

    def request_hash_ids(self, i: int) -> np.ndarray:
        if self.hash_ids is None or self.hash_offsets is None:
            raise ValueError(f"{self.description} has no prefix ids (hash_ids); use a Mooncake trace")
        return self.hash_ids[self.hash_offsets[i] : self.hash_offsets[i + 1]]


@dataclass(frozen=True, eq=False)
class Trace(RequestArrays):
    """Requests of a trace, as parallel arrays of length N (`len(trace)`).

    arrival_s      float64 [N]  seconds since the first request of the file
    prompt_tokens  int64   [N]  prompt (context) length
    output_tokens  int64   [N]  generated length
    hash_offsets   int64   [N+1] (Mooncake) request i's ids are hash_ids[hash_offsets[i]:hash_offsets[i+1]]
    hash_ids       int64   [H]   (Mooncake) flat prefix-block ids
    """

    kind: str
    path: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: np.ndarray | None = None
    hash_offsets: np.ndarray | None = None

    @property
    def description(self) -> str:
        return f"real trace: {self.kind} {self.path} ({len(self):,} requests)"

    def head(self, limit: int) -> Trace:
        """The first `limit` requests (all of them when limit >= N)."""
        if limit <= 0:
            raise ValueError(f"--limit must be a positive number of requests, got {limit}")
        n = min(limit, len(self))
        ids, offsets = self.hash_ids, self.hash_offsets
        if ids is not None and offsets is not None:
            ids, offsets = ids[: offsets[n]], offsets[: n + 1]
        return Trace(
            self.kind, self.path, self.arrival_s[:n], self.prompt_tokens[:n], self.output_tokens[:n], ids, offsets
        )


def check_mooncake_block_size(block_size: int) -> None:
    """Mooncake's content keys exist per 512-token hash id, so a block must tile one id exactly."""
    if block_size < 1 or MOONCAKE_BLOCK_TOKENS % block_size:
        raise ValueError(
            f"block size {block_size} does not divide {MOONCAKE_BLOCK_TOKENS}, the tokens of one Mooncake hash id: "
            "use a divisor such as 8, 16, 32 or 64"
        )


def mooncake_block_keys(hash_ids: np.ndarray, prompt_tokens: int, block_size: int, where: str = "") -> np.ndarray:
    """int64 [prompt_tokens // block_size]: the content key of every full prompt block of one request.

    One Mooncake hash id covers 512 tokens (equal ids = equal content, prefix-chained), so with block size
    B (B must divide 512) full block j has the key (hash_ids[j // S], j % S), S = 512 / B, encoded exactly
    as the integer hash_id · S + j % S. A block past the last id's coverage is an error in the trace.
    """
    check_mooncake_block_size(block_size)
    per_id = MOONCAKE_BLOCK_TOKENS // block_size
    full = prompt_tokens // block_size
    if full and (full - 1) // per_id >= len(hash_ids):
        raise ValueError(
            f"{where}{prompt_tokens} prompt tokens need {ceil_div(prompt_tokens, MOONCAKE_BLOCK_TOKENS)} hash_ids "
            f"(one per {MOONCAKE_BLOCK_TOKENS} tokens), the request has {len(hash_ids)}"
        )
    j = np.arange(full, dtype=np.int64)
    return hash_ids[j // per_id] * per_id + j % per_id


def read_trace(kind: str, path: str | Path) -> Trace:
    """Read a trace file of `kind` ('azure' or 'mooncake')."""
    kind = kind.strip().lower()
    if kind not in TRACE_KINDS:
        raise ValueError(f"unknown trace kind {kind!r}: choose one of {', '.join(TRACE_KINDS)}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    trace = read_azure(path) if kind == "azure" else read_mooncake(path)
    if len(trace) == 0:
        raise ValueError(f"the {kind} trace {path} holds no requests: give a file with at least one request")
    return trace


def _parse_count(text: str | int | float, what: str, where: str) -> int:
    """A length from a CSV cell (str) or a JSON value (int; an integral float such as 512.0 is accepted).
    3.7 or true are errors, never truncated to 3 or read as 1."""
    try:
        if isinstance(text, bool) or (isinstance(text, float) and not text.is_integer()):
            raise ValueError
        value = int(text)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{where}: {what} {text!r} is not an integer; fix or remove that line") from None
    if value < 0:
        raise ValueError(f"{where}: {what} is negative ({value}); lengths must be >= 0")
    return value


def read_azure(path: Path) -> Trace:
    """Azure LLM inference trace 2023: CSV with TIMESTAMP, ContextTokens, GeneratedTokens."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path} is empty: an Azure trace starts with the header {','.join(_AZURE_COLUMNS)}")
        header = [h.strip() for h in header]
        missing = [c for c in _AZURE_COLUMNS if c not in header]
        if missing:
            if header and header[0].startswith("{"):
                raise ValueError(f"{path} is JSON lines, not an Azure CSV: read it with --trace mooncake {path}")
            shown = ", ".join(header)
            shown = shown if len(shown) <= 120 else shown[:117] + "..."
            raise ValueError(
                f"{path}: no column {', '.join(missing)} in the header (it has {shown}); "
                f"an Azure trace has {', '.join(_AZURE_COLUMNS)}"
            )
        i_time, i_ctx, i_gen = (header.index(c) for c in _AZURE_COLUMNS)
        stamps: list[str] = []
        prompts: list[int] = []
        outputs: list[int] = []
        for line_no, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            where = f"{path}:{line_no}"
            if len(row) < len(header):
                raise ValueError(f"{where}: expected {len(header)} columns, found {len(row)}")
            stamps.append(row[i_time].strip())
            prompts.append(_parse_count(row[i_ctx], "ContextTokens", where))
            outputs.append(_parse_count(row[i_gen], "GeneratedTokens", where))
    try:
        times = np.array(stamps, dtype="datetime64[ns]")
    except ValueError:
        bad = next(s for s in stamps if not _is_timestamp(s))
        raise ValueError(f"{path}: TIMESTAMP {bad!r} is not a date and time like 2023-11-16 18:15:46.6805900") from None
    arrival_s = (times - times.min()).astype(np.int64) / 1e9 if len(times) else np.zeros(0)
    return Trace("azure", str(path), arrival_s, np.array(prompts, np.int64), np.array(outputs, np.int64))


def _is_timestamp(text: str) -> bool:
    try:
        np.datetime64(text, "ns")
    except ValueError:
        return False
    return True


def read_mooncake(path: Path) -> Trace:
    """Mooncake trace: JSON lines with timestamp (ms), input_length, output_length, hash_ids."""
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    ids: list[int] = []
    offsets = [0]
    any_ids = True
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                if line_no == 1 and all(c in line for c in _AZURE_COLUMNS):
                    raise ValueError(
                        f"{path} is an Azure CSV, not JSON lines: read it with --trace azure {path}"
                    ) from None
                raise ValueError(f"{where}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object per line, found {type(record).__name__}")
            missing = [f for f in _MOONCAKE_FIELDS if f not in record]
            if missing:
                raise ValueError(
                    f"{where}: missing field {', '.join(missing)}; a Mooncake line has "
                    "timestamp, input_length, output_length and hash_ids"
                )
            try:
                arrivals.append(float(record["timestamp"]) / 1000.0)
            except (TypeError, ValueError):
                raise ValueError(f"{where}: timestamp {record['timestamp']!r} is not a number of ms") from None
            prompts.append(_parse_count(record["input_length"], "input_length", where))
            outputs.append(_parse_count(record["output_length"], "output_length", where))
            hashes = record.get("hash_ids")
            if hashes is None:
                any_ids = False
            elif not isinstance(hashes, list) or not all(type(h) is int for h in hashes):  # bool is not an id
                raise ValueError(f"{where}: hash_ids must be a list of integers")
            else:
                ids.extend(hashes)
            offsets.append(len(ids))
    arrival = np.array(arrivals, dtype=np.float64)
    if len(arrival):
        arrival -= arrival.min()
    hash_ids = np.array(ids, dtype=np.int64) if any_ids else None
    hash_offsets = np.array(offsets, dtype=np.int64) if any_ids else None
    return Trace(
        "mooncake", str(path), arrival, np.array(prompts, np.int64), np.array(outputs, np.int64), hash_ids, hash_offsets
    )
