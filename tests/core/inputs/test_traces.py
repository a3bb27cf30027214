"""The trace readers (core/traces.py): what they read, and every malformed line as one ValueError that names
the line and the fix — never a silent truncation."""

from __future__ import annotations

import json
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
        ({"timestamp": 0, "input_length": "12", "output_length": -1}, "output_length is negative"),
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


def test_unknown_kind_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown trace kind 'sharegpt'"):
        read_trace("sharegpt", tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        read_trace("azure", tmp_path / "missing.csv")


def test_a_trace_of_the_other_format_says_which_kind_to_use(tmp_path: Path) -> None:
    record = {"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": list(range(500))}
    mooncake = _mooncake(tmp_path, record)
    with pytest.raises(ValueError, match="is JSON lines, not an Azure CSV: read it with --trace mooncake") as info:
        read_trace("azure", mooncake)
    assert "hash_ids" not in str(info.value)  # not the whole first line with its 500 ids
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n")
    with pytest.raises(ValueError, match="is an Azure CSV, not JSON lines: read it with --trace azure"):
        read_trace("mooncake", azure)
    odd = tmp_path / "odd.csv"
    odd.write_text(",".join(f"column_{i}" for i in range(100)) + "\n1\n")
    with pytest.raises(ValueError, match=r"\.\.\.\); an Azure trace has") as info:
        read_trace("azure", odd)
    assert "column_99" not in str(info.value)
