"""KV bytes of the pool's blocks for a model: block counts of a sharing run in bytes, and a memory budget in
blocks.

A pool block holds `block_size` token positions of every layer that keeps KV (equation 1 for one token, times
the block size, rounded up to whole bytes once). The pool keeps every block of a sequence in every layer, so
for a model with windowed or chunked layers — which need only the blocks of their last W tokens — the byte
figures are an upper bound once a sequence outgrows the window (`upper_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ParameterError
from ..model.kv_groups import DEFAULT_LAYOUT, KVLayout, kv_layout
from ..model.models import ModelSpec
from ..model.sizing import bits_to_bytes
from ..pool.groups import PoolGroup, check_state_mode_given, pool_groups
from ..units import format_bytes, memory_flag_at_least


def block_bytes(spec: ModelSpec, dtype_bits: int, block_size: int) -> int:
    """KV bytes of one pool block of `block_size` tokens (every KV layer holds all of them)."""
    if block_size < 1:
        raise ParameterError(f"block_size {block_size} must be a positive number of tokens", "block_size")
    return bits_to_bytes(spec.kv_bits(1, dtype_bits) * block_size)


def blocks_in_memory(memory_bytes: int, bytes_per_block: int, least_blocks: int = 1, needed_by: str = "") -> int:
    """Whole blocks of `bytes_per_block` in `memory_bytes`; refused when fewer than `least_blocks` (what
    `needed_by`, e.g. the largest request of a trace, needs)."""
    blocks = memory_bytes // bytes_per_block
    if blocks < least_blocks:
        held = f"holds no block of {format_bytes(bytes_per_block)}" if not blocks else (
            f"holds {blocks:,} blocks of {format_bytes(bytes_per_block)}, fewer than the {least_blocks:,} {needed_by}")
        raise ParameterError(
            f"memory_bytes {format_bytes(memory_bytes)} {held}: give at least "
            f"{memory_flag_at_least(least_blocks * bytes_per_block)}", "memory_bytes",
        )
    return blocks


def bytes_upper_bound(spec: ModelSpec, dtype_bits: int, longest_tokens: int) -> bool:
    """True when some layer keeps fewer than all `longest_tokens` tokens of the longest sequence (a window or
    chunk), which the pool does not model: it holds every layer for every block."""
    return spec.kv_bits(longest_tokens, dtype_bits) < spec.kv_bits(1, dtype_bits) * longest_tokens


@dataclass(frozen=True)
class PoolBytes:
    """A model's KV bytes per pool block, and the byte figures of block counts."""

    model: str
    dtype: str
    block_size: int
    bytes_per_block: int
    upper_bound: bool  # a sequence outgrows a window or chunk of the model: every byte figure is an upper bound

    def of_blocks(self, blocks: int) -> int:
        return blocks * self.bytes_per_block


def pool_bytes(spec: ModelSpec, dtype: str, dtype_bits: int, block_size: int, longest_tokens: int,
               layout: KVLayout | None = None) -> PoolBytes:
    """Bytes per block of `spec` at `dtype` (`dtype_bits` per scalar), for sequences up to `longest_tokens`.
    With a hybrid `layout` (a pool of its KV cache groups) a block is one page in every layer slot of a group,
    exact: each group holds only what its layers read."""
    if layout is not None:
        return PoolBytes(spec.name, dtype, layout.block_size, layout.page_bytes, False)
    return PoolBytes(spec.name, dtype, block_size, block_bytes(spec, dtype_bits, block_size),
                     bytes_upper_bound(spec, dtype_bits, longest_tokens))


def model_groups(spec: ModelSpec | None, dtype_bits: int, block_size: int, layout: str | None,
                 mamba_cache_mode: str | None) -> tuple[KVLayout | None, tuple[PoolGroup, ...] | None]:
    """(the model's KV cache layout, its pool groups): groups None for one group of full attention (a plain
    pool) or no model. `mamba_cache_mode` given for a model without recurrent layers is refused."""
    if spec is None:
        return None, None
    if mamba_cache_mode is not None and not spec.has_state:
        raise ParameterError(f"mamba_cache_mode {mamba_cache_mode} applies to a model with recurrent layers; "
                             f"{spec.name} has none: drop it", "mamba_cache_mode")
    mode = "none" if mamba_cache_mode is None else mamba_cache_mode.strip().lower()
    check_state_mode_given(mode)
    found = kv_layout(spec, dtype_bits, block_size, DEFAULT_LAYOUT if layout is None else layout.strip().lower(), 1,
                      mode)
    return found, pool_groups(found, weighted=True)


def units_phrase(layout: KVLayout, doc: dict) -> str:
    """How the ideal layout's types take units, for a note under `group_doc`'s table `doc`."""
    if all(row["block_tables"] == g.pages_per_block for row, g in zip(doc["groups"], layout.groups, strict=True)):
        return "a type's block of B tokens takes 'block tables' units"
    each = ", ".join(f"{g.kind} {g.pages_per_block:,}" for g in layout.groups)
    return (f"a type's block of B tokens costs its bytes / the unit in units ({each}), one table of such blocks a "
            "type (weighted tables; physical blocks count units)")


def group_doc(layout: KVLayout, group_blocks: tuple[int, ...], bytes_per_block: int) -> dict:
    """Each layer type's block tables, physical blocks and bytes (`group_blocks`: per pool group, in the order
    pool_groups makes them: each type's tables one after another). Physical blocks are units of `bytes_per_block`
    (layout.page_bytes): a weighted table's blocks (pool_groups(weighted=True): one table per type, its block
    `pages_per_block` units, core/pool/weighted.py) count their units, as the same type's unit tables would."""
    rows, at = [], 0
    weighted = len(group_blocks) == len(layout.groups) != sum(g.pages_per_block for g in layout.groups)
    for g in layout.groups:
        tables = 1 if weighted else g.pages_per_block
        blocks = sum(group_blocks[at : at + tables]) * (g.pages_per_block if weighted else 1)
        at += tables
        name = g.kind if g.window is None else f"{g.kind} {g.window:,}"
        rows.append({"group": f"{name} ({g.layers} {g.source} layers)", "kind": g.kind, "window": g.window,
                     "layers": g.layers, "block_tables": tables, "physical_blocks": blocks,
                     "physical_bytes": blocks * bytes_per_block})
    return {"layout": layout.layout, "block_size": layout.block_size, "reason": layout.reason,
            "mamba_cache_mode": layout.mamba_cache_mode, "block_bytes": bytes_per_block, "groups": rows}
