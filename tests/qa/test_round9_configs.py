"""Round-9 QA: every command on real config.json files of 2025-26 models not tried before (tests/round9_configs.py),
each number by hand from the config's fields and vLLM v1's rules.

Olmo-3-7B: 32 layers of 32 KV heads × 128 (MHA), bf16: 2 · 32 · 128 · 2 = 16,384 B a token a layer; layer_types
put every 4th layer (3, 7, ..., 31) on full attention (8) and the other 24 on a 4,096-token window. Its length:
yarn factor 8 × original_max_position_embeddings 8,192 = 65,536 = max_position_embeddings.
vLLM's hybrid allocator (kv_cache_utils): 8 full and 24 sliding layers, groups of the smaller count, 8 layer slots:
1 full group + 3 sliding groups, a block id = 8 slots × a 16-token page of 16 · 16,384 = 262,144 B = 2 MiB.
A request of max_model_len needs (SlidingWindowSpec.max_memory_usage_bytes, max_num_batched_tokens 8,192):
full cdiv(65,536, 16) = 4,096; each sliding table cdiv(min(4,095 + 8,192, 65,536), 16) + 1 = 768 + 1 = 769.
Seed-OSS-36B: 64 layers · 2 · 8 · 128 · 2 = 262,144 B a token; max_position_embeddings 524,288 (rope default).
GLM-4.6: 92 layers (the one MTP layer keeps KV only under speculation) · 2 · 8 · 128 · 2 = 376,832 B a token;
202,752 tokens long.
Apertus-8B: a model_type kvcalc has no rules for, read as a plain decoder (all its cache fields read): 32 layers
· 2 · 8 · (4,096 / 32 = 128) · 2 = 131,072 B a token; rope llama3 keeps max_position_embeddings 65,536.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from round9_configs import APERTUS_8B, GLM47_FLASH, GLM_46, OLMO3_7B, SEED_OSS_36B, write

GiB = 2**30


def _json(run_cli, *args: str) -> dict:
    result = run_cli(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()


def test_olmo3_size_by_layer_kind(run_cli, tmp_path: Path) -> None:
    doc = _json(run_cli, "size", "--config", str(write(tmp_path / "olmo", OLMO3_7B)), "--tokens", "65536")
    kinds = {g["kind"]: (g["layers"], g["window"], g["bytes_per_token"]) for g in doc["model"]["layer_groups"]}
    assert kinds == {"sliding": (24, 4096, 24 * 16_384), "full": (8, None, 8 * 16_384)}
    assert doc["bytes_per_token"] == 32 * 16_384 == 524_288
    # (8 · 65,536 + 24 · 4,096) token-layers · 16,384 B = 622,592 · 16,384 = 10,200,547,328
    assert doc["bytes_per_seq"] == (8 * 65_536 + 24 * 4096) * 16_384 == 10_200_547_328
    assert doc["model"]["max_position_embeddings"] == 8 * 8192 == 65_536


def test_olmo3_gpu_plan_groups_blocks_and_concurrency(run_cli, tmp_path: Path) -> None:
    doc = _json(run_cli, "size", "--config", str(write(tmp_path / "olmo", OLMO3_7B)), "--kv-memory", "100GiB")
    plan = doc["gpu_plan"]
    assert sorted((g["kind"], g["layers"], g["blocks_per_request"]) for g in plan["groups"]) == [
        ("full", 8, 4096), ("sliding", 8, 769), ("sliding", 8, 769), ("sliding", 8, 769)]
    assert (plan["page_bytes"], plan["group_size"], plan["block_bytes"]) == (262_144, 8, 2 * 2**20)
    # vLLM: 100 GiB // 262,144 B // 8 slots = 51,200 block ids; one request 4,096 + 3 · 769 = 6,403 of them
    assert (plan["num_blocks"], plan["blocks_per_request"]) == (100 * GiB // 262_144 // 8, 6403) == (51_200, 6403)
    assert plan["max_concurrency"] == pytest.approx(51_200 / 6403)
    # "GPU KV cache size": int(concurrency × max_model_len) = int(51,200 · 65,536 / 6,403) = 524,042
    assert plan["kv_cache_tokens"] == 51_200 * 65_536 // 6403 == 524_042


def test_olmo3_frag_and_share_per_group(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "olmo", OLMO3_7B))
    frag = _json(run_cli, "frag", "--config", config, "--lengths", "5000,100")["paged"][0]
    by_kind = {g["kind"]: g["blocks"] for g in frag["groups"]}
    # full: cdiv(5,000, 16) + cdiv(100, 16) = 313 + 7 = 320 in its one table
    # sliding (vLLM get_num_skipped_tokens: n − W + 1 = 905 skipped, 905 // 16 = 56 blocks freed): blocks 56 .. 312
    # = 257 for the 5,000, all 7 of the 100: 264 a table, 3 tables
    assert by_kind == {"full": 320, "sliding": 3 * (257 + 7)}
    share = _json(run_cli, "share", "--config", config, "--prefix", "5000", "--branches", "4", "--gen", "100")
    groups = {g["kind"]: g["physical_blocks"] for g in share["kv_cache_groups"]["groups"]}
    # each branch 5,100 tokens; the 312 whole prefix blocks shared, the partial 313th copied on write:
    # full 312 + 4 · (319 − 312) = 340; sliding keeps positions 5,100 − 4,095 = 1,005 .. 5,099 = blocks 62 .. 318:
    # shared 62 .. 311 (250) + 4 · 7 private = 278 a table, 3 tables = 834
    assert groups == {"full": 312 + 4 * 7, "sliding": 3 * (250 + 4 * 7)}
    assert share["physical_blocks"] == 340 + 834 and share["block_bytes"] == 2 * 2**20
    # logical: 4 branches · (319 full + 3 · 257 sliding blocks) = 4,360
    assert share["logical_blocks"] == 4 * (319 + 3 * 257) == 4360


def test_olmo3_sim_timeline_frees_the_window_step_by_step(run_cli, tmp_path: Path) -> None:
    # One request alone, P = 4,110, O = 5 (block 16, W = 4,096; vLLM frees before (n − W + 1) // 16 first, then takes
    # cdiv(n + 1, 16) for a decode of n computed tokens). Prefill: cdiv(4,110, 16) = 257 in all 4 tables (useful
    # 4 · 4,110, tail 4 · 2). n = 4,110: 15 // 16 = 0 freed, 257 (4 · 4,111, 4 · 1). n = 4,111: 16 // 16 = 1 freed:
    # sliding 256 (positions 16 .. 4,111 = 4,096), full 257 (4,112): 3 · 4,096 + 4,112 = 16,400, tail 0.
    # n = 4,112: block 257 taken: sliding 257 (4,097), full 258 (4,113): 16,404, tail 4 · 15; n = 4,113: 16,408, 56.
    timeline = tmp_path / "t.csv"
    doc = _json(run_cli, "sim", "--config", str(write(tmp_path / "olmo", OLMO3_7B)), "--gpu", "H200", "--requests", "1",
                "--rate", "inf", "--prompt-dist", "uniform:low=4110,high=4110", "--output-dist", "uniform:low=5,high=5",
                "--timeline", str(timeline))
    tables = [g["kind"] for g in doc["kv_cache_groups"]["groups"] for _ in range(g["block_tables"])]
    full = tables.index("full")
    rows = list(csv.DictReader(timeline.open()))
    got = [([int(r[f"group{i}_blocks"]) for i in range(4)], int(r["useful_slots"]), int(r["tail_fragmentation_slots"]))
           for r in rows]
    expected_blocks = [(257, 257), (257, 257), (256, 257), (257, 258), (257, 258)]
    assert [g[0] for g in got] == [[f if i == full else s for i in range(4)] for s, f in expected_blocks]
    assert [g[1:] for g in got] == [(16_440, 8), (16_444, 4), (16_400, 0), (16_404, 60), (16_408, 56)]
    # the pool is size --gpu's on the same GPU, less vLLM's null block
    plan = _json(run_cli, "size", "--config", str(tmp_path / "olmo"), "--gpu", "H200")["gpu_plan"]
    assert doc["memory_plan"]["num_blocks"] == plan["num_blocks"]
    assert doc["memory_plan"]["free_blocks"] == plan["num_blocks"] - 1


def test_seed_oss_long_context_at_tp2(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "seed", SEED_OSS_36B))
    doc = _json(run_cli, "size", "--config", config, "--tp", "2", "--kv-memory", "100GiB")
    assert doc["bytes_per_token"] == 64 * 2 * 8 * 128 * 2 == 262_144
    plan = doc["gpu_plan"]
    # tp 2: 4 KV heads a GPU, a page 16 · 2 · 4 · 128 · 2 = 32,768 B; one group of 64 layers: 2 MiB a block id
    # 100 GiB // 2 MiB = 51,200 ids; one 524,288-token request needs 32,768: concurrency 1.5625, 819,200 tokens
    assert (plan["max_model_len"], plan["num_blocks"], plan["blocks_per_request"]) == (524_288, 51_200, 32_768)
    assert plan["max_concurrency"] == 1.5625 and plan["kv_cache_tokens"] == 819_200
    # 1 GiB holds 1 GiB // 262,144 B = 4,096 tokens on one GPU (every layer, every token)
    capacity = _json(run_cli, "size", "--config", config, "--memory", "1GiB", "--tokens", "1000")["capacity"]
    assert capacity["max_tokens"] == GiB // 262_144 == 4096 and capacity["max_seqs"] == 4


def test_glm46_mtp_layer_not_counted_and_tp8_blocks(run_cli, tmp_path: Path) -> None:
    config = str(write(tmp_path / "glm", GLM_46))
    result = run_cli("size", "--config", config, "--tp", "8", "--kv-memory", "60GiB", "--json")
    assert result.exit_code == 0, result.stderr
    assert "num_nextn_predict_layers" in result.stderr  # said, not silently dropped
    doc = result.json()
    assert doc["bytes_per_token"] == 92 * 2 * 8 * 128 * 2 == 376_832
    plan = doc["gpu_plan"]
    # tp 8: 1 KV head a GPU, a page 16 · 2 · 1 · 128 · 2 = 8,192 B; 92 layers in one group: 753,664 B a block id;
    # 60 GiB // 753,664 = 85,481; a 202,752-token request needs 12,672 ids
    assert (plan["page_bytes"], plan["block_bytes"]) == (8192, 92 * 8192)
    assert plan["num_blocks"] == 60 * GiB // (92 * 8192) == 85_481
    assert (plan["max_model_len"], plan["blocks_per_request"]) == (202_752, 202_752 // 16)
    assert plan["kv_cache_tokens"] == 85_481 * 202_752 // 12_672 == 85_481 * 16
    # MTP's KV only with speculation: 93 layers' worth
    spec = _json(run_cli, "size", "--config", config, "--spec-tokens", "1", "--spec-method", "mtp", "--tokens", "16")
    assert spec["bytes_per_token"] == 93 * 4096


def test_apertus_read_as_a_plain_decoder(run_cli, tmp_path: Path) -> None:
    doc = _json(run_cli, "size", "--config", str(write(tmp_path / "apertus", APERTUS_8B)), "--tokens", "65536")
    assert (doc["model"]["layers"], doc["model"]["kv_heads"], doc["model"]["head_dim"]) == (32, 8, 128)
    assert doc["bytes_per_seq"] == 65_536 * 131_072 == 8 * GiB
    assert doc["model"]["max_position_embeddings"] == 65_536  # llama3 rope: the length is already the scaled one


@pytest.mark.parametrize("config", [OLMO3_7B, SEED_OSS_36B, GLM_46, APERTUS_8B],
                         ids=["olmo3", "seed", "glm", "apertus"])
def test_every_command_runs_and_agrees_on_bytes(run_cli, tmp_path: Path, config: dict) -> None:
    path = str(write(tmp_path / "m", config))
    per_token = _json(run_cli, "size", "--config", path, "--tokens", "16")["bytes_per_token"]
    tp = ["--tp", "8"] if config is GLM_46 else []
    sim = _json(run_cli, "sim", "--config", path, "--gpu", "H200", *tp, "--requests", "20", "--max-model-len", "32768")
    assert sim["completed"] == 20 and sim["memory_plan"]["kv_bytes_per_token"] * (8 if tp else 1) == per_token
    plan = run_cli("plan", "--config", path, "--gpu-cost", "H200=3", "--tp", tp[1] if tp else "1", "--replicas", "1",
                   "--requests", "20", "--max-model-len", "32768", "--slo", "ttft=5", "--jobs", "1", "--no-cache",
                   "--json")
    assert plan.exit_code == 0, plan.stderr
    (point,) = plan.json()["points"]  # the one GPU count asked for: its pool is sim's
    assert point["memory"]["kv_pool_bytes"] == sim["memory_plan"]["kv_pool_bytes"]
    frag = _json(run_cli, "frag", "--config", path, "--lengths", "100")["paged"][0]
    assert frag["blocks"] == 7  # cdiv(100, 16) in every table


def test_olmo3_share_trace_replay_by_hand(run_cli, tmp_path: Path) -> None:
    # Three requests, output 10 each (block 16, W = 4,096, 4 tables): A = 4,096 tokens (ids 0..7), B = A's 4,096 + 512
    # (ids 0..8), C = 4,608 new. A request's peak before its window frees is every table's cdiv(4,618, 16) = 289
    # blocks: 1,156, so 2,314 MiB = 1,157 ids (1,156 free past vLLM's null block) is the least that serves it.
    # A: prefill 4 · 256, decode to 4,105 tokens: 4 · 257 = 1,028 held, freed at its end (the partial blocks 256
    # unhashed). B hits A's 256 blocks in every table (its window covers them: 4,096 tokens, all groups), takes the
    # 128 never-used ids for blocks 256..287, then A's 4 unhashed ids for block 288; at n = 4,608 each sliding table
    # frees (4,608 − 4,095) // 16 = 32 blocks (96 cached): 289 + 3 · 257 = 1,060 held; freed at its end (1,152
    # hashed of 1,156 free). C hits nothing: 1,152 ids for its prefill evict 1,148 hashed (4 unhashed among them),
    # its first decode 4 more: 1,152 evictions; peaks: 1,152 held (C's prefill), 1,152 cached (after B).
    trace = tmp_path / "t.jsonl"
    rows = [(0, 4096, list(range(8))), (1000, 4608, list(range(9))), (2000, 4608, list(range(20, 29)))]
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 10, "hash_ids": ids})
                             + "\n" for t, n, ids in rows))
    config = str(write(tmp_path / "olmo", OLMO3_7B))
    short = run_cli("share", "--config", config, "--trace", "mooncake", str(trace), "--memory", "2312MiB")
    assert short.exit_code == 2 and "1,156" in short.stderr  # 1,155 free ids: one short of A's peak
    doc = _json(run_cli, "share", "--config", config, "--trace", "mooncake", str(trace), "--memory", "2314MiB")
    assert (doc["capacity_blocks"], doc["null_blocks"], doc["largest_request_blocks"]) == (1156, 1, 1156)
    assert doc["hit_tokens"] == 4096 and {g["kind"]: g["hit_tokens"] for g in doc["groups"]} == {
        "full": 4096, "sliding": 4096}
    assert (doc["evictions"], doc["peak_used_blocks"], doc["peak_cached_blocks"]) == (1152, 1152, 1152)


def test_glm47_flash_mla_latent_pool(run_cli, tmp_path: Path) -> None:
    # GLM-4.7-Flash (glm4_moe_lite, MLA as vLLM caches it): one latent of 512 + 64 a token a layer, 47 layers:
    # 47 · 576 · 2 = 54,144 B a token; tp does not split it (one latent, replicated). Block 16: a page 16 · 1,152 =
    # 18,432 B, one group of 47 layers: 866,304 B a block id; 10 GiB // 866,304 = 12,394 ids; at --max-model-len
    # 32,768 a request needs 2,048: "GPU KV cache size" 12,394 · 32,768 // 2,048 = 198,304 tokens
    config = str(write(tmp_path / "glm47", GLM47_FLASH))
    doc = _json(run_cli, "size", "--config", config, "--tp", "2", "--kv-memory", "10GiB", "--max-model-len", "32768")
    assert doc["bytes_per_token"] == 54_144 and doc["per_gpu_bytes_per_token"] == 54_144
    plan = doc["gpu_plan"]
    assert (plan["page_bytes"], plan["block_bytes"]) == (18_432, 47 * 18_432) == (18_432, 866_304)
    assert (plan["num_blocks"], plan["blocks_per_request"]) == (10 * GiB // 866_304, 2048) == (12_394, 2048)
    assert plan["kv_cache_tokens"] == 12_394 * 32_768 // 2048 == 198_304
