"""A model's KV cache groups and the one memory plan: how many blocks a KV budget holds.

Layers with the same cache spec are one *layer type*: full attention (MLA included), sliding window W,
chunked local attention C, each with its bytes per token on one GPU, or a recurrent state (Mamba, linear
attention) with its bytes per sequence. Two layouts turn the types into groups, one group per type:

* ``vllm`` — vLLM v1's hybrid allocator (``kv_cache_utils.py``), re-derived here:
  1. One type of attention (every layer holds the same tokens): one group; a block is `B` tokens of every
     layer, its bytes the sum of the layers' pages.
  2. Mamba hybrids (``_align_hybrid_block_size``): the attention block grows to the smallest multiple of
     the kernel alignment A = max(16, B) whose attention page (per layer) holds one layer's state:
     B' = A · ceil(state / (A · attention bytes per token)); the state page is padded up to that page.
     With ``mamba_cache_mode="all"`` the block is a multiple of lcm(Mamba chunk, A) instead.
  3. Pages are unified: a type with a smaller page grows its tokens per block until its page equals the
     largest (the ratio must be whole).
  4. Group size G: the smallest type's layer count, or the largest's when that is under 1.5 × the
     smallest. A type of n layers spans ceil(n / G) of vLLM's groups (block tables), the last padded
     to G layers: `padded_layers` = G · ceil(n / G).
  5. One physical block id is one page in each of the G layer slots: `page_bytes` = page · G, and
     blocks = budget // page_bytes. A type's logical block takes one block id per block table it spans
     (`pages_per_block` = ceil(n / G)).
* ``ideal`` — each type pooled on its own, the user's block size, no padding, no alignment: a block of a
  type is B tokens (or one state) of its real layers. The budget is counted in units of `page_bytes` =
  gcd of the types' block bytes; a type's block takes `pages_per_block` = block_bytes / page_bytes units.

Either way `plan_blocks(layout, budget) = budget // page_bytes` units, and a group's block costs
`pages_per_block` of them: the single-group (Llama-class) model is the case G = L, pages_per_block 1.

What a sequence of n tokens holds in one group (its blocks per block table, steady state):

    full      ceil(n / B)
    sliding   ceil(n / B) − floor(max(n − W, 0) / B)        the blocks that hold one of the last W tokens
    chunked   ceil(n / B) − floor(C · floor((n − 1) / C) / B)    the current chunk's blocks
    state     1 ("none"), 2 ("align": the running state and the last one saved), ceil(n / B) ("all")

Everything is per GPU of `tp`: each layer split by its own KV heads, the state by its heads.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass

from ..blocks import DEFAULT_BLOCK_SIZE, ceil_div
from ..errors import ParameterError
from .layers import UNKNOWN_STATE_NOTE, bits_to_bytes
from .model_spec import ModelSpec

LAYOUTS = ("vllm", "ideal")
DEFAULT_LAYOUT = "vllm"
GROUP_KINDS = ("full", "sliding", "chunked", "state")
MAMBA_CACHE_MODES = ("none", "align", "all")
KERNEL_BLOCK_ALIGNMENT = 16  # tokens: the attention kernels' smallest block granularity (FlashAttention, FlashInfer)
GROUP_SIZE_THRESHOLD = 1.5  # vLLM: G = the largest type's count when it is under 1.5 × the smallest
VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vLLM's CacheConfig BlockSize: what --block-size accepts


@dataclass(frozen=True)
class KVCacheGroup:
    """One layer type of a model, paged as `layout` pages it (see the module docstring); bytes per GPU.

    `tables`: block tables a sequence holds for this type (vllm: ceil(layers / G), each with the same
    blocks; ideal: 1). `pages_per_block`: units of the layout's `page_bytes` one logical block of this type
    takes (vllm: `tables`). `layer_page_bytes`: one layer's page as allocated (a padded state page under
    vllm); `layer_used_bytes`: what the layer really stores in it. `source`: the layer kind it came from
    (full, mla, sliding, chunked, or the state's kind: mamba2, gated_deltanet, ...).
    """

    kind: str  # "full" (incl. MLA) | "sliding" | "chunked" | "state" (Mamba / linear attention)
    window: int | None  # W for sliding, C for chunked, else None
    layers: int  # real layers in this group
    padded_layers: int  # layers including padding (vllm layout); == layers under "ideal"
    block_tokens: int  # tokens per block (state: the block whose boundaries can save a state)
    block_bytes: int  # bytes of one block of this group across its (padded) layers, per GPU (state: one state)
    tables: int = 1
    pages_per_block: int = 1
    layer_page_bytes: int = 0
    layer_used_bytes: int = 0
    source: str = ""
    token_bits: int = 0  # the real layers together: bits of one token (attention) or of one sequence's state

    @property
    def is_state(self) -> bool:
        return self.kind == "state"

    @property
    def used_block_bytes(self) -> int:
        """Bytes one block holds in the real layers: B tokens of each (attention) or one state each."""
        return bits_to_bytes(self.token_bits if self.is_state else self.token_bits * self.block_tokens)

    @property
    def padding_bytes_per_block(self) -> int:
        """Bytes of a block that hold nothing: padding layers and the padded part of each state page."""
        return self.block_bytes - self.used_block_bytes


@dataclass(frozen=True)
class KVLayout:
    """The groups of one model under one layout, and the unit the memory plan counts (see the docstring).

    `page_bytes`: vllm: bytes of one physical block id (one page × group size G); ideal: the gcd of the
    groups' block bytes. `group_size`: G under vllm (1 under ideal). `block_size`: attention tokens per
    block actually used; `requested_block_size`: the one asked for. `reason` says why they differ, if so.
    """

    layout: str  # "vllm" | "ideal"
    groups: tuple[KVCacheGroup, ...]
    block_size: int
    reason: str
    page_bytes: int
    group_size: int = 1
    requested_block_size: int = DEFAULT_BLOCK_SIZE
    mamba_cache_mode: str = "none"

    @property
    def attention_groups(self) -> tuple[KVCacheGroup, ...]:
        return tuple(g for g in self.groups if not g.is_state)

    @property
    def state_groups(self) -> tuple[KVCacheGroup, ...]:
        return tuple(g for g in self.groups if g.is_state)

    @property
    def num_tables(self) -> int:
        """Block tables per sequence: vLLM's KV cache group count under vllm, the types under ideal."""
        return sum(g.tables for g in self.groups)


@dataclass(frozen=True)
class _LayerType:
    kind: str
    window: int | None
    source: str
    count: int
    bits: int  # per layer on one GPU: one token (attention) or one sequence's state


def layer_types(spec: ModelSpec, dtype_bits: int, tp: int = 1) -> list[_LayerType]:
    """The model's layer types in order of first appearance (layers with equal cache specs merged)."""
    counts: Counter[tuple[str, int | None, str, int]] = Counter()
    for g in spec.layer_groups:
        if g.keeps_kv:
            kind = "full" if g.kind == "mla" else g.kind
            counts[(kind, g.window, g.kind, g.bits_per_token(dtype_bits, tp))] += g.count
        elif g.state is not None:
            counts[("state", None, g.state.kind, g.state.bits(tp))] += g.count
        elif g.note == UNKNOWN_STATE_NOTE:  # vLLM pages that state beside the KV: the pool would be a guess
            raise ParameterError(f"{spec.name}: the recurrent state of {g.count} linear-attention / state-space "
                                 "layers is not known (the config has no Mamba, linear_* or lightning fields), so "
                                 "the paged pool would be a guess; add the state's fields to the config (kvcalc "
                                 "size gives its KV alone)", "model")
    return [_LayerType(kind, window, source, n, bits) for (kind, window, source, bits), n in counts.items()]


def kv_layout(
    spec: ModelSpec,
    dtype_bits: int,
    block_size: int | None = None,
    layout: str = "vllm",
    tp: int = 1,
    mamba_cache_mode: str = "none",
    mamba_chunk_size: int | None = None,
) -> KVLayout:
    """The KV cache groups of `spec` at `dtype_bits` per scalar on one of `tp` GPUs (module docstring).

    `block_size` None is vLLM's default, 16. `mamba_cache_mode` is vLLM's: "none" (no prefix caching of
    the state), "align" (a state saved at each block boundary the prefix cache can hit), "all" (a state per
    block; the block aligned to `mamba_chunk_size`, the kernel's chunk: by default the config's, `chunk_size`).
    """
    if layout not in LAYOUTS:
        raise ParameterError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}", "layout")
    if mamba_cache_mode not in MAMBA_CACHE_MODES:
        raise ParameterError(f"mamba_cache_mode {mamba_cache_mode!r} is not one of {', '.join(MAMBA_CACHE_MODES)}",
                             "mamba_cache_mode")
    requested = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    if not isinstance(requested, int) or requested <= 0:
        raise ParameterError(f"block_size {block_size} must be a positive integer", "block_size")
    types = layer_types(spec, dtype_bits, tp)
    if not any(t.kind != "state" for t in types):
        raise ParameterError(f"{spec.name}: no layer keeps a KV cache, so there is nothing to page", "model")
    if layout == "ideal":
        return _ideal(types, requested, mamba_cache_mode)
    said = ""  # a chunk the config does not give: which default it is (hf_state_fields._CHUNK_DEFAULTS)
    if mamba_cache_mode == "all" and mamba_chunk_size is None and any(t.kind == "state" for t in types):
        mamba_chunk_size = state_chunk(spec)
        said = next((f"; Mamba chunk {g.state.chunk}: {g.state.chunk_from}" for g in spec.layer_groups
                     if g.state is not None and g.state.chunk_from), "")
    kv = _vllm(spec.name, types, requested, mamba_cache_mode, mamba_chunk_size)
    return dataclasses.replace(kv, reason=kv.reason + said) if said else kv


def state_chunk(spec: ModelSpec) -> int:
    """The Mamba-2 scan kernel's chunk of `spec`'s recurrent layers (config `chunk_size`), which vLLM's
    mamba_cache_mode all aligns the block to: its kernel writes a state at every chunk boundary of a prefill, so
    every block boundary has one. vLLM runs mode all on Mamba-2 layers only (Qwen3-Next and Qwen3.5 raise
    NotImplementedError); a config without the chunk is refused by name."""
    states = [g.state for g in spec.layer_groups if g.state is not None]
    other = sorted({s.kind for s in states if s.kind != "mamba2"})
    if other:
        raise ParameterError(f"{spec.name}: mamba_cache_mode all (a state at every block) is vLLM's for Mamba-2 "
                             f"layers only, not {', '.join(other)}: use none or align", "mamba_cache_mode")
    chunks = {s.chunk for s in states}
    if chunks == {0} or len(chunks) != 1:
        raise ParameterError(f"{spec.name}: mamba_cache_mode all aligns the block to the Mamba kernel's chunk, and "
                             "the model gives none (config chunk_size or mamba_chunk_size): add it to the config, "
                             "or use none or align", "mamba_cache_mode")
    return chunks.pop()


def _ideal(types: list[_LayerType], block_size: int, mode: str) -> KVLayout:
    blocks = []
    for t in types:
        per_layer = t.bits if t.kind == "state" else t.bits * block_size
        blocks.append((t, bits_to_bytes(per_layer), bits_to_bytes(per_layer * t.count)))
    unit = math.gcd(*(block_bytes for _, _, block_bytes in blocks))
    groups = tuple(
        KVCacheGroup(t.kind, t.window, t.count, t.count, block_size, block_bytes, 1, block_bytes // unit,
                     layer_page, layer_page, t.source, t.bits * t.count)
        for t, layer_page, block_bytes in blocks
    )
    reason = f"block {block_size}: as given; each layer type pooled on its own, no padding (ideal layout)"
    return KVLayout("ideal", groups, block_size, reason, unit, 1, block_size, mode)


def _vllm(name: str, types: list[_LayerType], block_size: int, mode: str, chunk_size: int | None) -> KVLayout:
    attention = [t for t in types if t.kind != "state"]
    states = [t for t in types if t.kind == "state"]
    if not states and len({(t.kind, t.window) for t in attention}) == 1:
        # One type of attention: one group, one block table; a block id holds B tokens of every layer. Equal
        # layers share one page size (G = L slots); unequal ones (per-layer heads) page side by side (G = 1).
        t = attention[0]
        layers = sum(a.count for a in attention)
        if len(attention) == 1:
            layer_page, group_size = bits_to_bytes(t.bits * block_size), layers
        else:
            layer_page, group_size = bits_to_bytes(block_size * sum(a.bits * a.count for a in attention)), 1
        source = "+".join(dict.fromkeys(a.source for a in attention))
        group = KVCacheGroup(t.kind, t.window, layers, layers, block_size, layer_page * group_size, 1, 1,
                             layer_page, layer_page, source, sum(a.bits * a.count for a in attention))
        reason = f"block {block_size}: as given; one KV cache group (every layer in one block table)"
        return KVLayout("vllm", (group,), block_size, reason, layer_page * group_size, group_size, block_size, mode)
    attn_block, reason = block_size, f"block {block_size}: as given"
    state_page = 0
    if states:
        attn_block, state_page, reason = _align_to_state(name, attention, states, block_size, mode, chunk_size)
    pages = {t: bits_to_bytes(t.bits * attn_block) for t in attention}
    page = max([*pages.values(), state_page])
    tokens: dict[_LayerType, int] = {}
    for t in attention:
        if page % pages[t]:
            raise ParameterError(
                f"{name}: vLLM cannot unify its {t.kind} layers' page ({pages[t]:,} B for {attn_block} tokens) "
                f"with the largest page ({page:,} B): not a whole number of tokens per block; use layout 'ideal'",
                "layout")
        tokens[t] = attn_block * (page // pages[t])
    counts = [t.count for t in types]
    group_size = max(counts) if max(counts) < GROUP_SIZE_THRESHOLD * min(counts) else min(counts)
    groups = []
    for t in types:
        tables = ceil_div(t.count, group_size)
        used = bits_to_bytes(t.bits) if t.kind == "state" else page
        groups.append(KVCacheGroup(t.kind, t.window, t.count, tables * group_size,
                                   attn_block if t.kind == "state" else tokens[t], tables * page * group_size,
                                   tables, tables, page, used, t.source, t.bits * t.count))
    unified = [t for t in attention if tokens[t] != attn_block]
    if unified:
        reason += "; " + ", ".join(f"{t.kind} pages hold {tokens[t]} tokens" for t in unified) + (
            " (pages unified to the largest, vLLM unify_kv_cache_spec_page_size)")
    padded = sum(g.padded_layers - g.layers for g in groups)
    reason += f"; {len(groups)} layer types in {sum(g.tables for g in groups)} groups of {group_size} layer slots"
    if padded:
        reason += f" ({padded} padding)"
    return KVLayout("vllm", tuple(groups), attn_block, reason, page * group_size, group_size, block_size, mode)


def _align_to_state(name: str, attention: list[_LayerType], states: list[_LayerType], block_size: int, mode: str,
                    chunk_size: int | None) -> tuple[int, int, str]:
    """(attention block, the padded state page, why): vLLM's Mamba-hybrid block alignment."""
    token_page = bits_to_bytes(max(t.bits for t in attention))  # one token of one attention layer
    state = max(states, key=lambda t: t.bits)
    state_bytes = bits_to_bytes(state.bits)
    alignment = max(KERNEL_BLOCK_ALIGNMENT, block_size)
    if mode == "all":
        if chunk_size is None or chunk_size <= 0:
            raise ParameterError(f"mamba_cache_mode 'all' aligns the block to the Mamba kernel's chunk: give "
                                 f"mamba_chunk_size (a positive token count) for {name}", "mamba_chunk_size")
        chunk = math.lcm(chunk_size, alignment)
        needed = chunk * ceil_div(ceil_div(state_bytes, token_page), chunk)
        how = f"lcm({chunk_size}, {alignment}) · ceil({ceil_div(state_bytes, token_page)} tokens / {chunk})"
    else:
        needed = alignment * ceil_div(state_bytes, alignment * token_page)
        how = f"{alignment} · ceil({state_bytes:,} B / ({alignment} · {token_page:,} B per token))"
    attn_block = max(block_size, needed)
    page = attn_block * token_page
    if attn_block == block_size:
        reason = f"block {block_size}: as given; its page holds the {state.source} state"
    else:
        reason = (f"block {attn_block}: the {state.source} state page ({state_bytes:,} B per layer) forces it, "
                  f"{how} (vLLM _align_hybrid_block_size)")
    if page > state_bytes:
        reason += f"; state page padded by {100 * (page - state_bytes) / state_bytes:.2f} %"
    return attn_block, page, reason


def plan_blocks(layout: KVLayout, kv_memory_bytes: int) -> int:
    """The one memory plan: units of `layout.page_bytes` (vllm: block ids) that `kv_memory_bytes` per GPU holds."""
    if kv_memory_bytes < 0:
        raise ParameterError(f"kv_memory_bytes {kv_memory_bytes} must be >= 0", "kv_memory_bytes")
    return kv_memory_bytes // layout.page_bytes


def blocks_held(group: KVCacheGroup, tokens: int, mamba_cache_mode: str = "none") -> int:
    """Blocks one block table of `group` holds for a sequence of `tokens` tokens (module docstring table)."""
    b = group.block_tokens
    if tokens <= 0:
        return 0
    if group.kind == "state":
        if mamba_cache_mode == "all":
            return ceil_div(tokens, b)
        return 2 if mamba_cache_mode == "align" else 1
    blocks = ceil_div(tokens, b)
    if group.kind == "sliding":
        assert group.window is not None
        return blocks - max(tokens - group.window, 0) // b
    if group.kind == "chunked":
        assert group.window is not None
        return blocks - group.window * ((tokens - 1) // group.window) // b
    return blocks


def request_blocks(group: KVCacheGroup, max_model_len: int, max_num_batched_tokens: int,
                   mamba_cache_mode: str = "none") -> int:
    """Blocks one block table of `group` may need for one request, vLLM's worst case (max concurrency):
    full cdiv(L, B); sliding cdiv(min(W − 1 + T, L), B) + 1; chunked cdiv(min(C + T, L), B); state as held."""
    b = group.block_tokens
    if group.kind == "full":
        return ceil_div(max_model_len, b)
    if group.kind == "sliding":
        assert group.window is not None
        return ceil_div(min(group.window - 1 + max_num_batched_tokens, max_model_len), b) + 1
    if group.kind == "chunked":
        assert group.window is not None
        return ceil_div(min(group.window + max_num_batched_tokens, max_model_len), b)
    return blocks_held(group, max_model_len, mamba_cache_mode)
