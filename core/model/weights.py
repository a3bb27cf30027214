"""Parameters from dimensions, for the memory plan of `sim` and `size --gpu` when no count is known.

    total  = embeddings + Σ_layers (attention or recurrent mixer + MLP / MoE + norms)
    active = total − the routed experts a token does not pick (experts − experts_per_token per MoE layer)

Per layer, from its layer group (core/model/layers.py) and its FFN group:

* attention: Q hidden·h_q·d_K (twice as wide with a query gate), K hidden·h_KV·d_K, V hidden·h_KV·d_V (none
  when K = V), O h_q·d_V·hidden; MLA: q_a hidden·q_lora + q_b q_lora·h_q·d_K (or hidden·h_q·d_K without
  q_lora), kv_a hidden·(kv_lora_rank + rope), kv_b kv_lora_rank·h_q·(d_K − rope + d_V), O h_q·d_V·hidden;
* Mamba-2: in_proj hidden·(2·d_inner + 2·g·d_state + heads), conv (d_inner + 2·g·d_state)·d_conv,
  out_proj d_inner·hidden; Mamba-1: in_proj hidden·2·d_inner, conv d_inner·d_conv, x_proj
  d_inner·(dt_rank + 2·d_state), dt_proj dt_rank·d_inner, A d_inner·d_state, out_proj d_inner·hidden;
  Gated DeltaNet: in_proj hidden·(2·k_heads·k_dim + 2·v_heads·v_dim + 2·v_heads), conv (2·k_heads·k_dim +
  v_heads·v_dim)·d_conv, out_proj v_heads·v_dim·hidden; lightning attention and Kimi Delta Attention:
  q, k, v and gate hidden·4·h·d, out h·d·hidden; short conv: in_proj hidden·3·d, conv d·d_conv, out d·hidden;
* MLP: (3 gated, else 2)·hidden·intermediate; MoE: routed experts of their own width, a router
  hidden·experts, the dense / shared part of `dense_intermediate`;
* embeddings vocab·hidden, twice unless tied.

Biases, norms and small per-head vectors are left out (well under 1 % of any model here); it is an estimate
and says so. Checked against published parameter counts in tests/core/model/test_weights.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from .layers import FfnGroup, LayerGroup
from .model_spec import ModelSpec
from .state import RecurrentState


@dataclass(frozen=True)
class ParamCount:
    total: int
    active: int
    estimated: bool  # True when counted from dimensions here, False when the spec carries the counts


def param_count(spec: ModelSpec) -> ParamCount:
    """The spec's own counts when it has them, else the estimate from dimensions (ValueError if it lacks them)."""
    if spec.num_params:
        return ParamCount(spec.num_params, spec.num_active_params or spec.num_params, estimated=False)
    return estimate_params(spec)


def estimate_params(spec: ModelSpec) -> ParamCount:
    """Total and active parameters from the spec's dimensions (see the module docstring)."""
    if spec.vocab_size is None:
        raise ValueError(f"model {spec.name!r} has no vocab_size to count its embeddings: give --weights-bytes")
    hidden = spec.hidden_size
    mixer = sum(g.count * _mixer_params(g, hidden) for g in spec.layer_groups)
    ffn_groups = spec.ffn_groups or _default_ffn(spec)
    ffn_total = sum(f.count * _ffn_params(f, hidden, f.experts) for f in ffn_groups)
    ffn_active = sum(f.count * _ffn_params(f, hidden, f.experts_per_token) for f in ffn_groups)
    embeddings = spec.vocab_size * hidden * (1 if spec.tie_word_embeddings else 2)
    total = embeddings + mixer + ffn_total
    return ParamCount(total, embeddings + mixer + ffn_active, estimated=True)


def _default_ffn(spec: ModelSpec) -> tuple[FfnGroup, ...]:
    """One gated MLP (or one MoE block of `intermediate_size` experts) in every layer."""
    if spec.intermediate_size is None:
        raise ValueError(
            f"model {spec.name!r} has no intermediate_size to count its MLP weights: give --weights-bytes"
        )
    if spec.num_experts:
        assert spec.experts_per_token is not None
        return (FfnGroup(spec.model_layers, experts=spec.num_experts, experts_per_token=spec.experts_per_token,
                         expert_intermediate=spec.intermediate_size),)
    return (FfnGroup(spec.model_layers, dense_intermediate=spec.intermediate_size),)


def _ffn_params(f: FfnGroup, hidden: int, experts: int) -> int:
    matrices = 3 if f.gated else 2
    routed = experts * matrices * hidden * f.expert_intermediate + (hidden * f.experts if f.experts else 0)
    return matrices * hidden * f.dense_intermediate + routed


def _mixer_params(g: LayerGroup, hidden: int) -> int:
    if g.state is not None:
        return _recurrent_params(g.state, hidden)
    if not g.keeps_kv or not g.q_heads:
        return 0  # no-op, MLP-only or KV-shared layers (a KV-shared layer's Q and O are counted with its group)
    out = g.q_heads * g.v_head_dim * hidden
    if g.kind == "mla":
        q = hidden * g.q_lora_rank + g.q_lora_rank * g.q_heads * g.k_head_dim if g.q_lora_rank else (
            hidden * g.q_heads * g.k_head_dim)
        kv = hidden * (g.kv_lora_rank + g.rope_dim) + g.kv_lora_rank * g.q_heads * (
            g.k_head_dim - g.rope_dim + g.v_head_dim)
        return q + kv + out
    q = hidden * g.q_heads * g.k_head_dim * (2 if g.gated_query else 1)
    k = hidden * g.kv_heads * g.k_head_dim
    v = 0 if g.k_eq_v else hidden * g.kv_heads * g.v_head_dim
    return q + k + v + out


def _recurrent_params(s: RecurrentState, hidden: int) -> int:
    if s.kind == "mamba2":
        conv_dim = s.d_inner + 2 * s.n_groups * s.d_state
        return hidden * (s.d_inner + conv_dim + s.heads) + conv_dim * s.d_conv + s.d_inner * hidden
    if s.kind == "mamba1":
        return (hidden * 2 * s.d_inner + s.d_inner * s.d_conv + s.d_inner * (s.dt_rank + 2 * s.d_state)
                + s.dt_rank * s.d_inner + s.d_inner * s.d_state + s.d_inner * hidden)
    if s.kind == "gated_deltanet":
        key_dim, value_dim = s.k_heads * s.k_dim, s.heads * s.head_dim
        return (hidden * (2 * key_dim + 2 * value_dim + 2 * s.heads) + (2 * key_dim + value_dim) * s.d_conv
                + value_dim * hidden)
    if s.kind in ("lightning", "kda"):
        return hidden * 4 * s.heads * s.head_dim + s.heads * s.head_dim * hidden
    return hidden * 3 * s.d_inner + s.d_inner * s.d_conv + s.d_inner * hidden  # short_conv
