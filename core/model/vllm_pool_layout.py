"""vLLM's pool in the two cases the GPU plan (gpu_plan.py) adds to kv_groups.kv_layout: an attention-free
model's one group of whole-request blocks (`attention_free_layout`), and the layer slots per block id on each
pipeline stage of a model with several KV cache groups (`stage_slots`)."""

from __future__ import annotations

from ..errors import ParameterError
from .kv_groups import VLLM_BLOCK_SIZES, KVCacheGroup, KVLayout, layer_types
from .layers import bits_to_bytes
from .model_spec import ModelSpec


def stage_slots(spec: ModelSpec, layout: KVLayout, kv_dtype_bits: int, tp: int, pp: int) -> tuple[int, ...]:
    """Layer slots per block id on each pipeline stage of a model with several KV cache groups, as vLLM 0.19+
    plans them (get_kv_cache_configs): the groups are made once for the whole model (each layer type's layers, in
    model order, cut into runs of G), each stage keeps its own layers of every group, and a stage's block id is
    one page in each of max(its layers in any one group) slots; the engine then takes the least blocks over the
    stages. Needs the layers' order (`spec.layer_order`, from a config.json)."""
    from .vllm_memory import pp_layers

    if layout.layout != "vllm":
        raise ParameterError(f"pp {pp}: pipeline stages are planned for vLLM's layout only; use layout vllm or pp 1",
                             "pp")
    order = spec.layer_order
    if any(g.beside_attention for g in spec.layer_groups):
        raise ParameterError(f"{{pp}} {pp}: {spec.name}'s layers each hold attention and a recurrent state side by "
                             "side, and kvcalc does not plan how vLLM cuts such layers' KV cache groups into "
                             "pipeline stages: use {pp} 1", "pp")
    if len(order) != spec.model_layers or len(spec.layer_groups) <= max(order, default=-1):
        raise ParameterError(f"{{pp}} {pp}: {spec.name} has several KV-cache groups and kvcalc does not know which "
                             "layer is which (a preset, or layers of two kinds): give its config.json ({config}), or "
                             "use {pp} 1", "pp", "config")
    types = [(t.kind, t.window, t.source, t.bits) for t in layer_types(spec, kv_dtype_bits, tp)]
    keys: list[tuple[str, int | None, str, int] | None] = []
    for g in spec.layer_groups:
        if g.keeps_kv:
            keys.append(("full" if g.kind == "mla" else g.kind, g.window, g.kind, g.bits_per_token(kv_dtype_bits, tp)))
        else:
            keys.append(("state", None, g.state.kind, g.state.bits(tp)) if g.state is not None else None)
    seen = [0] * len(types)
    run_of: list[tuple[int, int] | None] = []  # each layer's (layer type, run of G layers); None: pages nothing
    for i in order:
        key = keys[i]
        if key is None:
            run_of.append(None)
            continue
        t = types.index(key)
        run_of.append((t, seen[t] // layout.group_size))
        seen[t] += 1
    out, start = [], 0
    for n in pp_layers(spec.model_layers, pp):
        runs = [r for r in run_of[start:start + n] if r is not None]
        out.append(max((runs.count(r) for r in set(runs)), default=0))
        start += n
    return tuple(out)


def attention_free_layout(spec: ModelSpec, kv_dtype_bits: int, tp: int, max_model_len: int, block_size: int,
                          mamba_cache_mode: str = "none") -> KVLayout | None:
    """vLLM's pool for a model without attention (Mamba, Mamba-2, FalconMamba), or None when a layer keeps KV.

    vLLM (MambaModelConfig) sets the Mamba block size to max_model_len, so one block holds a whole request; the
    layers' equal state specs make one KV cache group of all L layers, a block id is one state page per layer
    (page = one layer's state on this GPU, unpadded: no attention page to match) and a request takes one:
    blocks = KV memory // (L · page), max concurrency = blocks, "GPU KV cache size" = blocks · max_model_len.
    """
    types = layer_types(spec, kv_dtype_bits, tp)
    if any(t.kind != "state" for t in types):
        return None
    if not types:
        raise ParameterError(f"{spec.name}: no layer keeps a KV cache or a recurrent state", "model")
    if {t.source for t in types} & {"rwkv"}:
        raise ParameterError(f"{spec.name}: RWKV-4 is not among vLLM's models, so there is no vLLM start-up to "
                             "predict; drop {gpu}/{kv_memory_bytes} (its state per sequence is in the table)", "gpu",
                             "kv_memory_bytes")
    if len(types) > 1:
        raise ParameterError(f"{spec.name}: layers with different recurrent states and no attention: vLLM's grouping "
                             "of them is not modelled; drop {gpu}/{kv_memory_bytes}", "model", "gpu",
                             "kv_memory_bytes")
    if mamba_cache_mode != "none":
        raise ParameterError(f"mamba_cache_mode {mamba_cache_mode!r}: an attention-free model's prefix caching is "
                             "not modelled; use 'none'", "mamba_cache_mode")
    t = types[0]
    page = bits_to_bytes(t.bits)
    group = KVCacheGroup("state", None, t.count, t.count, max_model_len, page * t.count, 1, 1, page, page, t.source,
                         t.bits * t.count)
    reason = (f"attention-free: one {t.source} state page of {page:,} B per layer, {t.count} layers in one group; a "
              f"block is one sequence (vLLM's Mamba block size is max_model_len, {max_model_len:,} tokens)")
    return KVLayout("vllm", (group,), max_model_len, reason, page * t.count, t.count, block_size, "none")


def check_vllm_block_size(block_size: int) -> None:
    """A block size vLLM's pool takes (CacheConfig's BlockSize: VLLM_BLOCK_SIZES), else one error naming the way out:
    kvcalc's ideal layout pages any block size."""
    if block_size not in VLLM_BLOCK_SIZES:
        *sizes, last = map(str, VLLM_BLOCK_SIZES)
        raise ParameterError(f"block_size {block_size:,}: vLLM pages blocks of {', '.join(sizes)} or {last} tokens "
                             "only: give one of those, or layout ideal for kvcalc's own pool at any block size",
                             "block_size", "layout")
