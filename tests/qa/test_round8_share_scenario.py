"""Round-8 QA, issue 19: `share` scenario mode (K branches forked from one prompt) on a Mamba hybrid, Falcon-H1-0.5B's
config, by hand: a state per branch.

Falcon-H1-0.5B under vLLM's layout: block 800 (16 · ceil(403,968 / (16 · 512))), one full and one state group of 36
layer slots, a block id 36 · 800 · 512 = 14,745,600 B. P = 4,000 prompt tokens, K = 3 branches of G = 500 tokens:
a branch writes P + G − 1 = 4,499 positions (its last token writes no KV).
"""

from __future__ import annotations

from pathlib import Path

from real_configs import write_config


def test_branches_share_the_prompt_and_each_keep_a_state(run_cli, tmp_path: Path) -> None:
    config = write_config(tmp_path, "FALCON_H1_05B", "test_architecture_configs")
    result = run_cli("share", "--config", str(config), "--prefix", "4000", "--branches", "3", "--gen", "500", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert (doc["block_size"], doc["block_bytes"]) == (800, 14_745_600)
    # full table: 4,000 = 5 whole blocks shared by all, then ceil(4,499 / 800) − 5 = 1 private block a branch (the
    # prompt ends on a block boundary: nothing shared is written, no copy-on-write of KV): 5 + 3 = 8 blocks;
    # state: one page a branch (mode none), the first branch keeps the prompt's, the 2 others copy it: 3 pages, 2
    # copies. Logical: 3 branches · (6 + 1) = 21; physical 8 + 3 = 11 = the peak; saved 10
    assert (doc["logical_blocks"], doc["physical_blocks"], doc["peak_blocks"], doc["saved_blocks"]) == (21, 11, 11, 10)
    assert (doc["cow_copies"], doc["forks"]) == (2, 2)
    assert doc["physical_bytes"] == 11 * 14_745_600 == 162_201_600
    assert doc["logical_bytes"] == 21 * 14_745_600
