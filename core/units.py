"""Byte sizes in and out: exact integers inside, IEC units (KiB = 2^10 bytes) for people.

Inputs accept IEC (`80GiB`), SI (`80GB` = 80·10^9) and plain numbers (`80e9`, `1073741824`). A size that is
not a whole number of bytes is an error, never rounded.
"""

from __future__ import annotations

import re
from fractions import Fraction

_IEC = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50}
_SI = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15}
_UNITS = {**_IEC, **_SI}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | int) -> int:
    """`"80GiB"` -> 85899345920; `"80GB"` -> 80000000000; `"80e9"` -> 80000000000. Exact; never rounds."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(str(text))
        unit = match.group(2).upper() if match else ""
        if match is None or unit not in _UNITS:
            raise ValueError(
                f"cannot read the memory size {text!r}: write a number with an optional unit, "
                "e.g. 80GiB (2^30), 80GB (10^9), 80e9 or 1073741824"
            )
        exact = Fraction(match.group(1)) * _UNITS[unit]
        if exact.denominator != 1:
            raise ValueError(f"the memory size {text!r} is not a whole number of bytes: give whole bytes")
        value = int(exact)
    if value <= 0:
        raise ValueError(f"the memory size {text!r} must be positive")
    return value


def format_bytes(num_bytes: int | float | Fraction, digits: int = 2) -> str:
    """IEC units for people: 819200 -> '800.00 KiB'. Exact integers below 1 KiB print as 'N B'."""
    value = Fraction(num_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            break
        value /= 1024
    if unit == "B" and value.denominator == 1:
        return f"{sign}{int(value)} B"
    return f"{sign}{float(value):.{digits}f} {unit}"


def format_percent(fraction: float | Fraction) -> str:
    """0.975806... -> '97.58 %' (two decimals, as every kvcalc percentage)."""
    return f"{float(fraction) * 100:.2f} %"


def format_count(value: int) -> str:
    """Thousands separators for integers: 145000000 -> '145,000,000'."""
    return f"{value:,}"
