"""What a `kvcalc bench` run holds in memory at once, and the memory there is: a run that cannot fit is
refused before its first allocation (a context of 10^9 tokens would otherwise start by asking for 2 TB).

The peak of one timed shape (batch B, context T, block size b; nb = ceil(T / b) blocks per sequence, capacity
C = nb · b, E bytes per element, Hq/Hk query/KV heads of dimension D), term by term:

    inputs (make_inputs)   K and V caches  2 · (B · nb + 1) · b · Hk · D · E
                           contiguous K, V 2 · B · C · Hk · D · E
                           q, out, the expected output 3 · B · Hq · D · E; block tables 4 · B · nb; seq_lens 4 · B
    building K/V           the gather's int64 indices 3 · B · C · 8 (host) and one gathered copy B · C · Hk · D · E
    cpu (the reference)    K and V gathered again 2 · B · C · Hk · D · E, their float32 copies 2 · B · C · Hk · D · 4
                           and the permuted copy einsum makes of one of them B · C · Hk · D · 4, and at most three
                           [B, Hq, C] float32 score tensors alive together 3 · B · Hq · C · 4
    cuda (the kernel)      split-KV partials B · Hq · splits · (D + 1) · 4, and the timer's 256 MiB L2 flush
                           buffer, held while timing

The sum is an estimate of the peak: on CPU it lies within about 25 % of the peak resident memory measured
for a run (a test checks it), so a refused run would not have fitted either. Left out: the correctness grid
(lengths up to 700, a few MiB), the copy ceiling (2 x 2 GiB, measured and freed before the shapes) and the
optional comparators (SDPA, FlexAttention), whose failure is recorded in their row, not fatal.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.blocks import ceil_div
from ..core.errors import ParameterError
from ..core.host_memory import available_bytes
from ..core.units import format_bytes, format_count_short
from .bench import SWEEP_BLOCK_SIZES, SWEEP_SHAPE, BenchConfig
from .ops import choose_num_splits
from .timing import L2_FLUSH_BYTES

INDEX_BYTES = 8  # the gather's positions, physical block ids and slots are int64


@dataclass(frozen=True)
class ShapeBytes:
    """Peak bytes of one timed shape: on the device that runs it, and on the host beside it (the gather's
    indices are built on the host even for cuda); `input_bytes`, the tensors of make_inputs plus out and the
    expected output, is part of the first (of the second on cpu)."""

    device_bytes: int
    host_bytes: int
    input_bytes: int


def shape_bytes(batch: int, context: int, block_size: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                device: str, num_splits: int = 1, elem_bytes: int = 2) -> ShapeBytes:
    """The module docstring's sum for one shape; `device` "cpu" puts every term on the host."""
    num_blocks = ceil_div(context, block_size)  # in integers: a context of 1e400 tokens overflows a float
    capacity = num_blocks * block_size
    token_bytes = num_kv_heads * head_dim * elem_bytes  # one token of K (or of V)
    caches = 2 * (batch * num_blocks + 1) * block_size * token_bytes
    contiguous = 2 * batch * capacity * token_bytes
    small = 3 * batch * num_q_heads * head_dim * elem_bytes + 4 * batch * num_blocks + 4 * batch
    gathered = batch * capacity * token_bytes
    indices = 3 * batch * capacity * INDEX_BYTES
    inputs = caches + contiguous + small
    if device == "cpu":
        reference = (2 * batch * capacity * token_bytes + 3 * batch * capacity * num_kv_heads * head_dim * 4
                     + 3 * batch * num_q_heads * capacity * 4)
        return ShapeBytes(0, inputs + gathered + indices + reference, inputs)
    partials = batch * num_q_heads * num_splits * (head_dim + 1) * 4 if num_splits > 1 else 0
    return ShapeBytes(inputs + gathered + partials, indices, inputs)


def check_run_fits(config: BenchConfig, device_available: tuple[int, str] | None = None,
                   sm_count: int | None = None) -> None:
    """Raises a ParameterError naming batch and context for the first timed shape that does not fit.

    The host's memory is read here; `device_available` (free bytes and where the figure comes from) and
    `sm_count` (for the split-KV heuristic) describe the GPU of a cuda run.
    """
    host_bytes = available_bytes()
    host_available = None if host_bytes is None else (host_bytes, "MemAvailable of the host")
    shapes = [(batch, context, config.block_size) for batch, context in config.shapes]
    if config.sweep_block:
        shapes += [(*SWEEP_SHAPE[config.device], block_size) for block_size in SWEEP_BLOCK_SIZES]
    for batch, context, block_size in shapes:
        capacity = ceil_div(context, block_size) * block_size  # the kernel's max_len: the table's capacity
        splits = config.num_splits or (choose_num_splits(batch, config.num_kv_heads, capacity, sm_count)
                                       if sm_count else 1)
        need = shape_bytes(batch, context, block_size, config.num_q_heads, config.num_kv_heads, config.head_dim,
                           config.device, splits)
        _check("host", need.host_bytes, host_available, batch, context, block_size)
        if config.device == "cuda":
            _check("GPU", need.device_bytes + L2_FLUSH_BYTES, device_available, batch, context, block_size)


def _check(label: str, need_bytes: int, available: tuple[int, str] | None, batch: int, context: int,
           block_size: int) -> None:
    if available is None or need_bytes <= available[0]:
        return
    have, source = available
    raise ParameterError(
        f"batch {format_count_short(batch)} and context {format_count_short(context)} (block size {block_size}) "
        f"need {format_bytes(need_bytes)} of {label} memory at once ({format_count_short(need_bytes)} bytes: K/V "
        f"caches, their contiguous copy and working set), but {format_bytes(have)} is available ({source}): "
        "lower batch or context",
        "batch", "context")
