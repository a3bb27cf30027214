"""Storage precisions of the KV cache, in bits so that int4 (half a byte) stays exact; and the quantized KV
formats whose pages hold more than the scalars, as vLLM pages them (vllm/v1/kv_cache_interface.py):

* `fp8` (vLLM's fp8, fp8_e4m3, fp8_e5m2): one byte a scalar. Its scales are per tensor (k_scale and v_scale,
  two numbers per layer, from the checkpoint or 1.0): nothing per token, so the page is scalars × 1 B;
* `fp8_per_token_head`, `int8_per_token_head`: one byte a scalar plus a float32 scale for K and for V of every
  KV head of every token: + 2 · 4 B per KV head per token (vLLM carves them from the KV allocation);
* `nvfp4`: per KV head, d//2 bytes of fp4 data and d//16 bytes of fp8 block scales (one per 16 values), for
  K (d = K head dim) and V each; full-attention layers only (vLLM packs it in FullAttentionSpec, not in its
  sliding-window, chunked or MLA specs, so kvcalc refuses it there);
* `fp8_ds_mla`: DeepSeek's sparse-MLA layout (FlashMLA-sparse): 656 B per token per layer — a 512-wide
  fp8 latent, 4 float32 scales (one per 128) and the 64-wide rope part in bf16: 512 + 16 + 128.

The plain precisions are an int of bits per scalar. The formats with a layout are a `KvBits`: an int (the
bits of a data scalar, which is what arithmetic on it sees) that also names its layout, so that the one
function that prices a token of a layer (layers.LayerGroup.bits_per_token) adds the scales exactly.
"""

from __future__ import annotations

from .errors import ParameterError

# Every command's --dtype defaults to this: the precision current models ship their weights and KV in.
DEFAULT_DTYPE = "bf16"


class KvBits(int):
    """Bits of one data scalar of a KV format whose pages also hold scales (`layout`, see the module docstring)."""

    layout: str
    name: str

    def __new__(cls, bits: int, layout: str, name: str) -> KvBits:
        obj = int.__new__(cls, bits)
        obj.layout = layout
        obj.name = name
        return obj

    def __reduce__(self) -> tuple[type[KvBits], tuple[int, str, str]]:
        """Pickled and copied as the call that makes it (int's own reduction keeps only the int)."""
        return KvBits, (int(self), self.layout, self.name)

    def __repr__(self) -> str:
        return f"KvBits({int(self)}, {self.layout!r}, {self.name!r})"


DTYPE_BITS: dict[str, int] = {
    "fp32": 32,
    "fp16": 16,
    "bf16": 16,
    "fp8": 8,
    "int8": 8,
    "int4": 4,
    "fp8_per_token_head": KvBits(8, "per_token_head", "fp8_per_token_head"),
    "int8_per_token_head": KvBits(8, "per_token_head", "int8_per_token_head"),
    "nvfp4": KvBits(4, "nvfp4", "nvfp4"),
    "fp8_ds_mla": KvBits(8, "fp8_ds_mla", "fp8_ds_mla"),
}
# KV cache formats only: they name a page layout, not how weights are stored
KV_ONLY = frozenset({"fp8_per_token_head", "int8_per_token_head", "fp8_ds_mla"})
# kvcalc's precisions that vLLM's kv_cache_dtype has no form of (plain int8 / int4 KV): a vLLM memory plan refuses them
NOT_VLLM_KV_DTYPES = frozenset({"int8", "int4"})

_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
}


def parse_dtype(name: str, param: str = "dtype") -> str:
    """Canonical dtype name ('bfloat16' -> 'bf16'); an unknown name raises a ParameterError naming `param`
    (the caller's parameter that holds it, e.g. "weight_dtype") and listing the choices."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    weights = "weight" in param
    if key not in DTYPE_BITS or (weights and key in KV_ONLY):
        choices = [k for k in DTYPE_BITS if not (weights and k in KV_ONLY)]
        raise ParameterError(f"{param} {name!r} is not a known precision: choose one of {', '.join(choices)}",
                             param)
    return key


def dtype_bits(name: str, param: str = "dtype") -> int:
    return DTYPE_BITS[parse_dtype(name, param)]
