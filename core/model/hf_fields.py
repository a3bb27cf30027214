"""A config.json object that remembers which fields were read, so that the unread fields that could change
which layers keep KV (or how much) can be named.

`STRUCTURAL` is the pattern of field names that may describe the KV cache layer by layer (layer kinds,
patterns, windows, chunks, KV sharing, recurrent state, head counts and widths, sparse or compressed
attention). After a config is read, the fields that match it, hold a value (not null / false / 0 / empty),
were not read and are not listed in `KNOWN_NO_KV` are `unread_structural`; what that means depends on the
architecture (hf_families.py): nothing for one kvcalc knows, a refusal naming them all for one it does not.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Mapping
from typing import Any

from ..errors import ParameterError

STRUCTURAL = re.compile(
    r"layer_types|block_type|layers_block|pattern|hybrid|attn_type|attention_type|linear_attn|full_attn|"
    r"full_attention|attn_layer|swa_|sliding|window|chunk|kv_shar|shared_kv|share_kv|cross_layer|mamba|ssm|lightning|"
    r"no_rope|global_|kv_lora|q_lora|rope_head|nope_head|head_dim|kv_heads|key_value|query_groups|kv_group|"
    r"attention_group|kv_channels|kv_n_heads|layer_group|ut_steps|mb_per_layer|yoco|_dim_factor$|"
    r"index_|indexer|sparse_attention|compress|linear_|conv_|cla_|_cla\b|attention_hidden_size|"
    # encoder-decoder and cross-attention models (T5, Mllama): cross-attention layers cache the encoder's tokens
    r"cross_attention|cross_attn|encoder_decoder|decoder_layers|encoder_layers|^d_kv$"
)

# Fields that match STRUCTURAL but do not change the KV cache or the recurrent state (read by nothing).
KNOWN_NO_KV = frozenset({
    "chunk_size_feed_forward",  # transformers' feed-forward chunking (compute, not cache)
    "chunk_size", "mamba_chunk_size",  # Mamba scan chunk length (compute)
    "mamba_hidden_act", "mamba_proj_bias", "mamba_conv_bias", "use_mamba_kernels", "mamba_rms_norm",
    "mamba_norm_before_gate", "mamba_d_ssm_bias",
    "cache_implementation",  # how transformers' generate allocates its cache, not the model
    "conv_bias", "linear_bias", "use_conv_bias",
    "activation_sparsity_pattern",  # Gemma-3n: which MLPs are sparse
})
# ... and by pattern: residual scales of MiniMax's norms (layernorm_full_attention_alpha in its own configs,
# full_attn_alpha_factor in transformers'), per-kind RoPE bases, attention-sink biases, the
# multi-token-prediction heads (which serve only speculative decoding, off by default), and the scalar
# multipliers of Falcon-H1 / Granite (ssm_multipliers, attention_multiplier ...).
# Objects that hold an architecture's attention fields one level down (DBRX's attn_config: kv_n_heads)
NESTED_ATTENTION = re.compile(r"^(attn|attention)_config$")
KNOWN_NO_KV_PATTERN = re.compile(
    r"^layernorm_\w+_(alpha|beta)$|_(alpha|beta)_factor$|rope_theta$|sink_bias$|^mtp_|multiplier")


class ConfigFields:
    """Read access to one config object; every key looked up is recorded in `read`."""

    def __init__(self, data: Mapping[str, Any], source: str) -> None:
        self.data = data
        self.source = source
        self.read: set[str] = set()

    def error(self, message: str, *params: str) -> ValueError:
        """`params`: the parameters (of load_config) that the message marks as `{name}`, as a ParameterError."""
        text = f"{self.source}: {message}"
        return ParameterError(text, *params) if params else ValueError(text)

    def raw(self, *keys: str) -> Any:
        """The first of `keys` whose value is not null (None if none); all of them count as read."""
        self.read.update(keys)
        for key in keys:
            if self.data.get(key) is not None:
                return self.data[key]
        return None

    def key_of(self, *keys: str) -> str | None:
        """Which of `keys` holds the value `raw` returns."""
        return next((key for key in keys if self.data.get(key) is not None), None)

    def int(self, *keys: str, minimum: int = 1) -> int | None:
        value = self.raw(*keys)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            kind = "positive" if minimum == 1 else f"at least {minimum}"
            raise self.error(f"field '{self.key_of(*keys)}' must be a {kind} integer, got {value!r}")
        return value

    def required_int(self, *keys: str, fix: str = "add it to the file", param: str | None = None) -> builtins.int:
        """`param`: the parameter that `fix` marks (`{layers}`), if any."""  # int: the method, hence builtins
        value = self.int(*keys)
        if value is None:
            raise self.error(f"missing the field '{keys[0]}'; {fix}", *(() if param is None else (param,)))
        return value

    def flag(self, key: str) -> bool | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.error(f"field '{key}' must be true or false, got {value!r}")
        return value

    def int_list(self, key: str, length: builtins.int | None = None) -> list[builtins.int] | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise self.error(f"field '{key}' must be a list of integers, got {value!r}")
        if length is not None and len(value) != length:
            raise self.error(f"{key} lists {len(value)} layers but num_hidden_layers is {length}; fix one")
        return value

    def str_list(self, key: str, length: builtins.int | None = None) -> list[str] | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, list) or any(not isinstance(v, str) for v in value):
            raise self.error(f"field '{key}' must be a list of strings, got {value!r}")
        if length is not None and len(value) != length:
            raise self.error(f"{key} lists {len(value)} layers but num_hidden_layers is {length}; fix one")
        return value

    def unread_structural(self) -> list[str]:
        """The set fields (not null / false / 0 / empty) whose name may describe the KV cache and that nothing
        read, in the file's order (see the module docstring); hf_families.py judges them."""
        return [key for key, value in self.data.items()
                if key not in self.read and key not in KNOWN_NO_KV and not KNOWN_NO_KV_PATTERN.search(key)
                and STRUCTURAL.search(key) and value not in (None, False, 0, "", [], {})]

    def unread_nested(self) -> list[str]:
        """`object.field` for the set fields of unread attention-config objects (NESTED_ATTENTION) whose names may
        describe the KV cache: an architecture kvcalc does not know keeps them there (DBRX: attn_config.kv_n_heads)."""
        return [f"{key}.{sub}" for key, value in self.data.items()
                if key not in self.read and NESTED_ATTENTION.search(key) and isinstance(value, Mapping)
                for sub, inner in value.items()
                if isinstance(sub, str) and STRUCTURAL.search(sub) and inner not in (None, False, 0, "", [], {})]
