"""The MLP and MoE blocks of a Hugging Face config, layer by layer, for the weight estimate; and the MoE
expert counts.

Expert counts: routed experts `n_routed_experts` (DeepSeek, Nemotron), `num_local_experts` (Mixtral,
gpt-oss, MiniMax, Llama-4), `num_experts` (Qwen-MoE, Jamba, Gemma-4) or `moe_num_experts` (ERNIE-4.5); per
token `num_experts_per_tok`, `top_k_experts` (Gemma-4), `experts_per_token` (gpt-oss), `num_experts_per_token`
(Kimi-Linear) or `moe_k` (ERNIE-4.5); both or neither (they change no KV: experts are MLPs); a per-layer list
of one repeated value (Hunyuan) is that value. Shared experts: `n_shared_experts` · `moe_intermediate_size`
(DeepSeek; `num_shared_experts`, Kimi-Linear; `moe_num_shared_experts`, ERNIE-4.5), `num_shared_expert` ·
`intermediate_size` (Hunyuan, with use_mixed_mlp_moe), `shared_expert_intermediate_size` (Qwen-MoE),
`moe_shared_expert_intermediate_size` (Nemotron-H), `shared_intermediate_size` (Granite-4.0, in every layer;
0 = none), one of `intermediate_size` (Llama-4). Granite-4.0's dense members write 0 experts and 0 per token:
no MoE block, their MLP is the shared one (`shared_intermediate_size` wide).

Which layers are MoE: `first_k_dense_replace` (DeepSeek: the first k dense), `moe_layer_freq` (a list,
MiMo; 1 MoE), `mlp_layer_types` (dense / sparse), `decoder_sparse_step` with `mlp_only_layers` (Qwen-MoE),
`interleave_moe_layer_step` / `moe_layers` (Llama-4; dense layers `intermediate_size_mlp` wide),
`moe_layer_start_index` / `moe_layer_end_index` / `moe_layer_interval` (ERNIE-4.5),
`expert_layer_period` / `expert_layer_offset` (Jamba), `E` blocks of Nemotron-H (whose `-` blocks are dense
and `M` / `*` blocks have no MLP), `enable_moe_block` (Gemma-4: a dense MLP beside the experts), DeciLM's
per-block `ffn_mult`; LongCat-Flash (a dense MLP in each of the two sublayers of a decoder layer, and
one MoE); else every layer. Expert width `moe_intermediate_size` / `expert_intermediate_size` /
`expert_ffn_hidden_size`, else `intermediate_size` (one width, or a list with one per layer: Gemma-3n).
MLPs are gated (three matrices) unless the activation is relu2 or the model type has a plain two-matrix MLP.
"""

from __future__ import annotations

from collections import Counter

from .hf_fields import ConfigFields
from .layers import FfnGroup

_PLAIN_MLP_TYPES = frozenset({"falcon", "opt", "gpt2", "gpt_bigcode", "gptj", "gpt_neox", "phi", "mpt", "bloom",
                              "starcoder2", "RefinedWeb", "RefinedWebModel"})
# MLP 4 x hidden when the config names no width (transformers' defaults: Falcon's ffn_hidden_size, GPT-2 /
# GPT-J / StarCoder's n_inner; BLOOM has no field): tiiuae/falcon-7b's config.json names none
_FOUR_X_TYPES = frozenset({"falcon", "RefinedWeb", "RefinedWebModel", "gpt2", "gptj", "gpt_bigcode", "bloom"})


def expert_counts(f: ConfigFields) -> tuple[int | None, int | None]:
    """(routed experts, experts per token), both None for a dense model."""
    if f.flag("enable_moe_block") is False:
        f.raw("num_experts", "top_k_experts")
        return None, None
    count_keys = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
    per_token_keys = ("num_experts_per_tok", "top_k_experts", "experts_per_token", "num_experts_per_token", "moe_k",
                      "moe_topk")
    if f.raw(*count_keys) == 0 and f.raw(*per_token_keys) in (0, None):
        return None, None  # Granite-4.0's dense members: num_local_experts 0 and num_experts_per_tok 0, no MoE block
    experts = f.int(*count_keys)
    per_token = _one_int(f, *per_token_keys)
    if (experts is None) != (per_token is None):
        missing = "num_experts_per_tok (or top_k_experts)" if per_token is None else "the expert count"
        raise f.error(f"a MoE config needs both the expert count and the experts per token (missing {missing}); "
                      "add it to the file")
    if experts is not None and per_token is not None and per_token > experts:
        raise f.error(f"{per_token} experts per token exceeds the {experts} experts; fix the file")
    return experts, per_token


def intermediate_widths(f: ConfigFields, n: int) -> list[int] | None:
    """The MLP width of each of the `n` layers: `intermediate_size` (or its spellings), one int for all, or a
    list with one per layer (Gemma-3n); None when the config names none."""
    value = f.raw("intermediate_size")
    if isinstance(value, list):
        widths = f.int_list("intermediate_size", n)
        if widths is None or any(w < 1 for w in widths):
            raise f.error(f"field 'intermediate_size' must be a positive integer or a list of them, got {value!r}")
        return widths
    # ff_intermediate_size: Phi-3-small's spelling (its config names no intermediate_size)
    width = f.int("intermediate_size", "ffn_dim", "ffn_hidden_size", "n_inner", "ff_intermediate_size")
    if width is None and f.raw("model_type") in _FOUR_X_TYPES:
        hidden = f.int("hidden_size", "n_embd", "d_model")
        width = None if hidden is None else 4 * hidden
    return None if width is None else [width] * n


def uniform_intermediate(f: ConfigFields, n: int) -> int | None:
    """The one MLP width of every layer; None when the config names none or the layers' widths differ."""
    widths = intermediate_widths(f, n)
    return widths[0] if widths and len(set(widths)) == 1 else None


def ffn_groups(f: ConfigFields, n: int, hidden: int) -> tuple[FfnGroup, ...]:
    """One FfnGroup per distinct block (see the module docstring); () when the config lacks the widths."""
    widths = intermediate_widths(f, n)
    intermediate = uniform_intermediate(f, n)
    experts, per_token = expert_counts(f)
    gated = not (f.raw("hidden_act", "mlp_hidden_act") == "relu2" or f.raw("model_type") in _PLAIN_MLP_TYPES)
    blocks = f.raw("block_configs")
    if blocks is not None:
        return _count([_decilm_ffn(block, hidden, gated) for block in blocks])
    expert_width = _one_int(f, "moe_intermediate_size", "expert_intermediate_size", "expert_ffn_hidden_size")
    expert_width = expert_width or intermediate
    shared = _shared_width(f, expert_width, intermediate)
    dense_width = f.int("intermediate_size_mlp")
    if experts is None and shared and str(f.raw("model_type")).startswith("granitemoe"):
        dense_width = shared  # Granite-4.0's dense members: no MoE block, the shared MLP is the layer's MLP
    moe = _moe_layers(f, n, experts is not None)
    longcat = f.raw("model_type") == "longcat_flash"
    if longcat and experts is not None:
        moe = [i % 2 == 0 for i in range(n)]  # one MoE per decoder layer of two sublayers, each with a dense MLP
    if widths is None and expert_width is None:
        return ()
    blocks = _nemotron_blocks(f, n)
    per_layer: list[FfnGroup | None] = []
    for i in range(n):
        if blocks is not None and blocks[i] not in ("mlp", "moe"):
            per_layer.append(None)  # Nemotron-H: Mamba and attention blocks carry no MLP
        elif moe[i]:
            # Gemma-4's dense MLP next to the experts; LongCat-Flash's first sublayer's
            beside = intermediate if f.flag("enable_moe_block") or longcat else 0
            per_layer.append(FfnGroup(1, (shared or 0) + (beside or 0), experts or 0, per_token or 0,
                                      expert_width or 0, gated))
        else:
            per_layer.append(FfnGroup(1, dense_width or (widths[i] if widths else 0), gated=gated))
    return _count([g for g in per_layer if g is not None and (g.dense_intermediate or g.experts)])


def _one_int(f: ConfigFields, *keys: str) -> int | None:
    """`f.int(*keys)`, or the one value of a per-layer list of equal ints (Hunyuan writes moe_topk: [8, 8, ...]);
    a list whose values differ has no one value for the weight estimate, so it is refused by name."""
    value = f.raw(*keys)
    if isinstance(value, list) and value:
        key = f.key_of(*keys) or keys[0]
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value) or len(set(value)) > 1:
            raise f.error(f"field '{key}' must be a positive integer or a list of one repeated positive integer, "
                          f"got {value!r}")
        return value[0]
    return f.int(*keys)


def _shared_width(f: ConfigFields, expert_width: int | None, intermediate: int | None) -> int | None:
    shared = f.int("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", minimum=0)
    if shared is not None:
        return shared * (expert_width or 0)
    if f.flag("use_mixed_mlp_moe"):  # Hunyuan: num_shared_expert (a per-layer list) MLPs of intermediate_size
        return (_one_int(f, "num_shared_expert") or 0) * (intermediate or 0)
    width = f.int("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", "shared_intermediate_size",
                  minimum=0)
    if width is not None:
        return width
    if str(f.raw("model_type")).startswith("llama4"):
        return intermediate  # Llama-4's one shared expert per MoE layer
    return None


def _nemotron_blocks(f: ConfigFields, n: int) -> list[str] | None:
    """Nemotron-H's block of each layer (mamba, attention, mlp, moe), None for other models."""
    pattern = f.raw("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) == n:
        return [{"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}.get(c, c) for c in pattern]
    blocks = f.raw("layers_block_type")
    if f.raw("model_type") == "nemotron_h" and isinstance(blocks, list) and len(blocks) == n:
        return [str(b) for b in blocks]
    return None


def _moe_layers(f: ConfigFields, n: int, is_moe: bool) -> list[bool]:
    if not is_moe:
        return [False] * n
    blocks = _nemotron_blocks(f, n)
    if blocks is not None:
        return [b == "moe" for b in blocks]
    freq = f.raw("moe_layer_freq")
    if isinstance(freq, list) and len(freq) == n:
        return [bool(x) for x in freq]
    types = f.raw("mlp_layer_types")
    if isinstance(types, list) and len(types) == n:
        return [t == "sparse" for t in types]
    first_dense = f.int("first_k_dense_replace", minimum=0)
    if first_dense is not None:
        step = freq if isinstance(freq, int) and freq > 0 else 1
        return [i >= first_dense and (i - first_dense) % step == 0 for i in range(n)]
    layers = f.raw("moe_layers")
    if isinstance(layers, list):
        return [i in set(layers) for i in range(n)]
    interleave = f.int("interleave_moe_layer_step")
    if interleave is not None:
        return [(i + 1) % interleave == 0 for i in range(n)]
    period, offset = f.int("expert_layer_period"), f.int("expert_layer_offset", minimum=0)
    if period is not None:
        return [i % period == (offset or 0) for i in range(n)]
    start = _first(f, "moe_layer_start_index")
    if start is not None:  # ERNIE-4.5: MoE from start to end (inclusive), every moe_layer_interval-th
        end, every = _first(f, "moe_layer_end_index"), f.int("moe_layer_interval") or 1
        return [start <= i <= (n - 1 if end is None else end) and (i + 1) % every == 0 for i in range(n)]
    sparse_step = f.int("decoder_sparse_step")
    only_dense = set(f.int_list("mlp_only_layers") or [])
    if any(not 0 <= i < n for i in only_dense):
        raise f.error(f"mlp_only_layers names layers {sorted(i for i in only_dense if not 0 <= i < n)}, outside "
                      f"0 .. {n - 1}; fix the file")
    if sparse_step is not None:
        return [i not in only_dense and (i + 1) % sparse_step == 0 for i in range(n)]
    return [True] * n


def _first(f: ConfigFields, key: str) -> int | None:
    """An int field, or the first of a list of them (ERNIE-4.5-VL lists its text experts' bound first)."""
    value = f.raw(key)
    if isinstance(value, list) and value and isinstance(value[0], int) and not isinstance(value[0], bool):
        return value[0] if value[0] >= 0 else f.int(key, minimum=0)
    return f.int(key, minimum=0)


def _decilm_ffn(block: object, hidden: int, gated: bool) -> FfnGroup:
    """DeciLM: intermediate = the multiple of 256 at or above int(2 · ffn_mult · hidden / 3)."""
    ffn = block.get("ffn", {}) if isinstance(block, dict) else {}
    mult = ffn.get("ffn_mult")
    if ffn.get("no_op") or ffn.get("replace_with_linear") or not mult:
        return FfnGroup(1)
    width = int(2 * mult * hidden / 3)
    return FfnGroup(1, -(-width // 256) * 256, gated=gated)


def _count(groups: list[FfnGroup]) -> tuple[FfnGroup, ...]:
    counts = Counter(groups)
    return tuple(FfnGroup(c, g.dense_intermediate, g.experts, g.experts_per_token, g.expert_intermediate, g.gated)
                 for g, c in counts.items())
