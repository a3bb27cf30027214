"""The trace readers (core/traces.py): what they read, and every malformed line as one ValueError that names
the line and the fix — never a silent truncation."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from kvcalc.core.inputs.traces import read_trace
from kvcalc.core.sim.workload import from_trace


def _mooncake(tmp_path: Path, *records: dict) -> Path:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_mooncake_fields_and_prefix_ids(tmp_path: Path) -> None:
    path = _mooncake(
        tmp_path,
        {"timestamp": 1500, "input_length": 700, "output_length": 20, "hash_ids": [4, 5]},
        {"timestamp": 500, "input_length": 512.0, "output_length": 0, "hash_ids": [4]},
    )
    trace = read_trace("mooncake", path)
    assert len(trace) == 2 and trace.has_prefix_ids
    # ms -> s, relative to the earliest request (file order is kept): 1.5 - 0.5 = 1.0, 0.0
    assert trace.arrival_s.tolist() == [1.0, 0.0]
    assert trace.prompt_tokens.tolist() == [700, 512] and trace.output_tokens.tolist() == [20, 0]
    assert trace.request_hash_ids(0).tolist() == [4, 5] and trace.request_hash_ids(1).tolist() == [4]
    head = trace.head(1)
    assert len(head) == 1 and head.hash_ids.tolist() == [4, 5] and head.hash_offsets.tolist() == [0, 2]


def test_workload_shares_the_trace_accessors(tmp_path: Path) -> None:
    path = _mooncake(
        tmp_path,
        {"timestamp": 1500, "input_length": 700, "output_length": 20, "hash_ids": [4, 5]},
        {"timestamp": 500, "input_length": 512, "output_length": 3, "hash_ids": [6]},
    )
    workload = from_trace(read_trace("mooncake", path))
    # sorted by arrival: the second line comes first, its ids move with it
    assert len(workload) == 2 and workload.has_prefix_ids
    assert workload.request_hash_ids(0).tolist() == [6] and workload.request_hash_ids(1).tolist() == [4, 5]
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n")
    for requests in (read_trace("azure", azure), from_trace(read_trace("azure", azure))):
        assert not requests.has_prefix_ids
        with pytest.raises(ValueError, match="has no prefix ids"):
            requests.request_hash_ids(0)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"timestamp": 0, "input_length": 3.7, "output_length": 1}, r"input_length 3\.7 is not an integer"),
        ({"timestamp": 0, "input_length": True, "output_length": 1}, "input_length True is not an integer"),
        ({"timestamp": 0, "input_length": 12, "output_length": -1}, "output_length is negative"),
        ({"timestamp": 0, "input_length": 1e400, "output_length": 1}, "input_length inf is not an integer"),
        ({"timestamp": "soon", "input_length": 1, "output_length": 1}, "timestamp 'soon' is not a number"),
        ({"input_length": 1, "output_length": 1}, "missing field timestamp"),
        ({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1, True]}, "list of integers"),
        ({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1.5]}, "list of integers"),
    ],
)
def test_mooncake_bad_lines_name_the_line(tmp_path: Path, record: dict, message: str) -> None:
    good = {"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}
    path = _mooncake(tmp_path, good, record)
    with pytest.raises(ValueError, match=message) as info:
        read_trace("mooncake", path)
    assert f"{path}:2" in str(info.value)


def test_mooncake_not_json(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r":2: expected a JSON object per line, found list"):
        read_trace("mooncake", path)
    path.write_text("{oops\n")
    with pytest.raises(ValueError, match=r":1: not valid JSON"):
        read_trace("mooncake", path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("", "is empty"),
        ("TIMESTAMP,Context\n", "no column ContextTokens, GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5\n", r":2: expected 3 columns, found 2"),
        # a field too many (an unquoted comma?) is as ambiguous as one too few
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1,9\n", r":2: expected 3 columns, found 4"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n2023-11-16 18:15:46,5,1,7\n",
         "names ContextTokens more than once"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5.5,1\n", r":2: ContextTokens '5.5'"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,1\n", "TIMESTAMP 'yesterday' is not a date"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "holds no requests"),
    ],
)
def test_azure_bad_files(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "a.csv"
    path.write_text(body)
    with pytest.raises(ValueError, match=message):
        read_trace("azure", path)


def test_azure_times_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.5000000,374,44\n"
        "\n"
        "2023-11-16 18:15:46.2500000,396,109\n"
    )
    trace = read_trace("azure", path)
    # 46.5 - 46.25 = 0.25 s after the earliest request; the blank line is skipped
    assert np.allclose(trace.arrival_s, [0.25, 0.0]) and trace.prompt_tokens.tolist() == [374, 396]


def test_azure_stamps_with_a_utc_offset_are_read_in_utc_without_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    # the 2024 Azure traces write +00:00; 02:00:00.5+02:00 is 00:00:00.5 UTC, and Z is UTC
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2024-05-10 00:00:00.000000+00:00,5,1\n"
                    "2024-05-10 02:00:00.500000+02:00,6,1\n"
                    "2024-05-10T00:00:01.250000Z,7,1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's time-zone warning reached stderr before
        trace = read_trace("azure", path)
    assert trace.arrival_s.tolist() == [0.0, 0.5, 1.25]


def test_unknown_kind_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown trace kind 'sharegpt'"):
        read_trace("sharegpt", tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        read_trace("azure", tmp_path / "missing.csv")


def test_a_trace_of_the_other_format_says_which_kind_to_use(tmp_path: Path) -> None:
    record = {"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": list(range(500))}
    mooncake = _mooncake(tmp_path, record)
    with pytest.raises(ValueError, match="is JSON lines, not an Azure CSV: read it with trace mooncake") as info:
        read_trace("azure", mooncake)
    assert "hash_ids" not in str(info.value)  # not the whole first line with its 500 ids
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n")
    with pytest.raises(ValueError, match="is an Azure CSV, not JSON lines: read it with trace azure"):
        read_trace("mooncake", azure)
    odd = tmp_path / "odd.csv"
    odd.write_text(",".join(f"column_{i}" for i in range(100)) + "\n1\n")
    with pytest.raises(ValueError, match=r"\.\.\.\); an Azure trace has") as info:
        read_trace("azure", odd)
    assert "column_99" not in str(info.value)


# --- every field of a Mooncake line, every bad type: the file, the line and the value ------------------

_GOOD = {"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("hash_ids", [1, 2**70], "hash_ids holds 1180591620717411303424, which is past 2^63 - 1"),  # was OverflowError
        ("hash_ids", [1, 2**63], "hash_ids holds 9223372036854775808, which is past 2^63 - 1"),
        ("hash_ids", [3, -1], "hash_ids holds -1, which is negative"),
        ("hash_ids", [1.0], "hash_ids holds 1.0; hash_ids must be a list of integers"),
        ("hash_ids", ["7"], "hash_ids holds '7'; hash_ids must be a list of integers"),
        ("hash_ids", [False], "hash_ids holds False"),
        ("hash_ids", [[1]], "hash_ids holds [1]"),
        ("hash_ids", "1,2", "hash_ids '1,2' must be a list of integers"),
        ("hash_ids", 5, "hash_ids 5 must be a list"),
        ("hash_ids", {"a": 1}, "hash_ids {'a': 1} must be a list"),
        ("timestamp", float("nan"), "timestamp nan is not finite"),
        ("timestamp", float("inf"), "timestamp inf is not finite"),
        ("timestamp", float("-inf"), "timestamp -inf is not finite"),
        ("timestamp", "NaN", "timestamp 'NaN' is not a number but a string"),  # quoted: refused as any string
        ("timestamp", -5, "timestamp -5 is negative"),
        ("timestamp", -0.5, "timestamp -0.5 is negative"),
        ("timestamp", 2**60, "timestamp 1152921504606846976 is past 2^53 ms"),
        ("timestamp", 10**400, "is past 2^53 ms"),  # an int too large for a float: still the file and line
        ("timestamp", True, "timestamp True is not a number of ms"),
        ("timestamp", None, "timestamp None is not a number of ms"),
        ("timestamp", [1], "timestamp [1] is not a number of ms"),
        ("timestamp", {"ms": 1}, "timestamp {'ms': 1} is not a number of ms"),
        ("input_length", 2**70, "input_length 1180591620717411303424 is too large (lengths must be <= 2^62)"),
        ("input_length", None, "input_length None is not an integer"),
        ("input_length", [1], "input_length [1] is not an integer"),
        ("input_length", "abc", "input_length 'abc' is not an integer"),
        ("input_length", float("nan"), "input_length nan is not an integer"),
        ("output_length", 2**63, "output_length 9223372036854775808 is too large"),
        ("output_length", {"n": 1}, "output_length {'n': 1} is not an integer"),
        ("output_length", False, "output_length False is not an integer"),
        ("output_length", -1, "output_length is negative (-1)"),
    ],
    ids=lambda v: repr(v)[:30],
)
def test_every_bad_field_names_file_line_and_value(tmp_path: Path, field: str, value: object, message: str) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(_GOOD) + "\n" + json.dumps(dict(_GOOD, **{field: value})) + "\n")
    with pytest.raises(ValueError) as info:
        read_trace("mooncake", path)
    assert f"{path}:2: " in str(info.value) and message in str(info.value), str(info.value)


def test_a_long_bad_value_is_cut_short(tmp_path: Path) -> None:
    path = _mooncake(tmp_path, dict(_GOOD, hash_ids="x" * 10_000))
    with pytest.raises(ValueError, match=r"hash_ids 'x+\.\.\. must be a list") as info:
        read_trace("mooncake", path)
    assert len(str(info.value)) < 200


def test_out_of_order_and_zero_timestamps_are_fine(tmp_path: Path) -> None:
    # arrival order is the replays' business; the reader keeps file order, relative to the earliest (2.0 s)
    path = _mooncake(tmp_path, dict(_GOOD, timestamp=5000), dict(_GOOD, timestamp=2000.5), dict(_GOOD, timestamp=2000))
    assert np.allclose(read_trace("mooncake", path).arrival_s, [3.0, 0.0005, 0.0], rtol=0, atol=1e-12)


def test_largest_hash_id_is_read_exactly(tmp_path: Path) -> None:
    path = _mooncake(tmp_path, dict(_GOOD, input_length=1024, hash_ids=[0, 2**63 - 1]))  # two ids of 512 tokens
    assert read_trace("mooncake", path).hash_ids.tolist() == [0, 2**63 - 1]


@pytest.mark.parametrize(
    ("stamp", "message"),
    [
        ("NaT", "TIMESTAMP 'NaT' is not a time"),  # numpy reads it as not-a-time: NaN of datetimes
        ("", "TIMESTAMP '' is not a time"),
        ("3000-01-01 00:00:00", "is outside the years 1678–2261"),  # numpy's ns clock would wrap it to 1830
        ("1600-01-01 00:00:00", "is outside the years 1678–2261"),
        ("5", "TIMESTAMP '5' is outside the years"),  # the year 5
        ("yesterday", "TIMESTAMP 'yesterday' is not a date and time"),
    ],
)
def test_azure_bad_timestamps_name_the_line(tmp_path: Path, stamp: str, message: str) -> None:
    path = tmp_path / "a.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n{stamp},5,1\n")
    with pytest.raises(ValueError, match=message) as info:
        read_trace("azure", path)
    assert f"{path}:3: " in str(info.value)


def test_azure_huge_count_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,{2**70},1\n")
    with pytest.raises(ValueError, match=rf"{path}:2: ContextTokens {2**70} is too large"):
        read_trace("azure", path)


@pytest.mark.parametrize("kind", ["azure", "mooncake"])
@pytest.mark.parametrize("data", [b"\xff\xd8\xff\xe0\x00\x10JFIF", b"\x93NUMPY\x01\x00v\x00{'descr': '<i8'}"])
def test_binary_trace_names_the_file_and_the_format(tmp_path: Path, kind: str, data: bytes) -> None:
    path = tmp_path / "trace.bin"
    path.write_bytes(data)
    with pytest.raises(ValueError) as info:
        read_trace(kind, path)
    text = str(info.value)
    assert text.startswith(f"{path}: not a text file") and "codec" not in text
    expected = "a CSV with the columns TIMESTAMP" if kind == "azure" else "JSON lines with timestamp"
    assert expected in text


def test_azure_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n".encode())
    assert read_trace("azure", path).prompt_tokens.tolist() == [5]


def test_a_directory_is_named_as_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=rf"{tmp_path} is a directory, not a file: .*a Mooncake trace"):
        read_trace("mooncake", tmp_path)


def test_prompt_plus_output_past_int64_is_refused_not_wrapped(tmp_path: Path) -> None:
    from kvcalc.core.inputs.lengths import lengths_from_trace

    # 2^62 + 2^62 = 2^63 wraps to -2^63 in int64 (and was then reported as "length 0")
    path = _mooncake(tmp_path, dict(_GOOD), dict(_GOOD, input_length=2**62, output_length=2**62))
    with pytest.raises(ValueError, match=r"request 2 \(file order\): length 9223372036854775808 \(prompt \+ output\) "
                                         r"is too large .*use phase prompt"):
        lengths_from_trace("mooncake", path)
    assert lengths_from_trace("mooncake", path, "prompt").tokens.tolist() == [1, 2**62]


def test_azure_span_past_int64_nanoseconds_is_refused(tmp_path: Path) -> None:
    # 1700 and 2200 both fit datetime64[ns], but 500 years of ns (1.6e19) do not fit int64 and wrapped
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1700-01-01 00:00:00,5,1\n2200-01-01 00:00:00,5,1\n")
    with pytest.raises(ValueError, match=r"the TIMESTAMPs span 500 years, more than the 292 years"):
        read_trace("azure", path)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1900-01-01 00:00:00,5,1\n2150-01-01 00:00:00,5,1\n")
    days = 250 * 365 + 61  # 1900..2150: 61 leap days (1900 and 2100 are not leap years)
    assert read_trace("azure", path).arrival_s.tolist() == [0.0, days * 86_400.0]


# --- hash_ids on some lines only, quoted numbers, ids past the prompt ------------------------------------------

_IDS = {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}  # ceil(1000 / 512) = 2 ids


@pytest.mark.parametrize("without", [
    {"timestamp": 2, "input_length": 1000, "output_length": 10},  # missing
    {"timestamp": 2, "input_length": 1000, "output_length": 10, "hash_ids": None},  # null
])
def test_hash_ids_on_some_lines_only_is_refused_naming_the_first_line_without(tmp_path: Path, without: dict) -> None:
    # was: one line without ids dropped every line's ids, so the two identical requests shared nothing
    path = _mooncake(tmp_path, _IDS, _IDS, without)
    with pytest.raises(ValueError, match=r"m\.jsonl:3: no hash_ids, but 2 other lines have them; give every request"):
        read_trace("mooncake", path)
    first = _mooncake(tmp_path, without, _IDS)  # the line without comes first: it is named, found once line 2 has ids
    with pytest.raises(ValueError, match=r"m\.jsonl:1: no hash_ids, but 1 other line has them"):
        read_trace("mooncake", first)


def test_no_line_with_hash_ids_is_a_trace_without_prefix_ids(tmp_path: Path) -> None:
    bare = {"timestamp": 0, "input_length": 1000, "output_length": 10}
    trace = read_trace("mooncake", _mooncake(tmp_path, bare, dict(bare, hash_ids=None)))
    assert not trace.has_prefix_ids and len(trace) == 2


@pytest.mark.parametrize(("field", "value", "message"), [
    ("timestamp", "0", "timestamp '0' is not a number but a string"),
    ("input_length", "100", "input_length '100' is not an integer but a string"),
    ("output_length", "10", "output_length '10' is not an integer but a string"),
])
def test_quoted_numbers_are_refused(tmp_path: Path, field: str, value: str, message: str) -> None:
    path = _mooncake(tmp_path, _GOOD, dict(_GOOD, **{field: value}))
    with pytest.raises(ValueError, match=message) as info:
        read_trace("mooncake", path)
    assert f"{path}:2" in str(info.value)


def test_more_hash_ids_than_the_prompt_covers_are_refused(tmp_path: Path) -> None:
    # 1,000 tokens are ceil(1000 / 512) = 2 ids; a third would key a block with no prompt token in it
    path = _mooncake(tmp_path, _IDS, dict(_IDS, hash_ids=[1, 2, 3]))
    with pytest.raises(ValueError, match=r"m\.jsonl:2: 3 hash_ids for input_length 1,000, which needs 2"):
        read_trace("mooncake", path)
    exact = read_trace("mooncake", _mooncake(tmp_path, dict(_IDS, input_length=1024), dict(_IDS, input_length=1025,
                                                                                          hash_ids=[1, 2, 3])))
    assert exact.hash_offsets.tolist() == [0, 2, 5]  # 1,024 = 2 · 512 exactly; 1,025 needs a third


@pytest.mark.parametrize("name", ["mooncake_conversation.jsonl", "mooncake_synthetic.jsonl"])
def test_real_traces_have_exactly_one_id_per_512_prompt_tokens(name: str) -> None:
    path = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / name
    if not path.exists():
        pytest.skip(f"{name} is not on this machine")
    trace = read_trace("mooncake", path)
    counts = np.diff(trace.hash_offsets)
    assert np.array_equal(counts, -(-trace.prompt_tokens // 512))


def test_one_request_is_said_in_the_singular(tmp_path: Path) -> None:
    assert read_trace("mooncake", _mooncake(tmp_path, _IDS)).description.endswith("(1 request)")


def test_an_empty_path_is_said_to_be_empty() -> None:
    with pytest.raises(ValueError, match="the path is empty"):
        read_trace("mooncake", "")
