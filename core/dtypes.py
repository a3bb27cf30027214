"""Storage precisions of the KV cache, in bits so that int4 (half a byte) stays exact."""

from __future__ import annotations

from .errors import ParameterError

# Every command's --dtype defaults to this: the precision current models ship their weights and KV in.
DEFAULT_DTYPE = "bf16"

DTYPE_BITS: dict[str, int] = {
    "fp32": 32,
    "fp16": 16,
    "bf16": 16,
    "fp8": 8,
    "int8": 8,
    "int4": 4,
}

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
    if key not in DTYPE_BITS:
        raise ParameterError(f"{param} {name!r} is not a known precision: choose one of {', '.join(DTYPE_BITS)}",
                             param)
    return key


def dtype_bits(name: str, param: str = "dtype") -> int:
    return DTYPE_BITS[parse_dtype(name, param)]
