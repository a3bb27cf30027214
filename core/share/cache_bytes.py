"""Bytes of one cached prefix block, per KV cache group of the model (the per-group pool's view).

A cached block of B tokens holds, in every attention group, that group's block of those B tokens: full
attention for every prefix; sliding-window and chunked groups too, because vLLM frees a block that falls
out of the window with its hash and it stays cached (LRU) until evicted — so a windowed group costs cache
bytes like a full one (an engine that dropped them would hold less: the figures are then an upper bound).
A Mamba / linear-attention hybrid can resume only from a recurrent state saved at exactly the hit's
boundary: to hit at every block boundary, as the curve assumes, each cached block carries one saved state
per state group (vLLM's mamba_cache_mode "align"/"all"); `state_bytes` is that cost. With mode "none" a
hybrid caches no prefix at all, which is refused rather than answered with attention bytes alone.
Groups are core.model.kv_groups' layout, per GPU of `tp`: ``vllm`` (the default, the one memory plan's) pages
each group in block ids of G layer slots, so a cached block costs its padded bytes (Gemma-3-27B at block 16:
10 full layers + 52 sliding layers in 6 tables of 10 slots = 70 pages of 128 KiB, 8.75 MiB, where its 62 real
layers hold 7.75 MiB); a Mamba hybrid whose state forces a larger block is refused at any other block size.
``ideal`` is kvcalc's own pool: each layer type on its own, no padding, the block size as given.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ParameterError
from ..model.kv_groups import kv_layout
from ..model.model_spec import ModelSpec


@dataclass(frozen=True)
class GroupBytes:
    label: str  # "full", "sliding_4096", "chunked_8192", "state_mamba2", ...
    layers: int
    bytes_per_block: int


@dataclass(frozen=True)
class CachedBlockBytes:
    """Bytes of one cached block of `block_size` tokens, split by KV cache group."""

    model: str
    dtype: str
    block_size: int
    tp: int
    groups: tuple[GroupBytes, ...]
    layout: str = "ideal"
    padding_bytes: int = 0  # of bytes_per_block: padding layer slots and padded state pages (vllm layout)

    @property
    def bytes_per_block(self) -> int:
        return sum(g.bytes_per_block for g in self.groups)

    @property
    def state_bytes(self) -> int:
        return sum(g.bytes_per_block for g in self.groups if g.label.startswith("state_"))

    def split(self, blocks: int) -> dict[str, int]:
        """Bytes of `blocks` cached blocks, per group label."""
        return {g.label: blocks * g.bytes_per_block for g in self.groups}


def cached_block_bytes(spec: ModelSpec, dtype: str, dtype_bits: int, block_size: int, tp: int = 1,
                       mamba_cache_mode: str = "align", layout_name: str = "ideal") -> CachedBlockBytes:
    """The bytes of one cached prefix block of `spec` under `layout_name` (module docstring)."""
    layout = kv_layout(spec, dtype_bits, block_size, layout_name, tp, mamba_cache_mode)
    if layout.block_size != block_size:
        raise ParameterError(
            f"{{layout}} vllm pages {spec.name} at block {layout.block_size:,}, not {block_size:,} ({layout.reason}): "
            f"give {{block_size}} {layout.block_size}, or {{layout}} ideal for kvcalc's own pool at block "
            f"{block_size:,}",
            "block_size", "layout")
    groups = []
    for g in layout.groups:
        if g.is_state:
            if mamba_cache_mode == "none":
                raise ParameterError(
                    f"mamba_cache_mode 'none': {spec.name} has recurrent-state layers, and without saved states it "
                    "caches no prefix: use align or all", "mamba_cache_mode")
            label = f"state_{g.source}"
        else:
            label = g.kind if g.window is None else f"{g.kind}_{g.window}"
        groups.append(GroupBytes(label, g.layers, g.block_bytes))
    padding = sum(g.padding_bytes_per_block for g in layout.groups)
    return CachedBlockBytes(spec.name, dtype, block_size, tp, tuple(groups), layout.layout, padding)


def vllm_cache_groups(spec: ModelSpec, dtype_bits: int, block_size: int, tp: int = 1,
                      mamba_cache_mode: str = "align") -> int:
    """vLLM's KV cache group count for `spec` (its block tables: core.model.kv_groups' ``vllm`` layout).

    It matters to host offloading: vLLM #56871 (open) reports that the native offloading connector stores
    every (block hash, group) key as a row holding all groups, so its host capacity is divided by this count.
    """
    return kv_layout(spec, dtype_bits, block_size, "vllm", tp, mamba_cache_mode).num_tables
