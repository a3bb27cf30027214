"""The computation behind `kvcalc frag`: fixed reservation vs paging for one set of lengths, in one result;
with speculative decoding, paging at every sequence's speculative peak as well (core/spec_decode.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from . import paged_bytes, paging
from .errors import ParameterError
from .host_memory import check_fits
from .model.kv_groups import KVLayout, kv_layout
from .model.layers import bits_to_bytes
from .model.models import ModelSpec
from .spec_decode import Speculation
from .units import format_count_short

DEFAULT_BLOCK_SIZES = (16, 32)  # vLLM's default block size and the next one, as in the worked example
# Per-sequence rows leave as Python ints, dicts, table rows and JSON text: about 140 bytes per value with
# --json (measured with tracemalloc over 10^5 rows, records + table + JSON text), besides their int64 columns.
_ROW_OUTPUT_BYTES_PER_VALUE = 150


@dataclass(frozen=True)
class ModelBytes:
    """The same comparison in bytes for `spec` at `dtype_bits` per scalar, group by group under `layout`
    ("vllm" or "ideal"); `layouts` and `paged` align with the token results (one per block size asked for)."""

    spec: ModelSpec
    dtype_bits: int
    fixed: paged_bytes.KvBytes
    paged: list[paged_bytes.KvBytes]
    layouts: list[KVLayout]

    @property
    def layout(self) -> str:
        return self.layouts[0].layout

    @property
    def kv_cache_groups(self) -> int:
        """Block tables per sequence at the first block size."""
        return self.layouts[0].num_tables

    @property
    def has_state(self) -> bool:
        return any(g.is_state for g in self.layouts[0].groups)

    @property
    def state_bytes_per_seq(self) -> int:
        """One sequence's recurrent state in every layer (0 without recurrent layers)."""
        return bits_to_bytes(self.spec.state_bits())

    @property
    def best(self) -> BestBlock:
        """The block size that holds the fewest bytes (KV, state and exact block tables); under the vllm
        layout among the sizes vLLM accepts; ties go to the smaller block size used, then asked for."""
        candidates = [kv for kv in self.paged if kv.engine_accepts] or self.paged
        kv = min(candidates, key=lambda k: (k.held_bytes, k.used_block_size, k.block_size))
        assert kv.block_size is not None and kv.used_block_size is not None
        return BestBlock(kv.block_size, kv.used_block_size, kv.held_bytes,
                         tuple(k.block_size for k in candidates if k.block_size is not None))


@dataclass(frozen=True)
class BestBlock:
    """The answer to "which block size is best?" for bytes held (KV + state + exact block tables)."""

    block_size: int  # as asked for
    used_block_size: int  # as the layout pages it
    held_bytes: int
    candidates: tuple[int, ...]  # the block sizes it was chosen among


@dataclass(frozen=True)
class SpeculativePeak:
    """One block size: paging as it is (`plain`) and with every sequence at its speculative peak (`peak`:
    Σ ceil((n + K + λ) / B) blocks; its useful tokens are still Σ n); in bytes when a model is given."""

    plain: paging.PagedAllocation
    peak: paging.PagedAllocation
    plain_bytes: paged_bytes.KvBytes | None = None
    peak_bytes: paged_bytes.KvBytes | None = None

    @property
    def block_size(self) -> int:
        return self.peak.block_size

    @property
    def extra_blocks(self) -> int:
        return self.peak.num_blocks - self.plain.num_blocks

    @property
    def extra_fraction(self) -> Fraction:
        """Extra blocks over the plain ones."""
        return Fraction(self.extra_blocks, self.plain.num_blocks)

    @property
    def concurrency(self) -> Fraction:
        """The share of these sequences that a pool holding them without speculation holds at their peaks."""
        return Fraction(self.plain.num_blocks, self.peak.num_blocks)

    @property
    def extra_kv_bytes(self) -> int | None:
        """Extra bytes held at the peak: KV and state pages allocated (block tables aside)."""
        if self.plain_bytes is None or self.peak_bytes is None:
            return None
        return (self.peak_bytes.allocated_kv_bytes + self.peak_bytes.allocated_state_bytes
                - self.plain_bytes.allocated_kv_bytes - self.plain_bytes.allocated_state_bytes)


@dataclass(frozen=True, eq=False)
class SpeculativePeaks:
    """Paging at every sequence's speculative peak, one `SpeculativePeak` per block size (ascending)."""

    speculation: Speculation
    block_sizes: list[SpeculativePeak]


@dataclass(frozen=True, eq=False)
class FragAnalysis:
    """Fixed reservation to `fixed.max_len` vs paging with each block size (ascending)."""

    fixed: paging.FixedReservation
    paged: list[paging.PagedAllocation]
    per_sequence: paging.PerSequence | None = None
    model_bytes: ModelBytes | None = None
    speculative: SpeculativePeaks | None = None

    @property
    def block_sizes(self) -> list[int]:
        return [p.block_size for p in self.paged]


def block_sizes_for(blocks: list[int] | None, sweep: bool) -> list[int]:
    """The union of the given block sizes and (with `sweep`) 1, 2, 4 … 256 (which hold every size vLLM's
    block_size accepts: 1, 8, 16 … 256); 16 and 32 when neither is given."""
    sizes = sorted(set(blocks or ()) | set(paging.SWEEP_BLOCK_SIZES if sweep else ()))
    sizes = sizes or list(DEFAULT_BLOCK_SIZES)
    paging.check_block_sizes(sizes)
    return sizes


def memory_needed(num_lengths: int, num_block_sizes: int, per_sequence: bool, lengths_held: bool) -> int:
    """Bytes `analyse` holds at its peak beyond the lengths (which add 8 a length unless `lengths_held`):
    with per-sequence rows, 2 + 2 per block size int64 columns and their output; otherwise only a pass's
    scratch, which is small enough to leave out."""
    lengths = 0 if lengths_held else 8 * num_lengths
    if not per_sequence:
        return lengths
    columns = 3 + 2 * num_block_sizes  # the row number, n, M − n, then A_B(n) and W_B(n) per block size
    return lengths + num_lengths * columns * (8 + _ROW_OUTPUT_BYTES_PER_VALUE)


def check_memory(num_lengths: int, num_block_sizes: int, per_sequence: bool, lengths_held: bool) -> None:
    """Refuse, before any allocation, an analysis that would not fit in the memory available (the fix
    names `per_sequence`, or `count`: the sample size of `load_lengths`)."""
    rows = " with per-sequence rows" if per_sequence else " (8 bytes each)"
    what = f"{format_count_short(num_lengths)} lengths{rows}"
    needed = memory_needed(num_lengths, num_block_sizes, per_sequence, lengths_held)
    if per_sequence:
        check_fits(needed, what, "drop per_sequence or give fewer lengths", "per_sequence")
    else:
        check_fits(needed, what, "lower count", "count")


def analyse(
    tokens: np.ndarray,
    block_sizes: list[int],
    max_len: int | None = None,
    per_sequence: bool = False,
    spec: ModelSpec | None = None,
    dtype_bits: int = 16,
    progress: Callable[[int], None] | None = None,
    speculation: Speculation | None = None,
    layout: str = "vllm",
    mamba_cache_mode: str = "none",
) -> FragAnalysis:
    """Equations 2–3 for the lengths `tokens` int64 [N]; `max_len` defaults to the next power of two (of the
    longest speculative peak with `speculation`: M must hold it). `progress(n)`: n more lengths through a
    paging pass (the ones that grow with the block sizes; two with `speculation`). With `spec`, bytes group by
    group under `layout` (core/model/kv_groups.py), recurrent states paged by `mamba_cache_mode`."""
    if speculation is not None:
        max_len = _check_speculative_room(tokens, speculation, max_len)
    if max_len is None:
        max_len = paging.default_max_len(int(tokens.max()))
    if per_sequence:
        check_memory(int(tokens.size), len(block_sizes), per_sequence, lengths_held=True)
    fixed, paged = paging.fixed_and_paged(tokens, block_sizes, max_len, progress)
    rows = paging.per_sequence(tokens, block_sizes, max_len) if per_sequence else None
    model_bytes = None
    layouts: list[KVLayout] = []
    sums: paged_bytes.Sums = {}  # passes over the lengths that groups and block sizes share
    if spec is not None:
        layouts = [kv_layout(spec, dtype_bits, p.block_size, layout, mamba_cache_mode=mamba_cache_mode)
                   for p in paged]
        kv = [paged_bytes.paged_kv_bytes(tokens, lay, max_len, sums=sums) for lay in layouts]
        model_bytes = ModelBytes(spec, dtype_bits, paged_bytes.fixed_kv_bytes(layouts[0], fixed, kv[0]), kv, layouts)
    speculative = None
    if speculation is not None:
        counts = peak_block_counts(tokens, block_sizes, speculation.extra_slots, progress)
        peaks = [paging.PagedAllocation(p.block_size, p.num_seqs, max_len, p.useful_tokens, n)
                 for p, n in zip(paged, counts, strict=True)]
        plain_bytes = [None] * len(peaks) if model_bytes is None else model_bytes.paged
        peak_bytes = [_speculative_states(paged_bytes.paged_kv_bytes(tokens, lay, max_len, speculation.extra_slots,
                                                                     sums), lay, speculation.spec_tokens)
                      for lay in layouts] if layouts else [None] * len(peaks)
        speculative = SpeculativePeaks(speculation, [
            SpeculativePeak(p, q, kv, peak)
            for p, q, kv, peak in zip(paged, peaks, plain_bytes, peak_bytes, strict=True)
        ])
    return FragAnalysis(fixed, paged, rows, model_bytes, speculative)


def _speculative_states(kv: paged_bytes.KvBytes, layout: KVLayout, spec_tokens: int) -> paged_bytes.KvBytes:
    """At a speculative peak vLLM keeps K more state pages a sequence in each state group, the state after each
    draft position (MambaSpec.num_speculative_blocks = K): mamba_cache_mode none holds 1 + K pages where it held
    one. (align's 2 + K and all's page per block are left as the pool holds them.)"""
    if layout.mamba_cache_mode != "none" or not kv.allocated_state_bytes:
        return kv
    return replace(kv, allocated_state_bytes=kv.allocated_state_bytes * (1 + spec_tokens))


def _check_speculative_room(tokens: np.ndarray, speculation: Speculation, max_len: int | None) -> int | None:
    """The max_len to use: a fixed reservation (and the dense block table, ceil(M/B) entries) must hold the
    longest sequence's peak n + K + λ; a given max_len that cannot is refused, naming both."""
    if tokens.size == 0:
        return max_len  # paging refuses empty input, with its own message
    longest, extra = int(tokens.max()), speculation.extra_slots
    peak = longest + extra
    slots = f"{speculation.spec_tokens} drafts + {speculation.lookahead_slots} lookahead"
    if peak > paging.MAX_LENGTH:
        raise ParameterError(
            f"spec_tokens {format_count_short(speculation.spec_tokens)} is too many: the longest sequence's peak, "
            f"{longest} tokens + {format_count_short(extra)} slots, passes 2^62", "spec_tokens",
        )
    if max_len is None:
        return paging.default_max_len(peak)
    if peak > max_len:
        raise ParameterError(
            f"max_len {max_len} cannot hold the speculative peak of the longest sequence: {longest} tokens + "
            f"{extra} slots ({slots}) = {peak}; raise max_len to at least {peak}, leave it out, or lower "
            "spec_tokens", "max_len", "spec_tokens",
        )
    return max_len


def peak_block_counts(
    tokens: np.ndarray, block_sizes: list[int], extra_slots: int, progress: Callable[[int], None] | None = None
) -> list[int]:
    """Σ ceil((n + extra_slots) / B) for each block size, exact, over chunks of the lengths (not copied)."""
    counts = [0] * len(block_sizes)
    size = min(tokens.size, paging.PASS_CHUNK)
    shifted, scratch = np.empty(size, dtype=np.int64), np.empty(size, dtype=np.int64)
    bound = int(tokens.max()) + extra_slots if tokens.size else 0  # bounds every block count too
    for start in range(0, tokens.size, paging.PASS_CHUNK):
        chunk = tokens[start : start + paging.PASS_CHUNK]
        ends = np.add(chunk, extra_slots, out=shifted[: chunk.size])
        for i, b in enumerate(block_sizes):
            counts[i] += paging.exact_sum(paging.ceil_div_array(ends, b, out=scratch[: chunk.size]), bound)
        if progress is not None:
            progress(chunk.size)
    return counts
