"""`kvcalc sim` starts as vLLM v1 starts: the null block, the refusal when one request of max_model_len does not fit
the pool, the block sizes and KV precisions vLLM pages, and --timeout written as --slo writes a time.

The GPU is a custom one with every fixed cost given or known, so that the pool is a few blocks:
    2,200 MiB × utilisation 1 − weights 1 GiB − workspace 1 B − vLLM 0.21's non-torch 256 MiB and CUDA graphs
    860 MiB (core/model/vllm_memory.py's estimates, the same for every model here) = 60 MiB − 1 B = 62,914,559 B.
"""

from __future__ import annotations

import json

import pytest

from kvcalc.core.model.kv_groups import VLLM_BLOCK_SIZES

MiB, GiB = 2**20, 2**30
POOL = 2200 * MiB - GiB - 1 - 256 * MiB - 860 * MiB  # 62,914,559 B
GPU = ("--gpu-memory", "2200MiB", "--bandwidth", "4.8e12", "--flops", "989e12", "--weights-bytes", "1GiB",
       "--workspace-bytes", "1", "--memory-utilization", "1")
# 40 requests of 10 + 6 tokens at once: each holds 10 + 6 − 1 = 15 positions at its peak, one block of 16
SMALL = ("--rate", "inf", "--requests", "40", "--prompt-dist", "uniform:low=10,high=10", "--output-dist",
         "uniform:low=6,high=6")
# Llama-3-8B: 32 layers · 2 (K, V) · 8 KV heads · 128 · 2 B = 131,072 B a token; a block of 16 is 2 MiB
LLAMA_BLOCK = 32 * 2 * 8 * 128 * 2 * 16
LLAMA_IDS = POOL // LLAMA_BLOCK  # 29 (29 · 2 MiB = 58 MiB ≤ 60 MiB − 1 B < 30 · 2 MiB)
# Gemma-2-9B: 21 sliding (W 4,096) + 21 full layers of 8 KV heads × 256: 21 < 1.5 · 21, so vLLM's groups have 21
# layer slots, one sliding and one full table; a block id is 21 layers · 2 · 8 · 256 · 2 B · 16 = 2,752,512 B
GEMMA_BLOCK = 21 * 2 * 8 * 256 * 2 * 16
GEMMA_IDS = POOL // GEMMA_BLOCK  # 22 (22 · 2,752,512 = 60,555,264 ≤ 62,914,559 < 63,307,776)


def _json(run_cli, *args: str) -> dict:
    result = run_cli("sim", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _error(run_cli, *args: str) -> str:
    result = run_cli("sim", *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


# ---- (1) vLLM's null block -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("model", "ids", "tables", "max_len"), [
    # Llama-3-8B: one table; 28 free ids hold 28 requests of one block (a pool of every id would run 29)
    ("Llama-3-8B", LLAMA_IDS, 1, "464"),
    # Gemma-2-9B: a request holds a block in each of its 2 tables; 21 free ids hold 10 (every id: 11)
    ("Gemma-2-9B", GEMMA_IDS, 2, "160"),
])
def test_vllm_layout_hands_out_every_block_but_the_null_block(run_cli, model, ids, tables, max_len):
    doc = _json(run_cli, "--model", model, *GPU, *SMALL, "--max-model-len", max_len)
    plan = doc["memory_plan"]
    assert plan["kv_pool_bytes"] == POOL
    assert (plan["num_blocks"], plan["null_blocks"], plan["free_blocks"]) == (ids, 1, ids - 1)
    assert doc["peak_running"] == (ids - 1) // tables
    assert (doc["completed"], doc["preemptions"]) == (40, 0)


@pytest.mark.parametrize(("model", "ids", "tables"), [("Llama-3-8B", LLAMA_IDS, 1), ("Gemma-2-9B", GEMMA_IDS, 2)])
def test_ideal_layout_is_kvcalcs_own_pool_without_a_null_block(run_cli, model, ids, tables):
    doc = _json(run_cli, "--model", model, *GPU, *SMALL, "--layout", "ideal", "--max-model-len", "160")
    plan = doc["memory_plan"]
    assert (plan["num_blocks"], plan["null_blocks"], plan["free_blocks"]) == (ids, 0, ids)
    assert doc["peak_running"] == ids // tables  # 29 and 11


def test_the_table_says_the_null_block(run_cli):
    text = run_cli("sim", "--model", "Llama-3-8B", *GPU, *SMALL, "--max-model-len", "464").stdout
    assert "= 29 blocks of 16 (1 null block, 28 free; 464 token slots" in " ".join(text.split())


# ---- (2) one request of max_model_len must fit, as vLLM's check_enough_kv_cache_memory ------------------------------
def test_llama_refused_past_the_longest_request_the_pool_holds(run_cli):
    # the default max_model_len 8,192 (max_position_embeddings) needs 8,192 / 16 = 512 blocks of the 29
    line = _error(run_cli, "--model", "Llama-3-8B", *GPU, *SMALL)
    assert line == ("error: vLLM would not start: --max-model-len 8,192: one request of that length needs 512 blocks "
                    "and the pool has 29 (not enough KV cache memory for one request at the max length); give "
                    "--max-model-len 464 or less (the longest request it holds), or more KV memory (a larger --gpu, "
                    "a higher --memory-utilization, more --tp)")
    # vLLM compares bytes: 465 tokens need ceil(465 / 16) = 30 blocks, 60 MiB > 60 MiB − 1 B; 464 need 29, 58 MiB
    assert "needs 30 blocks and the pool has 29" in _error(run_cli, "--model", "Llama-3-8B", *GPU, *SMALL,
                                                           "--max-model-len", "465")
    assert _json(run_cli, "--model", "Llama-3-8B", *GPU, *SMALL, "--max-model-len", "464")["completed"] == 40


def test_gemma_2_counts_both_tables_and_the_windows_extra_block(run_cli):
    # vLLM's worst case for a request of L tokens: full ceil(L / 16); sliding ceil(min(W − 1 + T, L) / 16) + 1 with
    # T = max_num_batched_tokens 8,192. At 8,192: 512 + (ceil(8,192 / 16) + 1 = 513) = 1,025. The longest L with
    # 2 · ceil(L / 16) + 1 ≤ 22 is 160 (10 blocks a table + 1); 161 needs 2 · 11 + 1 = 23
    line = _error(run_cli, "--model", "Gemma-2-9B", *GPU, *SMALL)
    assert "--max-model-len 8,192: one request of that length needs 1,025 blocks (512 full + 513 sliding) and the " \
           "pool has 22" in line and "give --max-model-len 160 or less" in line
    assert "needs 23 blocks" in _error(run_cli, "--model", "Gemma-2-9B", *GPU, *SMALL, "--max-model-len", "161")
    assert _json(run_cli, "--model", "Gemma-2-9B", *GPU, *SMALL, "--max-model-len", "160")["completed"] == 40


def test_the_longest_length_named_runs_and_one_more_is_refused_on_a_state_hybrid(run_cli):
    # Nemotron-H on 4 GiB: whatever the layout's block, the length named is the boundary of the refusal
    gpu = ("--gpu-memory", "4GiB", *GPU[2:])
    line = _error(run_cli, "--model", "nemotron-h-56b", *gpu, *SMALL, "--max-model-len", "100000")
    longest = int(line.split("give --max-model-len ")[1].split(" ")[0].replace(",", ""))
    assert 0 < longest < 100_000
    assert _json(run_cli, "--model", "nemotron-h-56b", *gpu, *SMALL, "--max-model-len", str(longest))["completed"] == 40
    _error(run_cli, "--model", "nemotron-h-56b", *gpu, *SMALL, "--max-model-len", str(longest + 1))


# ---- (3) what vLLM pages: block sizes and KV precisions, as size --gpu -----------------------------------------------
@pytest.mark.parametrize("block", ["7", "12", "48", "512"])
def test_a_block_size_vllm_does_not_take_is_refused_as_size_gpu_refuses_it(run_cli, block):
    line = _error(run_cli, "--requests", "3", "--block", block)
    assert line == (f"error: --block {block}: vLLM pages blocks of 1, 8, 16, 32, 64, 128 or 256 tokens only: give one "
                    "of those, or --layout ideal for kvcalc's own pool at any block size")
    size = run_cli("size", "--model", "OPT-13B", "--gpu", "A100-40GB", "--block", block)
    assert size.exit_code == 2 and f"--block {block}: vLLM's start-up figures need a block size" in size.stderr
    assert _json(run_cli, "--requests", "3", "--block", block, "--layout", "ideal")["completed"] == 3


@pytest.mark.parametrize("block", [str(b) for b in VLLM_BLOCK_SIZES if b >= 8])
def test_every_block_size_vllm_takes_runs(run_cli, block):
    assert _json(run_cli, "--requests", "3", "--block", block)["memory_plan"]["block_size"] == int(block)


@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_a_kv_precision_vllm_does_not_page_is_refused_as_size_gpu_refuses_it(run_cli, dtype):
    line = _error(run_cli, "--requests", "3", "--dtype", dtype)
    assert line.startswith(f"error: --dtype {dtype}: vLLM pages no plain {dtype} KV") and "--layout ideal" in line
    size = run_cli("size", "--model", "OPT-13B", "--gpu", "A100-40GB", "--dtype", dtype)
    assert size.exit_code == 2 and f"--dtype {dtype}: vLLM's start-up figures need a KV precision" in size.stderr
    assert _json(run_cli, "--requests", "3", "--dtype", dtype, "--layout", "ideal")["kv_dtype"] == dtype


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2", "bf16", "fp16"])
def test_the_precisions_vllm_pages_run(run_cli, dtype):
    assert _json(run_cli, "--requests", "3", "--dtype", dtype)["completed"] == 3


# ---- --timeout in --slo's units -------------------------------------------------------------------------------------
def test_timeout_takes_seconds_or_a_unit_as_slo_does(run_cli):
    # 300 requests at once on OPT-13B's 789 free blocks: most wait longer than a second for their first token
    runs = {t: _json(run_cli, "--requests", "300", "--rate", "inf", "--timeout", t) for t in ("1", "1s", "1000ms",
                                                                                             "1000")}
    assert runs["1"] == runs["1s"] == runs["1000ms"]
    assert runs["1"]["timed_out"] > 0 and runs["1000"]["timed_out"] == 0


@pytest.mark.parametrize(("value", "needle"), [
    ("1x", "--timeout '1x' is not a number; write seconds, e.g. 30, 30s or 500ms"),
    ("infs", "--timeout 'infs': inf takes no unit"),
    ("0ms", "--timeout 0 must be a positive number of seconds"),
])
def test_a_timeout_it_cannot_read_is_one_line(run_cli, value, needle):
    assert needle in _error(run_cli, "--requests", "3", "--timeout", value)
