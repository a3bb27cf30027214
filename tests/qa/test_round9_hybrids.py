"""Round-9 QA: two 2025-26 hybrids not tried before (tests/round9_configs.py), every command, by hand from the config
fields and vLLM v1's rules (kv_cache_utils: page sizes unified, groups of the smallest layer count; MambaManager:
one state page a request per state group with mamba_cache_mode none).

LFM2-8B-A1B: 6 attention layers (2, 6, 10, 14, 18, 21) of 8 KV heads × (2,048 / 32 = 64): 2 · 8 · 64 · 2 = 2,048 B a
token a layer, 12,288 B for the 6; 18 short-convolution layers, each a state of hidden 2,048 × (conv_L_cache 3 − 1)
= 4,096 bf16 scalars = 8,192 B: 147,456 B a sequence. Block 16: an attention page 16 · 2,048 = 32,768 B holds a
state (8,192 B, padded 4×); groups of 6 layer slots: 1 full + 3 state groups, a block id 6 · 32,768 = 196,608 B.
Qwen3.5-35B-A3B: 10 gated-attention layers of 2 KV heads × 256: 2,048 B a token a layer, 20,480 B for the 10;
30 Gated DeltaNet layers, each conv (4 − 1) · (2 · 16 · 128 + 32 · 128 = 8,192) = 24,576 scalars + state
32 · 128 · 128 = 524,288 scalars, bf16 (the config's dtype): 1,097,728 B, 32,931,840 B for the 30.
vLLM raises the attention block until its page holds a state: 16 · cdiv(1,097,728, 16 · 2,048) = 16 · 34 = 544
tokens, a page 544 · 2,048 = 1,114,112 B; groups of 10 slots: 1 full + 3 state, a block id 11,141,120 B.
Nemotron-Nano-9B-v2: the pattern's 4 '*' layers keep 2 · 8 · 128 · 2 = 4,096 B a token each (16,384 B); 27 'M'
Mamba-2 layers, each conv (4 − 1) · (128 · 80 + 2 · 8 · 128 = 12,288) = 36,864 bf16 scalars = 73,728 B and SSM
128 · 80 · 128 = 1,310,720 fp32 scalars (vLLM's NemotronH state dtype) = 5,242,880 B: 5,316,608 B a layer.
"""

from __future__ import annotations

import csv
from pathlib import Path

from round9_configs import LFM2_8B_A1B, NEMOTRON_NANO_9B_V2, QWEN35_35B_A3B, write

GiB = 2**30


def _json(run_cli, *args: str) -> dict:
    result = run_cli(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()


def _plan(run_cli, config: str, memory: str) -> dict:
    return _json(run_cli, "size", "--config", config, "--kv-memory", memory)["gpu_plan"]


def test_lfm2_size_and_pool(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "lfm2", LFM2_8B_A1B))
    doc = _json(run_cli, "size", "--config", config, "--tokens", "4096")
    assert (doc["bytes_per_token"], doc["state_bytes_per_seq"]) == (12_288, 18 * 8192) == (12_288, 147_456)
    assert doc["bytes_per_seq"] == 4096 * 12_288 + 147_456
    plan = _plan(run_cli, config, "10GiB")
    assert (plan["block_size"], plan["page_bytes"], plan["group_size"], plan["block_bytes"]) == (16, 32_768, 6,
                                                                                                 196_608)
    # 10 GiB // 196,608 = 54,613 ids; a 128,000-token request: 128,000 / 16 = 8,000 full + 3 state pages
    assert (plan["num_blocks"], plan["blocks_per_request"]) == (10 * GiB // 196_608, 8003) == (54_613, 8003)
    assert plan["kv_cache_tokens"] == 54_613 * 128_000 // 8003 == 873_480


def test_lfm2_frag_and_share_hold_one_state_page_a_request(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "lfm2", LFM2_8B_A1B))
    frag = _json(run_cli, "frag", "--config", config, "--lengths", "100,2000")["paged"][0]
    groups = {g["kind"]: g for g in frag["groups"]}
    # full: cdiv(100, 16) + cdiv(2,000, 16) = 7 + 125; state: 2 requests · 3 tables, 147,456 B useful each
    assert (groups["full"]["blocks"], groups["state"]["blocks"]) == (132, 6)
    assert groups["state"]["useful_bytes"] == 2 * 147_456 and groups["state"]["allocated_bytes"] == 6 * 196_608
    assert frag["useful_kv_bytes"] == 2100 * 12_288
    share = _json(run_cli, "share", "--config", config, "--prefix", "1000", "--branches", "3", "--gen", "50")
    by_kind = {g["kind"]: g["physical_blocks"] for g in share["kv_cache_groups"]["groups"]}
    # full: 62 whole prefix blocks shared + 3 branches · (cdiv(1,050, 16) − 62 = 4); state: a page per branch and table
    assert by_kind == {"full": 62 + 3 * 4, "state": 3 * 3}
    assert share["logical_blocks"] == 3 * (66 + 3) == 207


def test_qwen35_block_raised_to_hold_a_state(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "qwen35", QWEN35_35B_A3B))
    result = run_cli("size", "--config", config, "--tokens", "4096", "--json")
    assert result.exit_code == 0 and "mtp_num_hidden_layers" in result.stderr  # the MTP layer said, not counted
    doc = result.json()
    assert (doc["bytes_per_token"], doc["state_bytes_per_seq"]) == (20_480, 30 * 1_097_728) == (20_480, 32_931_840)
    assert doc["model"]["max_position_embeddings"] == 262_144
    plan = _plan(run_cli, config, "10GiB")
    assert (plan["block_size"], plan["page_bytes"], plan["group_size"]) == (544, 1_114_112, 10)
    assert plan["block_bytes"] == 10 * 1_114_112 == 11_141_120
    # 10 GiB // 11,141,120 = 963; a 262,144-token request: cdiv(262,144, 544) = 482 full + 3 state pages = 485
    assert (plan["num_blocks"], plan["blocks_per_request"]) == (963, 485)
    assert plan["kv_cache_tokens"] == 963 * 262_144 // 485 == 520_504
    # what fits in 40 GiB: sequences of 8,192 (8,192 · 20,480 + 32,931,840 = 200,704,000 B each): 213; tokens with one
    # state: (40 GiB − 32,931,840) // 20,480 = 2,095,544; vLLM's ids 40 GiB // 11,141,120 = 3,855 of 544 tokens
    cap = _json(run_cli, "size", "--config", config, "--memory", "40GiB", "--tokens", "8192")["capacity"]
    assert (cap["max_seqs"], cap["max_tokens"]) == (40 * GiB // 200_704_000, (40 * GiB - 32_931_840) // 20_480)
    assert (cap["max_seqs"], cap["max_tokens"], cap["vllm_num_blocks"], cap["vllm_block_size"]) == (
        213, 2_095_544, 3855, 544)


def test_qwen35_sim_timeline_at_block_544(run_cli, tmp_path: Path) -> None:
    # One request, P = 1,086, O = 5: full cdiv(1,086, 544) = 2 blocks (1,088 slots), each state group 1 page, counted
    # whole (3 · 544 = 1,632 slots). Rows: prefill 1,086 + 1,632 = 2,718, tail 2; n = 1,086 and 1,087 fill the
    # second block (tails 1, 0); n = 1,088 opens a third: 1,089 + 1,632 = 2,721, tail 3 · 544 − 1,089 = 543; then 542.
    config = str(write(tmp_path / "qwen35", QWEN35_35B_A3B))
    timeline = tmp_path / "t.csv"
    doc = _json(run_cli, "sim", "--config", config, "--gpu", "H200", "--requests", "1", "--rate", "inf",
                "--prompt-dist", "uniform:low=1086,high=1086", "--output-dist", "uniform:low=5,high=5",
                "--timeline", str(timeline))
    tables = [g["kind"] for g in doc["kv_cache_groups"]["groups"] for _ in range(g["block_tables"])]
    assert sorted(tables) == ["full"] + ["state"] * 3 and doc["memory_plan"]["block_size"] == 544
    full = tables.index("full")
    rows = list(csv.DictReader(timeline.open()))
    blocks = [[int(r[f"group{i}_blocks"]) for i in range(4)] for r in rows]
    assert blocks == [[n if i == full else 1 for i in range(4)] for n in (2, 2, 2, 3, 3)]
    assert [(int(r["useful_slots"]), int(r["tail_fragmentation_slots"])) for r in rows] == [
        (2718, 2), (2719, 1), (2720, 0), (2721, 543), (2722, 542)]
    plan = _json(run_cli, "size", "--config", config, "--gpu", "H200")["gpu_plan"]
    assert doc["memory_plan"]["num_blocks"] == plan["num_blocks"] == plan["kv_cache_bytes"] // 11_141_120
    assert doc["memory_plan"]["free_blocks"] == plan["num_blocks"] - 1  # vLLM's null block


def test_both_plan_and_sim_agree_on_the_pool(run_cli, tmp_path: Path) -> None:
    for name, config in (("lfm2", LFM2_8B_A1B), ("qwen35", QWEN35_35B_A3B)):
        path = str(write(tmp_path / name, config))
        sim = _json(run_cli, "sim", "--config", path, "--gpu", "H200", "--requests", "20", "--max-model-len", "32768")
        assert sim["completed"] == 20
        plan = _json(run_cli, "plan", "--config", path, "--gpu-cost", "H200=3", "--tp", "1", "--replicas", "1",
                     "--requests", "20", "--max-model-len", "32768", "--slo", "ttft=5", "--jobs", "1", "--no-cache")
        (point,) = plan["points"]
        assert point["memory"]["kv_pool_bytes"] == sim["memory_plan"]["kv_pool_bytes"]
        assert point["memory"]["block_size"] == sim["memory_plan"]["block_size"]


def test_nemotron_nano_9b_v2_pool(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "nano", NEMOTRON_NANO_9B_V2))
    doc = _json(run_cli, "size", "--config", config, "--tokens", "4096")
    assert (doc["bytes_per_token"], doc["state_bytes_per_seq"]) == (16_384, 27 * 5_316_608) == (16_384, 143_548_416)
    plan = _plan(run_cli, config, "10GiB")
    # block 16 · cdiv(5,316,608, 16 · 4,096) = 16 · 82 = 1,312 tokens, a page 1,312 · 4,096 = 5,373,952 B; groups of
    # 4 slots (the 4 attention layers): 1 full + cdiv(27, 4) = 7 state groups (the last 3 layers + 1 padding slot)
    assert (plan["block_size"], plan["page_bytes"], plan["group_size"]) == (1312, 5_373_952, 4)
    assert plan["block_bytes"] == 4 * 5_373_952 == 21_495_808
    assert sorted(g["layers"] for g in plan["groups"] if g["kind"] == "mamba2") == [3] + [4] * 6
    # 10 GiB // 21,495,808 = 499; a 131,072-token request: cdiv(131,072, 1,312) = 100 full + 7 state pages
    assert (plan["num_blocks"], plan["blocks_per_request"]) == (499, 107)
    assert plan["kv_cache_tokens"] == 499 * 131_072 // 107 == 611_261


def test_pipeline_stages_page_the_global_groups(run_cli, tmp_path: Path) -> None:
    # vLLM (kv_cache_utils.get_kv_cache_configs) forms the groups over ALL layers, keeps each worker's layers of each,
    # and pages a block id of the largest such share on every stage; num_blocks is the smallest over the stages.
    # Qwen3.5-35B-A3B at pp 2 (layers 0..19 | 20..39): groups full (3, 7, .., 39), A = the first 10 DeltaNet layers
    # (0 .. 12, all on stage 0), B = the next 10 (13 .. 26: 5 and 5), C = the last 10 (all on stage 1): 10 slots on
    # both stages, 10 GiB // (10 · 1,114,112) = 963 ids, as without pp
    plan = _plan(run_cli, str(write(tmp_path / "qwen35", QWEN35_35B_A3B)), "10GiB")
    pp = _json(run_cli, "size", "--config", str(tmp_path / "qwen35"), "--kv-memory", "10GiB", "--pp", "2")["gpu_plan"]
    assert (pp["stage_slots"], pp["num_blocks"]) == (10, 963) == (10, plan["num_blocks"])
    # LFM2-8B-A1B at pp 2 (layers 0..11 | 12..23): attention layers 2, 6, 10 | 14, 18, 21 (3 each); conv groups of 6
    # in order: [0, 1, 3, 4, 5, 7], [8, 9, 11, 12, 13, 15] (3 and 3), [16, 17, 19, 20, 22, 23]: 6 slots on both
    lfm2 = str(write(tmp_path / "lfm2", LFM2_8B_A1B))
    pp = _json(run_cli, "size", "--config", lfm2, "--kv-memory", "10GiB", "--pp", "2")["gpu_plan"]
    assert (pp["stage_slots"], pp["num_blocks"]) == (6, 10 * GiB // (6 * 32_768)) == (6, 54_613)
