"""`kvcalc share --trace ... --capacity`: a capacity given twice (as typed, or the same amount written another
way, or a range point repeated) is refused with one `error:` line naming --capacity and the value, exit 2; a
range too narrow for its points (rounding to whole amounts repeats some) likewise. --blocks already refuses
16,16 (checked here too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcalc.core.errors import ParameterError
from kvcalc.core.share.capacity import parse_capacities


def _trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 1000, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]}\n')
    return path


def _one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize(("capacity", "fragments"), [
    ("1M,1M", ("--capacity", "'1M'", "twice")),
    ("1M,1000k", ("--capacity", "'1000k'", "'1M'", "1,000,000 tokens")),  # the same amount written twice
    ("4M,1M:4M:3", ("--capacity", "'4M'", "twice")),  # a range's end repeats a value given
    ("1GiB,1024MiB", ("--capacity", "'1024MiB'", "'1GiB'", "1.00 GiB")),
    ("1:3:10", ("--capacity", "'1:3:10'", "3 distinct")),  # 1, 1, 1, 1, 2, 2, 2, 2, 3, 3 once rounded
])
def test_repeated_capacity_is_refused(run_cli, tmp_path: Path, capacity: str, fragments: tuple[str, ...]) -> None:
    args = ("share", "--trace", "mooncake", str(_trace(tmp_path)), "--capacity", capacity)
    _one_line_error(run_cli(*args), *fragments)
    with pytest.raises(ParameterError) as info:
        parse_capacities(capacity)
    assert info.value.param == "capacity"


def test_distinct_capacities_still_pass(run_cli, tmp_path: Path) -> None:
    assert [v.amount for v in parse_capacities("1M:4M:3,8M")] == [1_000_000, 2_000_000, 4_000_000, 8_000_000]
    result = run_cli("share", "--trace", "mooncake", str(_trace(tmp_path)), "--capacity", "1k,2k", "--json")
    assert result.exit_code == 0, result.stderr
    # whole blocks of 16: floor(1,000 / 16) · 16 = 62 · 16 = 992; 2,000 = 125 · 16
    assert [p["capacity_tokens"] for p in result.json()["curves"][0]["points"]] == [992, 2000]


def test_repeated_block_size_is_refused(run_cli, tmp_path: Path) -> None:
    args = ("share", "--trace", "mooncake", str(_trace(tmp_path)), "--capacity", "1M", "--blocks", "16,16")
    _one_line_error(run_cli(*args), "--blocks", "'16,16'", "distinct")


@pytest.mark.parametrize(("args", "flag"), [
    (("--capacity", "1M,1GiB"), "--capacity '1GiB'"),
    (("--gpu-cache", "40GiB"), "--gpu-cache '40GiB'"),
    (("--gpu-cache", "1M", "--host-cache", "1TB"), "--host-cache '1TB'"),
])
def test_bytes_without_a_model_name_the_option(run_cli, tmp_path: Path, args: tuple[str, ...], flag: str) -> None:
    # was 'error: 1GiB is bytes: give a model ...', the option left out
    _one_line_error(run_cli("share", "--trace", "mooncake", str(_trace(tmp_path)), *args), flag, "is bytes",
                    "--model")
