"""The recurrent state of a Hugging Face config's linear-attention / state-space layers, and the dtypes it is
kept in (split from hf_groups.py, which reads each layer's kind and attention dimensions).

Recurrent state (state.py): Mamba-2 from `mamba_num_heads`/`mamba_n_heads`, `mamba_head_dim`/`mamba_d_head`,
`ssm_state_size`/`mamba_d_state`, `n_groups`/`mamba_n_groups`, `conv_kernel`/`mamba_d_conv` (Zamba2:
`n_mamba_heads`, `mamba_headdim`, `mamba_ngroups`); Mamba-1 (Jamba)
from `mamba_expand`, `mamba_d_state`, `mamba_d_conv`; Gated DeltaNet from the `linear_*` fields; MiniMax's
lightning attention from its heads; Kimi Delta Attention from `linear_attn_config` (`num_heads`, `head_dim`,
`short_conv_kernel_size`; transformers 5: `linear_num_heads`, `linear_head_dim`, `linear_conv_kernel_dim`;
defaults 32, 128, 4 as transformers' KimiLinearConfig; recurrent state float32,
as vLLM keeps it); LFM2's short convolution from `conv_L_cache`. The conv state is in the
model's dtype (`torch_dtype` / `dtype`), the SSM state in `mamba_ssm_dtype` / `mamba_ssm_cache_dtype`, else
the default of transformers' config class (float32 for nemotron_h), else the model's dtype; with no dtype
at all bf16 is assumed and said. A recurrent layer whose state fields are missing is kept with an unknown
state, and the spec's notes say so.
"""

from __future__ import annotations

from ..dtypes import parse_dtype
from .hf_fields import ConfigFields
from .state import RecurrentState

# PLaMo-2 adds hidden_size_per_head (vLLM's Plamo2MambaMixer: heads that wide, n_groups 0: B and C not grouped)
_MAMBA_HEAD_KEYS = ("mamba_head_dim", "mamba_d_head", "mamba_headdim")
_SSM_DTYPE_DEFAULTS = {"nemotron_h": "fp32"}  # transformers' NemotronHConfig.mamba_ssm_cache_dtype
# The Mamba-2 scan chunk as vLLM reads it (ModelConfig.get_mamba_chunk_size): hf_text_config.mamba_chunk_size, else
# .chunk_size, on the config object transformers built, so a config.json without either takes its config class's
# default (transformers 5.24: each class instantiated with no arguments). Other model types: none, refused by name.
_CHUNK_DEFAULTS = {
    "granitemoehybrid": ("GraniteMoeHybridConfig", "mamba_chunk_size", 256),
    "bamba": ("BambaConfig", "mamba_chunk_size", 256),
    "falcon_h1": ("FalconH1Config", "mamba_chunk_size", 256),
    "nemotron_h": ("NemotronHConfig", "chunk_size", 128),
    "mamba2": ("Mamba2Config", "chunk_size", 256),
    "zamba2": ("Zamba2Config", "chunk_size", 256),
}


def model_dtype(f: ConfigFields) -> str | None:
    """The checkpoint's dtype (`torch_dtype`, or transformers 5's `dtype`), None when the config names none."""
    value = f.raw("torch_dtype", "dtype")
    return None if value is None else _dtype(f, value, f.key_of("torch_dtype", "dtype") or "torch_dtype")


def state_dtypes(f: ConfigFields, notes: list[str]) -> tuple[str, str]:
    """(conv state dtype, SSM / recurrent state dtype) by the rule in the module docstring."""
    conv = model_dtype(f)
    if conv is None:
        notes.append("the config names no dtype (torch_dtype): the recurrent state is assumed bf16")
        conv = "bf16"
    value = f.raw("mamba_ssm_dtype", "mamba_ssm_cache_dtype")
    if value in (None, "auto"):
        return conv, _SSM_DTYPE_DEFAULTS.get(str(f.raw("model_type")), conv)
    return conv, _dtype(f, value, f.key_of("mamba_ssm_dtype", "mamba_ssm_cache_dtype") or "mamba_ssm_dtype")


def _dtype(f: ConfigFields, value: object, field: str) -> str:
    try:
        return parse_dtype(str(value).removeprefix("torch."))
    except ValueError:
        raise f.error(f"field '{field}' is {value!r}, not a dtype kvcalc knows (float32, bfloat16, ...)") from None


def read_state(f: ConfigFields, kind: str, heads: int, head_dim: int, dtypes: tuple[str, str]) -> RecurrentState | None:
    conv, ssm = dtypes
    hidden = f.int("hidden_size", "d_model") or heads * head_dim
    if kind == "lightning":
        return RecurrentState("lightning", conv, conv, heads=heads, head_dim=head_dim)
    if kind == "kda":
        kda = f.raw("linear_attn_config")
        if isinstance(kda, dict):
            heads, dim = kda.get("num_heads", 32), kda.get("head_dim", 128)
            d_conv = kda.get("short_conv_kernel_size", 4)
        else:  # transformers 5 writes them at the top level
            heads, dim, d_conv = (f.int("linear_num_heads") or 32, f.int("linear_head_dim") or 128,
                                  f.int("linear_conv_kernel_dim") or 4)
        # vLLM keeps KDA's recurrent state in float32 whatever the model dtype (its state-dtype rule)
        return RecurrentState("kda", conv, ssm if f.raw("mamba_ssm_dtype", "mamba_ssm_cache_dtype") else "fp32",
                              heads=heads, head_dim=dim, d_conv=d_conv)
    if kind == "conv":
        width = f.int("conv_dim") or hidden
        return RecurrentState("short_conv", conv, conv, d_inner=width, d_conv=f.required_int("conv_L_cache"))
    mamba_heads = f.int("mamba_num_heads", "mamba_n_heads", "n_mamba_heads")
    linear_heads = f.int("linear_num_value_heads")
    mamba1 = f.int("mamba_expand") if mamba_heads is None else None
    if sum(x is not None for x in (mamba_heads, linear_heads, mamba1)) > 1:
        raise f.error("the config has both Mamba and linear-attention state fields; kvcalc cannot tell which "
                      "its recurrent layers use")
    if mamba_heads is not None:
        head_keys = _MAMBA_HEAD_KEYS + (("hidden_size_per_head",) if f.raw("model_type") == "plamo2" else ())
        d_head = f.raw(*head_keys)
        # `mamba_expand` (Zamba2, Bamba ...) is d_inner / hidden_size and heads · head_dim must agree with it;
        # Falcon-H1's mamba_d_ssm overrides it (transformers uses expand only when d_ssm is absent).
        expand, expand_key = f.int("mamba_expand", "expand"), f.key_of("mamba_expand", "expand")
        d_inner = f.int("mamba_d_ssm") or (mamba_heads * f.required_int(*head_keys) if d_head != "auto"
                                           else (expand or 2) * hidden)  # Falcon-H1's "auto": d_inner / heads
        # Nemotron-H (Nemotron-3-Nano: expand 2 · 2688 = 5376, but 64 heads · 64 = 4096): transformers' mixer
        # and vLLM's both take heads · head_dim and never read `expand`, so neither does kvcalc
        by_heads = f.raw("model_type") == "nemotron_h" and d_head != "auto"
        if not by_heads and f.int("mamba_d_ssm") is None and expand is not None and expand * hidden != d_inner:
            raise f.error(f"{expand_key} {expand} · hidden_size {hidden} = {expand * hidden} is not the Mamba inner "
                          f"width {mamba_heads} heads · {d_inner // mamba_heads} = {d_inner}; fix one")
        chunk, chunk_from = _mamba_chunk(f)
        return RecurrentState(
            "mamba2", conv, ssm, d_inner=d_inner, heads=mamba_heads, head_dim=d_inner // mamba_heads,
            d_state=f.required_int("ssm_state_size", "mamba_d_state", "state_size"),
            n_groups=0 if len(head_keys) > 3 else f.int("n_groups", "mamba_n_groups", "mamba_ngroups") or 1,
            d_conv=f.required_int("conv_kernel", "mamba_d_conv"), chunk=chunk, chunk_from=chunk_from,
        )
    if linear_heads is not None:
        return RecurrentState(
            "gated_deltanet", conv, ssm, heads=linear_heads, head_dim=f.required_int("linear_value_head_dim"),
            k_heads=f.required_int("linear_num_key_heads"), k_dim=f.required_int("linear_key_head_dim"),
            d_conv=f.required_int("linear_conv_kernel_dim"),
        )
    if mamba1 is not None:
        dt_rank = f.raw("mamba_dt_rank")
        return RecurrentState(
            "mamba1", conv, ssm, d_inner=mamba1 * hidden, d_state=f.required_int("mamba_d_state"),
            d_conv=f.required_int("mamba_d_conv"), dt_rank=-(-hidden // 16) if dt_rank in (None, "auto") else dt_rank,
        )
    return None


def _mamba_chunk(f: ConfigFields) -> tuple[int, str]:
    """(the Mamba-2 scan chunk, "" or where it came from when the file gives none); 0: unknown (_CHUNK_DEFAULTS)."""
    chunk = f.int("mamba_chunk_size", "chunk_size")  # vLLM's order: mamba_chunk_size wins
    if chunk is not None:
        return chunk, ""
    default = _CHUNK_DEFAULTS.get(str(f.raw("model_type")))
    if default is None:
        return 0, ""
    cls, key, value = default
    return value, f"the config gives neither mamba_chunk_size nor chunk_size: transformers' {cls} default {key} {value}"
