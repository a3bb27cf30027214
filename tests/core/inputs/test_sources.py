"""Where inputs come from (core/inputs/sources.py): paths, `-` for standard input, streams; directories,
binary files and byte-order marks named the same way for lengths files and traces."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest

from kvcalc.core.inputs.lengths import lengths_from_trace, read_lengths_file
from kvcalc.core.inputs.sources import decode_text, read_source
from kvcalc.core.inputs.traces import read_trace


def _stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_lengths_from_standard_input_in_every_format(monkeypatch):
    _stdin(monkeypatch, b"37\n91\n128\n")
    lengths = read_lengths_file("-")
    assert lengths.tokens.tolist() == [37, 91, 128] and lengths.source == "lengths file <stdin> (3 lengths)"
    _stdin(monkeypatch, b"[37, 91]")  # content that opens a JSON list is read as one, as a .json file
    assert read_lengths_file("-").tokens.tolist() == [37, 91]
    buffer = io.BytesIO()
    np.save(buffer, np.array([5, 6], dtype=np.int32))
    _stdin(monkeypatch, buffer.getvalue())  # the .npy magic
    assert read_lengths_file("-").tokens.tolist() == [5, 6]
    _stdin(monkeypatch, b"id,n\n1,37\n2,91\n")
    assert read_lengths_file("-", column="n").tokens.tolist() == [37, 91]


def test_errors_from_standard_input_name_it(monkeypatch):
    _stdin(monkeypatch, b"37\nninety\n")
    with pytest.raises(ValueError, match="<stdin>:2: 'ninety' is not an integer length"):
        read_lengths_file("-")


def test_a_terminal_is_not_read(monkeypatch):
    _stdin(monkeypatch, b"")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    with pytest.raises(ValueError, match=r"standard input, which is a terminal: pipe the file in \(… - < FILE\)"):
        read_lengths_file("-")


def test_traces_from_standard_input_and_streams(monkeypatch):
    line = json.dumps({"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [4, 5]}) + "\n"
    _stdin(monkeypatch, line.encode())
    trace = read_trace("mooncake", "-")
    assert trace.path == "<stdin>" and trace.prompt_tokens.tolist() == [700]
    assert read_trace("mooncake", io.BytesIO(line.encode())).hash_ids.tolist() == [4, 5]
    azure = b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,5,1\n"
    _stdin(monkeypatch, azure)
    assert lengths_from_trace("azure", "-").tokens.tolist() == [6]


@pytest.mark.parametrize("column", [None, "n"])
def test_a_directory_says_so_and_what_to_give(tmp_path, column):
    with pytest.raises(ValueError, match=rf"{tmp_path} is a directory, not a file: give the path of the file itself "
                                         r"\(lengths: one integer per line, a CSV with column,"):
        read_lengths_file(tmp_path, column)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_source(tmp_path / "absent.txt", "lengths")


@pytest.mark.parametrize("name", ["nul.txt", "nul.json"])
def test_nul_bytes_are_binary_even_when_valid_utf8(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"37\x00\n91\n")
    with pytest.raises(ValueError, match=rf"{name}: not a text file \(it holds NUL bytes.*expected lengths: one"):
        read_lengths_file(path)


def test_a_byte_order_mark_is_dropped(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf37\n91\n")
    assert read_lengths_file(path).tokens.tolist() == [37, 91]
    csv_path = tmp_path / "bom.csv"
    csv_path.write_bytes(b"\xef\xbb\xbfn,m\n37,1\n")
    assert read_lengths_file(csv_path, column="n").tokens.tolist() == [37]


def test_decode_text_names_the_byte_and_the_format():
    expected = r"^x: not a text file \(not UTF-8\), byte 0xff at offset 3; expected a thing$"
    with pytest.raises(ValueError, match=expected):
        decode_text(b"abc\xff", "x", "a thing")


def test_deeply_nested_json_is_an_error_not_a_recursion(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    lengths = tmp_path / "deep.json"
    lengths.write_text(deep)
    with pytest.raises(ValueError, match="nests JSON lists too deeply to read: write one flat list"):
        read_lengths_file(lengths)
    trace = tmp_path / "deep.jsonl"
    trace.write_text(deep + "\n")
    with pytest.raises(ValueError, match=r"deep.jsonl:1: JSON nested too deeply to read"):
        read_trace("mooncake", trace)


def test_huge_numbers_are_shown_short():
    from kvcalc.core.inputs.lengths import parse_lengths_list

    # 1e400 has 401 digits: the message shows four significant ones; 2^62 + 1 (19 digits) stays exact
    with pytest.raises(ValueError, match=r"^lengths item 2: length 1\.000e\+400 is too large"):
        parse_lengths_list("5,1e400")
    with pytest.raises(ValueError, match=r"^lengths item 1: length 4611686018427387905 is too large"):
        parse_lengths_list(str(2**62 + 1))


def test_a_text_stream_as_stdin_is_read_as_bytes(monkeypatch):
    # A StringIO has no .buffer: its read() gives str, which the lengths reader (bytes: the .npy magic, the fast
    # parser) could not take; read_source hands back bytes either way, and a trace reads the same.
    monkeypatch.setattr(sys, "stdin", io.StringIO("37\n91\n"))
    assert read_source("-", "lengths") == ("<stdin>", b"37\n91\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("37\n91\n"))  # that read took it all
    assert read_lengths_file("-").tokens.tolist() == [37, 91]
    line = json.dumps({"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [4]}) + "\n"
    assert read_trace("mooncake", io.StringIO(line)).prompt_tokens.tolist() == [700]
