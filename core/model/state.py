"""The constant per-sequence state of recurrent layers (Mamba, linear attention), and how TP splits it.

A recurrent layer keeps no KV cache: whatever the context length, one sequence holds a fixed state in each
such layer. Its shapes follow the engines that serve these models (vLLM's state-shape calculator, which
mirrors the models' own caches), per GPU of `tp`:

    mamba1 (Jamba)         conv [d_inner/tp, d_conv − 1]            ssm [d_inner/tp, d_state]
    mamba2 (Nemotron-H)    conv [d_conv − 1, d_inner/tp + 2·g·d_state]   ssm [heads/tp, head_dim, d_state]
    gated_deltanet (Qwen3-Next, Qwen3.5)
                           conv [d_conv − 1, (2·k_heads·k_dim + v_heads·v_dim)/tp]
                           recurrent [v_heads/tp, k_dim, v_dim]
    lightning (MiniMax)    recurrent [heads/tp, head_dim, head_dim]
    kda (Kimi-Linear)      conv q, k, v 3 × [d_conv − 1, heads/tp · head_dim]
                           recurrent [heads/tp, head_dim, head_dim]
    short_conv (LFM2)      conv [d_conv − 1, d_inner/tp]
    rwkv (RWKV-4)          token shift 2 × [hidden] in the model dtype; wkv (numerator, denominator,
                           running max) 3 × [hidden] in float32 (transformers' RwkvModel); no TP split

`g` is the Mamba-2 group count on one GPU: n_groups/tp when tp divides it, else 1 (the groups are
replicated so that each head shard has its group, as vLLM does), which needs tp to be a multiple of n_groups.

The conv state is kept in `conv_dtype` and the SSM / recurrent state in `ssm_dtype` (the config's
`mamba_ssm_dtype` / `mamba_ssm_cache_dtype`; how the reader chooses is in hf_config).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import dtype_bits
from ..errors import ParameterError

STATE_KINDS = ("mamba1", "mamba2", "gated_deltanet", "lightning", "kda", "short_conv", "rwkv")


@dataclass(frozen=True)
class RecurrentState:
    """The state one sequence keeps in one recurrent layer. Dims not used by `kind` stay 0.

    mamba1 / short_conv: d_inner, d_conv (and d_state for mamba1); mamba2: d_inner, d_conv, d_state,
    heads, head_dim, n_groups; gated_deltanet: d_conv, heads (value heads), head_dim (value dim),
    k_heads, k_dim; lightning: heads, head_dim; kda: heads, head_dim, d_conv; rwkv: d_inner (hidden_size;
    conv_dtype for the two token-shift vectors, ssm_dtype for the three wkv vectors).
    """

    kind: str
    conv_dtype: str
    ssm_dtype: str
    d_inner: int = 0
    d_conv: int = 0
    d_state: int = 0
    heads: int = 0
    head_dim: int = 0
    n_groups: int = 0
    k_heads: int = 0
    k_dim: int = 0
    dt_rank: int = 0  # mamba1 only: the rank of the dt projection (weights, not state)
    chunk: int = 0  # mamba2: the scan kernel's chunk (config chunk_size); mamba_cache_mode all aligns to it; 0 unknown
    chunk_from: str = ""  # where `chunk` came from when the config.json gives none (a transformers class default)

    def __post_init__(self) -> None:
        if self.kind not in STATE_KINDS:
            raise ValueError(f"unknown recurrent state kind {self.kind!r}: choose one of {', '.join(STATE_KINDS)}")
        dtype_bits(self.conv_dtype)  # an unknown dtype name is refused here, not when sizing
        dtype_bits(self.ssm_dtype)

    def tensors(self, tp: int = 1) -> tuple[tuple[str, int, int], ...]:
        """(name, scalars, bits per scalar) of each state tensor of one sequence on one of `tp` GPUs."""
        conv_bits, ssm_bits = dtype_bits(self.conv_dtype), dtype_bits(self.ssm_dtype)
        if self.kind == "mamba1":
            d_inner = _split(self.d_inner, tp, "the Mamba inner width (mamba_expand · hidden_size)")
            return ("conv", d_inner * (self.d_conv - 1), conv_bits), ("ssm", d_inner * self.d_state, ssm_bits)
        if self.kind == "mamba2":
            heads = _split(self.heads, tp, "the Mamba heads")
            d_inner = _split(self.d_inner, tp, "the Mamba inner width")
            groups = _groups_per_gpu(self.n_groups, tp)
            conv = (self.d_conv - 1) * (d_inner + 2 * groups * self.d_state)
            return ("conv", conv, conv_bits), ("ssm", heads * self.head_dim * self.d_state, ssm_bits)
        if self.kind == "gated_deltanet":
            v_heads = _split(self.heads, tp, "the linear-attention value heads")
            k_heads = _split(self.k_heads, tp, "the linear-attention key heads")
            conv = (self.d_conv - 1) * (2 * k_heads * self.k_dim + v_heads * self.head_dim)
            return ("conv", conv, conv_bits), ("recurrent", v_heads * self.k_dim * self.head_dim, ssm_bits)
        if self.kind in ("lightning", "kda"):
            heads = _split(self.heads, tp, "the linear-attention heads")
            recurrent = ("recurrent", heads * self.head_dim * self.head_dim, ssm_bits)
            if self.kind == "lightning":
                return (recurrent,)
            return ("conv", 3 * (self.d_conv - 1) * heads * self.head_dim, conv_bits), recurrent
        if self.kind == "rwkv":
            if tp != 1:
                raise ParameterError(f"tp {tp}: RWKV-4 has no tensor-parallel split in transformers (and vLLM does not "
                                     "serve it), so its state per GPU is not defined; use tp 1", "tp")
            return ("token_shift", 2 * self.d_inner, conv_bits), ("wkv", 3 * self.d_inner, ssm_bits)
        d_inner = _split(self.d_inner, tp, "the short-convolution width")
        return (("conv", d_inner * (self.d_conv - 1), conv_bits),)

    def bits(self, tp: int = 1) -> int:
        """Exact bits of one sequence's state in one such layer on one GPU."""
        return sum(scalars * bits for _, scalars, bits in self.tensors(tp))

    def describe(self) -> str:
        """'mamba2 state (conv bf16, ssm fp32)', for the layer table: the dtype of each tensor it has."""
        names = [name for name, _, _ in self.tensors()]
        dtypes = {name: self.conv_dtype if name in ("conv", "token_shift") else self.ssm_dtype for name in names}
        if len(set(dtypes.values())) == 1:
            text = next(iter(dtypes.values()))
        else:
            text = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
        return f"{self.kind.replace('_', ' ')} state ({text})"


def _split(n: int, tp: int, what: str) -> int:
    if n % tp:
        raise ParameterError(f"tp {tp} does not divide {what} ({n}): use a tp that divides {n}", "tp")
    return n // tp


def _groups_per_gpu(n_groups: int, tp: int) -> int:
    if n_groups % tp == 0:
        return n_groups // tp
    if tp % n_groups == 0:
        return 1  # replicated: each head shard keeps the group its heads read
    raise ParameterError(
        f"tp {tp} neither divides the {n_groups} Mamba groups (n_groups) nor is a multiple of them: "
        f"use a tp that divides {n_groups} or a multiple of it", "tp"
    )
