"""Model KV specs: the per-token, per-layer shape of the KV cache (equation 1 of DESIGN.md).

    M_KV = 2 · L · n · h_KV · d_h · b

A spec knows what one token costs in each layer; sizes are computed in bits and returned as exact
integers, so int4 (half a byte) and 10^12-token contexts stay exact (Python ints, no float, no int64).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """The dimensions that decide KV size (and, for `sim`, weights and FLOPs).

    `sliding_window` applies to `num_sliding_layers` of the `layers` (all of them for Mistral-7B-v0.1,
    every other one for Gemma-2). MLA (DeepSeek-V2/V3) caches one latent of
    `kv_lora_rank + qk_rope_head_dim` scalars per token per layer, with no factor 2 and no KV heads.
    """

    name: str
    layers: int
    num_attention_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    max_position_embeddings: int
    intermediate_size: int | None = None
    vocab_size: int | None = None
    num_params: int | None = None
    sliding_window: int | None = None
    num_sliding_layers: int = 0
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("layers", "num_attention_heads", "kv_heads", "head_dim", "hidden_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
        if not 0 <= self.num_sliding_layers <= self.layers:
            raise ValueError(
                f"model {self.name!r}: num_sliding_layers={self.num_sliding_layers} is outside 0..{self.layers}"
            )
        if self.num_sliding_layers and not self.sliding_window:
            raise ValueError(f"model {self.name!r}: sliding layers need a positive sliding_window")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"model {self.name!r}: sliding_window must be positive, got {self.sliding_window}")
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError(f"model {self.name!r}: MLA needs both kv_lora_rank and qk_rope_head_dim")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def attention(self) -> str:
        """'mla', 'mqa' (one KV head), 'mha' (KV heads = query heads) or 'gqa'."""
        if self.is_mla:
            return "mla"
        if self.kv_heads == 1 and self.num_attention_heads > 1:
            return "mqa"
        if self.kv_heads == self.num_attention_heads:
            return "mha"
        return "gqa"

    @property
    def scalars_per_token_per_layer(self) -> int:
        """K and V of every KV head (2 · h_KV · d_h), or the MLA latent (kv_lora_rank + rope dim)."""
        if self.is_mla:
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim

    @property
    def num_global_layers(self) -> int:
        return self.layers - self.num_sliding_layers

    def layer_tokens(self, tokens: int) -> int:
        """Σ over layers of the tokens each layer holds for a context of `tokens` (windows cap it)."""
        held_by_sliding = min(tokens, self.sliding_window) if self.num_sliding_layers else 0
        return self.num_global_layers * tokens + self.num_sliding_layers * held_by_sliding

    def kv_bits(self, tokens: int, dtype_bits: int) -> int:
        """Exact KV bits of one sequence of `tokens` tokens on one (unsplit) replica."""
        return self.layer_tokens(tokens) * self.scalars_per_token_per_layer * dtype_bits

    def kv_bytes(self, tokens: int, dtype_bits: int) -> int:
        """Exact KV bytes of one sequence; raises if int4 leaves half a byte over (odd scalar count)."""
        bits = self.kv_bits(tokens, dtype_bits)
        if bits % 8:
            raise ValueError(f"{bits} bits is not a whole number of bytes; use kv_bits")
        return bits // 8

    def bytes_per_token(self, dtype_bits: int) -> int:
        """KV bytes of one token in every layer, for a context within every window (eq. 1 with n = 1)."""
        return self.layers * self.scalars_per_token_per_layer * dtype_bits // 8


# Built-in presets, from each model's published config.json (cited per entry).
PRESETS: dict[str, ModelSpec] = {}


def _preset(spec: ModelSpec) -> None:
    PRESETS[spec.name.lower()] = spec


# huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json: 32 layers, 32 heads, 8 KV heads,
# hidden 4096 (head_dim 128), intermediate 14336, vocab 128256, max_position_embeddings 8192; 8.03B params.
_preset(
    ModelSpec(
        name="Llama-3-8B", layers=32, num_attention_heads=32, kv_heads=8, head_dim=128, hidden_size=4096,
        intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192, num_params=8_030_261_248,
        source="meta-llama/Meta-Llama-3-8B config.json",
    )
)
# huggingface.co/facebook/opt-13b/blob/main/config.json: 40 layers, 40 heads, hidden 5120 (head_dim 128),
# ffn_dim 20480, vocab 50272, max_position_embeddings 2048; 12.85B params.
_preset(
    ModelSpec(
        name="OPT-13B", layers=40, num_attention_heads=40, kv_heads=40, head_dim=128, hidden_size=5120,
        intermediate_size=20480, vocab_size=50272, max_position_embeddings=2048, num_params=12_853_473_280,
        source="facebook/opt-13b config.json",
    )
)


def get_preset(name: str) -> ModelSpec:
    """Case-insensitive lookup; an unknown name raises ValueError naming the closest presets."""
    spec = PRESETS.get(name.strip().lower())
    if spec is None:
        import difflib

        names = [s.name for s in PRESETS.values()]
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.3) or names[:5]
        raise ValueError(f"unknown model {name!r}: did you mean {', '.join(close)}? (kvcalc size lists all)")
    return spec
