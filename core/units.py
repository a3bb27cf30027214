"""Byte sizes in and out: exact integers inside, IEC units (KiB = 2^10 bytes) for people.

Inputs accept IEC (`80GiB`, any case: `80gib`), SI (`80GB` = 80·10^9) and plain numbers (`80e9`,
`1073741824`), from 1 byte to 1024 YiB (2^90). A size that is not a whole number of bytes is an error,
never rounded; so are inf, nan, negative sizes and sizes past 1024 YiB (`1e400` is a typo, not a machine). An upper-case
prefix with a lower-case `b` (`80Gb`, `80Mb`, `80Gib`) is how bits are written, so it is refused rather than
read as bytes; an all-lower-case unit (`80gb`, `80gib`, `80b`) is read case-insensitively, as bytes.

Output never goes through float: `format_bytes` rounds the exact value, so 10^40 bytes print as
`8.272e+15 YiB`: below 1024 YiB the mantissa is under 1024 (no separator needed); past YiB, the last IEC
unit, it grows: thousands separators up to a million YiB (`1,048,576.00 YiB`), then scientific notation
with four significant digits.
"""

from __future__ import annotations

import re
from fractions import Fraction

_IEC_NAMES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")
_IEC = {name.upper(): 1024**k for k, name in enumerate(_IEC_NAMES)} | {"": 1}
_SI = {f"{prefix}B": 1000**k for k, prefix in enumerate("KMGTPEZY", 1)}
_UNITS = {**_IEC, **_SI}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([A-Za-z]*)\s*$")
_SCIENTIFIC_FROM = 10**6  # YiB mantissas from a million on print as 8.272e+15 YiB
MAX_EXPONENT = 1000  # |e| above this is refused: 10^1000 bytes is no memory, and 1e999999999 would hang
MAX_BYTES = 2**90  # 1024 YiB (YiB is the largest IEC unit): a byte size above it is a typo (1e400), not a machine


def parse_bytes(text: str | int) -> int:
    """`"80GiB"` -> 85899345920; `"80GB"` -> 80000000000; `"80e9"` -> 80000000000. Exact; never rounds."""
    exact = _exact_bytes(text)
    if exact.denominator != 1:  # e.g. 79.19GiB as a log prints it: the fix names the whole sizes around it
        down = exact.numerator // exact.denominator
        if not down:
            raise ValueError(f"the memory size {text!r} is not a whole number of bytes (less than one): give whole "
                             "bytes, 1 or more")
        raise ValueError(f"the memory size {text!r} is not a whole number of bytes ({_decimal(exact)}): give whole "
                         f"bytes, e.g. {down} (rounded down) or {down + 1}")
    return int(exact)


def parse_logged_bytes(text: str | int) -> tuple[int, str | None]:
    """A size as a log prints it, e.g. vLLM's `34.81GiB` (two decimals of GiB, so not whole bytes): the whole
    bytes at or below it, and a note saying so when it was not whole (None when it was). Otherwise as
    `parse_bytes`: what is not a size, not positive or past 1024 YiB is refused."""
    exact = _exact_bytes(text)
    whole = exact.numerator // exact.denominator
    if whole == exact:
        return whole, None
    if whole == 0:
        raise ValueError(f"the memory size {text!r} is less than one byte: give a size such as 34.81GiB")
    return whole, (f"{text} is {_decimal(exact)} bytes: {whole:,} whole bytes are used (rounded down by less "
                   "than one byte)")


def _decimal(value: Fraction) -> str:
    """`value`'s exact decimal with thousands separators: a size typed in decimal has one (its denominator
    divides a power of 10, and the IEC units are powers of 2)."""
    places = 0
    while (value * 10**places).denominator != 1:
        places += 1
    whole, fraction = divmod(int(value * 10**places), 10**places)
    return f"{whole:,}" + (f".{fraction:0{places}d}" if places else "")


def _exact_bytes(text: str | int) -> Fraction:
    """The size `text` names, exactly, checked for syntax, sign and range but not for whole bytes."""
    if isinstance(text, int):
        value = Fraction(text)
    else:
        match = _SIZE_RE.match(str(text))
        unit = match.group(3) if match else ""
        if match is None and str(text).strip().startswith("-") and _SIZE_RE.match(str(text).strip()[1:]):
            raise ValueError(_not_positive(text))
        if match is None or unit.upper() not in _UNITS:
            raise ValueError(
                f"cannot read the memory size {text!r}: write a number with an optional unit, "
                "e.g. 80GiB (2^30), 80GB (10^9), 80e9 or 1073741824"
            )
        if len(unit) > 1 and unit[0].isupper() and unit.endswith("b"):
            raise ValueError(_bits_message(text, match.group(0).strip()[: -len(unit)].strip(), unit))
        mantissa, exponent = match.group(1), int(match.group(2) or 0)
        if abs(exponent) > MAX_EXPONENT:
            raise ValueError(
                f"the memory size {text!r} has an exponent beyond ±{MAX_EXPONENT}: give a realistic size, e.g. 80GiB"
            )
        value = Fraction(mantissa) * Fraction(10) ** exponent * _UNITS[unit.upper()]
    if value <= 0:
        raise ValueError(_not_positive(text))
    if value > MAX_BYTES:
        raise ValueError(
            f"the memory size {text!r} is more than 1024 YiB (2^90 bytes), the largest size kvcalc reads: no machine "
            "has that much; give a realistic size, e.g. 80GiB"
        )
    return value


def _not_positive(text: str | int) -> str:
    return f"the memory size {text!r} must be positive: give a size such as 80GiB"


def _bits_message(text: str, number: str, unit: str) -> str:
    """Why `80Gb` (or `80Gib`) is refused: a capital prefix with a lower-case `b` is how bits are written."""
    prefix = unit[0].upper()
    power = "KMGTPEZY".index(prefix) + 1
    si, iec = f"{prefix}B = 10^{3 * power} bytes", f"{prefix}iB = 2^{10 * power} bytes"
    meant = f"{number}{prefix}iB" if unit[1:2].lower() == "i" else f"{number}{prefix}B"
    return (f"{text!r} is how bits are written ({unit}: a capital prefix and a lower-case b): did you mean {meant} "
            f"(bytes)? Sizes are bytes ({si}, {iec}); all lower case ({number}{unit.lower()}) is read as bytes")


def format_bytes(num_bytes: int | float | Fraction, digits: int = 2) -> str:
    """IEC units for people: 819200 -> '800.00 KiB'. Exact integers below 1 KiB print as 'N B'.

    The unit is the largest whose mantissa is >= 1 after rounding to `digits` decimals (so 1023.999 MiB
    prints as '1.00 GiB', never '1024.00 MiB'); the rounding is exact (Fraction, half to even), so any
    integer formats, however large.
    """
    value = Fraction(num_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value < 1024 and value.denominator == 1:
        return f"{sign}{int(value)} B"
    scale = 10**digits
    for power, unit in enumerate(_IEC_NAMES):
        scaled = round(value * scale / 1024**power)  # the mantissa in units of 10^-digits, rounded exactly
        if scaled < 1024 * scale or unit == _IEC_NAMES[-1]:
            break
    whole, fraction = divmod(scaled, scale)
    if whole >= _SCIENTIFIC_FROM:  # only past YiB: 4 significant digits, exact rounding
        exponent = len(str(whole)) - 1
        mantissa = round(value / 1024**power / Fraction(10) ** exponent * 1000)
        if mantissa >= 10_000:  # 9.9996 rounded up to 10.000
            exponent, mantissa = exponent + 1, round(Fraction(mantissa, 10))
        return f"{sign}{mantissa // 1000}.{mantissa % 1000:03d}e+{exponent:02d} {unit}"
    decimals = f".{fraction:0{digits}d}" if digits > 0 else ""
    grouped = f"{whole:,}" if whole >= 1024 else str(whole)  # only past YiB
    return f"{sign}{grouped}{decimals} {unit}"


def format_percent(fraction: float | Fraction) -> str:
    """0.975806... -> '97.58 %' (two decimals, as every kvcalc percentage)."""
    return f"{float(fraction) * 100:.2f} %"


def format_count(value: int) -> str:
    """Thousands separators for integers: 145000000 -> '145,000,000'."""
    return f"{value:,}"


def format_int_short(value: int) -> str:
    """An integer as a message echoes it: exact up to 30 digits, then four significant digits (`1.000e+400`)."""
    return str(value) if abs(value) < 10**30 else format_count_short(value)


def format_count_short(value: int) -> str:
    """`format_count` up to 10^15, then four significant digits (`1.000e+400`), exact: for messages that
    echo a count someone typed as 1e400."""
    if abs(value) < 10**15:
        return f"{value:,}"
    from decimal import Decimal  # only here: `kvcalc size` starts without it

    return f"{Decimal(value):.3e}"


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """`plural(1, "layer")` -> '1 layer'; `plural(2, "layer")` -> '2 layers' (thousands separators)."""
    return f"{count:,} {noun if count == 1 else (plural_noun or noun + 's')}"


_INT_RE = re.compile(r"^([+-]?)([0-9]+(?:_[0-9]+)*)?(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?$")


def parse_int(text: str | int, flag: str) -> int:
    """An exact integer from a count as people type it: `4096`, `+4096`, `1_000_000`, `1e12`, `1.5e3`, `12.0`.

    Anything that is not exactly an integer (`abc`, `12.5`, `1e-3`) raises ValueError naming `flag` and the text.
    Python's own `int()` spellings are tried first, so every spelling accepted before stays accepted.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    stripped = str(text).strip()
    try:
        return int(stripped)
    except ValueError:
        pass
    match = _INT_RE.match(stripped)
    problem = "is not an integer"
    if match is not None and (match.group(2) or match.group(3)):
        sign, whole, decimals, exponent = match.groups()
        if abs(int(exponent or 0)) > MAX_EXPONENT:
            problem = f"has an exponent beyond ±{MAX_EXPONENT}"
        else:
            exact = Fraction(f"{whole or 0}.{decimals or 0}".replace("_", "")) * Fraction(10) ** int(exponent or 0)
            if exact.denominator == 1:
                return -int(exact) if sign == "-" else int(exact)
    raise ValueError(f"{flag} {str(text)!r} {problem}: write a whole number, e.g. 4096, 1_000_000 or 1e12")


def memory_flag_at_least(num_bytes: int) -> str:
    """The least size, as a memory option takes it (whole bytes, written as a user types it), that holds
    `num_bytes`: the largest IEC unit in which it is exact to two decimals (58,982,400 -> '56.25MiB'), else whole
    units one below the largest, rounded up, which overshoots by less than 1/1,024 (65,142,784 -> '63616KiB')."""
    if num_bytes < 1024:
        return f"{num_bytes}B"
    power = min(len(_IEC_NAMES) - 1, (num_bytes.bit_length() - 1) // 10)
    for p in range(power, 0, -1):
        hundredths = Fraction(num_bytes * 100, 1024**p)
        if hundredths.denominator == 1:
            whole, fraction = divmod(hundredths.numerator, 100)
            decimals = f".{fraction:02d}".rstrip("0") if fraction else ""
            return f"{whole}{decimals}{_IEC_NAMES[p]}"
    unit = 1024 ** (power - 1)
    return f"{-(-num_bytes // unit)}{_IEC_NAMES[power - 1]}"
