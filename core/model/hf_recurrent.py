"""Pure recurrent models: no KV cache at all, a constant state per sequence in every layer.

Fields by model_type (transformers' config classes; the state shapes are state.py's, after vLLM):

* `mamba` / `falcon_mamba` (Mamba-1): `hidden_size`, `num_hidden_layers`, `expand` (d_inner = expand ·
  hidden, or `intermediate_size` when given), `state_size`, `conv_kernel`;
* `mamba2` (Mamba-2, e.g. Mamba-Codestral): `num_heads` · `head_dim` is the inner width (transformers' and
  vLLM's mixer), `state_size`, `n_groups`, `conv_kernel`; `expand` · hidden_size must agree with it;
* `rwkv` (RWKV-4): `hidden_size`, `num_hidden_layers`; no attention heads at all.

The conv / token-shift state is kept in the model dtype (`torch_dtype`); the SSM state in
`mamba_ssm_cache_dtype` when the config names one, else the model dtype (vLLM's "auto"); RWKV's wkv state
is float32 whatever the model dtype (transformers' RwkvModel).
"""

from __future__ import annotations

from .hf_fields import ConfigFields
from .hf_groups import max_positions, state_dtypes, tied, weight_dtype
from .layers import FfnGroup, LayerGroup
from .model_spec import ModelSpec
from .state import RecurrentState


def recurrent_spec(f: ConfigFields, name: str) -> ModelSpec:
    """The ModelSpec of a pure recurrent config (see the module docstring)."""
    model_type = f.raw("model_type")
    n = f.required_int("num_hidden_layers", "n_layer", fix="add it to the file or give {layers}",
                       param="layers")
    hidden = f.required_int("hidden_size", "d_model")
    notes: list[str] = []
    conv, ssm = state_dtypes(f, notes)
    if model_type == "rwkv":
        # transformers' RwkvModel: five [hidden] vectors per layer, the first two in the model dtype
        state = RecurrentState("rwkv", conv, "fp32", d_inner=hidden)
        f.raw("attention_hidden_size")  # the attention's inner width; the cached vectors are hidden_size wide
        ffn = f.int("intermediate_size") or 4 * hidden
        ffn_groups: tuple[FfnGroup, ...] = (FfnGroup(n, ffn, gated=False),)
    elif model_type == "mamba2":
        heads, head_dim = f.required_int("num_heads"), f.required_int("head_dim")
        expand = f.int("expand")
        if expand is not None and expand * hidden != heads * head_dim:
            raise f.error(f"expand {expand} · hidden_size {hidden} = {expand * hidden} is not num_heads {heads} · "
                          f"head_dim {head_dim} = {heads * head_dim}, the Mamba-2 inner width; fix one")
        state = RecurrentState("mamba2", conv, ssm, d_inner=heads * head_dim, heads=heads, head_dim=head_dim,
                               d_state=f.required_int("state_size"), n_groups=f.int("n_groups") or 1,
                               d_conv=f.required_int("conv_kernel"))
        ffn_groups = (FfnGroup(n),)  # no MLP: the mixer is the whole layer
    else:  # mamba, falcon_mamba
        d_inner = f.int("intermediate_size") or (f.int("expand") or 2) * hidden
        rank = f.raw("time_step_rank")
        state = RecurrentState("mamba1", conv, ssm, d_inner=d_inner, d_state=f.required_int("state_size"),
                               d_conv=f.required_int("conv_kernel"),
                               dt_rank=-(-hidden // 16) if rank in (None, "auto") else rank)
        ffn_groups = (FfnGroup(n),)  # no MLP: the mixer is the whole layer
    group = LayerGroup("none", n, note=state.kind, state=state)
    return ModelSpec.from_groups(
        name, (group,), hidden_size=hidden, max_position_embeddings=max_positions(f),
        vocab_size=f.int("vocab_size"), ffn_groups=ffn_groups, tie_word_embeddings=tied(f),
        weight_dtype=weight_dtype(f), source=f"{f.source} (no layer keeps KV: a {state.kind} state per sequence)",
        notes=tuple(notes),
    )
