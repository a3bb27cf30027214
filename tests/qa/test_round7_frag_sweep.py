"""What the round-7 sweep of `kvcalc frag` over real configs, the four shared traces and bad inputs found wrong,
each pinned: block sizes vLLM refuses are said so (the best-block note claimed vLLM accepts 7 and 9)."""

from __future__ import annotations

import pytest


def _text(run_cli, *args: str) -> str:
    result = run_cli("frag", *args)
    assert result.exit_code == 0, result.stderr
    return " ".join(result.stdout.split())


@pytest.mark.parametrize("model", ["gemma-3-27b", "nemotron-h-56b", "llama-3-8b"])
def test_block_sizes_vllm_refuses_are_said_so(run_cli, model: str) -> None:
    # vLLM's --block-size takes 1, 8, 16, 32, 64, 128 or 256 (CacheConfig.BlockSize): 7 and 9 are neither
    both = _text(run_cli, "--model", model, "--block", "7", "--block", "9")
    assert "that vLLM's block_size accepts: 7, 9" not in both
    assert "None of the sizes given (7, 9) is one vLLM's block_size accepts" in both
    one = _text(run_cli, "--model", model, "--block", "7")
    assert "None of the sizes given (7) is one vLLM's block_size accepts" in one
    # under --layout ideal no engine is asked: no such note
    ideal = _text(run_cli, "--model", model, "--block", "7", "--layout", "ideal")
    assert "accepts" not in ideal


def test_accepted_sizes_keep_their_notes(run_cli) -> None:
    mixed = _text(run_cli, "--model", "gemma-3-27b", "--block", "7", "--block", "16")
    assert "Best block size: only B = 16 of those given is one vLLM accepts." in mixed
    assert "None of the sizes given" not in mixed
    plain = _text(run_cli, "--model", "gemma-3-27b", "--block", "16", "--block", "32")
    assert "chosen among the sizes given that vLLM's block_size accepts: 16, 32." in plain


def test_speculative_state_pages_have_their_own_column(run_cli) -> None:
    # Nemotron-H-56B, vllm: blocks of 4,128 tokens, a block id 10 · 4,128 · 4,096 = 169,082,880 B; state 6 tables.
    # Lengths 100, 5,000, 4,128, 4,127, K = 3 drafts + 3 lookahead slots (draft): the peak holds n + 6 tokens.
    # KV: plain 1 + 2 + 1 + 1 = 5 blocks; peak ceil(106, 5,006, 4,134, 4,133 / 4,128) = 1 + 2 + 2 + 2 = 7.
    # State (mamba_cache_mode none): plain 1 page a sequence a table = 4 · 6 = 24; at the peak 1 + K = 4: 96.
    page = 10 * 4128 * 4096
    args = ("frag", "--model", "nemotron-h-56b", "--lengths", "100,5000,4128,4127", "--spec-tokens", "3", "--block",
            "16")
    entry = run_cli(*args, "--json").json()["speculative"]["paged"][0]
    assert entry["peak_allocated_kv_bytes"] == 7 * page
    assert entry["peak_allocated_state_bytes"] == 96 * page
    assert entry["extra_kv_bytes"] == (7 - 5 + 96 - 24) * page  # KV and state pages together, as before
    out = run_cli(*args, "--format", "markdown").stdout
    header = next(line for line in out.splitlines() if line.startswith("|") and "peak blocks" in line)
    cells = [c.strip() for c in header.strip().strip("|").split("|")]
    # was 'peak KV' 1.10 GiB beside 'extra KV' 11.65 GiB: the extra held the state pages the peak left out
    assert cells[-3:] == ["peak KV", "peak state", "extra (KV + state)"]
    row = [c.strip() for c in out.splitlines()[out.splitlines().index(header) + 2].strip().strip("|").split("|")]
    assert row[-3:] == ["1.10 GiB", "15.12 GiB", "11.65 GiB"]  # 7 · page; 96 · page; 74 · page


def test_speculative_without_state_keeps_its_columns(run_cli) -> None:
    out = run_cli("frag", "--model", "gemma-3-27b", "--lengths", "100,5000", "--spec-tokens", "3", "--format",
                  "markdown").stdout
    header = next(line for line in out.splitlines() if line.startswith("|") and "peak blocks" in line)
    assert [c.strip() for c in header.strip().strip("|").split("|")][-2:] == ["peak KV", "extra KV"]
    doc = run_cli("frag", "--model", "gemma-3-27b", "--lengths", "100,5000", "--spec-tokens", "3", "--json").json()
    assert "peak_allocated_state_bytes" not in doc["speculative"]["paged"][0]


def test_groups_table_says_it_shows_the_best_block_size_only(run_cli) -> None:
    # more than two block sizes: the groups table keeps the best one's rows, and its title says so (it did not)
    out = run_cli("frag", "--model", "gemma-3-27b", "--block", "16", "--block", "32", "--block", "64").stdout
    assert "KV cache groups — layout vllm, best block size only (B = 16; --json has every size)" in out
    two = run_cli("frag", "--model", "gemma-3-27b", "--block", "16", "--block", "32").stdout
    assert "KV cache groups — layout vllm\n" in two
