"""Round-6 QA, issue 19: per-group checks of recurrent hybrids not yet covered (Falcon-H1, Nemotron-3-Nano,
MiniMax-M1, LFM2), worked by hand from their config.json fields and vLLM v1's rules, never from kvcalc's code.

The rules used (vLLM v1, read in vllm/v1/core/kv_cache_utils.py and vllm/platforms/interface.py):
* layers are bucketed by type; group size = the smallest bucket, or the largest when largest < 1.5 · smallest;
  each bucket splits into ceil(layers / group size) groups (the last padded); a block id is one page in each of
  the group-size layer slots, so num_blocks = KV bytes // (page · group size);
* a Mamba-like state forces the attention block to 16 · ceil(state page / (16 · attention bytes per token of
  ONE layer)) (mamba_cache_mode none), and the state page is padded to the attention page;
* a request holds ceil(tokens / block) blocks in an attention group and one page in each state group.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from real_configs import write_config

GiB, MiB = 2**30, 2**20
# a custom GPU whose KV pool is gpu memory − 1 GiB of weights − vLLM 0.21's non-torch 256 MiB and CUDA graphs
# 860 MiB − a 1-byte workspace, at utilisation 1 (as tests/core/sim/test_sim_hybrid.py's small_gpu)
FIXED = 1 * GiB + 256 * MiB + 860 * MiB + 1


def small_gpu(mib: int) -> tuple[str, ...]:
    return ("--gpu-memory", f"{mib}MiB", "--bandwidth", "4.8e12", "--flops", "989e12", "--weights-bytes", "1GiB",
            "--workspace-bytes", "1", "--memory-utilization", "1")


def _config(tmp_path: Path, name: str) -> str:
    return str(write_config(tmp_path, name, "test_architecture_configs" if name in ARCH else "test_real_configs"))


ARCH = {"FALCON_H1_05B", "NEMOTRON3_NANO", "LFM2_12B", "KIMI_K3"}

# Per model, by hand from config.json:
# FALCON_H1_05B: 36 parallel layers, each one attention (2 KV heads of 64: 2 · 2 · 64 · 2 B = 512 B a token) and
#   one Mamba-2 mixer (conv (4 − 1) · (1536 + 2 · 1 · 128) = 5,376 + SSM 24 · 64 · 128 = 196,608 bf16 scalars =
#   403,968 B). Block 16 · ceil(403,968 / (16 · 512)) = 16 · 50 = 800; page 800 · 512 = 409,600 B; buckets 36 and
#   36: group size 36 (36 < 54), 1 full + 1 state group; a block id 36 · 409,600 = 14,745,600 B.
# NEMOTRON3_NANO: 6 attention layers (2 KV heads of 128: 1,024 B a token), 23 Mamba-2 (conv 3 · (64 · 64 + 2 · 8
#   · 128) = 18,432 bf16 = 36,864 B + SSM 64 · 64 · 128 fp32 = 2,097,152 B = 2,134,016 B). Block 16 · ceil(
#   2,134,016 / 16,384) = 16 · 131 = 2,096; page 2,096 · 1,024 = 2,146,304 B; buckets 6 and 23: 23 ≥ 9, group
#   size 6: 1 full + ceil(23 / 6) = 4 state groups (1 padding slot); a block id 6 · 2,146,304 = 12,877,824 B.
# MINIMAX_M1: 10 full layers (8 KV heads of 128: 4,096 B a token), 70 lightning layers (64 heads · 128 · 128 bf16
#   = 2,097,152 B). Block 16 · ceil(2,097,152 / 65,536) = 512, page 512 · 4,096 = 2,097,152 B (no padding);
#   group size 10: 1 full + 7 state groups; a block id 10 · 2,097,152 = 20,971,520 B.
# LFM2_12B: 6 attention layers (8 KV heads of 2048 / 32 = 64: 2,048 B a token), 10 short convs ((3 − 1) · 2,048
#   bf16 = 8,192 B). Block 16 · ceil(8,192 / 32,768) = 16; page 16 · 2,048 = 32,768 B (the state padded 4×);
#   group size 6 (10 ≥ 9): 1 full + 2 state groups (2 padding slots); a block id 6 · 32,768 = 196,608 B.
# KIMI_K3 (Kimi-Linear-48B's layers): 7 MLA layers ((512 + 64) latent · 2 B = 1,152 B a token), 20 KDA layers (conv
#   q, k, v 3 · (4 − 1) · 32 · 128 bf16 = 73,728 B + recurrent 32 · 128 · 128 fp32, vLLM's kda_state_dtype, =
#   2,097,152 B = 2,170,880 B). FlashAttention-MLA (Hopper's first MLA backend) pages in multiples of 16: block
#   16 · ceil(2,170,880 / 18,432) = 16 · 118 = 1,888, page 1,888 · 1,152 = 2,174,976 B; group size 7 (20 ≥ 10.5):
#   1 MLA + 3 state groups (1 padding slot); a block id 7 · 2,174,976 = 15,224,832 B.
MODELS = {
    # name: (block, block id bytes, state tables, state bytes a sequence, attention bytes a token)
    "FALCON_H1_05B": (800, 14_745_600, 1, 36 * 403_968, 36 * 512),
    "NEMOTRON3_NANO": (2096, 12_877_824, 4, 23 * 2_134_016, 6 * 1024),
    "MINIMAX_M1": (512, 20_971_520, 7, 70 * 2_097_152, 10 * 4096),
    "LFM2_12B": (16, 196_608, 2, 10 * 8192, 6 * 2048),
    "KIMI_K3": (1888, 15_224_832, 3, 20 * 2_170_880, 7 * 1152),
}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_size_kv_memory_groups_blocks_and_concurrency(run_cli, tmp_path: Path, name: str) -> None:
    block, block_id, state_tables, _, _ = MODELS[name]
    result = run_cli("size", "--config", _config(tmp_path, name), "--kv-memory", "40GiB", "--max-model-len", "16384",
                     "--json")
    assert result.exit_code == 0, result.stderr
    plan = result.json()["gpu_plan"]
    assert (plan["block_size"], plan["block_bytes"]) == (block, block_id)
    assert plan["num_blocks"] == 40 * GiB // block_id
    # vLLM's worst case for max concurrency: ceil(16,384 / block) in the full group, 1 page a state group
    per_request = _cdiv(16384, block) + state_tables
    assert plan["blocks_per_request"] == per_request
    assert plan["max_concurrency"] == pytest.approx((40 * GiB // block_id) / per_request, rel=1e-12)
    # one attention group (full, or Kimi's MLA) paged in blocks, and the state groups (no tokens per block)
    assert [g["block_size"] for g in plan["groups"]].count(block) == 1 and len(plan["groups"]) == 1 + state_tables


@pytest.mark.parametrize(("name", "tp", "block", "page", "why"), [
    # Falcon-H1 at tp 2: 1 KV head (256 B a token); n_groups 1 is replicated to 2 (one per rank): conv 3 · (1536 +
    # 2 · 2 · 128) / 2 = 3,072 + SSM 12 · 64 · 128 = 98,304 bf16 = 202,752 B; 16 · ceil(202,752 / 4,096) = 800
    ("FALCON_H1_05B", 2, 800, 800 * 256, "(202,752 B per layer)"),
    # Nemotron-3-Nano at tp 2: 1 KV head (512 B); conv 3 · (4096 + 2 · 8 · 128) / 2 = 9,216 bf16 = 18,432 B + SSM
    # 32 · 64 · 128 fp32 = 1,048,576 B = 1,067,008 B; 16 · ceil(1,067,008 / 8,192) = 16 · 131 = 2,096
    ("NEMOTRON3_NANO", 2, 2096, 2096 * 512, "(1,067,008 B per layer)"),
    # MiniMax-M1 at tp 8: 1 KV head (512 B); 8 heads · 128 · 128 bf16 = 262,144 B; 16 · ceil(262,144 / 8,192) = 512
    ("MINIMAX_M1", 8, 512, 512 * 512, "(262,144 B per layer)"),
    # LFM2 at tp 2: 4 KV heads (1,024 B); 2 · 1,024 bf16 = 4,096 B fits a page of 16 · 1,024 = 16,384 B (4×)
    ("LFM2_12B", 2, 16, 16 * 1024, "state page padded by 300.00 %"),
])
def test_size_tensor_parallel_pages(run_cli, tmp_path: Path, name: str, tp: int, block: int, page: int,
                                    why: str) -> None:
    result = run_cli("size", "--config", _config(tmp_path, name), "--kv-memory", "40GiB", "--max-model-len", "16384",
                     "--tp", str(tp), "--json")
    assert result.exit_code == 0, result.stderr
    plan = result.json()["gpu_plan"]
    group_size = {"FALCON_H1_05B": 36, "NEMOTRON3_NANO": 6, "MINIMAX_M1": 10, "LFM2_12B": 6}[name]
    assert (plan["block_size"], plan["page_bytes"], plan["block_bytes"]) == (block, page, page * group_size)
    assert why in plan["block_size_reason"]


def test_size_max_tokens_leaves_one_state(run_cli, tmp_path: Path) -> None:
    # --memory 1 GiB on Falcon-H1: (1,073,741,824 − one state 14,542,848) // 18,432 B a token = 57,465 tokens;
    # whole sequences of 4,096 tokens: 1 GiB // (4,096 · 18,432 + 14,542,848 = 90,039,296) = 11
    doc = run_cli("size", "--config", _config(tmp_path, "FALCON_H1_05B"), "--memory", "1GiB", "--tokens", "4096",
                  "--json").json()
    capacity = doc["capacity"]
    assert capacity["max_tokens"] == (GiB - 14_542_848) // 18_432 == 57_465
    assert capacity["max_seqs"] == GiB // (4096 * 18_432 + 14_542_848) == 11
    assert capacity["vllm_num_blocks"] == GiB // 14_745_600 == 72 and capacity["vllm_block_size"] == 800


@pytest.mark.parametrize("name", sorted(MODELS))
def test_frag_state_column_and_tables_per_group(run_cli, tmp_path: Path, name: str) -> None:
    block, block_id, state_tables, state, per_token = MODELS[name]
    lengths = (100, 3000, 9000)
    doc = run_cli("frag", "--config", _config(tmp_path, name), "--lengths", ",".join(map(str, lengths)), "--block",
                  "16", "--json").json()
    paged = doc["paged"][0]
    assert paged["used_block_size"] == block and paged["engine_accepts"] is True
    groups = {g["kind"]: g for g in paged["groups"]}
    full_blocks = sum(_cdiv(n, block) for n in lengths)
    assert groups["full"]["blocks"] == full_blocks
    assert groups["full"]["allocated_bytes"] == full_blocks * block_id
    assert groups["full"]["useful_bytes"] == paged["useful_kv_bytes"] == sum(lengths) * per_token
    # the state: its own column, one page per sequence in each state table, padded to the block id
    assert (groups["state"]["block_tables"], groups["state"]["blocks"]) == (state_tables, 3 * state_tables)
    assert paged["state_bytes"] == groups["state"]["useful_bytes"] == 3 * state
    assert paged["allocated_state_bytes"] == 3 * state_tables * block_id
    # block tables: 4-byte ids, ceil(n / block) entries in the full table and 1 in each state table
    assert paged["block_table_bytes_exact"] == 4 * (full_blocks + 3 * state_tables)
    assert paged["held_bytes"] == (full_blocks + 3 * state_tables) * block_id + paged["block_table_bytes_exact"]


def test_frag_sweep_names_the_block_with_fewest_bytes_held_among_the_engines(run_cli, tmp_path: Path) -> None:
    # Falcon-H1, lengths 100, 1,000, 5,000. vLLM raises a block b to b · ceil(403,968 / (b · 512)) (b ≥ 16): 16 and
    # 32 -> 800, 64 -> 832, 128 -> 896, 256 -> 1,024. Bytes held = (full blocks + 3 states) · 36 · block · 512 +
    # 4 B a table entry: 800: (1 + 2 + 7 + 3) · 14,745,600 + 52 = 191,692,852; 832: (1 + 2 + 7 + 3) · 15,335,424 +
    # 52; 896: (1 + 2 + 6 + 3) · 16,515,072 + 48; 1,024: (1 + 1 + 5 + 3) · 18,874,368 + 40 = 188,743,720: the least
    doc = run_cli("frag", "--config", _config(tmp_path, "FALCON_H1_05B"), "--lengths", "100,1000,5000", "--sweep",
                  "--json").json()
    held = {p["block_size"]: (p["used_block_size"], p["held_bytes"]) for p in doc["paged"]}
    assert held[16] == held[32] == (800, 13 * 14_745_600 + 52)
    assert held[64] == (832, 13 * 15_335_424 + 52)
    assert held[128] == (896, 12 * 16_515_072 + 48)
    assert held[256] == (1024, 10 * 18_874_368 + 40) == (1024, 188_743_720)
    best = doc["best_block_size"]
    assert (best["block_size"], best["used_block_size"], best["held_bytes"]) == (256, 1024, 188_743_720)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_share_copies_a_state_per_branch(run_cli, tmp_path: Path, name: str) -> None:
    block, block_id, state_tables, _, _ = MODELS[name]
    doc = run_cli("share", "--config", _config(tmp_path, name), "--prefix", "5000", "--branches", "3", "--gen",
                  "300", "--json").json()
    groups = {g["kind"]: g for g in doc["kv_cache_groups"]["groups"]}
    assert (doc["block_size"], doc["block_bytes"]) == (block, block_id)
    # full: the prompt's whole blocks shared, each branch its own blocks from the partial one on
    shared, partial = divmod(5000, block)
    own = _cdiv(partial + 300, block)
    assert groups["full"]["physical_blocks"] == shared + 3 * own
    # state: one page a branch in each state table, never shared
    assert (groups["state"]["block_tables"], groups["state"]["physical_blocks"]) == (state_tables, 3 * state_tables)
    # without sharing each branch holds its states and ceil(5,300 / block) attention blocks
    assert doc["logical_blocks"] == 3 * (state_tables + _cdiv(5300, block))
    # two branches copy the forked states and (5,000 not a multiple of the block) the shared partial block
    assert doc["cow_copies"] == 2 * (state_tables + 1)
    assert doc["physical_bytes"] == (shared + 3 * own + 3 * state_tables) * block_id


@pytest.mark.parametrize(("name", "mib", "prompt", "output"), [
    # Falcon-H1: (3,000 MiB − FIXED) // 14,745,600 = 61 ids; 300 + 400 tokens stay in one 800-token block: a
    # request holds 1 full block + 1 state page from its first chunk to its end: 61 // 2 = 30 at once
    ("FALCON_H1_05B", 3000, 300, 400),
    # Nemotron-3-Nano: (3,100 MiB − FIXED) // 12,877,824 = 78 ids; 1 + 4 a request: 78 // 5 = 15
    ("NEMOTRON3_NANO", 3100, 1000, 500),
    # MiniMax-M1: 3,100 MiB − FIXED = 1,006,632,959 B, one byte short of 48 ids: 47; 1 + 7 a request: 47 // 8 = 5
    ("MINIMAX_M1", 3100, 200, 300),
    # LFM2: (2,150 MiB − FIXED) // 196,608 = 53 ids; 10 + 6 tokens in one 16-token block, 1 + 2: 53 // 3 = 17
    ("LFM2_12B", 2150, 10, 6),
    # Kimi-Linear: (3,100 MiB − FIXED) // 15,224,832 = 66 ids; 1 MLA block + 3 state pages: 66 // 4 = 16
    ("KIMI_K3", 3100, 1000, 500),
])
def test_sim_concurrency_at_rate_inf_is_ids_over_a_requests_pages(run_cli, tmp_path: Path, name: str, mib: int,
                                                                  prompt: int, output: int) -> None:
    block, block_id, state_tables, _, _ = MODELS[name]
    assert prompt + output <= block
    doc = run_cli("sim", "--config", _config(tmp_path, name), *small_gpu(mib), "--rate", "inf", "--requests", "40",
                  "--prompt-dist", f"uniform:low={prompt},high={prompt}", "--output-dist",
                  f"uniform:low={output},high={output}", "--max-model-len", str(prompt + output), "--json").json()
    ids = (mib * MiB - FIXED) // block_id
    assert doc["memory_plan"]["num_blocks"] == ids
    assert doc["kv_cache_groups"]["block_bytes"] == block_id
    hold = 1 + state_tables
    # vLLM's null block (one id it never hands out) leaves ids − 1; the ids are never a multiple of `hold` here, so
    # every id free would give the same
    assert ids % hold != 0 and (ids - 1) // hold == ids // hold
    assert doc["peak_running"] == min(40, (ids - 1) // hold)
    assert (doc["completed"], doc["preemptions"], doc["rejected"]) == (40, 0, 0)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_share_ideal_layout_holds_exact_bytes(run_cli, tmp_path: Path, name: str) -> None:
    # --layout ideal: each layer type pooled on its own at the block asked for (16), no padding, a state its exact
    # bytes: the full table 312 shared blocks + 3 · ceil((8 + 300) / 16) = 60 own, each 16 tokens of every attention
    # layer; 3 branches, a state each
    _, _, _, state, per_token = MODELS[name]
    doc = run_cli("share", "--config", _config(tmp_path, name), "--prefix", "5000", "--branches", "3", "--gen",
                  "300", "--layout", "ideal", "--json").json()
    groups = {g["kind"]: g for g in doc["kv_cache_groups"]["groups"]}
    assert doc["kv_cache_groups"]["layout"] == "ideal" and doc["block_size"] == 16
    assert groups["full"]["physical_bytes"] == (312 + 3 * 20) * 16 * per_token
    assert groups["state"]["physical_bytes"] == 3 * state
    assert doc["physical_bytes"] == (312 + 3 * 20) * 16 * per_token + 3 * state


@pytest.mark.parametrize(("name", "unit", "expected"), [
    # Falcon-H1: an attention block 16 · 18,432 = 294,912 B = 2^15 · 9, a state 14,542,848 B = 2^11 · 9 · 789: the
    # unit is their gcd 2^11 · 9 = 18,432 B; (3,000 MiB − FIXED) // 18,432 = 48,924 units; a 10 + 6-token request
    # holds 1 block (16 units) and a state (789 units): 48,924 // 805 = 60 at once
    ("FALCON_H1_05B", 18_432, 60),
    # Kimi-Linear: 16 · 8,064 = 129,024 B = 2^11 · 63, a state 43,417,600 B = 2^15 · 1,325: unit 2,048 B; 440,319
    # units; 63 + 21,200 a request: 440,319 // 21,263 = 20
    ("KIMI_K3", 2048, 20),
])
def test_sim_ideal_layout_concurrency_in_units(run_cli, tmp_path: Path, name: str, unit: int, expected: int) -> None:
    doc = run_cli("sim", "--config", _config(tmp_path, name), *small_gpu(3000), "--layout", "ideal", "--rate", "inf",
                  "--requests", "80", "--prompt-dist", "uniform:low=10,high=10", "--output-dist",
                  "uniform:low=6,high=6", "--json").json()
    _, _, _, state, per_token = MODELS[name]
    units = (3000 * MiB - FIXED) // unit
    assert (doc["kv_cache_groups"]["block_bytes"], doc["memory_plan"]["num_blocks"]) == (unit, units)
    assert doc["peak_running"] == units // ((16 * per_token + state) // unit) == expected
    # an ideal engine: whole requests of 16 · per_token + state bytes in the pool's bytes
    assert (3000 * MiB - FIXED) // (16 * per_token + state) == expected
    assert (doc["completed"], doc["preemptions"]) == (80, 0)


def test_sim_memory_over_time_per_group_of_one_mamba_request(run_cli, tmp_path: Path) -> None:
    # Nemotron-3-Nano (block 2,096; 4 state tables, then the full one), one request of 4,000 + 300 tokens: step 1
    # prefills 4,000 tokens (ceil(4,000 / 2,096) = 2 full blocks), decode step s ≥ 2 writes position 3,998 + s with
    # n = 3,998 + s cached: ceil((n + 1) / 2,096) full blocks; each state table holds its one page all along (mode
    # none). A state page counts as a whole state, 2,096 slots of use; the full table's unused slots are its tail
    timeline = tmp_path / "t.csv"
    result = run_cli("sim", "--config", _config(tmp_path, "NEMOTRON3_NANO"), *small_gpu(3100), "--requests", "1",
                     "--prompt-dist", "uniform:low=4000,high=4000", "--output-dist", "uniform:low=300,high=300",
                     "--max-model-len", "4300", "--timeline", str(timeline))
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(timeline.open()))
    written = [4000] + [n + 1 for n in range(4000, 4299)]  # tokens in the cache at the end of each step
    full = [_cdiv(t, 2096) for t in written]
    assert [tuple(int(r[f"group{i}_blocks"]) for i in range(5)) for r in rows] == [(1, 1, 1, 1, f) for f in full]
    assert full.count(2) == 193 and full.count(3) == 107  # the third block from position 4,192 (step 194) on
    assert [int(r["useful_slots"]) for r in rows] == [t + 4 * 2096 for t in written]
    tails = [f * 2096 - t for f, t in zip(full, written, strict=True)]
    assert [int(r["tail_fragmentation_slots"]) for r in rows] == tails


@pytest.mark.parametrize(("mode", "hits"), [
    # none: one state page a request, overwritten in place: no state to resume from, no hit in any group
    ("none", 0),
    # align (vLLM's _mamba_block_aligned_split): a prefill chunk that passes the last block boundary of the prompt
    # ends on it, so the 1,024-token prompt runs as 800 + 224 and a state is saved at 800 (block 800). The 2nd
    # request resumes at 800; the 3rd (1,500 tokens, ids 1, 2, 3) too: 1,600 on every group
    ("align", 800 + 800),
])
def test_sim_mamba_prefix_hits_only_where_a_state_was_saved(run_cli, tmp_path: Path, mode: str, hits: int) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {t}, "input_length": {n}, "output_length": 5, "hash_ids": {ids}}}\n'
                             for t, n, ids in [(0, 1024, [1, 2]), (1000, 1024, [1, 2]), (2000, 1500, [1, 2, 3])]))
    doc = run_cli("sim", "--config", _config(tmp_path, "FALCON_H1_05B"), *small_gpu(2890), "--trace", "mooncake",
                  str(trace), "--mamba-cache-mode", mode, "--json").json()
    cache = doc["prefix_cache"]
    assert doc["kv_cache_groups"]["block_size"] == 800
    assert (cache["prompt_tokens"], cache["hit_tokens"]) == (3548, hits)
    assert [g["hit_tokens"] for g in cache["groups"]] == [hits, hits]


def test_frag_sweep_forced_blocks_of_nemotron3_nano(run_cli, tmp_path: Path) -> None:
    # a block b (kernel alignment max(16, b)) becomes max(16, b) · ceil(2,134,016 / (max(16, b) · 1,024)): 1, 8, 16 ->
    # 2,096; 32, 64 -> 2,112; 128 -> 2,176; 256 -> 2,304. Lengths 100, 3,000, 9,000: full blocks 1 + 2 + 5 (4 at
    # 2,304), 12 state pages; a block id 6 · block · 1,024 B; 4 B a table entry
    doc = run_cli("frag", "--config", _config(tmp_path, "NEMOTRON3_NANO"), "--lengths", "100,3000,9000", "--sweep",
                  "--json").json()
    held = {p["block_size"]: (p["used_block_size"], p["held_bytes"]) for p in doc["paged"]}
    for asked, block, full in [(1, 2096, 8), (8, 2096, 8), (16, 2096, 8), (32, 2112, 8), (64, 2112, 8),
                               (128, 2176, 8), (256, 2304, 7)]:
        assert held[asked] == (block, (full + 12) * 6 * block * 1024 + 4 * (full + 12))
    best = doc["best_block_size"]
    assert (best["used_block_size"], best["held_bytes"]) == (2096, 20 * 12_877_824 + 80)


@pytest.mark.parametrize(("name", "block_id", "hold"), [
    # tp 2 halves the pages: Falcon-H1 36 slots · 800 · 256 B = 7,372,800 B a block id, 1 full block + 1 state a
    # request; Nemotron-3-Nano 6 · 2,096 · 512 B = 6,438,912 B, 1 + 4
    ("FALCON_H1_05B", 7_372_800, 2),
    ("NEMOTRON3_NANO", 6_438_912, 5),
])
def test_sim_tensor_parallel_concurrency(run_cli, tmp_path: Path, name: str, block_id: int, hold: int) -> None:
    # the pool's bytes are the plan's (its tp-2 non-torch estimate is not what this checks); 300 + 400 tokens stay
    # in one block, so a request holds `hold` ids from its first chunk to its end
    doc = run_cli("sim", "--config", _config(tmp_path, name), *small_gpu(6000), "--tp", "2", "--rate", "inf",
                  "--requests", "300", "--prompt-dist", "uniform:low=300,high=300", "--output-dist",
                  "uniform:low=400,high=400", "--max-seqs", "512", "--max-model-len", "700", "--json").json()
    plan = doc["memory_plan"]
    assert doc["kv_cache_groups"]["block_bytes"] == block_id
    assert plan["num_blocks"] == plan["kv_pool_bytes"] // block_id
    assert doc["peak_running"] == min(300, (plan["num_blocks"] - 1) // hold)  # all but vLLM's null block
    assert (doc["completed"], doc["preemptions"]) == (300, 0)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_frag_ideal_layout_holds_exact_bytes(run_cli, tmp_path: Path, name: str) -> None:
    # --layout ideal, block 16: the attention layers in one table of 16-token blocks (ceil(n / 16) each: 7 + 188 +
    # 563 = 758), a state its exact bytes, one table entry a sequence for it; 4 B a table entry
    _, _, _, state, per_token = MODELS[name]
    paged = run_cli("frag", "--config", _config(tmp_path, name), "--lengths", "100,3000,9000", "--block", "16",
                    "--layout", "ideal", "--json").json()["paged"][0]
    assert paged["used_block_size"] == 16 and paged["padding_bytes"] == 0
    assert paged["allocated_kv_bytes"] == 758 * 16 * per_token
    assert paged["allocated_state_bytes"] == paged["state_bytes"] == 3 * state
    assert paged["block_table_bytes_exact"] == 4 * (758 + 3)
    assert paged["held_bytes"] == 758 * 16 * per_token + 3 * state + 4 * (758 + 3)
