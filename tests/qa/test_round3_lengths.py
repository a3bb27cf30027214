"""Round-3 QA of lengths files: a .npy of float64 [3.0] was read as length 3 while a JSON list [2.0] was refused.
The typed formats now agree on the stricter rule: a length is an integer value (a JSON integer, an integer
dtype), never a float, whole or not, each refused with the same shape ("... is not an integer length ...; fix").
Text formats (lines, CSV, --lengths) read an integer's spelling as every integer option does (4096.0, 1e3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvcalc.core.inputs.lengths import read_lengths_file


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_a_whole_float_npy_is_refused_naming_its_dtype_and_the_fix(tmp_path: Path, dtype) -> None:
    path = tmp_path / "lengths.npy"
    np.save(path, np.array([3.0, 5.0], dtype=dtype))  # was read as [3, 5]
    with pytest.raises(ValueError) as caught:
        read_lengths_file(path)
    assert str(caught.value) == (f"{path}: {np.dtype(dtype)} values are not integer lengths; save an integer array, "
                                 "e.g. numpy.save(path, lengths.astype(numpy.int64)) once they are whole")


def test_a_whole_float_json_is_refused_with_the_same_shape(tmp_path: Path) -> None:
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps([5, 2.0]))
    with pytest.raises(ValueError) as caught:
        read_lengths_file(path)
    assert str(caught.value) == (f"{path}, item 2: 2.0 is not an integer length; write whole numbers without a "
                                 "decimal point")


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint64])
def test_integer_npy_and_json_read_the_same_lengths(tmp_path: Path, dtype) -> None:
    np.save(tmp_path / "a.npy", np.array([3, 5, 100], dtype=dtype))
    (tmp_path / "a.json").write_text("[3, 5, 100]")
    assert read_lengths_file(tmp_path / "a.npy").tokens.tolist() == [3, 5, 100]
    assert read_lengths_file(tmp_path / "a.json").tokens.tolist() == [3, 5, 100]


def test_frag_cli_refuses_a_float_npy_in_one_line(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "lengths.npy"
    np.save(path, np.array([3.0]))
    result = run_cli("frag", "--lengths-file", str(path))
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (f"error: {path}: float64 values are not integer lengths; save an integer "
                                     "array, e.g. numpy.save(path, lengths.astype(numpy.int64)) once they are whole")
