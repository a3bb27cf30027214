"""Model KV specs: the per-token, per-layer shape of the KV cache (equation 1 of DESIGN.md).

    M_KV = 2 · L · n · h_KV · d_h · b

A spec knows what one token costs in each layer; sizes are computed in bits and returned as exact
integers, so int4 (half a byte) and 10^12-token contexts stay exact (Python ints, no float, no int64).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    """The dimensions that decide KV size (and, for `sim`, weights and FLOPs).

    `sliding_window` applies to `num_sliding_layers` of the `layers` (all of them for Mistral-7B-v0.1,
    every other one for Gemma-2). MLA (DeepSeek-V2/V3) caches one latent of
    `kv_lora_rank + qk_rope_head_dim` scalars per token per layer, with no factor 2 and no KV heads.
    For MLA `kv_heads` is 1 (the latent is the one cached "head", as vLLM counts it) and `head_dim` is the
    query/key head width; neither enters the cache size.
    `num_params` is the total parameter count (weights memory); `num_active_params` the parameters one
    token passes through (MoE: shared weights plus the routed experts; for FLOPs), counted like
    `num_params` (input embedding included); None when every parameter is active.
    `max_position_embeddings` is None when the config does not say (commands that need it say so).
    MoE: `num_experts` routed experts per MoE layer, `experts_per_token` of them per token (config.json
    `n_routed_experts` or `num_local_experts` or `num_experts`, and `num_experts_per_tok`); shared experts are
    always active and counted in `num_active_params`, not here. None for dense models.
    `layers` counts the layers that keep KV; a hybrid's other layers are `num_kv_free_layers`.
    """

    name: str
    layers: int
    num_attention_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    max_position_embeddings: int | None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    num_params: int | None = None
    num_active_params: int | None = None
    sliding_window: int | None = None
    num_sliding_layers: int = 0
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    num_experts: int | None = None
    experts_per_token: int | None = None
    num_kv_free_layers: int = 0  # hybrids: layers that keep no KV cache (linear attention, state space)
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("layers", "num_attention_heads", "kv_heads", "head_dim", "hidden_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
        for field in ("max_position_embeddings", "intermediate_size", "vocab_size", "num_params", "num_active_params",
                      "num_experts", "experts_per_token"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"model {self.name!r}: {field} must be a positive integer or None, got {value!r}")
        if (self.num_active_params or 0) > (self.num_params or self.num_active_params or 0):
            raise ValueError(f"model {self.name!r}: num_active_params exceeds num_params")
        if not isinstance(self.num_kv_free_layers, int) or self.num_kv_free_layers < 0:
            raise ValueError(f"model {self.name!r}: num_kv_free_layers must be >= 0, got {self.num_kv_free_layers!r}")
        if not 0 <= self.num_sliding_layers <= self.layers:
            raise ValueError(
                f"model {self.name!r}: num_sliding_layers={self.num_sliding_layers} is outside 0..{self.layers}"
            )
        if self.num_sliding_layers and not self.sliding_window:
            raise ValueError(f"model {self.name!r}: sliding layers need a positive sliding_window")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"model {self.name!r}: sliding_window must be positive, got {self.sliding_window}")
        if (self.num_experts is None) != (self.experts_per_token is None):
            raise ValueError(f"model {self.name!r}: MoE needs both num_experts and experts_per_token")
        if self.num_experts is not None and self.experts_per_token > self.num_experts:  # type: ignore[operator]
            raise ValueError(
                f"model {self.name!r}: experts_per_token {self.experts_per_token} exceeds "
                f"num_experts {self.num_experts}"
            )
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError(f"model {self.name!r}: MLA needs both kv_lora_rank and qk_rope_head_dim")
        if not self.is_mla and self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"model {self.name!r}: {self.num_attention_heads} query heads are not a multiple of "
                f"{self.kv_heads} KV heads; choose a KV head count that divides {self.num_attention_heads}"
            )

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

    @property
    def latent_dim(self) -> int | None:
        """MLA: scalars of the one cached latent per token per layer (kv_lora_rank + rope dim); else None."""
        if self.kv_lora_rank is None or self.qk_rope_head_dim is None:
            return None
        return self.kv_lora_rank + self.qk_rope_head_dim

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


# Built-in presets by lower-case name.
PRESETS: dict[str, ModelSpec] = {}


def _preset(spec: ModelSpec) -> None:
    PRESETS[spec.name.lower()] = spec


# Each entry: the numbers of the model's published config.json (huggingface.co/<repo>/blob/main/config.json).
# num_params is the total parameter count computed from those dimensions (embeddings, attention, MLP or
# experts, norms, biases, an untied lm_head where the model has one); each equals the total that the model
# card or the safetensors index reports. num_active_params (MoE only) counts what one token passes through.

# facebook/opt-13b: num_hidden_layers 40, num_attention_heads 40 (MHA), hidden_size 5120 (head_dim 128),
# ffn_dim 20480, vocab_size 50272, max_position_embeddings 2048. Params 12,853,473,280: layers
# 40 x 314,639,360 (q/k/v/out and fc1/fc2 with biases, 2 LayerNorms) + tokens 50272x5120 + 2050 learned
# positions x5120 + final LayerNorm; lm_head tied. vLLM paper: 800 KiB of KV per token at fp16.
_preset(ModelSpec(
    name="OPT-13B", layers=40, num_attention_heads=40, kv_heads=40, head_dim=128, hidden_size=5120,
    intermediate_size=20480, vocab_size=50272, max_position_embeddings=2048, num_params=12_853_473_280,
    source="facebook/opt-13b config.json",
))
# meta-llama/Llama-2-7b-hf: 32 layers, 32 heads, num_key_value_heads 32 (MHA), hidden 4096 (head_dim 128),
# intermediate 11008, vocab 32000, max_position_embeddings 4096. Params 6,738,415,616 (6.74B).
_preset(ModelSpec(
    name="Llama-2-7B", layers=32, num_attention_heads=32, kv_heads=32, head_dim=128, hidden_size=4096,
    intermediate_size=11008, vocab_size=32000, max_position_embeddings=4096, num_params=6_738_415_616,
    source="meta-llama/Llama-2-7b-hf config.json",
))
# meta-llama/Llama-2-70b-hf: 80 layers, 64 heads, 8 KV heads, hidden 8192 (head_dim 128), intermediate 28672,
# vocab 32000, max_position_embeddings 4096. Params 68,976,648,192 (69.0B).
_preset(ModelSpec(
    name="Llama-2-70B", layers=80, num_attention_heads=64, kv_heads=8, head_dim=128, hidden_size=8192,
    intermediate_size=28672, vocab_size=32000, max_position_embeddings=4096, num_params=68_976_648_192,
    source="meta-llama/Llama-2-70b-hf config.json",
))
# meta-llama/Meta-Llama-3-8B: 32 layers, 32 heads, 8 KV heads, hidden 4096 (head_dim 128), intermediate
# 14336, vocab 128256, max_position_embeddings 8192. Params 8,030,261,248 (8.03B). 128 KiB per token at bf16.
_preset(ModelSpec(
    name="Llama-3-8B", layers=32, num_attention_heads=32, kv_heads=8, head_dim=128, hidden_size=4096,
    intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192, num_params=8_030_261_248,
    source="meta-llama/Meta-Llama-3-8B config.json",
))
# meta-llama/Meta-Llama-3-70B: 80 layers, 64 heads, 8 KV heads, hidden 8192 (head_dim 128), intermediate
# 28672, vocab 128256, max_position_embeddings 8192. Params 70,553,706,496 (70.6B).
_preset(ModelSpec(
    name="Llama-3-70B", layers=80, num_attention_heads=64, kv_heads=8, head_dim=128, hidden_size=8192,
    intermediate_size=28672, vocab_size=128256, max_position_embeddings=8192, num_params=70_553_706_496,
    source="meta-llama/Meta-Llama-3-70B config.json",
))
# meta-llama/Llama-3.1-405B: 126 layers, 128 heads, 8 KV heads, hidden 16384 (head_dim 128), intermediate
# 53248, vocab 128256, max_position_embeddings 131072. Params 405,853,388,800 (405.9B).
_preset(ModelSpec(
    name="Llama-3.1-405B", layers=126, num_attention_heads=128, kv_heads=8, head_dim=128, hidden_size=16384,
    intermediate_size=53248, vocab_size=128256, max_position_embeddings=131072, num_params=405_853_388_800,
    source="meta-llama/Llama-3.1-405B config.json",
))
# mistralai/Mistral-7B-v0.1: 32 layers, 32 heads, 8 KV heads, hidden 4096 (head_dim 128), intermediate 14336,
# vocab 32000, max_position_embeddings 32768, sliding_window 4096 on every layer. Params 7,241,732,096.
_preset(ModelSpec(
    name="Mistral-7B-v0.1", layers=32, num_attention_heads=32, kv_heads=8, head_dim=128, hidden_size=4096,
    intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768, num_params=7_241_732_096,
    sliding_window=4096, num_sliding_layers=32, source="mistralai/Mistral-7B-v0.1 config.json",
))
# mistralai/Mixtral-8x7B-v0.1: 32 layers, 32 heads, 8 KV heads, hidden 4096 (head_dim 128), 8 experts of
# intermediate 14336, 2 per token (num_local_experts 8, num_experts_per_tok 2), vocab 32000,
# max_position_embeddings 32768, sliding_window null (no window; the first release said 4096, Mistral
# corrected it). Params 46,702,792,704 (46.7B); active
# 12,879,925,248 (12.9B: attention, 2 experts, router, norms, embeddings and lm_head).
_preset(ModelSpec(
    name="Mixtral-8x7B", layers=32, num_attention_heads=32, kv_heads=8, head_dim=128, hidden_size=4096,
    intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768, num_params=46_702_792_704,
    num_active_params=12_879_925_248, num_experts=8, experts_per_token=2,
    source="mistralai/Mixtral-8x7B-v0.1 config.json",
))
# Qwen/Qwen2.5-7B: 28 layers, 28 heads, 4 KV heads, hidden 3584 (head_dim 128), intermediate 18944, vocab
# 152064, max_position_embeddings 131072, sliding_window 131072 with use_sliding_window false (no window).
# Params 7,615,616,512 (7.61B; q/k/v biases, untied lm_head).
_preset(ModelSpec(
    name="Qwen2.5-7B", layers=28, num_attention_heads=28, kv_heads=4, head_dim=128, hidden_size=3584,
    intermediate_size=18944, vocab_size=152064, max_position_embeddings=131072, num_params=7_615_616_512,
    source="Qwen/Qwen2.5-7B config.json",
))
# Qwen/Qwen2.5-72B: 80 layers, 64 heads, 8 KV heads, hidden 8192 (head_dim 128), intermediate 29568, vocab
# 152064, max_position_embeddings 131072, use_sliding_window false. Params 72,706,203,648 (72.7B).
_preset(ModelSpec(
    name="Qwen2.5-72B", layers=80, num_attention_heads=64, kv_heads=8, head_dim=128, hidden_size=8192,
    intermediate_size=29568, vocab_size=152064, max_position_embeddings=131072, num_params=72_706_203_648,
    source="Qwen/Qwen2.5-72B config.json",
))
# Qwen/Qwen3-8B: 36 layers, 32 heads, 8 KV heads, head_dim 128, hidden 4096, intermediate 12288, vocab
# 151936, max_position_embeddings 40960, use_sliding_window false. Params 8,190,735,360 (8.19B).
_preset(ModelSpec(
    name="Qwen3-8B", layers=36, num_attention_heads=32, kv_heads=8, head_dim=128, hidden_size=4096,
    intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960, num_params=8_190_735_360,
    source="Qwen/Qwen3-8B config.json",
))
# Qwen/Qwen3-32B: 64 layers, 64 heads, 8 KV heads, head_dim 128 (not hidden/heads = 80), hidden 5120,
# intermediate 25600, vocab 151936, max_position_embeddings 40960. Params 32,762,123,264 (32.8B).
_preset(ModelSpec(
    name="Qwen3-32B", layers=64, num_attention_heads=64, kv_heads=8, head_dim=128, hidden_size=5120,
    intermediate_size=25600, vocab_size=151936, max_position_embeddings=40960, num_params=32_762_123_264,
    source="Qwen/Qwen3-32B config.json",
))
# tiiuae/falcon-7b: 32 layers, 71 heads, multi_query true (1 KV head), hidden 4544 (head_dim 64), MLP 4 x
# hidden = 18176, vocab 65024; the config gives no max_position_embeddings, the model card trains at 2048.
# Params 6,921,720,704 (6.92B; lm_head tied).
_preset(ModelSpec(
    name="Falcon-7B", layers=32, num_attention_heads=71, kv_heads=1, head_dim=64, hidden_size=4544,
    intermediate_size=18176, vocab_size=65024, max_position_embeddings=2048, num_params=6_921_720_704,
    source="tiiuae/falcon-7b config.json",
))
# google/gemma-2-9b: 42 layers, 16 heads, 8 KV heads, head_dim 256, hidden 3584, intermediate 14336, vocab
# 256000, max_position_embeddings 8192, sliding_window 4096 on every other layer (transformers' Gemma2
# slides on even layer indices: 21 of 42). Params 9,241,705,984 (9.24B; lm_head tied).
_preset(ModelSpec(
    name="Gemma-2-9B", layers=42, num_attention_heads=16, kv_heads=8, head_dim=256, hidden_size=3584,
    intermediate_size=14336, vocab_size=256000, max_position_embeddings=8192, num_params=9_241_705_984,
    sliding_window=4096, num_sliding_layers=21, source="google/gemma-2-9b config.json",
))
# deepseek-ai/DeepSeek-V3: 61 layers (first 3 dense, intermediate 18432; then MoE: 256 routed experts of
# 2048 + 1 shared, 8 per token: n_routed_experts 256, n_shared_experts 1, num_experts_per_tok 8), 128 heads,
# MLA with kv_lora_rank 512 + qk_rope_head_dim 64 (576 cached scalars per token per layer), qk_nope_head_dim
# 128 (q/k heads are 192 wide), hidden 7168, vocab 129280,
# max_position_embeddings 163840. The config's num_key_value_heads 128 is not the cache: like vLLM we
# count one cached "head" (the latent). Params 671,026,419,200 (671B, without the 14B multi-token-prediction
# module that the 685B checkpoint adds); active 37,552,297,472 (counted like num_params, i.e. with the
# 0.93B input embedding; DeepSeek's report says 36.6B, which leaves the embedding out).
_preset(ModelSpec(
    name="DeepSeek-V3", layers=61, num_attention_heads=128, kv_heads=1, head_dim=192, hidden_size=7168,
    intermediate_size=18432, vocab_size=129280, max_position_embeddings=163840, num_params=671_026_419_200,
    num_active_params=37_552_297_472, kv_lora_rank=512, qk_rope_head_dim=64, num_experts=256, experts_per_token=8,
    source="deepseek-ai/DeepSeek-V3 config.json",
))


def _key(name: str) -> str:
    """Lookup key: lower case, letters and digits only ('llama3-8b' and 'Llama-3-8B' meet)."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def get_preset(name: str) -> ModelSpec:
    """Case-insensitive lookup (punctuation ignored); an unknown name raises ValueError naming the closest."""
    spec = PRESETS.get(name.strip().lower())
    if spec is None:
        matches = [s for s in PRESETS.values() if _key(s.name) == _key(name)]
        if len(matches) == 1:
            return matches[0]
        import difflib

        by_key = {_key(s.name): s.name for s in PRESETS.values()}
        close = [by_key[k] for k in difflib.get_close_matches(_key(name), list(by_key), n=3, cutoff=0.5)]
        hint = f"did you mean {', '.join(close)}?" if close else f"choose one of {', '.join(by_key.values())}"
        raise ValueError(f"unknown model {name!r}: {hint} (kvcalc size lists them all)")
    return spec


def resolve_model(
    model: str | None,
    config: Path | str | None,
    layers: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
) -> ModelSpec | None:
    """The model of the shared options `--model`, `--config`, `--layers`, `--kv-heads`, `--head-dim`.

    A preset by name, or a config.json, or fully explicit dimensions (a spec named "custom", MHA: as
    many query heads as KV heads); explicit dimensions override a preset's or config's values. None when
    nothing was given. ValueError when both --model and --config are given, or explicit dimensions
    alone are incomplete.
    """
    if model is not None and config is not None:
        raise ValueError("give either --model or --config, not both")
    dims = {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim}
    for field, value in dims.items():
        if value is not None and value <= 0:
            raise ValueError(f"--{field.replace('_', '-')} must be a positive integer, got {value}")
    given = {field: value for field, value in dims.items() if value is not None}
    if model is not None:
        spec = get_preset(model)
    elif config is not None:
        from .hf_config import load_config

        spec = load_config(config, layers=layers, head_dim=head_dim)
    elif not given:
        return None
    elif len(given) < len(dims):
        missing = ", ".join(f"--{f.replace('_', '-')}" for f in dims if f not in given)
        raise ValueError(
            f"explicit model dimensions need --layers, --kv-heads and --head-dim together (missing {missing}); "
            "or give --model/--config and override some of them"
        )
    else:
        assert layers is not None and kv_heads is not None and head_dim is not None
        return ModelSpec(
            name="custom", layers=layers, num_attention_heads=kv_heads, kv_heads=kv_heads, head_dim=head_dim,
            hidden_size=kv_heads * head_dim, max_position_embeddings=None,
            source="explicit --layers/--kv-heads/--head-dim",
        )
    return with_overrides(spec, layers=layers, kv_heads=kv_heads, head_dim=head_dim)


def with_overrides(
    spec: ModelSpec, layers: int | None = None, kv_heads: int | None = None, head_dim: int | None = None
) -> ModelSpec:
    """`spec` with the given dimensions replaced (and re-validated); the name records what changed."""
    changes: dict[str, int] = {}
    if spec.is_mla and (kv_heads is not None or head_dim is not None):
        raise ValueError(
            f"{spec.name} uses MLA: its cache is one latent of kv_lora_rank + qk_rope_head_dim per token, "
            "so --kv-heads and --head-dim do not apply; drop them (or edit a config.json)"
        )
    if layers is not None and layers != spec.layers:
        changes["layers"] = layers
        if spec.num_sliding_layers:
            # Keep the model's sliding/global proportion only when it stays exact; never round silently.
            num_sliding, remainder = divmod(layers * spec.num_sliding_layers, spec.layers)
            if remainder:
                raise ValueError(
                    f"--layers {layers}: {spec.name} has {spec.num_sliding_layers} of {spec.layers} layers "
                    "with a sliding window, which does not scale to a whole number of layers; "
                    "give a config.json with layer_types instead"
                )
            changes["num_sliding_layers"] = num_sliding
    if kv_heads is not None and kv_heads != spec.kv_heads:
        changes["kv_heads"] = kv_heads
    if head_dim is not None and head_dim != spec.head_dim:
        changes["head_dim"] = head_dim
    if not changes:
        return spec
    label = ", ".join(f"{k}={v}" for k, v in changes.items() if k != "num_sliding_layers")
    return dataclasses.replace(spec, name=f"{spec.name} ({label})", source=f"{spec.source}; overridden: {label}",
                               **changes)
