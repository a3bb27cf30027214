"""Readers for real request traces (Azure LLM inference 2023, Mooncake FAST'25).

Both become one `Trace`: arrival times in seconds from the first request, prompt and output lengths,
and — for Mooncake — the prefix-block ids (`hash_ids`, one per 512-token block; equal ids = equal
content). Requests keep file order. Every problem in a file is a ValueError naming the line and the fix.
A trace comes from a path, `-` (standard input) or a binary stream (see sources.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks import ceil_div
from ..errors import ParameterError
from ..units import format_int_short, plural
from .sources import InputSource, decode_text, read_source
from .trace_formats import MOONCAKE_BLOCK_TOKENS, read_azure, read_mooncake

TRACE_KINDS = ("azure", "mooncake")
_EXPECTED = {
    "azure": "an Azure trace: a CSV with the columns TIMESTAMP, ContextTokens, GeneratedTokens",
    "mooncake": "a Mooncake trace: JSON lines with timestamp, input_length, output_length, hash_ids",
}


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
        return f"real trace: {self.kind} {self.path} ({plural(len(self), 'request')})"

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
        raise ParameterError(
            f"block_size {format_int_short(block_size)} does not divide {MOONCAKE_BLOCK_TOKENS}, the tokens of one "
            "Mooncake hash id: use a divisor such as 8, 16, 32 or 64", "block_size"
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


def read_trace(kind: str, source: InputSource) -> Trace:
    """Read a trace of `kind` ('azure' or 'mooncake') from a path, `-` (standard input) or a binary stream."""
    kind = kind.strip().lower()
    if kind not in TRACE_KINDS:
        raise ValueError(f"unknown trace kind {kind!r}: choose one of {', '.join(TRACE_KINDS)}")
    expected = _EXPECTED[kind]
    name, data = read_source(source, expected)
    text = decode_text(data, name, expected)
    columns = read_azure(text, name) if kind == "azure" else read_mooncake(text, name)
    trace = Trace(kind, name, *columns)
    if len(trace) == 0:
        raise ValueError(f"the {kind} trace {name} holds no requests: give a file with at least one request")
    return trace
