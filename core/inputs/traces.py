"""Readers for real request traces (Azure LLM inference 2023, Mooncake FAST'25).

Both become one `Trace`: arrival times in seconds from the first request, prompt and output lengths,
and — for Mooncake — the prefix-block ids (`hash_ids`, one per 512-token block; equal ids = equal
content). Requests keep file order. Every problem in a file is a ValueError naming the line and the fix.
A trace comes from a path, `-` (standard input) or a binary stream (see sources.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..blocks import ceil_div
from ..errors import ParameterError
from .sources import InputSource
from .trace_formats import TraceColumns, mooncake_columns, read_azure, read_mooncake
from .trace_text import (
    MOONCAKE_BLOCK_TOKENS,
    MooncakeLines,
    mooncake_block_size_error,
    mooncake_blocks_per_id,
    mooncake_ids_per_block,
    read_trace_text,
    trace_description,
)


class RequestArrays:
    """What traces and simulation workloads share: N requests as parallel arrays, and for Mooncake the
    prefix-block ids of each request (flat `hash_ids`, request i's are hash_ids[hash_offsets[i]:hash_offsets[i+1]]).
    Subclasses are dataclasses with the fields `prompt_tokens`, `hash_ids` and `hash_offsets` and a
    `description` (a field or a property)."""

    prompt_tokens: np.ndarray
    hash_ids: np.ndarray | None
    hash_offsets: np.ndarray | None
    if TYPE_CHECKING:  # each subclass's own field or property (see above)

        @property
        def description(self) -> str: ...

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
        return trace_description(self.kind, self.path, len(self))

    def head(self, limit: int) -> Trace:
        """The first `limit` requests (all of them when limit >= N)."""
        if limit <= 0:
            raise ParameterError(f"limit must be a positive number of requests, got {limit}", "limit")
        n = min(limit, len(self))
        ids, offsets = self.hash_ids, self.hash_offsets
        if ids is not None and offsets is not None:
            ids, offsets = ids[: offsets[n]], offsets[: n + 1]
        return Trace(
            self.kind, self.path, self.arrival_s[:n], self.prompt_tokens[:n], self.output_tokens[:n], ids, offsets
        )


def check_mooncake_block_size(block_size: int) -> None:
    """Mooncake's content keys exist per 512-token hash id: a block must tile one id or cover whole ids."""
    message = mooncake_block_size_error(block_size)
    if message:
        raise ParameterError(message, "block_size")


def first_unchained_id(hash_ids: np.ndarray, hash_offsets: np.ndarray) -> tuple[int, int] | None:
    """None when the ids are prefix-chained — every id has one predecessor (the id before it in its request,
    or none at position 0) wherever it occurs, so by induction equal ids at a position imply equal ids at
    every position before it, i.e. equal whole prefixes; else (request index, position) of a first id seen
    after two different predecessors. Vectorised: a table of one predecessor per id, when the ids span a range
    of at most a few times their number (O(ids)); to name the first clash, or for sparse ids, sorted pairs."""
    ids = hash_ids[hash_offsets[0] : hash_offsets[-1]]
    if not len(ids):
        return None
    lengths = np.diff(hash_offsets)
    low, high = int(ids.min()), int(ids.max())
    before = np.empty_like(ids)  # predecessor; position 0 gets a value below every id (no predecessor)
    before[1:] = ids[:-1]
    before[hash_offsets[:-1][lengths > 0] - hash_offsets[0]] = low - 1
    if high - low < 4 * len(ids) + (1 << 20):  # NOTE: O(ids), no sort (~30x faster): one predecessor per id
        seen = np.empty(high - low + 1, dtype=ids.dtype)  # per id, one of its predecessors (whichever write lands)
        seen[ids - low] = before
        if np.array_equal(seen[ids - low], before):
            return None
    order = np.lexsort((before, ids))
    a, b = ids[order], before[order]
    clash = np.flatnonzero((a[1:] == a[:-1]) & (b[1:] != b[:-1]))
    if not len(clash):
        return None
    k = int(order[clash[0] + 1]) + int(hash_offsets[0])
    r = int(np.searchsorted(hash_offsets, k, side="right")) - 1
    return r, k - int(hash_offsets[r])


def check_mooncake_chaining(hash_ids: np.ndarray, hash_offsets: np.ndarray, block_size: int, where: str) -> None:
    """A block of B = 512·m tokens (m > 1) is keyed by the id of its last 512-token block: exact only when the
    ids are prefix-chained (first_unchained_id), which is checked here; a block dividing 512 needs no check
    (its key chain holds every id)."""
    if mooncake_ids_per_block(block_size) == 1:
        return
    bad = first_unchained_id(hash_ids, hash_offsets)
    if bad is not None:
        r, j = bad
        raise ParameterError(
            f"{where}request {r + 1}'s hash id {int(hash_ids[hash_offsets[r] + j]):,} at position {j} follows "
            f"different ids in different requests (not prefix-chained), so a block_size {block_size:,} key "
            f"(the id of its last 512-token block) would not be exact: use a block_size that divides "
            f"{MOONCAKE_BLOCK_TOKENS}", "block_size")


def mooncake_block_keys(hash_ids: np.ndarray, prompt_tokens: int, block_size: int, where: str = "") -> np.ndarray:
    """int64 [prompt_tokens // block_size]: the content key of every full prompt block of one request.

    One Mooncake hash id covers 512 tokens (equal ids = equal content, prefix-chained). With block size B
    dividing 512, full block j has the key (hash_ids[j // S], j % S), S = 512 / B, encoded exactly as the
    integer hash_id · S + j % S. With B = 512·m (m > 1), full block j covers the whole ids m·j .. m·j + m - 1
    and its key is the last of them, hash_ids[m·j + m - 1]: exact because prefix-chained ids make an equal
    last id mean equal ids before it (check_mooncake_chaining verifies that of a trace). A block past the
    last id's coverage is an error in the trace.
    """
    check_mooncake_block_size(block_size)
    per_id, m = mooncake_blocks_per_id(block_size), mooncake_ids_per_block(block_size)
    full = prompt_tokens // block_size
    if full and ((full - 1) // per_id + 1) * m > len(hash_ids):
        raise ValueError(
            f"{where}{prompt_tokens} prompt tokens need {ceil_div(prompt_tokens, MOONCAKE_BLOCK_TOKENS)} hash_ids "
            f"(one per {MOONCAKE_BLOCK_TOKENS} tokens), the request has {len(hash_ids)}"
        )
    j = np.arange(full, dtype=np.int64)
    return hash_ids[(j // per_id) * m + m - 1] * per_id + j % per_id


def coarse_hash_ids(hash_ids: np.ndarray, hash_offsets: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, offsets): per request, one id per whole block of B = 512·m tokens — the id of its last 512-token
    block (see mooncake_block_keys) — floor(len / m) of them; the ids themselves when B divides 512."""
    m = mooncake_ids_per_block(block_size)
    if m == 1:
        return hash_ids, hash_offsets
    counts = np.diff(hash_offsets) // m
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], counts)
    return hash_ids[np.repeat(hash_offsets[:-1], counts) + within * m + m - 1], offsets


def read_trace(kind: str, source: InputSource) -> Trace:
    """Read a trace of `kind` ('azure' or 'mooncake') from a path, `-` (standard input) or a binary stream."""
    kind, name, text = read_trace_text(kind, source)
    return trace_of(kind, name, read_azure(text, name) if kind == "azure" else read_mooncake(text, name))


def trace_of(kind: str, name: str, columns: TraceColumns | MooncakeLines) -> Trace:
    """The `Trace` of parsed columns (a Mooncake file's lists are made arrays); one with no request is an error."""
    if isinstance(columns, MooncakeLines):
        columns = mooncake_columns(columns)
    trace = Trace(kind, name, *columns)
    if len(trace) == 0:
        raise ValueError(f"the {kind} trace {name} holds no requests: give a file with at least one request")
    return trace
