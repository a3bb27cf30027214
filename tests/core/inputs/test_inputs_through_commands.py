"""The trace and lengths readers through every command that uses them (frag, share, sim): a bad file is one
`error:` line naming the file, the line and the value, exit 2, no traceback; `-` reads standard input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvcalc.cli.app import app

_GOOD = {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [7, 8]}
_COMMANDS = [("frag",), ("share",), ("sim", "--model", "llama-3-8b")]


def _invoke(*args: str, stdin: bytes | None = None):
    result = CliRunner().invoke(app, list(args), input=stdin, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def _one_line_error(code: int, stdout: str, stderr: str, *fragments: str) -> None:
    assert code == 2, (stdout, stderr)
    assert stderr.startswith("error: ") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr and stdout == ""
    for fragment in fragments:
        assert fragment in stderr, (fragment, stderr)


@pytest.mark.parametrize("command", _COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ({"hash_ids": [1, 2**70]}, "hash_ids holds 1180591620717411303424, which is past 2^63 - 1"),  # OverflowError
        ({"hash_ids": [-3]}, "hash_ids holds -3, which is negative"),
        ({"hash_ids": [1.5]}, "hash_ids holds 1.5"),
        ({"hash_ids": ["a"]}, "hash_ids holds 'a'"),
        ({"hash_ids": [True]}, "hash_ids holds True"),
        ({"timestamp": float("nan")}, "timestamp nan is not finite"),  # sim suggested a larger --time-scale
        ({"timestamp": float("inf")}, "timestamp inf is not finite"),
        ({"timestamp": -1}, "timestamp -1 is negative"),
        ({"input_length": 2**70}, "input_length 1180591620717411303424 is too large"),
        ({"output_length": None}, "output_length None is not an integer"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_bad_mooncake_line_in_every_command(tmp_path, command, bad, fragment):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(_GOOD) + "\n" + json.dumps(dict(_GOOD, **bad)) + "\n")
    _one_line_error(*_invoke(*command, "--trace", "mooncake", str(path)), f"{path}:2: ", fragment)


@pytest.mark.parametrize("command", _COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("kind", ["mooncake", "azure"])
def test_binary_trace_in_every_command(tmp_path, command, kind):
    path = tmp_path / "trace.bin"
    path.write_bytes(b"\xff\xfe\x00binary")
    expected = "expected a Mooncake trace: JSON lines" if kind == "mooncake" else "expected an Azure trace: a CSV"
    _one_line_error(*_invoke(*command, "--trace", kind, str(path)), f"{path}: not a text file", expected)


@pytest.mark.parametrize("command", _COMMANDS, ids=lambda c: c[0])
def test_directory_as_trace_in_every_command(tmp_path, command):
    _one_line_error(*_invoke(*command, "--trace", "mooncake", str(tmp_path)), f"{tmp_path} is a directory, not a file")


@pytest.mark.parametrize("command", _COMMANDS, ids=lambda c: c[0])
def test_trace_from_standard_input_in_every_command(tmp_path, command):
    lines = "".join(json.dumps(dict(_GOOD, timestamp=t)) + "\n" for t in (0, 1000))
    path = tmp_path / "m.jsonl"
    path.write_text(lines)
    code, piped, stderr = _invoke(*command, "--trace", "mooncake", "-", "--json", stdin=lines.encode())
    assert code == 0, stderr
    code, from_file, stderr = _invoke(*command, "--trace", "mooncake", str(path), "--json")
    assert code == 0, stderr
    # the same numbers; only the name of the source differs
    assert json.loads(piped.replace("<stdin>", str(path))) == json.loads(from_file)
    assert "<stdin>" in piped


def test_lengths_file_from_standard_input():
    code, stdout, stderr = _invoke("frag", "--lengths-file", "-", "--json", stdin=b"37\n91\n128\n201\n511\n")
    assert code == 0, stderr
    doc = json.loads(stdout)
    # the worked example's numbers: 968 useful positions, 992 allocated in blocks of 16
    assert doc["lengths"]["total"] == 968 and doc["paged"][0]["allocated"] == 992
    assert doc["lengths"]["source"] == "user: lengths file <stdin> (5 lengths)"


def test_lengths_file_directory():
    code, stdout, stderr = _invoke("frag", "--lengths-file", "/")
    _one_line_error(code, stdout, stderr, "/ is a directory, not a file: give the path of the file itself")
