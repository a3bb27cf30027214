"""Which architectures kvcalc reads, and how a config field is judged: by the architecture that owns it.

A config's `model_type` names its architecture, and the engines (transformers, vLLM) build the model from
the fields that architecture reads and ignore every other field. kvcalc does the same:

* a `model_type` of `FAMILIES` is read by the rules of hf_layers.py / hf_groups.py / hf_recurrent.py for
  its family, which read every field that shapes that family's KV cache and recurrent state; any other
  field of the file is ignored (a field the architecture does not read cannot change what it caches);
* any other `model_type` (or none) is read as a plain decoder only when every field whose name says it
  could describe the cache (`hf_fields.STRUCTURAL`) was read; otherwise it is refused in one line naming the
  model_type and all of those fields at once. kvcalc never suggests deleting a field: a field it does not
  understand on an architecture it does not know may be exactly the one that changes the cache
  (DeepSeek-V4's `compress_ratios`: its layers keep a compressed cache that no other reader models).
"""

from __future__ import annotations

from .hf_fields import ConfigFields

# model_type -> family (the reader conventions of the family are in the modules named above).
FAMILIES: dict[str, str] = {
    # dense and MoE decoders: K and V of every KV head on every attention layer (sliding, chunked, NoPE ...)
    **dict.fromkeys((
        "llama", "mistral", "mistral3", "ministral", "pixtral", "llava", "llava_next", "mixtral", "qwen2",
        "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe", "gemma", "gemma2",
        "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text", "cohere", "cohere2", "exaone4",
        "phi", "phi3", "phi4_multimodal", "phimoe", "olmo", "olmo2", "olmo3", "olmoe", "granite", "granitemoe",
        "internlm2", "internlm3", "smollm3", "starcoder2", "gpt2", "gpt_neox", "gpt_bigcode", "gptj", "opt",
        "bloom", "mpt", "falcon", "RefinedWeb", "RefinedWebModel", "nemotron", "nemotron-nas", "deci", "afmoe",
        "hunyuan_v1_dense", "hunyuan_v1_moe", "ernie4_5", "ernie4_5_moe", "glm", "glm4", "glm4_moe", "chatglm",
        "gpt_oss", "minimax_m2", "mimo", "mimo_v2_flash", "llama4", "llama4_text", "seed_oss", "arcee",
        "step3p5", "step3p7",
        # multimodal wrappers' language models (text_config's model_type): Qwen3-VL, GLM-4.5V / 4.1V, Ministral-3,
        # and the thinkers of Qwen2.5-Omni / Qwen3-Omni (thinker_config, whose text_config vLLM serves)
        "qwen3_vl_text", "qwen3_vl_moe_text", "glm4v", "glm4v_text", "glm4v_moe", "glm4v_moe_text", "ministral3",
        "qwen2_5_omni_thinker", "qwen2_5_omni_text", "qwen3_omni_moe_thinker", "qwen3_omni_moe_text",
    ), "decoder"),
    # multi-head latent attention (one latent per token), with DeepSeek sparse attention's indexer keys
    **dict.fromkeys(("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "longcat_flash", "glm_moe_dsa",
                     "glm4_moe_lite"), "mla"),
    # attention + Mamba / linear attention / short convolution in one stack
    **dict.fromkeys(("nemotron_h", "jamba", "bamba", "granitemoehybrid", "zamba", "zamba2", "falcon_h1",
                     "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "minimax",
                     "minimax_m1", "minimax_text_01", "lfm2", "lfm2_moe", "kimi_linear", "kimi_k3", "kimi_k3_text",
                     "plamo2"),
                    "hybrid"),
    # no KV at all: a constant state per sequence (hf_recurrent.py)
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba", "rwkv"), "recurrent"),
}


# Fields whose names look like the cache's (hf_fields.STRUCTURAL) but that a known architecture's engines do not
# read for it, by model_type, each with why; a known architecture's other unread look-alikes are ignored too,
# and named in a note (never silently).
_KIMI_K3 = {"activation_situ_linear_beta": "a constant of the SiTU activation"}
IGNORED: dict[str, dict[str, str]] = {
    "phi3": {"full_attn_mod": "Phi-4-mini: read by no Phi-3 engine; every layer is the same attention"},
    "falcon_h1": {"mamba_use_mlp": "whether a layer has an MLP (weights, not state)"},
    "lfm2": {"conv_dim_out": "the short convolution's output projection width (the state is conv_dim wide)"},
    "kimi_k3": _KIMI_K3, "kimi_k3_text": _KIMI_K3,
    "glm_moe_dsa": {"index_topk_freq": "how often the indexer picks the top-k tokens (compute, not cache)",
                    "index_skip_topk_offset": "the first layers that skip the top-k selection (compute)",
                    "indexer_rope_interleave": "how the indexer rotates its keys (values, not their count)"},
}


# Architectures known NOT to be placeable by any reader here: refused by model_type, whatever fields the file
# keeps (DeepSeek-V4 with its compress_ratios, window_size and index_* fields deleted reads as 43 sliding layers of
# one 512-wide head: 11.3 MB per 32K sequence, about 19x too little).
UNSUPPORTED: dict[str, str] = {
    "deepseek_v4": "compressed sparse attention: each layer keeps a 128-token window, a cache compressed 4x or "
                   "128x (compress_ratios) and an indexer's keys, which kvcalc does not model yet",
    "minicpm3": "vLLM's MiniCPM3Attention decompresses the kv_lora_rank latent and caches K and V of every head, "
                "qk_nope_head_dim + qk_rope_head_dim wide (V padded to it), not the latent that kv_lora_rank names "
                "for DeepSeek's MLA; kvcalc does not model that cache yet",
    "ouro": "a looped model: its num_hidden_layers run total_ut_steps times and every pass keeps a KV cache of its own "
            "(vLLM's OuroAttention holds total_ut_steps caches a layer), which kvcalc does not model yet",
    # Phi-4-mini-flash (SambaY): of 32 layers the even ones are Mamba (mb_per_layer) or gated memory units, the odd ones
    # below the middle slide (window 512), the middle one is full and the cross-decoder's odd layers share its KV
    # (YOCO): 9 attention caches, not 32 sliding ones; vLLM v1 dropped it (_PREVIOUSLY_SUPPORTED_MODELS)
    "phi4flash": "SambaY (Phi-4-mini-flash): Mamba layers every mb_per_layer, sliding-window attention only below the "
                 "middle layer, and one full-attention layer whose KV the upper half's layers share (YOCO); vLLM v1 no "
                 "longer serves it, and kvcalc does not model that cache",
    "xlstm": "xLSTM keeps a recurrent matrix memory per block (qk_dim_factor, v_dim_factor of embedding_dim), not "
             "K and V a token; no vLLM model serves it, and kvcalc does not model that state",
}


# vLLM caches one latent (kv_lora_rank + qk_rope_head_dim) only for the architectures it lists as DeepSeek-style MLA
# (ModelConfig.is_deepseek_mla); any other with kv_lora_rank caches K and V of every head (MiniCPM3 always does)
_UNKNOWN_MLA = ("its kv_lora_rank is MLA, whose cache vLLM keeps as one latent only for the architectures it lists "
                "as DeepSeek-style MLA, else as K and V of every head; which one this is, kvcalc does not know")


def family_of(model_type: object) -> str | None:
    return FAMILIES.get(model_type) if isinstance(model_type, str) else None


def refusal(f: ConfigFields, fields: list[str], why: str = "", params: tuple[str, ...] = ()) -> ValueError:
    """The one-line refusal of an architecture kvcalc does not know: its model_type and every unread field
    that could change the KV or the state, at once. `params`: the parameters `why` marks (`{layers}`), if any."""
    model_type = f.data.get("model_type")
    which = f"model_type {model_type!r}" if model_type else "a config without a model_type"
    because = f" ({why})" if why else ""
    if not fields:
        return f.error(f"{which} is not an architecture kvcalc knows, and it cannot be read as a plain "
                       f"decoder{because}", *params)
    listed = ", ".join(fields)
    shape = ("layers", "kv_heads", "head_dim")
    return f.error(
        f"{which} is not an architecture kvcalc knows{because}, and it does not read its fields {listed}, "
        "which could change which layers keep KV or how much; its KV would be a guess, so kvcalc stops "
        "(for a plain decoder, give its shape with {layers}, {kv_heads} and {head_dim} instead)",
        *shape, *(p for p in params if p not in shape),
    )


def refuse_unsupported(f: ConfigFields) -> None:
    """An architecture of `UNSUPPORTED`: refused before any reading, naming it, why, and its cache fields."""
    model_type = f.data.get("model_type")
    why = UNSUPPORTED.get(model_type) if isinstance(model_type, str) else None
    if why is not None:
        raise refusal(f, f.unread_structural(), why=why)


def judge_unread(f: ConfigFields) -> str | None:
    """After a config was read. A known family: None, or a note naming the unread look-alike fields that `IGNORED`
    does not explain (ignored, as the family's engines ignore them). An unknown one: refused if any is unread."""
    model_type = f.data.get("model_type")
    family = family_of(model_type)
    unread = f.unread_structural()
    if family is None:
        if model_type and f.data.get("kv_lora_rank") is not None:  # (a hand-written config without one reads MLA)
            raise refusal(f, [], why=_UNKNOWN_MLA)
        unread += f.unread_nested()
        if unread:
            raise refusal(f, unread)
        return None
    other = [key for key in unread if key not in IGNORED.get(str(model_type), {})]  # a str: family is set
    if not other:
        return None
    return (f"{model_type}: {', '.join(other)} ignored (not among the fields kvcalc reads for this architecture's "
            "KV and state)")


# rope_scaling types whose factor vLLM does not apply to the length (_get_and_verify_max_len): LongRoPE's
# max_position_embeddings is already the scaled length, and so is Llama-3.1's
_UNSCALED_ROPE = frozenset({"su", "longrope", "llama3"})


def rope_scaled_length(f: ConfigFields, length: int) -> int:
    """The model's length as vLLM derives it from `length` (the smallest length field) and the config's rope
    scaling (`rope_scaling`, or transformers 5's `rope_parameters`, one dict or one per layer type): times its
    `factor` (1 when absent), from `original_max_position_embeddings` for yarn; unscaled for su / longrope /
    llama3 and for Gemma-3 (whose length is already scaled). InternLM3-8B: dynamic, factor 6: 32,768 -> 196,608."""
    params = f.raw("rope_scaling", "rope_parameters")
    if not isinstance(params, dict) or "gemma3" in str(f.raw("model_type")):
        return length
    entries = list(params.values()) if params and all(isinstance(v, dict) for v in params.values()) else [params]
    factor: float = 1.0
    for rope in entries:
        if rope.get("rope_type", rope.get("type")) in _UNSCALED_ROPE:
            continue
        factor = rope.get("factor", factor)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < 2**20:
            raise f.error(f"rope scaling factor {factor!r} must be a positive number; fix the file")
        if rope.get("rope_type", rope.get("type")) == "yarn" and rope.get("original_max_position_embeddings"):
            length = rope["original_max_position_embeddings"]
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise f.error(f"rope scaling original_max_position_embeddings {length!r} must be a positive "
                              "integer; fix the file")
    return int(length * factor)
