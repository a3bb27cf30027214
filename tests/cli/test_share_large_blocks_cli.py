"""`kvcalc share` / `share --capacity` / `sim` on a Mooncake trace at blocks of 512·m tokens (1,024, 2,048):
the numbers worked by hand in tests/core/share/test_large_blocks.py, through the CLI; other sizes one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# a: ids [1,2,3,4]; b shares 3 of them ([1,2,3,5]); c extends a ([1,2,3,4,7,8], 2,600 tokens)
SHARED_3_OF_4 = [(2048, [1, 2, 3, 4]), (2048, [1, 2, 3, 5]), (2600, [1, 2, 3, 4, 7, 8])]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": p, "output_length": 10, "hash_ids": ids})
                            + "\n" for i, (p, ids) in enumerate(SHARED_3_OF_4)))
    return path


@pytest.mark.parametrize(("block", "hit_tokens", "cached"), [
    ("1024", 1024 + 2048, 3),  # b hits [1,2] (its [3,5] differs); c hits [1,2] and [3,4]
    ("2048", 0 + 2048, 2),  # b's one block [1,2,3,5] is not a's [1,2,3,4]; c's is
    ("4096", 0, 0),  # no prompt fills a block
])
def test_share_by_hand(run_cli, trace: Path, block: str, hit_tokens: int, cached: int) -> None:
    result = run_cli("share", "--trace", "mooncake", str(trace), "--block", block, "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert (doc["hit_tokens"], doc["peak_cached_blocks"]) == (hit_tokens, cached)


def test_capacity_curve_by_hand(run_cli, trace: Path) -> None:
    """Block 1,024, chain keys k1 = [1,2], k2 = k1+[3,4], k3 = k1+[3,5]; a request's blocks enter the LRU
    block 0 on top. 1 block: a leaves {k1}; b hits k1 (1), leaves {k1}; c hits k1, not k2 (1): 2 blocks.
    2 blocks: a {k1,k2}; b hits k1, k3 enters, k2 (least recent) leaves; c hits k1 only: 2. 3 blocks: nothing
    is evicted: b 1, c 2: 3 blocks = the unbounded 3,072 tokens."""
    result = run_cli("share", "--trace", "mooncake", str(trace), "--block", "1024", "--capacity", "1024,2048,3072",
                     "--json")
    assert result.exit_code == 0, result.stderr
    (curve,) = result.json()["curves"]
    assert [p["capacity_blocks"] for p in curve["points"]] == [1, 2, 3]
    assert [p["hit_tokens"] for p in curve["points"]] == [2048, 2048, 3072]
    assert curve["unbounded_hit_tokens"] == 3072


def test_sim_uses_the_prefix_hits(run_cli, trace: Path) -> None:
    args = ("sim", "--trace", "mooncake", str(trace), "-b", "1024", "-m", "llama-3-8b", "--gpu", "H100-SXM", "--layout",
            "ideal", "--json")  # kvcalc's own pool: vLLM's takes blocks of 1 to 256 tokens only
    cached, plain = run_cli(*args), run_cli(*args, "--no-prefix-caching")
    assert cached.exit_code == 0 and plain.exit_code == 0, (cached.stderr, plain.stderr)
    assert cached.json()["completed"] == plain.json()["completed"] == 3
    # b and c skip the prefill of their hit blocks: the first token comes sooner
    assert cached.json()["ttft_s"]["mean"] < plain.json()["ttft_s"]["mean"]


@pytest.mark.parametrize("command", [("share",), ("share", "--capacity", "1M"), ("sim", "--layout", "ideal")])
def test_other_sizes_are_one_line(run_cli, trace: Path, command: tuple[str, ...]) -> None:
    result = run_cli(command[0], "--trace", "mooncake", str(trace), *command[1:], "--block", "1000")
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --block 1000 does not divide 512 and is not a multiple"), \
        lines
    assert "16, 32, 64" in lines[0] and "1,024, 2,048, 4,096" in lines[0]


@pytest.mark.parametrize("command", [("share",), ("share", "--capacity", "1M"),
                                     ("sim", "-m", "llama-3-8b", "--layout", "ideal")])
def test_unchained_ids_are_one_line_above_512(run_cli, tmp_path: Path, command: tuple[str, ...]) -> None:
    """Id 2 follows id 1, then id 3: keying [3,2] by its last id would read it as [1,2]. Refused at 1,024."""
    path = tmp_path / "u.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 1, "input_length": 1100, "output_length": 1, "hash_ids": [3, 2, 9]}\n')
    result = run_cli(command[0], "--trace", "mooncake", str(path), *command[1:], "--block", "1024")
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not prefix-chained" in lines[0] and "use a --block that divides 512" in lines[0], lines
    assert run_cli("share", "--trace", "mooncake", str(path), "--block", "512", "--json").json()["hit_tokens"] == 0
