"""A model's KV cache, layer by layer, and equation 1 as one sum over those layers.

A model is a list of layer groups: equal layers, counted once. Each has a kind:

    full     full attention: every token of the sequence, K and V of each KV head
    sliding  sliding-window attention: at most the last W tokens (`window`)
    chunked  chunked local attention (Llama-4): at most one chunk of C tokens (`window`)
    mla      multi-head latent attention (DeepSeek): one latent of kv_lora_rank + rope dim per token, no factor 2
    none     no KV: a recurrent layer (Mamba, linear attention: a constant `state` per sequence instead),
             a no-op or MLP-only layer, or a layer that reuses another layer's KV

Equation 1, for one sequence of n tokens on one of `tp` GPUs, b bits per scalar:

    M_KV(n) = Σ_layers held(n) · (s · b + x)   held(n) = n (full, mla), min(n, W) (sliding), 0 (none),
                                              n − C · ⌊(n − 1) / C⌋ (chunked: the current chunk, at most C)
                                              s = h_KV,gpu · (d_K + d_V)   (mla: kv_lora_rank + rope dim)
                                              x = a sparse-attention indexer's bits per token (usually 0)

plus, per sequence, Σ_layers state bits. Everything is an exact integer of bits. The one rounding rule for
sub-byte precisions (int4 is half a byte): a quantity is summed exactly in bits and its byte count is those
bits rounded up to whole bytes, once, for the whole quantity reported (never per layer or per token).

Tensor parallelism splits each layer by its own KV heads: with h_KV ≥ tp, tp must divide h_KV; with
h_KV < tp each GPU holds one head and each head is replicated, so tp must be a multiple of h_KV. MLA's
latent is not split by heads: every GPU holds all of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..blocks import ceil_div
from ..errors import ParameterError
from ..units import format_int_short
from .state import RecurrentState

# The largest tensor-parallel size kvcalc takes, for every command (size, frag, share, sim, plan): 1,024 GPUs in
# one tensor-parallel group is well past any real deployment (8 per node; 72 per NVL72 rack) and past the 128
# attention heads of the largest real models (vLLM needs tp to divide them), yet a bound that keeps every
# per-GPU count exact in the step-time and memory arithmetic. One value, read by every check.
MAX_TP = 1024


def check_tp(tp: int) -> int:
    """`tp` if it is a tensor-parallel size kvcalc takes (1..MAX_TP), else a ParameterError naming it."""
    if tp <= 0:
        raise ParameterError(f"tp must be a positive number of GPUs, got {tp}", "tp")
    if tp > MAX_TP:
        raise ParameterError(f"{{tp}} {format_int_short(tp)} is above its limit of {MAX_TP:,} GPUs, the largest "
                             f"tensor-parallel size kvcalc takes; give {{tp}} {MAX_TP} or fewer", "tp")
    return tp


KINDS = ("full", "sliding", "chunked", "mla", "none")
# A layer that keeps no KV and whose recurrent state the config does not describe.
UNKNOWN_STATE_NOTE = "linear attention or state-space"


def bits_to_bytes(bits: int) -> int:
    """Whole bytes that hold `bits`: the one rounding rule (up; only int4 can leave half a byte)."""
    return ceil_div(bits, 8)


@dataclass(frozen=True)
class LayerGroup:
    """`count` equal layers. KV fields are 0 for kind none; `window` is W (sliding) or C (chunked).

    `k_head_dim` is the key (and query) head width; for MLA it is nope + rope (the query/key heads), while
    the cache holds `kv_lora_rank + rope_dim`. `q_heads`, `q_lora_rank`, `gated_query` (a query projection
    twice as wide, Qwen3.5's attn_output_gate) and `k_eq_v` (no V projection, Gemma-4) size only weights.
    `note` says what a layer without KV is ("mamba2", "no-op", "KV shared") or where a group came from.
    `indexer_bytes`: bytes per token of a sparse-attention indexer's key cache kept beside the KV (DeepSeek
    sparse attention), in its own fixed precision whatever the KV's, and whole on every GPU under TP.
    `beside_attention`: these are the recurrent halves of layers that an attention group also counts (Falcon-H1
    runs attention and Mamba side by side in every layer), so they add no layers to the model.
    `vllm_window`: full layers whose config window W is no shorter than the model's positions (Phi-4-mini,
    Phi-3.5-MoE): no token ever leaves it, so they page as full attention, but vLLM still registers them as a
    sliding window of W, whose worst case counts one block more per request (gpu_plan's max concurrency).
    """

    kind: str
    count: int
    kv_heads: int = 0
    k_head_dim: int = 0
    v_head_dim: int = 0
    window: int | None = None
    kv_lora_rank: int = 0
    rope_dim: int = 0
    state: RecurrentState | None = None
    q_heads: int = 0
    q_lora_rank: int = 0
    gated_query: bool = False
    k_eq_v: bool = False
    note: str = ""
    indexer_bytes: int = 0
    beside_attention: bool = False
    vllm_window: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown layer kind {self.kind!r}: choose one of {', '.join(KINDS)}")
        if not isinstance(self.count, int) or self.count <= 0:
            raise ValueError(f"a layer group needs a positive layer count, got {self.count!r}")
        if self.kind in ("sliding", "chunked"):
            if not isinstance(self.window, int) or self.window <= 0:
                raise ValueError(f"{self.kind} layers need a positive window, got {self.window!r}")
        elif self.window is not None:
            raise ValueError(f"{self.kind} layers have no window, got {self.window!r}")
        if self.kind == "mla":
            if self.kv_lora_rank <= 0 or self.rope_dim <= 0:
                raise ValueError("MLA layers need a positive kv_lora_rank and qk_rope_head_dim")
        elif self.kind != "none":
            for name in ("kv_heads", "k_head_dim", "v_head_dim"):
                if getattr(self, name) <= 0:
                    raise ValueError(f"{self.kind} attention layers need a positive {name}, got {getattr(self, name)}")
        if self.kind != "none" and self.state is not None:
            raise ValueError("a layer keeps either KV or a recurrent state; give a hybrid layer as two groups")

    @property
    def keeps_kv(self) -> bool:
        return self.kind != "none"

    def tokens_held(self, tokens: int) -> int:
        """Tokens of a `tokens`-token sequence this layer holds."""
        if self.kind in ("full", "mla"):
            return tokens
        if self.kind == "sliding":
            assert self.window is not None
            return min(tokens, self.window)
        if self.kind == "chunked":  # the last token's chunk, which starts at C · floor((n − 1) / C)
            assert self.window is not None
            return tokens - self.window * ((tokens - 1) // self.window) if tokens > 0 else 0
        return 0

    def kv_heads_per_gpu(self, tp: int, where: str = "these layers") -> int:
        """KV heads of this layer on one of `tp` GPUs (the replication rule); MLA: the whole latent (1).

        `where` names the layers in the error (the model, and which of its layers).
        """
        check_tp(tp)
        if self.kind == "mla":
            return 1
        if not self.keeps_kv or tp == 1:
            return self.kv_heads
        heads = self.kv_heads
        if tp <= heads:
            if heads % tp:
                divisors = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
                raise ParameterError(
                    f"tp {tp} does not divide the {heads} KV heads of {where}: use a tp that divides "
                    f"{heads} ({divisors}) or a multiple of {heads}", "tp"
                )
            return heads // tp
        if tp % heads:
            raise ParameterError(
                f"tp {tp} is above the {heads} KV heads of {where} but not a multiple of {heads}, so the "
                f"heads cannot be replicated evenly: use a multiple of {heads} ({heads * 2}, {heads * 4}, ...) "
                f"or a divisor of {heads}", "tp"
            )
        return 1

    def scalars_per_token(self, tp: int = 1) -> int:
        """Cached scalars of one token in one layer on one GPU: h_KV,gpu · (d_K + d_V), or the MLA latent."""
        if self.kind == "mla":
            return self.kv_lora_rank + self.rope_dim
        return self.kv_heads_per_gpu(tp) * (self.k_head_dim + self.v_head_dim)

    def bits_per_token(self, dtype_bits: int, tp: int = 1) -> int:
        """Bits one token costs in one layer on one GPU: its cached scalars at `dtype_bits`, and an indexer.

        A `KvBits` precision pages more than its scalars (core/dtypes.py): per-token-head scales add 2 · 32
        bits per KV head; nvfp4 stores d//2 + d//16 bytes per head for K and for V; fp8_ds_mla 656 B per
        MLA token. A format vLLM does not page for this kind of layer is a ParameterError naming dtype."""
        layout = getattr(dtype_bits, "layout", None)
        indexer = 8 * self.indexer_bytes
        if layout is None:
            return self.scalars_per_token(tp) * dtype_bits + indexer
        name = getattr(dtype_bits, "name", layout)
        if layout == "fp8_ds_mla":
            if self.kind != "mla" or (self.kv_lora_rank, self.rope_dim) != (512, 64) or not self.indexer_bytes:
                what = "dense MLA (no sparse-attention indexer)" if self.kind == "mla" else f"{self.kind} layers"
                raise ParameterError(f"dtype {name!r} is the page of vLLM's sparse-MLA backend (DeepSeek sparse "
                                     f"attention, a 512 + 64 latent); these are {what}: use fp8 or bf16", "dtype")
            return 656 * 8 + indexer
        if self.kind == "mla":
            raise ParameterError(f"dtype {name!r}: vLLM pages an MLA latent in the model's own precision, fp8 or "
                                 f"fp8_ds_mla, not {name}; choose one of those", "dtype")
        heads = self.kv_heads_per_gpu(tp)
        if layout == "per_token_head":
            return heads * (self.k_head_dim + self.v_head_dim) * 8 + heads * 2 * 32 + indexer
        assert layout == "nvfp4", layout
        if self.kind != "full":  # vLLM packs nvfp4 in FullAttentionSpec only; its sliding / chunked specs do not
            raise ParameterError(f"dtype {name!r}: vLLM packs nvfp4 pages for full-attention layers only, and "
                                 f"these are {self.kind} layers; use fp8 or fp8_per_token_head", "dtype")
        packed = sum(d // 2 + d // 16 for d in (self.k_head_dim, self.v_head_dim))
        return heads * packed * 8 + indexer

    def state_bits(self, tp: int = 1) -> int:
        """Bits of one sequence's recurrent state in one layer on one GPU (0 without a state)."""
        return 0 if self.state is None else self.state.bits(tp)


def kv_bits(groups: Iterable[LayerGroup], tokens: int, dtype_bits: int, tp: int = 1) -> int:
    """Equation 1: exact KV bits of one `tokens`-token sequence on one of `tp` GPUs, the sum over layers."""
    return sum(g.count * g.tokens_held(tokens) * g.bits_per_token(dtype_bits, tp) for g in groups if g.keeps_kv)


def state_bits(groups: Iterable[LayerGroup], tp: int = 1) -> int:
    """Exact bits of one sequence's recurrent state in every layer, on one of `tp` GPUs."""
    return sum(g.count * g.state_bits(tp) for g in groups)


def window_terms(groups: Iterable[LayerGroup], dtype_bits: int, tp: int = 1) -> dict[int | None, int]:
    """{window (None: every token held): bits of one held token, summed over the layers with that window}.

    The same sum as `kv_bits`, grouped by how many tokens a layer holds, for callers that apply
    held(n) = min(n, window) to many lengths at once: kv_bits(n) = Σ_w bits_w · held_w(n) for sliding windows;
    a chunked layer holds only its current chunk (`tokens_held`), so for it min(n, C) is an upper bound.
    """
    terms: dict[int | None, int] = {}
    for g in groups:
        if g.keeps_kv:
            terms[g.window] = terms.get(g.window, 0) + g.count * g.bits_per_token(dtype_bits, tp)
    return terms


@dataclass(frozen=True)
class FfnGroup:
    """The MLP / MoE blocks of `count` layers, for the weight estimate (core/model/weights.py).

    `dense_intermediate`: width of the MLP every token passes through (a dense MLP, or the shared experts
    of a MoE layer together, or Gemma-4's dense MLP beside its experts); `experts` routed experts of
    `expert_intermediate` each, `experts_per_token` of them per token; `gated`: three matrices (SwiGLU /
    GeGLU) rather than two (up, down). A layer without an MLP (Nemotron-H's Mamba and attention blocks)
    has `dense_intermediate` 0 and no experts.
    """

    count: int
    dense_intermediate: int = 0
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    gated: bool = True

    def __post_init__(self) -> None:
        if self.count <= 0:
            raise ValueError(f"an FFN group needs a positive layer count, got {self.count}")
        if (self.experts == 0) != (self.experts_per_token == 0) or self.experts_per_token > self.experts:
            raise ValueError(f"MoE needs 0 < experts_per_token <= experts, got {self.experts_per_token} of "
                             f"{self.experts}")
