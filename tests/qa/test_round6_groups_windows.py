"""Round-6 QA, issue 19: per-group checks of sliding-window models not yet covered (Command-R7B and Gemma-2-9B:
sliding + global; Gemma-3n-E4B: sliding + global + KV-shared layers; gpt-oss-20b: W = 128; Mistral-7B-v0.1: every
layer sliding), worked by hand from the config fields and vLLM v1's rules, never from kvcalc's code.

vLLM v1's rules used (vllm/v1/core/kv_cache_utils.py, single_type_kv_cache_manager.py, kv_cache_interface.py):
* group size = the smallest layer-type bucket, or the largest when largest < 1.5 · smallest; each bucket in
  ceil(layers / group size) groups; a block id is one page in each of the group-size layer slots;
* KV-shared layers (Gemma-3n's last 15) own no cache spec at all;
* a sliding group, before the tokens after n computed ones, frees the blocks before (n − W + 1) // B (its
  table keeps its length with null entries); a full group keeps every block;
* max concurrency: full ceil(L / B) blocks a request, sliding ceil(min(W − 1 + max_num_batched_tokens, L) / B) + 1.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from real_configs import write_config

GiB, MiB = 2**30, 2**20
FIXED = 1 * GiB + 256 * MiB + 860 * MiB + 1  # weights, vLLM 0.21's non-torch and CUDA graphs, a 1-byte workspace
SMALL_GPU = ("--gpu-memory", "2200MiB", "--bandwidth", "4.8e12", "--flops", "989e12", "--weights-bytes", "1GiB",
             "--workspace-bytes", "1", "--memory-utilization", "1")

# name: (source flags, window W, sliding tables, full tables, layer slots a group, bytes a token a layer)
# Command-R7B: 24 sliding (W 4,096) + 8 full, 8 KV heads of 128 (4,096 B): group size 8 (24 ≥ 12): 3 + 1 groups.
# Gemma-3n-E4B: layers 0..19 keep KV (16 sliding W 512, 4 full), 15 shared keep none; 2 KV heads of 256 (2,048 B):
#   group size 4 (16 ≥ 6): 4 + 1 groups.
# gpt-oss-20b: 12 sliding (W 128) + 12 full, 8 KV heads of 64 (2,048 B): group size 12: 1 + 1.
# Gemma-2-9B: 21 sliding (W 4,096) + 21 full, 8 KV heads of 256 (8,192 B): group size 21: 1 + 1.
# Mistral-7B-v0.1: 32 sliding layers (W 4,096), 8 KV heads of 128 (4,096 B): one group of 32.
MODELS = {
    "COMMAND_R7B": (("--config", "COMMAND_R7B"), 4096, 3, 1, 8, 4096),
    "GEMMA3N_E4B": (("--config", "GEMMA3N_E4B"), 512, 4, 1, 4, 2048),
    "gpt-oss-20b": (("--model", "gpt-oss-20b"), 128, 1, 1, 12, 2048),
    "Gemma-2-9B": (("--model", "Gemma-2-9B"), 4096, 1, 1, 21, 8192),
    "Mistral-7B-v0.1": (("--model", "Mistral-7B-v0.1"), 4096, 1, 0, 32, 4096),
}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _source(tmp_path: Path, name: str) -> tuple[str, ...]:
    flags = MODELS[name][0]
    return ("--config", str(write_config(tmp_path, name))) if flags[0] == "--config" else flags


def _block_id(name: str, block: int = 16) -> int:
    _, _, _, _, slots, per_token = MODELS[name]
    return slots * block * per_token


def _window_blocks(n: int, window: int, block: int) -> int:
    """Blocks a finished sequence of n tokens keeps in a sliding table: those holding one of its last W tokens."""
    return _cdiv(n, block) if n <= window else (n - 1) // block - (n - window) // block + 1


@pytest.mark.parametrize("name", sorted(MODELS))
def test_size_groups_blocks_and_concurrency(run_cli, tmp_path: Path, name: str) -> None:
    _, window, sliding, full, _, _ = MODELS[name]
    result = run_cli("size", *_source(tmp_path, name), "--kv-memory", "40GiB", "--max-model-len", "32768",
                     "--max-num-batched-tokens", "2048", "--json")
    assert result.exit_code == 0, result.stderr
    plan = result.json()["gpu_plan"]
    assert (plan["block_size"], plan["block_bytes"]) == (16, _block_id(name))
    assert plan["num_blocks"] == 40 * GiB // _block_id(name)
    kinds = [g["kind"] for g in plan["groups"]]
    assert (kinds.count("sliding"), kinds.count("full")) == (sliding, full)
    # a request of 32,768 tokens: 2,048 blocks in a full group; ceil(min(W − 1 + 2,048, 32,768) / 16) + 1 sliding
    per_sliding = _cdiv(min(window - 1 + 2048, 32768), 16) + 1
    assert all(g["blocks_per_request"] == per_sliding for g in plan["groups"] if g["kind"] == "sliding")
    per_request = sliding * per_sliding + full * 2048
    assert plan["blocks_per_request"] == per_request
    # vLLM's "GPU KV cache size": int(num_blocks / blocks a request · max_model_len)
    assert plan["kv_cache_tokens"] == (40 * GiB // _block_id(name)) * 32768 // per_request


def test_size_capacity_of_sliding_and_global_layers(run_cli, tmp_path: Path) -> None:
    # Command-R7B, 40 GiB: every layer holding every token, 40 GiB // (32 · 4,096 B) = 327,680 tokens, a lower bound;
    # whole sequences of 32,768 tokens: (8 · 32,768 + 24 · 4,096) · 4,096 B = 1,476,395,008 B each: 29 of them
    capacity = run_cli("size", *_source(tmp_path, "COMMAND_R7B"), "--memory", "40GiB", "--tokens", "32768",
                       "--json").json()["capacity"]
    assert capacity["max_tokens"] == 40 * GiB // (32 * 4096) == 327_680 and capacity["max_tokens_is_lower_bound"]
    assert capacity["max_seqs"] == 40 * GiB // ((8 * 32768 + 24 * 4096) * 4096) == 29
    # vLLM's block ids: 8 slots · 16 · 4,096 B = 512 KiB each
    assert capacity["vllm_num_blocks"] == 40 * GiB // (512 * 1024) == 81_920
    # Gemma-3n-E4B: 20 KV layers · 2,048 B = 40,960 B a token; a 32,768-token sequence (4 · 32,768 + 16 · 512) ·
    # 2,048 = 285,212,672 B: 150 of them in 40 GiB
    capacity = run_cli("size", *_source(tmp_path, "GEMMA3N_E4B"), "--memory", "40GiB", "--tokens", "32768",
                       "--json").json()["capacity"]
    assert capacity["max_tokens"] == 40 * GiB // 40_960 == 1_048_576
    assert capacity["max_seqs"] == 40 * GiB // 285_212_672 == 150


@pytest.mark.parametrize("name", sorted(MODELS))
def test_frag_keeps_the_window_blocks_per_table(run_cli, tmp_path: Path, name: str) -> None:
    _, window, sliding, full, slots, per_token = MODELS[name]
    lengths = (100, 4096, 4097, 10000)
    paged = run_cli("frag", *_source(tmp_path, name), "--lengths", ",".join(map(str, lengths)), "--block", "16",
                    "--json").json()["paged"][0]
    groups = {g["kind"]: g for g in paged["groups"]}
    page = 16 * per_token * slots  # one block id
    kept = sum(_window_blocks(n, window, 16) for n in lengths)
    assert (groups["sliding"]["block_tables"], groups["sliding"]["blocks"]) == (sliding, sliding * kept)
    assert groups["sliding"]["allocated_bytes"] == sliding * kept * page
    # useful: min(n, W) tokens in each sliding layer (sliding · slots layers, Gemma-3n's 16 included)
    assert groups["sliding"]["useful_bytes"] == sum(min(n, window) for n in lengths) * sliding * slots * per_token
    whole = sum(_cdiv(n, 16) for n in lengths)
    if full:
        assert (groups["full"]["blocks"], groups["full"]["allocated_bytes"]) == (whole, whole * page)
    # tables keep their length (null entries for freed blocks): ceil(n / 16) 4-byte entries in every table
    assert paged["block_table_bytes_exact"] == 4 * whole * (sliding + full)
    assert paged["held_bytes"] == (sliding * kept + full * whole) * page + paged["block_table_bytes_exact"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_share_branches_per_table(run_cli, tmp_path: Path, name: str) -> None:
    _, window, sliding, full, _, _ = MODELS[name]
    prefix, branches, gen = 10000, 3, 300  # 625 whole prompt blocks; each branch 19 blocks of its own
    doc = run_cli("share", *_source(tmp_path, name), "--prefix", str(prefix), "--branches", str(branches), "--gen",
                  str(gen), "--json").json()
    groups = {g["kind"]: g for g in doc["kv_cache_groups"]["groups"]}
    shared, own = prefix // 16, _cdiv(gen, 16)
    if full:
        assert groups["full"]["physical_blocks"] == shared + branches * own == 682
    # a sliding table: the last token (the 10,300th) is computed with 10,299 cached, so the blocks before
    # (10,299 − W + 1) // 16 are freed and the table ends at block 10,299 // 16 = 643
    first, last = (prefix + gen - 1 - window + 1) // 16, (prefix + gen - 1) // 16
    per_table = max(0, shared - first) + branches * (last - max(first, shared) + 1)
    assert groups["sliding"]["physical_blocks"] == sliding * per_table
    assert doc["physical_blocks"] == sliding * per_table + full * (shared + branches * own)
    assert doc["physical_bytes"] == doc["physical_blocks"] * _block_id(name)
    # without sharing a branch holds 644 blocks in a full table and last − first + 1 in a sliding one
    assert doc["logical_blocks"] == branches * (full * 644 + sliding * (last - first + 1))
    # the peak: the whole prompt, prefilled at once, in every table before the first decode frees any
    assert doc["peak_blocks"] == max((sliding + full) * 625, doc["physical_blocks"])


@pytest.mark.parametrize(("name", "ids"), [
    # (2,200 MiB − FIXED) = 62,914,559 B: Command-R7B // 524,288 = 119 ids (one byte short of 120), gpt-oss-20b
    # // 393,216 = 159. 10 + 6 tokens stay in one 16-token block: a request holds one block in each table from its
    # first step to its last, so 119 // 4 = 29 and 159 // 2 = 79 run at once (and 118 // 4, 158 // 2 the same)
    ("COMMAND_R7B", 119),
    ("gpt-oss-20b", 159),
])
def test_sim_concurrency_is_ids_over_tables(run_cli, tmp_path: Path, name: str, ids: int) -> None:
    _, _, sliding, full, _, _ = MODELS[name]
    doc = run_cli("sim", *_source(tmp_path, name), *SMALL_GPU, "--rate", "inf", "--requests", "120", "--prompt-dist",
                  "uniform:low=10,high=10", "--output-dist", "uniform:low=6,high=6", "--max-model-len", "16",
                  "--json").json()
    assert doc["memory_plan"]["num_blocks"] == (2200 * MiB - FIXED) // _block_id(name) == ids
    tables = sliding + full
    assert doc["peak_running"] == ids // tables == (ids - 1) // tables
    assert (doc["completed"], doc["preemptions"]) == (120, 0)


def test_sim_memory_over_time_per_group_of_one_windowed_request(run_cli, tmp_path: Path) -> None:
    # gpt-oss-20b, one request of 200 + 40 tokens: step 1 prefills 200 tokens (13 blocks in both tables, nothing
    # freed: 0 computed); decode step s ≥ 2 computes position 198 + s with n = 198 + s cached: the full table holds
    # ceil((n + 1) / 16), the sliding one that minus the (n − 127) // 16 blocks before the window
    timeline = tmp_path / "t.csv"
    result = run_cli("sim", "--model", "gpt-oss-20b", *SMALL_GPU, "--requests", "1", "--prompt-dist",
                     "uniform:low=200,high=200", "--output-dist", "uniform:low=40,high=40", "--max-model-len", "240",
                     "--timeline", str(timeline))
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(timeline.open()))
    expected = [(13, 13)] + [(_cdiv(n + 1, 16), _cdiv(n + 1, 16) - (n - 127) // 16) for n in range(200, 239)]
    assert [(int(r["group0_blocks"]), int(r["group1_blocks"])) for r in rows] == expected
    # the slots: every token written so far is useful in the full table; in the sliding one those of its blocks
    assert [int(r["useful_slots"]) for r in rows[:2]] == [200 + 200, 201 + (201 - 4 * 16)]


@pytest.mark.parametrize(("name", "ids"), [
    # (2,200 MiB − FIXED) // 2,097,152 = 29 ids for Mistral-7B-v0.1 (one table), // 2,752,512 = 22 for Gemma-2-9B
    # (two tables). Requests of 10 + 6 tokens hold one block a table; vLLM's scheduler admits while the free queue
    # (29 − 1 = 28, 22 − 1 = 21 ids) holds them: 28 and 10 at once, where a pool of every id runs 29 and 11
    ("Mistral-7B-v0.1", 29),
    ("Gemma-2-9B", 22),
])
def test_sim_leaves_vllms_null_block_out_of_the_free_ids(run_cli, tmp_path: Path, name: str, ids: int) -> None:
    _, _, sliding, full, _, _ = MODELS[name]
    # (a max length the pool holds: vLLM refuses to start when one request of max_model_len does not fit)
    doc = run_cli("sim", *_source(tmp_path, name), *SMALL_GPU, "--rate", "inf", "--requests", "40", "--prompt-dist",
                  "uniform:low=10,high=10", "--output-dist", "uniform:low=6,high=6", "--max-model-len", "16",
                  "--json").json()
    assert doc["memory_plan"]["num_blocks"] == ids  # vLLM's num_gpu_blocks, as its start-up log counts them
    assert doc["peak_running"] == (ids - 1) // (sliding + full)


def test_size_pads_gpt_oss_20b_with_an_eagle_layer_as_vllms_own_example(run_cli, tmp_path: Path) -> None:
    # vLLM's kv_cache_utils comment: "gpt-oss-20b + eagle, with 12 sw + 13 full. We pad it to (13 sw, 13 full)
    # instead of (12 sw, 24 full)": 13 < 1.5 · 12, so the group size is 13: 2 groups, one padding slot. An EAGLE-3
    # head (one Llama layer, 8 KV heads of 64: the same page as the target's) joins the full bucket
    head = tmp_path / "eagle"
    head.mkdir()
    head.joinpath("config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 2880, "num_hidden_layers": 1,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 17280,
        "vocab_size": 201088, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}))
    result = run_cli("size", "--model", "gpt-oss-20b", "--kv-memory", "40GiB", "--max-model-len", "32768",
                     "--max-num-batched-tokens", "2048", "--spec-tokens", "3", "--spec-method", "eagle",
                     "--draft-config", str(head), "--json")
    assert result.exit_code == 0, result.stderr
    plan = result.json()["gpu_plan"]
    # a block id: 13 slots · 16 · 2,048 B = 425,984 B; 40 GiB of them: 100,824
    assert (plan["group_size"], plan["block_bytes"], plan["num_blocks"]) == (13, 425_984, 40 * GiB // 425_984)
    assert sorted((g["kind"], g["layers"]) for g in plan["groups"]) == [("full", 13), ("sliding", 12)]
    assert "1 padding" in plan["block_size_reason"]


@pytest.mark.parametrize(("source", "tables"), [(("--model", "llama-3-8b"), 1), (("--config", "COMMAND_R7B"), 4)])
def test_share_replay_holds_no_kv_for_the_last_output_token(run_cli, tmp_path: Path, source: tuple[str, ...],
                                                            tables: int) -> None:
    # one request of 1,500 + 5 tokens: the decode steps compute positions 1,500..1,503 (the 5th token ends it
    # unwritten), so every table holds ceil(1,504 / 16) = 94 blocks at most (W 4,096 frees nothing): a capacity of
    # 94 blocks a table serves it; kvcalc asks for ceil(1,505 / 16) = 95
    if source[0] == "--config":
        source = ("--config", str(write_config(tmp_path, "COMMAND_R7B")))
    trace = tmp_path / "one.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 3]}\n')
    result = run_cli("share", *source, "--trace", "mooncake", str(trace), "--capacity-blocks", str(94 * tables),
                     "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["peak_used_blocks"] == 94 * tables


def test_share_refuses_a_hybrid_capacity_below_the_largest_request_in_one_line(run_cli, tmp_path: Path) -> None:
    # said "--capacity-blocks 100 is blocks of 512.00 KiB, fewer than ..." (the count was missing)
    trace = tmp_path / "one.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1500, "output_length": 5, "hash_ids": [1, 2, 3]}\n')
    result = run_cli("share", *_source(tmp_path, "COMMAND_R7B"), "--trace", "mooncake", str(trace),
                     "--capacity-blocks", "100")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: --capacity-blocks 100 is 100 blocks of 512.00 KiB, fewer than the ")
    assert len(result.stderr.strip().splitlines()) == 1
