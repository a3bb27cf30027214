"""The --json document as text: exactly `json.dumps(doc, indent=2)` of the cleaned document (Fractions and
numpy values as plain numbers, non-finite floats as null, which JSON lacks), except that a list longer than
LONG_LIST prints one compact element per line through the C encoder: a million per-sequence rows take
seconds, not half a minute.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any


def _json_default(value: Any) -> Any:
    if isinstance(value, Fraction):
        return float(value)
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _plain(value: Any) -> Any:
    """Fractions and numpy values as the Python values JSON knows; anything else as it is."""
    return _json_default(value) if isinstance(value, Fraction) or hasattr(value, "tolist") else value


def _clean(value: Any) -> Any:
    """Plain Python values, non-finite floats as null (JSON has no NaN or Infinity)."""
    value = _plain(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


_STRICT = json.JSONEncoder(allow_nan=False, default=_json_default, separators=(", ", ": "))
LONG_LIST = 1000  # longer lists print one compact element per line (the C encoder; indent=2 is pure Python)


def _key(key: Any) -> str:
    return key if isinstance(key, str) else next(iter(json.loads(json.dumps({key: None}))))


_QUOTE = json.encoder.encode_basestring_ascii  # how json.dumps writes a string (ensure_ascii)


def _scalar(value: Any) -> str:
    """json.dumps of one value that is not a dict or list, without json.dumps's set-up per call (a document
    holds hundreds of them): the same text, by the same functions."""
    if value is None or value is True or value is False:
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, str):
        return _QUOTE(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return float.__repr__(value) if math.isfinite(value) else "null"
    return json.dumps(_clean(value))


def _compact(value: Any) -> str:
    try:
        return _STRICT.encode(value)
    except ValueError:  # a NaN or an infinity somewhere inside: clean this element only
        return _STRICT.encode(_clean(value))


def _encode(value: Any, level: int) -> str:
    """json.dumps(indent=2) of the cleaned value, except that a list longer than LONG_LIST prints one
    compact element per line: a million per-sequence rows take seconds, not half a minute."""
    value = _plain(value)
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = (f"{inner}{_QUOTE(_key(k))}: {_encode(v, level + 1)}" for k, v in value.items())
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        encode = _compact if len(value) > LONG_LIST else (lambda v: _encode(v, level + 1))
        return "[\n" + ",\n".join(inner + encode(v) for v in value) + "\n" + pad + "]"
    return _scalar(value)


def to_json(doc: dict[str, Any]) -> str:
    return _encode(doc, 0)
