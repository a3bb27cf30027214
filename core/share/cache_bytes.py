"""Bytes of one cached prefix block, per KV cache group of the model (the per-group pool's view).

A cached block of B tokens holds, in every attention group, that group's block of those B tokens: full
attention for every prefix; sliding-window and chunked groups too, because vLLM frees a block that falls
out of the window with its hash and it stays cached (LRU) until evicted — so a windowed group costs cache
bytes like a full one (an engine that dropped them would hold less: the figures are then an upper bound). A hit
reads back less: only the blocks each group needs (CachedBlockBytes.read_bytes, vLLM's null entries skipped).
A Mamba / linear-attention hybrid can resume only from a recurrent state saved at exactly the hit's
boundary: to hit at every block boundary, as the curve assumes, each cached block carries one saved state
per state group (vLLM's mamba_cache_mode "align"/"all"); `state_bytes` is that cost. With mode "none" a
hybrid caches no prefix at all, which is refused rather than answered with attention bytes alone.
Groups are core.model.kv_groups' layout, per GPU of `tp`: ``vllm`` (the default, the one memory plan's) pages
each group in block ids of G layer slots, so a cached block costs its padded bytes (Gemma-3-27B at block 16:
10 full layers + 52 sliding layers in 6 tables of 10 slots = 70 pages of 128 KiB, 8.75 MiB, where its 62 real
layers hold 7.75 MiB); a Mamba hybrid whose state forces a larger block is refused at any other block size.
``ideal`` is kvcalc's own pool: each layer type on its own, no padding, the block size as given.
A GPU pool given in bytes (share's --capacity in bytes, the --gpu-cache tier) is counted as the layout pages it:
under ``vllm`` in block ids of `page_bytes`, of which vLLM's null block (block 0) is never handed out, so
floor(bytes / page) − 1 ids hold (ids − 1) // tables cached blocks (`pool_blocks`; sim's pool alike); under
``ideal`` floor(bytes / bytes_per_block).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blocks import VLLM_NULL_BLOCKS
from ..errors import ParameterError
from ..model.kv_groups import kv_layout
from ..model.model_spec import ModelSpec


@dataclass(frozen=True)
class GroupBytes:
    label: str  # "full", "sliding_4096", "chunked_8192", "state_mamba2", ...
    layers: int
    bytes_per_block: int
    kind: str = "full"  # full | sliding | chunked | state: which blocks of a hit it reads (first_needed)
    window: int | None = None  # W (sliding) or C (chunked)

    def first_needed(self, hit_blocks: np.ndarray, block_size: int) -> np.ndarray:
        """The first block a hit of `hit_blocks` blocks needs in this group: vLLM's get_num_skipped_tokens(hit
        tokens) // B (single_type_kv_cache_manager; the blocks before are its null entries, never loaded): full 0,
        sliding max(0, n·B − W + 1) // B, chunked (n·B // C · C) // B (the current chunk's), state n − 1 (the one
        state at the hit's boundary)."""
        n = np.asarray(hit_blocks, dtype=np.int64)
        if self.kind == "sliding":
            assert self.window is not None
            return np.maximum(n * block_size - self.window + 1, 0) // block_size
        if self.kind == "chunked":
            assert self.window is not None
            return (n * block_size // self.window * self.window) // block_size
        if self.kind == "state":
            return np.maximum(n - 1, 0)
        return np.zeros_like(n)


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
    page_bytes: int = 0  # one block id of the vllm layout (0: the pool is counted in whole cached blocks)

    @property
    def bytes_per_block(self) -> int:
        return sum(g.bytes_per_block for g in self.groups)

    @property
    def null_blocks(self) -> int:
        """Block ids a pool of this layout never hands out: vLLM's null block (block 0); none under ideal."""
        return VLLM_NULL_BLOCKS if self.layout == "vllm" else 0

    def pool_blocks(self, pool_bytes: int) -> int:
        """Cached blocks a GPU pool of `pool_bytes` per GPU holds (module docstring): its block ids less the null
        block, over the ids one cached block takes (Llama-3-8B bf16 at block 16: 142 MiB // 2 MiB = 71 ids, 70
        blocks; gpt-oss-120b, 2 tables of 576 KiB ids: (ids − 1) // 2)."""
        page = self.page_bytes or self.bytes_per_block
        return max(pool_bytes // page - self.null_blocks, 0) * page // self.bytes_per_block

    def pool_bytes(self, blocks: int) -> int:
        """The bytes per GPU of the smallest pool that holds `blocks` cached blocks (pool_blocks' inverse): their
        ids and the null block under vllm (Llama-3-8B bf16 at block 16: 70 blocks, 71 ids of 2 MiB = 142 MiB)."""
        page = self.page_bytes or self.bytes_per_block
        return blocks * self.bytes_per_block + self.null_blocks * page if blocks > 0 else 0

    @property
    def state_bytes(self) -> int:
        return sum(g.bytes_per_block for g in self.groups if g.label.startswith("state_"))

    def split(self, blocks: int) -> dict[str, int]:
        """Bytes of `blocks` cached blocks, per group label."""
        return {g.label: blocks * g.bytes_per_block for g in self.groups}

    def read_bytes(self, lo: np.ndarray, hi: np.ndarray, hit_blocks: np.ndarray) -> dict[str, np.ndarray]:
        """Per group label: the bytes a load of a hit's blocks [lo, hi) reads, of a hit of `hit_blocks` blocks
        (elementwise): each group's blocks at or after its first needed one (GroupBytes.first_needed). share's
        tiers (a tier is a range of the hit) and sim's (core/sim/tiers.py, per tier past that block) read through
        this rule: sliding the window's min(k, ceil((W − 1) / B)) blocks, chunked the current chunk's, a state
        group one state, full every block."""
        lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
        out: dict[str, np.ndarray] = {}
        for g in self.groups:
            start = np.maximum(lo, g.first_needed(hit_blocks, self.block_size))
            out[g.label] = out.get(g.label, 0) + np.maximum(hi - start, 0) * g.bytes_per_block
        return out


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
        groups.append(GroupBytes(label, g.layers, g.block_bytes, g.kind, g.window))
    padding = sum(g.padding_bytes_per_block for g in layout.groups)
    return CachedBlockBytes(spec.name, dtype, block_size, tp, tuple(groups), layout.layout, padding,
                            layout.page_bytes if layout.layout == "vllm" else 0)


def vllm_cache_groups(spec: ModelSpec, dtype_bits: int, block_size: int, tp: int = 1,
                      mamba_cache_mode: str = "align") -> int:
    """vLLM's KV cache group count for `spec` (its block tables: core.model.kv_groups' ``vllm`` layout).

    It matters to host offloading: vLLM #56871 (open) reports that the native offloading connector stores
    every (block hash, group) key as a row holding all groups, so its host capacity is divided by this count.
    """
    return kv_layout(spec, dtype_bits, block_size, "vllm", tp, mamba_cache_mode).num_tables
