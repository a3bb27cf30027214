"""Round-5 QA of `kvcalc share` on hybrid models from their public configs: blocks and bytes per KV cache group,
worked by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

from real_configs import write_config


def _share(run_cli, tmp_path: Path, name: str, *args: str) -> dict:
    result = run_cli("share", "--config", str(write_config(tmp_path, name)), *args, "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()


def test_gpt_oss_120b_three_branches_per_group(run_cli, tmp_path: Path) -> None:
    doc = _share(run_cli, tmp_path, "GPT_OSS_120B", "--prefix", "5000", "--branches", "3", "--gen", "300")
    groups = {g["kind"]: g for g in doc["kv_cache_groups"]["groups"]}
    # 36 layers: 18 sliding (W = 128) and 18 full, 8 KV heads of 64 in bf16 = 2,048 B a token a layer; the vllm
    # layout pads both to 18 layer slots, so one block id is 18 · 16 · 2,048 = 589,824 B
    assert doc["block_bytes"] == 18 * 16 * 2048 == 589_824
    # full: floor(5,000 / 16) = 312 shared blocks + 3 · ceil((5,000 mod 16 + 300) / 16) = 3 · 20 of their own
    assert groups["full"]["physical_blocks"] == 312 + 3 * 20 == 372
    # sliding: the last token (5,300th) is computed at 5,299 cached: blocks before (5,299 − 128 + 1) // 16 = 323 are
    # freed, the table ends at 5,299 // 16 = 331: 9 blocks a branch, all past the prompt's (block 312), none shared
    assert groups["sliding"]["physical_blocks"] == 3 * (331 - 323 + 1) == 27
    assert doc["physical_blocks"] == 372 + 27
    assert doc["physical_bytes"] == 399 * 589_824 == 235_339_776
    # the closed form of a full-attention model holds for the full group alone
    assert groups["full"]["physical_bytes"] == 372 * 589_824


def test_nemotron_h_56b_copies_each_state_for_each_branch(run_cli, tmp_path: Path) -> None:
    doc = _share(run_cli, tmp_path, "NEMOTRON_H_56B", "--prefix", "5000", "--branches", "3", "--gen", "300")
    groups = {g["kind"]: g for g in doc["kv_cache_groups"]["groups"]}
    # the state page forces block 4,128; a block id is 10 layer slots of 4,128 · 4,096 B
    assert doc["block_size"] == 4128 and doc["block_bytes"] == 169_082_880
    # full (10 layers, 1 table): floor(5,000 / 4,128) = 1 shared + 3 · ceil((872 + 300) / 4,128) = 3 own
    assert groups["full"]["physical_blocks"] == 1 + 3 == 4
    # state (54 mamba2 layers in 6 tables of 10 slots): one page a table a branch, never shared
    assert (groups["state"]["block_tables"], groups["state"]["physical_blocks"]) == (6, 6 * 3)
    # without sharing each branch holds 6 states + ceil(5,300 / 4,128) = 2 attention blocks
    assert doc["logical_blocks"] == 3 * (6 + 2) == 24
    # copies: 2 of the 3 branches copy the 6 forked state pages and the shared, partly filled attention block
    assert doc["cow_copies"] == 2 * (6 + 1) == 14
    assert doc["physical_bytes"] == 22 * 169_082_880 == 3_719_823_360


def test_llama4_scout_chunked_tables_keep_the_current_chunk(run_cli, tmp_path: Path) -> None:
    doc = _share(run_cli, tmp_path, "LLAMA4_SCOUT", "--prefix", "10000", "--branches", "3", "--gen", "100")
    groups = {g["kind"]: g for g in doc["kv_cache_groups"]["groups"]}
    # 48 layers: 36 chunked (C = 8,192) in 3 tables of 12 slots, 12 full; 8 KV heads of 128: a block id is
    # 12 · 16 · 4,096 B. Full: 10,000 / 16 = 625 shared blocks + 3 · ceil(100 / 16) = 3 · 7 own = 646.
    assert doc["block_bytes"] == 12 * 16 * 4096 == 786_432
    assert groups["full"]["physical_blocks"] == 625 + 3 * 7 == 646
    # chunked: at 10,100 tokens the chunk starts at floor(10,099 / 8,192) · 8,192 = 8,192 (block 512); the prompt's
    # blocks 512..624 (113) are shared, 625..631 (7) are each branch's: 3 tables · (113 + 3 · 7)
    assert (groups["chunked"]["block_tables"], groups["chunked"]["physical_blocks"]) == (3, 3 * (113 + 21)) == (3, 402)
    assert doc["physical_bytes"] == (646 + 402) * 786_432


def test_a_mamba_hybrid_replays_in_the_least_memory_share_names(run_cli, tmp_path: Path) -> None:
    config = write_config(tmp_path, "NEMOTRON_H_56B")
    trace = tmp_path / "big.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 20000, "output_length": 10,
                                 "hash_ids": list(range(1, 41))}) + "\n")
    args = ("share", "--config", str(config), "--trace", "mooncake", str(trace))
    refused = run_cli(*args, "--capacity-blocks", "1")
    assert refused.exit_code == 2
    least = re.search(r"give --capacity-blocks ([\d,]+)", refused.stderr)
    assert least is not None, refused.stderr
    # B 4,128: full ceil(20,010 / 4,128) = 5 + 6 state tables x 1 page (mode none: one page a request, moved) = 11
    assert least.group(1) == "11"
    ran = run_cli(*args, "--capacity-blocks", least.group(1).replace(",", ""), "--json")
    assert ran.exit_code == 0, ran.stderr
    assert ran.json()["requests"] == 1 and ran.json()["peak_used_blocks"] == 11
