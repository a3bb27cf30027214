"""Round-8 QA, issue 19: `kvcalc plan` on a Mamba hybrid (Nemotron-H-56B): the fit rule counts every KV cache group
(the state pages too) at vLLM's forced block, and the chosen point's figures are the ones its `kvcalc sim` command
prints.

Nemotron-H-56B at vllm layout: block 4,128 (16 · ceil(16,900,096 / (16 · 4,096))), a block id of 10 layer slots ·
4,128 · 4,096 B = 169,082,880 B; a request holds ceil(tokens / 4,128) full blocks and 1 page in each of its 6 state
groups (mamba_cache_mode none). A sequence of L tokens writes L − 1 positions (its last token writes no KV).
"""

from __future__ import annotations

import shlex

WORKLOAD = ("--rate", "0.5", "--requests", "10", "--prompt-dist", "uniform:low=2000,high=2000", "--output-dist",
            "uniform:low=100,high=100")


def _point(run_cli, max_len: int) -> dict:
    result = run_cli("plan", "--model", "nemotron-h-56b", *WORKLOAD, "--slo", "ttft=5", "--gpu-cost", "H200=5",
                     "--tp", "1", "--replicas", "1", "--max-model-len", str(max_len), "--jobs", "1", "--no-cache",
                     "--json")
    assert result.exit_code == 0, result.stderr
    (point,) = result.json()["points"]
    return point


def test_fit_counts_the_state_pages(run_cli) -> None:
    # the ids the pool hands out, C (sim's memory plan: vLLM's num_gpu_blocks less its null block, where the pool
    # keeps one): a max-length request fits while ceil((L − 1) / 4,128) + 6 <= C, so the longest that fits is
    # L = (C − 6) · 4,128 + 1 and one more token does not
    sim = run_cli("sim", "--model", "nemotron-h-56b", "--gpu", "H200", "--max-model-len", "8192", "--requests", "1",
                  "--json")
    assert sim.exit_code == 0, sim.stderr
    plan = sim.json()["memory_plan"]
    assert plan["num_blocks"] == plan["kv_pool_bytes"] // 169_082_880
    usable = plan.get("free_blocks", plan["num_blocks"])
    probe = _point(run_cli, 8192)["memory"]
    assert (probe["block_size"], probe["kv_pool_bytes"]) == (4128, plan["kv_pool_bytes"])
    longest = (usable - 6) * 4128 + 1
    fits, too_long = _point(run_cli, longest), _point(run_cli, longest + 1)
    assert fits["verdict"] == "serves"
    assert too_long["verdict"] == "does_not_fit"
    assert f"cannot hold one max-length sequence ({longest + 1:,} tokens)" in too_long["reason"]


def test_chosen_point_is_what_its_sim_command_prints(run_cli) -> None:
    result = run_cli("plan", "--model", "nemotron-h-56b", *WORKLOAD, "--slo", "ttft=5,tpot=200ms", "--gpu-cost",
                     "H200=5", "--tp", "1", "--replicas", "1", "--max-model-len", "8192", "--jobs", "1", "--no-cache",
                     "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    chosen = doc["points"][doc["chosen"]]  # the chosen point's index
    command = shlex.split(doc["sim_command"])
    assert command[:2] == ["kvcalc", "sim"]
    sim = run_cli(*command[1:], "--json")
    assert sim.exit_code == 0, sim.stderr
    run = sim.json()
    # the same code path and seed: equal to the last bit
    assert run["max_rate_rps"]["paged"] == chosen["max_rate_rps"]
    assert run["ttft_s"]["p99"] == chosen["ttft_p99_s"] and run["tpot_s"]["p99"] == chosen["tpot_p99_s"]
    assert run["kv_cache_groups"]["block_size"] == chosen["memory"]["block_size"] == 4128
