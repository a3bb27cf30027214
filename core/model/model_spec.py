"""ModelSpec: the dimensions that decide a model's KV cache (its layer groups), weights and FLOPs.

A spec is made either from uniform dimensions (`layers` KV layers of `kv_heads` × `head_dim`, the first
`layers − num_sliding_layers` full attention and the rest sliding; MLA when `kv_lora_rank` is given) or
from explicit `layer_groups`, as config.json readers make it. Either way `layer_groups` is what equation 1
sums (core/model/layers.py); with explicit groups the uniform fields summarise them for display and for
the step-time model: `layers` counts the layers that keep KV, `kv_heads` / `head_dim` are those of the
attention group with the most layers, `sliding_window` / `num_sliding_layers` those of the windowed
layers (the largest window when they differ). A pure recurrent model (Mamba, RWKV) keeps no KV: its
`layers`, `kv_heads`, `head_dim` (and `num_attention_heads` when it has none) are 0, and every layer
group holds a recurrent state.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from . import layers as eq
from .layers import UNKNOWN_STATE_NOTE, FfnGroup, LayerGroup


@dataclass(frozen=True)
class ModelSpec:
    """See the module docstring. Weights: `num_params` is the total parameter count (weights memory),
    `num_active_params` what one token passes through (MoE: shared weights plus the routed experts it picks;
    None when every parameter is active); both None when unknown (core/model/weights.py estimates them from
    the dimensions). `max_position_embeddings` is None when the config does not say. MoE: `num_experts`
    routed experts per MoE layer, `experts_per_token` of them per token (shared experts are not counted
    here). `num_kv_free_layers` counts the layers that keep no KV (recurrent, no-op, KV-shared).
    `ffn_groups` (optional) describe the MLP / MoE blocks for the weight estimate; `weight_dtype` is the
    checkpoint's precision (config `torch_dtype`), None when unknown. `drafter_groups` are the layers that
    keep KV only under speculative decoding (multi-token-prediction layers, named by the config's
    `drafter_field`): not in `layer_groups`; models.with_drafter adds them when a drafting method uses them.
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
    num_kv_free_layers: int = 0
    source: str = ""
    layer_groups: tuple[LayerGroup, ...] = ()
    ffn_groups: tuple[FfnGroup, ...] = ()
    tie_word_embeddings: bool | None = None
    weight_dtype: str | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)
    drafter_groups: tuple[LayerGroup, ...] = ()
    drafter_field: str | None = None
    # The index into layer_groups of each layer in model order, when the config says it (one group per layer);
    # () when unknown (presets, layers made of two groups). Pipeline stages of a hybrid need it (gpu_plan.py).
    layer_order: tuple[int, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        kv_free = self.layer_groups and not any(g.keeps_kv for g in self.layer_groups)
        for name in ("layers", "num_attention_heads", "kv_heads", "head_dim", "hidden_size"):
            value = getattr(self, name)
            if kv_free and name != "hidden_size" and value == 0:
                continue  # a pure recurrent model (Mamba, RWKV): no attention, no KV
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"model {self.name!r}: {name} must be a positive integer, got {value!r}")
        for name in ("max_position_embeddings", "intermediate_size", "vocab_size", "num_params", "num_active_params",
                     "num_experts", "experts_per_token"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"model {self.name!r}: {name} must be a positive integer or None, got {value!r}")
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
        if self.num_experts is not None and (self.experts_per_token or 0) > self.num_experts:  # both given (above)
            raise ValueError(
                f"model {self.name!r}: experts_per_token {self.experts_per_token} exceeds "
                f"num_experts {self.num_experts}"
            )
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError(f"model {self.name!r}: MLA needs both kv_lora_rank and qk_rope_head_dim")
        if self.layer_groups:
            self._check_groups()
            return
        if not self.is_mla and self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"model {self.name!r}: {self.num_attention_heads} query heads are not a multiple of "
                f"{self.kv_heads} KV heads; choose a KV head count that divides {self.num_attention_heads}"
            )
        object.__setattr__(self, "layer_groups", self._uniform_groups())

    def _uniform_groups(self) -> tuple[LayerGroup, ...]:
        """The groups of a spec given by uniform dimensions: full (or MLA), then sliding, then KV-free."""
        groups = []
        num_global = self.layers - self.num_sliding_layers
        if self.is_mla:
            if self.num_sliding_layers:
                raise ValueError(f"model {self.name!r}: MLA with sliding-window layers needs explicit layer groups")
            assert self.kv_lora_rank is not None and self.qk_rope_head_dim is not None
            groups.append(LayerGroup("mla", self.layers, kv_heads=1, k_head_dim=self.head_dim,
                                     v_head_dim=self.head_dim, kv_lora_rank=self.kv_lora_rank,
                                     rope_dim=self.qk_rope_head_dim, q_heads=self.num_attention_heads))
        else:
            heads: dict[str, Any] = {"kv_heads": self.kv_heads, "k_head_dim": self.head_dim,
                                     "v_head_dim": self.head_dim, "q_heads": self.num_attention_heads}
            if num_global:
                groups.append(LayerGroup("full", num_global, **heads))
            if self.num_sliding_layers:
                groups.append(LayerGroup("sliding", self.num_sliding_layers, window=self.sliding_window, **heads))
        if self.num_kv_free_layers:
            groups.append(LayerGroup("none", self.num_kv_free_layers, note=UNKNOWN_STATE_NOTE))
        return tuple(groups)

    def _check_groups(self) -> None:
        kv_layers = sum(g.count for g in self.layer_groups if g.keeps_kv)
        if kv_layers != self.layers:
            raise ValueError(f"model {self.name!r}: layers={self.layers} but its layer groups keep KV in {kv_layers}")
        for g in self.layer_groups:
            if g.keeps_kv and g.kind != "mla" and g.q_heads and g.q_heads % g.kv_heads:
                raise ValueError(
                    f"model {self.name!r}: {g.q_heads} query heads are not a multiple of {g.kv_heads} KV heads "
                    f"in its {g.kind} layers"
                )

    @classmethod
    def from_groups(cls, name: str, groups: tuple[LayerGroup, ...], **fields: Any) -> ModelSpec:
        """A spec whose uniform fields summarise `groups` (see the module docstring); `fields` give the rest
        (num_attention_heads, hidden_size, max_position_embeddings, ...)."""
        kv = [g for g in groups if g.keeps_kv]
        if not kv:
            if not any(g.state is not None for g in groups):
                raise ValueError(f"model {name!r}: no layer keeps a KV cache or a recurrent state")
            # a pure recurrent model: no KV at all, a constant state per sequence in every layer
            fields.setdefault("num_attention_heads", 0)
            return cls(name=name, layer_groups=groups, layers=0, kv_heads=0, head_dim=0,
                       num_kv_free_layers=sum(g.count for g in groups), **fields)
        main = max(kv, key=lambda g: g.count)  # max keeps the first of equal counts
        windowed = [g for g in kv if g.window is not None]
        mla = next((g for g in kv if g.kind == "mla"), None)
        summary: dict[str, Any] = {
            "layers": sum(g.count for g in kv),
            "kv_heads": main.kv_heads or 1,
            "head_dim": main.k_head_dim or (main.kv_lora_rank + main.rope_dim),
            "sliding_window": max((g.window for g in windowed if g.window is not None), default=None),
            "num_sliding_layers": sum(g.count for g in windowed),
            "kv_lora_rank": mla.kv_lora_rank if mla else None,
            "qk_rope_head_dim": mla.rope_dim if mla else None,
            "num_kv_free_layers": sum(g.count for g in groups if not g.keeps_kv),
        }
        return cls(name=name, layer_groups=groups, **summary, **fields)

    @property
    def drafter_layers(self) -> int:
        """Layers that keep KV only under speculative decoding (MTP); 0 when the config has none."""
        return sum(g.count for g in self.drafter_groups)

    @property
    def keeps_kv(self) -> bool:
        """False for a pure recurrent model (Mamba, RWKV): every layer keeps a state, none keeps KV."""
        return self.layers > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def attention(self) -> str:
        """'mla', 'mqa' (one KV head), 'mha' (KV heads = query heads) or 'gqa' (of the main attention layers);
        'none' for a pure recurrent model."""
        if self.is_mla:
            return "mla"
        if not self.keeps_kv:
            return "none"
        if self.kv_heads == 1 and self.num_attention_heads > 1:
            return "mqa"
        if self.kv_heads == self.num_attention_heads:
            return "mha"
        return "gqa"

    @property
    def is_uniform(self) -> bool:
        """True when the spec is what its uniform fields say (no per-layer differences beyond sliding layers)."""
        return Counter(self.layer_groups) == Counter(self._uniform_groups())

    @property
    def num_global_layers(self) -> int:
        return self.layers - self.num_sliding_layers

    @property
    def latent_dim(self) -> int | None:
        """MLA: scalars of the one cached latent per token per layer (kv_lora_rank + rope dim); else None."""
        if self.kv_lora_rank is None or self.qk_rope_head_dim is None:
            return None
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def model_layers(self) -> int:
        """All layers, KV-less ones included; a recurrent half beside attention in the same layers is not another
        layer (Falcon-H1: 36 layers, each attention + Mamba-2, not 72)."""
        return sum(g.count for g in self.layer_groups if not g.beside_attention)

    @property
    def has_state(self) -> bool:
        return any(g.state is not None for g in self.layer_groups)

    def layer_tokens(self, tokens: int) -> int:
        """Σ over layers of the tokens each layer holds for a context of `tokens` (windows and chunks cap it)."""
        return sum(g.count * g.tokens_held(tokens) for g in self.layer_groups)

    def kv_bits(self, tokens: int, dtype_bits: int, tp: int = 1) -> int:
        """Exact KV bits of one sequence of `tokens` tokens on one of `tp` GPUs (equation 1)."""
        if tp != 1:
            self.kv_heads_per_gpu(tp)  # an uneven split is refused here, naming the model and its layers
        return eq.kv_bits(self.layer_groups, tokens, dtype_bits, tp)

    def state_bits(self, tp: int = 1) -> int:
        """Exact bits of one sequence's recurrent state (0 for a model without recurrent layers)."""
        return eq.state_bits(self.layer_groups, tp)

    def kv_bytes(self, tokens: int, dtype_bits: int) -> int:
        """KV bytes of one sequence (no state), rounded up to whole bytes once (the rule in layers.py)."""
        return eq.bits_to_bytes(self.kv_bits(tokens, dtype_bits))

    def bytes_per_token(self, dtype_bits: int) -> int:
        """KV bytes of one token in every layer, for a context within every window (eq. 1 with n = 1)."""
        return eq.bits_to_bytes(self.kv_bits(1, dtype_bits))

    def kv_heads_per_gpu(self, tp: int) -> dict[LayerGroup, int]:
        """KV heads on one of `tp` GPUs for each KV layer group; a ValueError names the model and layers."""
        kinds = Counter(g.kind for g in self.layer_groups if g.keeps_kv)
        out = {}
        for g in self.layer_groups:
            if g.keeps_kv:
                where = self.name if len(kinds) == 1 else f"{self.name}'s {g.kind} layers"
                out[g] = g.kv_heads_per_gpu(tp, where)
        return out
