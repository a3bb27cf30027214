"""Round-4 QA: sim's memory-plan line "N blocks of B (T token slots, X per token)" on a model with several KV cache
groups. T is num_blocks · B, but under the vllm layout a block id is one page of ONE group's layer slots, not of
every layer: Gemma-3-27B on an H100 prints "14,435 blocks of 16 (230,960 token slots, 496.00 KiB per token)",
and 230,960 tokens at 496 KiB are 109 GiB, from a 17.62 GiB pool (JSON memory_plan.capacity_tokens likewise).
A single-group model keeps T · X = the pool (to within a block), as it should."""

from __future__ import annotations

from pathlib import Path

from real_configs import write_config


def _plan(run_cli, *source: str, gpu: tuple[str, ...] = ("--gpu", "H100-SXM")) -> dict:
    result = run_cli("sim", *source, *gpu, "--requests", "5", "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()["memory_plan"]


def test_token_slots_of_a_single_group_model_fill_the_pool(run_cli) -> None:
    plan = _plan(run_cli, "--model", "Llama-3-8B")
    block = plan["block_size"] * plan["kv_bytes_per_token"]
    assert plan["capacity_tokens"] * plan["kv_bytes_per_token"] <= plan["kv_pool_bytes"]
    assert plan["kv_pool_bytes"] - plan["capacity_tokens"] * plan["kv_bytes_per_token"] < block


def test_token_slots_of_gemma3_do_not_exceed_the_pool(run_cli, tmp_path: Path) -> None:
    plan = _plan(run_cli, "--config", str(write_config(tmp_path, "GEMMA3_27B")))
    # 7 groups (6 sliding of 10 layer slots, 1 full): a block id is 10 · 16 · 8,192 B = 1.25 MiB, while a token of
    # every layer is 62 · 8,192 = 507,904 B; token slots at that size must fit the pool
    assert plan["kv_bytes_per_token"] == 507_904
    assert plan["capacity_tokens"] * plan["kv_bytes_per_token"] <= plan["kv_pool_bytes"]
    # the pool's 14,435 blocks over 6 sliding + 1 full tables of 16 tokens: 14,435 · 16 // 7 = 32,994 tokens
    assert plan["num_blocks"] == 14_435
    assert plan["capacity_tokens"] == 32_994


def test_token_slots_of_a_mamba_hybrid_count_attention_pages_only(run_cli) -> None:
    plan = _plan(run_cli, "--model", "Nemotron-H-56B", gpu=("--gpu", "H200", "--tp", "2"))
    # 902 blocks of 4,128 tokens (forced by the state page); one attention table per block of B tokens (the state's
    # pages are per sequence, not per token): num_blocks · B
    assert plan["capacity_tokens"] == plan["num_blocks"] * plan["block_size"]
    assert plan["capacity_tokens"] * plan["kv_bytes_per_token"] <= plan["kv_pool_bytes"]
