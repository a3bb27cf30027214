"""Round-8 QA, issue 19: prefix-cache tiers (GPU → host → disk) on hybrids, by hand: `share` on Nemotron-H-56B (a
state saved with every cached block) and `sim --host-cache` on gpt-oss-20b (a sliding window).

vLLM's rule for a sliding group loading an external (host) hit (single_type_kv_cache_manager.py,
allocate_new_computed_blocks): the blocks before get_num_skipped_tokens(hit) // B = (hit − W + 1) // B are null
entries, only the rest are allocated for the connector to fill: a sliding group reads its window's blocks only,
and a Mamba group (get_num_skipped_tokens = hit − 1) the one state at the hit's boundary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _write(tmp_path: Path, rows: list[tuple[int, int, list[int]]]) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 2, "hash_ids": ids}) + "\n"
                            for t, n, ids in rows))
    return str(path)


@pytest.fixture(scope="module")
def mamba_tiers(tmp_path_factory: pytest.TempPathFactory) -> dict:
    # Nemotron-H-56B, --layout ideal at block 16 (vllm would force 4,128): a cached block holds 16 · 40,960 =
    # 655,360 B of attention KV and one saved state 912,605,184 B: 913,260,544 B. GPU 4 GiB // that = 4 blocks,
    # host 64 GiB // that = 75. Requests: 10,240 tokens (ids 0..19) twice, then 9,000 (ids 0..17). A request's
    # blocks enter the cache block 0 most recent (exclusive tiers: the GPU keeps the 4 most recent, the host the next
    # 75, the rest are dropped: no disk); a hit needs the whole chain, so requests 2 and 3 each hit blocks 0..78 =
    # 79 blocks = 1,264 tokens: 4 · 16 = 64 on the GPU, 75 · 16 = 1,200 read back from the host
    from typer.testing import CliRunner

    from kvcalc.cli.app import app

    trace = _write(tmp_path_factory.mktemp("mamba"), [(0, 10240, list(range(20))), (1000, 10240, list(range(20))),
                                                      (2000, 9000, list(range(18)))])
    result = CliRunner().invoke(app, ["share", "--trace", "mooncake", trace, "--model", "nemotron-h-56b", "--layout",
                                      "ideal", "--gpu-cache", "4GiB", "--host-cache", "64GiB", "--gpu", "H200",
                                      "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["tiers"]


def test_share_tiers_on_a_mamba_hybrid_by_hand(mamba_tiers: dict) -> None:
    gpu, host, disk = mamba_tiers["by_tier"]
    assert (gpu["capacity_blocks"], host["capacity_blocks"], disk["capacity_blocks"]) == (4, 75, 0)
    assert host["capacity_bytes"] == 75 * 913_260_544
    assert (gpu["hit_tokens"], host["hit_tokens"], mamba_tiers["hit_tokens"]) == (2 * 64, 2 * 1200, 2528)
    assert host["read_blocks"] == 2 * 75
    assert host["read_bytes_by_group"]["full"] == 2 * 75 * 655_360  # every hit block's attention KV


def test_share_tiers_read_one_state_per_hit(mamba_tiers: dict) -> None:
    host = mamba_tiers["by_tier"][1]
    assert host["read_bytes_by_group"]["state_mamba2"] == 2 * 912_605_184
    assert host["read_bytes"] == 2 * (75 * 655_360 + 912_605_184)


@pytest.fixture
def sliding_run(run_cli, tmp_path: Path) -> dict:
    # gpt-oss-20b, block 16, a block id one page of 12 layer slots: 12 · 16 · 2,048 = 393,216 B a table. A custom GPU
    # of 585 ids (586 less the null block): request 1 (4,096 tokens, ids 0..7, 2 output tokens) is cached, request 2
    # (other ids) evicts most of it to the host, request 3 (= request 1) hits 4,095 // 16 = 255 blocks = 4,080 tokens.
    # Each group's block leaves the GPU on its own (core/sim/tiers.py, as vLLM's offloading keys (hash, group)):
    # r1's prefill takes 256 + 256 ids and its decode 2: the 71 never used, r0's sliding blocks 0..247 (freed at its
    # decode step, (4,096 − 128 + 1) // 16 = 248 of them), then 195 of what r0 freed at its end, full table first,
    # tail first: block 256 (1 token, no hash) and full blocks 255..62 (194, to the host); full 0..61 and sliding
    # 248..255 stay cached. r3: no GPU hit (its sliding window is gone); full 0..254 and the sliding window
    # (4,080 − 127) // 16 = 247..254 are loaded: 247 and full 62..254 from the host, the rest still cached on the
    # GPU past the hit, counted from the host as vLLM's write-through CPU copy holds them (core/sim/tiers_groups)
    trace = _write(tmp_path, [(0, 4096, list(range(8))), (2000, 4096, list(range(100, 108))),
                              (4000, 4096, list(range(8)))])
    result = run_cli("sim", "--model", "gpt-oss-20b", "--gpu-memory", "2360MiB", "--bandwidth", "4.8e12", "--flops",
                     "989e12", "--weights-bytes", "1GiB", "--workspace-bytes", "1", "--memory-utilization", "1",
                     "--max-model-len", "4098", "--trace", "mooncake", trace, "--host-cache", "1GiB", "--json")
    assert result.exit_code == 0, result.stderr
    gpu_only, with_host = result.json()["tiers"]["rungs"]
    assert (gpu_only["hit_tokens"], with_host["hit_tokens"]) == (0, 4080)
    assert with_host["host_hit_rate"] == 4080 / (3 * 4096)
    return with_host


def test_sim_tiers_full_group_reads_every_hit_block(sliding_run: dict) -> None:
    assert sliding_run["read_bytes_by_group"]["host"]["full"] == 255 * 393_216


def test_sim_tiers_sliding_group_reads_its_window_only(sliding_run: dict) -> None:
    # hit 4,080 tokens, W = 128: skipped (4,080 − 127) // 16 = 247 blocks; cdiv(4,080, 16) − 247 = 8 loaded
    assert sliding_run["read_bytes_by_group"]["host"]["sliding_128"] == 8 * 393_216


def test_sim_tiers_table_names_each_group(run_cli, tmp_path: Path) -> None:
    # the 'tier reads by KV cache group' table had no group column (its Field had no label): two unnamed rows
    trace = _write(tmp_path, [(0, 1000, [0, 1]), (1000, 1000, [0, 1])])
    result = run_cli("sim", "--model", "gpt-oss-20b", "--gpu", "H200", "--max-model-len", "8192", "--trace",
                     "mooncake", trace, "--host-cache", "64GiB", "--format", "markdown")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    at = lines.index("### tier reads by KV cache group")
    header = [c.strip() for c in lines[at + 2].strip().strip("|").split("|")]
    assert header == ["group", "per block", "host read", "disk read"]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[at + 4 : at + 6]]
    assert [r[:2] for r in rows] == [["full", "384.00 KiB"], ["sliding_128", "384.00 KiB"]]
