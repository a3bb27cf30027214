"""core/units.py: exact byte formatting for any integer, byte and integer parsing (hand-computed values)."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcalc.core.units import format_bytes, memory_flag_at_least, parse_bytes, parse_int, parse_logged_bytes, plural

_IEC_POWER = {"B": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4, "PiB": 5, "EiB": 6, "ZiB": 7, "YiB": 8}


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (819_200, "800.00 KiB"),  # 819,200 / 1024 = 800
        (1008 * 2**20, "1008.00 MiB"),  # below 1024 of a unit: stays in the unit (IEC), no separator
        (2**30 - 1, "1.00 GiB"),  # 1023.999999 MiB rounds to 1024.00 MiB, so it is shown as 1.00 GiB
        (2**60, "1.00 EiB"),  # was '1024.00 PiB' (PiB was the last unit)
        # 1,310,720,000,000,000,000,000,000 B = 131,072 B/token · 10^12 tokens · 10^7 seqs; / 2^70 = 1110.22 ZiB
        # -> 1.084... YiB (/ 2^80): 1.31072e24 / 1.2089258e24 = 1.0842
        (131_072 * 10**19, "1.08 YiB"),
        (999_999 * 2**80, "999,999.00 YiB"),  # past YiB the mantissa gets separators, up to a million
        # 10^40 / 2^80 = 8,271,806,125,530,276.748... YiB: from a million YiB on, four significant digits
        (10**40, "8.272e+15 YiB"),
        (-2048, "-2.00 KiB"),
        (Fraction(5, 2), "2.50 B"),  # half bytes (int4) show their fraction
        (1152, "1.12 KiB"),  # 1152 / 1024 = 1.125: half to even, as float formatting did
    ],
)
def test_format_bytes_hand_values(num_bytes, text):
    assert format_bytes(num_bytes) == text


def _read_back(text: str) -> tuple[Fraction, Fraction]:
    """The value a displayed size stands for, and half its last digit (its precision)."""
    number, unit = text.split(" ")
    unit_bytes = Fraction(1024) ** _IEC_POWER[unit]
    mantissa, _, exponent = number.partition("e")
    scale = Fraction(10) ** int(exponent or 0)
    decimals = len(mantissa.partition(".")[2])
    return Fraction(mantissa.replace(",", "")) * scale * unit_bytes, Fraction(1, 2 * 10**decimals) * scale * unit_bytes


@given(st.integers(min_value=0, max_value=10**40))
def test_format_bytes_any_int_round_trips_within_shown_precision(num_bytes):
    text = format_bytes(num_bytes)
    assert re.fullmatch(r"[0-9,]+(\.[0-9]{2})? [KMGTPEZY]?i?B|[1-9]\.[0-9]{3}e\+[0-9]{2} YiB", text), text
    shown, half_digit = _read_back(text)
    assert abs(shown - num_bytes) <= half_digit
    if not text.endswith("YiB"):
        assert 1 <= Fraction(text.split(" ")[0]) < 1024 or num_bytes < 1024  # the largest fitting unit
        assert "," not in text


@pytest.mark.parametrize(
    ("text", "num_bytes"),
    [
        ("80GiB", 80 * 2**30),
        ("80gib", 80 * 2**30),
        ("80GIB", 80 * 2**30),
        ("80 GiB", 80 * 2**30),
        ("80GB", 80 * 10**9),
        ("80gb", 80 * 10**9),  # all lower case: read case-insensitively, as bytes
        ("80kb", 80 * 10**3),
        ("80tb", 80 * 10**12),
        ("80b", 80),
        ("80kB", 80 * 10**3),  # the SI spelling of kilobyte: lower-case k, capital B
        ("80e9", 80 * 10**9),
        ("1073741824", 2**30),
        ("1EiB", 2**60),
        ("2YB", 2 * 10**24),
        ("1024YiB", 2**90),  # the largest size read
        ("1237940039285380274899124224", 2**90),  # the same, in bytes: exact, never a float
    ],
)
def test_parse_bytes_accepts(text, num_bytes):
    assert parse_bytes(text) == num_bytes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("80Gb", "'80Gb' is how bits are written (Gb: a capital prefix and a lower-case b): did you mean 80GB "
                 "(bytes)? Sizes are bytes (GB = 10^9 bytes, GiB = 2^30 bytes); all lower case (80gb) is read as "
                 "bytes"),
        ("80Mb", "did you mean 80MB (bytes)?"),
        ("80 Kb", "did you mean 80KB (bytes)? Sizes are bytes (KB = 10^3 bytes, KiB = 2^10 bytes)"),
        ("80Tb", "(TB = 10^12 bytes, TiB = 2^40 bytes); all lower case (80tb) is read as bytes"),
        ("80Gib", "'80Gib' is how bits are written (Gib: a capital prefix and a lower-case b): did you mean 80GiB"),
        ("1e5000", "'1e5000' has an exponent beyond ±1000"),
        ("1e-5000", "has an exponent beyond"),
        ("inf", "cannot read the memory size 'inf'"),
        ("nan", "cannot read the memory size 'nan'"),
        ("1.5B", "not a whole number of bytes"),
        ("80G", "cannot read the memory size '80G'"),
        # was accepted and printed as 8.272e+375 YiB: more than any machine, so a typo
        ("1e400", "'1e400' is more than 1024 YiB (2^90 bytes), the largest size kvcalc reads"),
        ("1025YiB", "is more than 1024 YiB"),
        ("1237940039285380274899124225", "is more than 1024 YiB"),  # 2^90 + 1
        ("-5", "the memory size '-5' must be positive: give a size such as 80GiB"),
        ("-80GiB", "'-80GiB' must be positive"),
        ("-0", "'-0' must be positive"),
        ("0", "'0' must be positive"),
        ("-inf", "cannot read the memory size '-inf'"),
        ("1e-400", "is not a whole number of bytes"),
    ],
)
def test_parse_bytes_refuses(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_bytes(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [("4096", 4096), (" 12 ", 12), ("+12", 12), ("1_000_000", 10**6), ("12.0", 12), ("1e12", 10**12),
     ("1.5e3", 1500), ("-5", -5), ("100e-2", 1), ("1e400", 10**400)],
)
def test_parse_int_exact_spellings(text, value):
    assert parse_int(text, "--tokens") == value


@pytest.mark.parametrize("text", ["abc", "12.5", "1e-3", "", "0x10", "1__0", "_1", "1e", ".", "inf"])
def test_parse_int_refuses_non_integers(text):
    with pytest.raises(ValueError, match=re.escape(f"--tokens {text!r} is not an integer")):
        parse_int(text, "--tokens")


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_parse_int_reads_python_and_scientific_forms(value):
    assert parse_int(str(value), "--n") == value
    assert parse_int(f"{value:_}", "--n") == value
    assert parse_int(f"{value}e0", "--n") == value
    assert parse_int(f"{value}0e-1", "--n") == value  # value·10 · 10^-1


def test_plural():
    assert [plural(1, "layer"), plural(2, "layer"), plural(1_000, "KV head"), plural(0, "length")] == [
        "1 layer", "2 layers", "1,000 KV heads", "0 lengths"]


def test_format_count_short():
    from kvcalc.core.units import format_count_short

    assert format_count_short(999_999_999_999_999) == "999,999,999,999,999"
    assert format_count_short(10**15) == "1.000e+15"
    assert format_count_short(10**400) == "1.000e+400"  # exact: a float would overflow
    assert format_count_short(123_456_789 * 10**30) == "1.235e+38"  # 1.23456789 rounds half-even to 1.235


@pytest.mark.parametrize(
    "args",
    [("size", "--model", "llama-3-8b", "--memory"), ("share", "--trace", "mooncake", "-", "--model", "llama-3-8b",
                                                     "--memory"),
     ("sim", "--requests", "3", "--bandwidth", "1e12", "--flops", "1e15", "--gpu-memory")],
    ids=lambda a: a[0],
)
@pytest.mark.parametrize("size", ["1e400", "-5GiB", "inf", "nan", "1e-5"])
def test_absurd_byte_sizes_are_one_line_in_every_command(run_cli, args, size):
    result = run_cli(*args, size)
    assert result.exit_code == 2 and result.stdout == "", result.stdout
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"'{size}'" in result.stderr or f" {size}" in result.stderr  # the value
    assert any(fix in result.stderr for fix in ("80GiB", "whole bytes", "e.g.")), result.stderr  # and a fix


def test_format_int_short():
    from kvcalc.core.units import format_int_short

    assert format_int_short(2**62 + 1) == "4611686018427387905"  # exact below 10^30
    assert format_int_short(-(10**29)) == "-100000000000000000000000000000"
    assert format_int_short(10**400) == "1.000e+400"


def test_logged_sizes_are_rounded_down_to_whole_bytes_and_say_so():
    # 34.81 · 2^30 = 37,376,952,893.44 exactly (0.01 · 2^30 = 10,737,418.24)
    note = ("34.81GiB is 37,376,952,893.44 bytes: 37,376,952,893 whole bytes are used (rounded down by less than "
            "one byte)")
    assert parse_logged_bytes("34.81GiB") == (37_376_952_893, note)
    assert parse_logged_bytes("80GiB") == (80 * 2**30, None)
    for text, message in (("0.4", "less than one byte"), ("-1GiB", "must be positive"), ("1e400", "1024 YiB"),
                          ("lots", "cannot read")):
        with pytest.raises(ValueError, match=message):
            parse_logged_bytes(text)


@given(st.integers(min_value=1, max_value=2**90))
def test_memory_flag_at_least_is_the_least_size_a_memory_option_takes(num_bytes: int) -> None:
    text = memory_flag_at_least(num_bytes)
    taken = parse_bytes(text)  # whole bytes, or parse_bytes refuses it
    assert taken >= num_bytes
    assert taken - num_bytes < max(1, num_bytes / 1024)  # rounded up by less than one part in 1,024


def test_memory_flag_at_least_by_hand() -> None:
    assert memory_flag_at_least(1000) == "1000B"
    assert memory_flag_at_least(1536) == "1.5KiB"
    assert memory_flag_at_least(71 * 896 * 1024) == "63616KiB"  # 62.125 MiB: not two decimals of MiB
    assert memory_flag_at_least(100 * 576 * 1024) == "56.25MiB"
    assert memory_flag_at_least(3207 * 2**20) == "3207MiB"  # 3.1318359375 GiB
    assert memory_flag_at_least(2**31) == "2GiB"
    assert memory_flag_at_least(10**12 + 7) == "953675MiB"  # 953,674.316… MiB rounded up
