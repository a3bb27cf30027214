"""Round-5 QA of `kvcalc sim` from the outside: hand-worked numbers, and each defect found by running it on real
configs (hybrids included), small traces and bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_configs import write_config

# Llama-3-8B on a made-up GPU whose figures make the roofline easy to work by hand
CUSTOM = ("--model", "llama-3-8b", "--gpu-memory", "80GiB", "--bandwidth", "1e12", "--flops", "1e15",
          "--weights-bytes", "16GB")
ONE_REQUEST = ("--requests", "1", "--prompt-dist", "uniform:low=1000,high=1000", "--output-dist",
               "uniform:low=11,high=11")


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout[-500:], result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines
    return lines[0]


def _mooncake(path: Path, requests: list[tuple[int, int, list[int]]], gap_ms: int = 1000) -> Path:
    """A Mooncake JSON-lines trace: (input_length, output_length, hash_ids) per request, `gap_ms` apart."""
    lines = [{"timestamp": gap_ms * i, "input_length": p, "output_length": o, "hash_ids": ids}
             for i, (p, o, ids) in enumerate(requests)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_one_request_alone_takes_the_rooflines_prefill_and_decode_step_times(run_cli) -> None:
    doc = run_cli("sim", *CUSTOM, *ONE_REQUEST, "--json").json()
    # Llama-3-8B: 8,030,261,248 params, 32 layers, 32 query heads of 128, 8 KV heads: 131,072 B of KV per token.
    # step = max(FLOPs / (1e15 · 0.6), 16e9 B / (1e12 · 0.8) + KV bytes / (1e12 · 0.8)) + 0.5 ms
    p, attn, kv = 8_030_261_248, 4 * 32 * 32 * 128, 131_072

    def step(tokens: int, positions: float, moved: int) -> float:
        return max((2 * p * tokens + attn * positions) / 6e14, 16e9 / 8e11 + moved * kv / 8e11) + 0.5e-3

    # prefill of 1,000: causal positions 1000·1001/2, 1,000 tokens read and 1,000 written -> compute-bound 27.2 ms
    ttft = step(1000, 1000 * 1001 / 2, 2000)
    assert ttft == pytest.approx(0.02770488107, rel=1e-9)
    # each decode token at context c = 1001 .. 1010 (the new one included) reads c tokens and writes one
    decodes = [step(1, c, c + 1) for c in range(1001, 1011)]
    assert doc["ttft_s"]["mean"] == pytest.approx(ttft, rel=1e-12)
    assert doc["tpot_s"]["mean"] == pytest.approx(sum(decodes) / 10, rel=1e-12)  # (E2E - TTFT) / (11 - 1)
    assert doc["e2e_s"]["mean"] == pytest.approx(ttft + sum(decodes), rel=1e-12)
    assert doc["steps"] == 11
    # the pool: 0.92 · 80 GiB − 16e9 − workspace − non-torch − CUDA graphs, in blocks of 16 · 131,072 B
    plan = doc["memory_plan"]
    assert plan["requested_bytes"] == int(0.92 * 80 * 2**30)
    assert plan["kv_pool_bytes"] == plan["requested_bytes"] - 16_000_000_000 - plan["workspace_bytes"] - (
        plan["non_torch_bytes"] + plan["cuda_graph_bytes"])
    assert plan["num_blocks"] == plan["kv_pool_bytes"] // (16 * kv) == 28_530


@pytest.mark.parametrize("workload", [
    ("--requests", "1"),
    ("--trace", "azure", "ONE"),
])
def test_max_rate_on_one_request_is_refused_before_simulating(run_cli, tmp_path: Path, workload) -> None:
    # was: "searching the max rate of paged …" on stderr, the whole run simulated, then the error (2 stderr lines)
    one = tmp_path / "one.csv"
    one.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,10\n")
    args = [str(one) if a == "ONE" else a for a in workload]
    line = _one_error_line(run_cli("sim", *args, "--max-rate", "--slo", "ttft=1"))
    assert "--max-rate needs at least 2 arrivals" in line and "give --requests 2 or more" in line


def test_max_model_len_above_the_models_length_warns_as_size_does(run_cli) -> None:
    # OPT-13B's max_position_embeddings is 2,048: vLLM refuses --max-model-len 4096 at start-up (unless
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1); size --gpu says so, sim ran it without a word
    args = ("--model", "opt-13b", "--gpu", "A100-40GB", "--max-model-len", "4096")
    size = run_cli("size", *args)
    sim = run_cli("sim", *args, "--requests", "5", "--json")
    assert size.exit_code == sim.exit_code == 0, sim.stderr
    refusal = "vLLM would not start: --max-model-len 4,096 is above the model's max_position_embeddings 2,048"
    assert refusal in size.stderr and refusal in sim.stderr
    assert isinstance(sim.json(), dict)
    assert refusal not in run_cli("sim", "--model", "opt-13b", "--requests", "5", "--max-model-len", "2048").stderr


def test_host_cache_on_a_forced_block_that_does_not_tile_the_ids_runs(run_cli, tmp_path: Path) -> None:
    # Qwen3.5-27B's gated-deltanet state forces vLLM's block to 784 tokens (16 · ceil(3,207,168 / (16 · 4,096))).
    # The tiered run keys such a block by the id of its last token, but the comparison with share's one-at-a-time
    # replay (exact keys only) failed after the whole run with "error: --block 784 does not divide 512" (no --block
    # was given). Now the replay's rates are "—" (JSON null) with a note saying why. --block 1024 would tile the ids,
    # but vLLM takes blocks of 1 to 256 tokens only (CacheConfig's BlockSize; its state then raises the block to 784)
    trace = _mooncake(tmp_path / "t.jsonl", [(1200, 4, [1, 2, 3]), (1300, 4, [1, 2, 4])])
    config = write_config(tmp_path, "QWEN35_27B")
    args = ("sim", "--config", str(config), "--gpu", "H200", "--trace", "mooncake", str(trace),
            "--mamba-cache-mode", "align", "--host-cache", "100GiB")
    forced = run_cli(*args, "--json")
    assert forced.exit_code == 0, forced.stderr
    tiers = forced.json()["tiers"]
    assert tiers["block_size"] == 784
    assert all(r["replay_hit_rate"] is None and r["replay_gpu_hit_rate"] is None for r in tiers["rungs"])
    table = run_cli(*args, "--format", "markdown").stdout
    assert "one at a time (share): — because the block of 784 tokens does not tile" in table.replace("\n", " ")
    line = _one_error_line(run_cli(*args, "--block", "1024"))
    assert line.startswith("error: --block 1,024: vLLM pages blocks of 1, 8, 16, 32, 64, 128 or 256 tokens only")


def test_no_prefix_caching_does_not_say_the_trace_has_no_prefix_ids(run_cli, tmp_path: Path) -> None:
    # the title of the preemption table said "no prefix cache: the workload has no prefix ids" of a Mooncake trace
    # run with --no-prefix-caching. A 400 MiB pool (2.5 GiB less 1 GiB of weights, 256 MiB non-torch, 860 MiB of
    # CUDA graphs, a 1-byte workspace) is 200 blocks of 16 · 128 KiB: two requests of 1,200+ and 1,500 tokens
    # (169 blocks each at the end) cannot both finish without a preemption
    trace = _mooncake(tmp_path / "t.jsonl", [(1200, 1500, [1, 2, 3]), (1300, 1500, [1, 2, 4])], gap_ms=1)
    # (--max-model-len 3,000: 188 blocks, within the pool; at the model's 8,192, 512 blocks, vLLM would not start)
    small = ("--model", "llama-3-8b", "--gpu-memory", "2540MiB", "--bandwidth", "3e12", "--flops", "989e12",
             "--weights-bytes", "1GiB", "--workspace-bytes", "1", "--memory-utilization", "1",
             "--max-model-len", "3000")
    out = run_cli("sim", *small, "--trace", "mooncake", str(trace), "--no-prefix-caching", "--format", "markdown")
    assert out.exit_code == 0, out.stderr
    assert "Preemption by recompute (no prefix cache: prefix caching off, --no-prefix-caching)" in out.stdout
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1200,1500\n"
                     "2023-11-16 18:15:46.6815900,1300,1500\n")
    out = run_cli("sim", *small, "--trace", "azure", str(azure), "--format", "markdown")
    assert "Preemption by recompute (no prefix cache: the workload has no prefix ids)" in out.stdout


@pytest.mark.parametrize(("name", "extra"), [
    ("QWEN35_27B", ("--mamba-cache-mode", "align", "--layout", "ideal")),
    ("NEMOTRON_H_56B", ("--layout", "ideal")),
    ("GEMMA3_27B", ("--layout", "ideal")),
])
def test_a_hybrid_on_a_mooncake_trace_runs_or_refuses_in_one_line(run_cli, tmp_path: Path, name: str,
                                                                  extra: tuple[str, ...]) -> None:
    # found in the working tree (weighted tables reaching sim, uncommitted): Qwen3.5-27B --layout ideal
    # --mamba-cache-mode align on a Mooncake trace died in engine.py's "a step with nothing scheduled" assertion
    trace = _mooncake(tmp_path / "t.jsonl", [(1200, 4, [1, 2, 3]), (1300, 4, [1, 2, 4]), (600, 3, [1, 5])])
    result = run_cli("sim", "--config", str(write_config(tmp_path, name)), "--gpu", "H200", "--trace", "mooncake",
                     str(trace), *extra, "--json")
    if result.exit_code == 0:
        doc = result.json()
        assert doc["completed"] + doc["rejected"] == 3
    else:
        _one_error_line(result)


def test_speculation_with_every_draft_accepted_verifies_four_tokens_a_step(run_cli) -> None:
    # K = 3 n-gram drafts (no drafter time), all accepted: each decode step computes the sampled token and 3 drafts
    # (m = 4 after s cached: s·m + m(m+1)/2 positions, s + m read + m written) and yields 4 tokens, so 13 tokens are
    # the prefill's first token and 3 steps at s = 1,000, 1,004, 1,008
    doc = run_cli("sim", *CUSTOM, "--requests", "1", "--prompt-dist", "uniform:low=1000,high=1000", "--output-dist",
                  "uniform:low=13,high=13", "--spec-tokens", "3", "--spec-acceptance", "1", "--spec-method", "ngram",
                  "--json").json()
    p, attn, kv = 8_030_261_248, 4 * 32 * 32 * 128, 131_072

    def step(tokens: int, positions: float, moved: int) -> float:
        return max((2 * p * tokens + attn * positions) / 6e14, 16e9 / 8e11 + moved * kv / 8e11) + 0.5e-3

    ttft = step(1000, 1000 * 1001 / 2, 2000)
    decodes = [step(4, s * 4 + 10, s + 8) for s in (1000, 1004, 1008)]
    assert doc["steps"] == 4
    assert doc["ttft_s"]["mean"] == pytest.approx(ttft, rel=1e-12)
    assert doc["e2e_s"]["mean"] == pytest.approx(ttft + sum(decodes), rel=1e-12)
    assert doc["tpot_s"]["mean"] == pytest.approx(sum(decodes) / 12, rel=1e-12)


def test_zero_speculative_tokens_is_refused(run_cli) -> None:
    # --spec-tokens 0 --spec-acceptance 0.7 ran "K = 0 drafts per decode step by a draft model ... 0 lookahead
    # slots" beside the same run without speculation: the acceptance and method changed nothing
    line = _one_error_line(run_cli("sim", "--requests", "5", "--spec-tokens", "0", "--spec-acceptance", "0.7"))
    assert line.startswith("error: --spec-tokens 0 drafts nothing") and "--spec-acceptance" in line


def test_a_mamba_hybrids_concurrency_comes_from_its_state_and_attention_pages(run_cli, tmp_path: Path) -> None:
    # Nemotron-H-56B on an H200 (vllm layout): the mamba2 state page (16,900,096 B a layer) forces the block to
    # 4,128 tokens; a block id is 10 layer slots of 4,128 · 4,096 B = 169,082,880 B. A request holds one page in each
    # of the 6 state tables (54 mamba2 layers over 10 slots) and ceil(tokens / 4,128) in the full table: 300 tokens
    # take 7 ids, so the 125 ids vLLM hands out (126 less its null block) run 125 // 7 = 17 requests at once, and 40
    # sent at once never preempt
    doc = run_cli("sim", "--config", str(write_config(tmp_path, "NEMOTRON_H_56B")), "--gpu", "H200", "--rate", "inf",
                  "--requests", "40", "--prompt-dist", "uniform:low=100,high=100", "--output-dist",
                  "uniform:low=200,high=200", "--json").json()
    groups = doc["kv_cache_groups"]
    assert groups["block_size"] == 4128 and groups["block_bytes"] == 10 * 4128 * 4096 == 169_082_880
    assert [(g["kind"], g["block_tables"]) for g in groups["groups"]] == [("state", 6), ("full", 1)]
    plan = doc["memory_plan"]
    assert plan["num_blocks"] == plan["kv_pool_bytes"] // 169_082_880 == 126
    assert doc["peak_running"] == (126 - 1) // 7 == 17
    assert (doc["completed"], doc["preemptions"], doc["rejected"]) == (40, 0, 0)


def test_a_search_that_never_fails_says_the_workload_is_one_batch(run_cli) -> None:
    # 20 requests: every rate up to 2^12 times the first passed, and the table said "max rate 4096.000" for OPT-13B
    # on an A100 with nothing to say that the 20 requests then arrive within 5 ms (a batch, not a sustained rate)
    out = run_cli("sim", "--requests", "20", "--max-rate", "--slo", "ttft=2", "--format", "markdown")
    assert out.exit_code == 0, out.stderr
    assert ("max rate of paged: every rate tried passed (up to 4,096 req/s, where the 20 requests arrive within about "
            "0.00488 s): one batch") in out.stdout.replace("\n", " ")
    many = run_cli("sim", "--requests", "300", "--rate", "4", "--max-rate", "--slo", "ttft=2,tpot=50ms", "--json")
    assert many.json()["max_rate_search"]["paged"]["bracket_rps"][1] < float("inf")
    assert "every rate tried passed" not in run_cli("sim", "--requests", "300", "--rate", "4", "--max-rate", "--slo",
                                                    "ttft=2,tpot=50ms").stdout


def test_attainment_of_a_run_with_every_request_cancelled_is_undefined(run_cli) -> None:
    # 0 of 0 measured requests was reported as 0.00 % attainment, and --max-rate searched 13 runs to say 0.000
    doc = run_cli("sim", "--requests", "50", "--cancel-fraction", "1", "--slo", "ttft=1", "--json").json()
    assert doc["cancelled"] == doc["requests"] == 50
    assert doc["slo_attainment"] is None
    search = run_cli("sim", "--requests", "50", "--cancel-fraction", "1", "--slo", "ttft=1", "--max-rate", "--json")
    assert search.exit_code == 0, search.stderr
    found = search.json()["max_rate_search"]["paged"]
    # the cancellation points are output counts drawn once: every rate cancels all 50, so one run decides
    assert len(found["evaluations"]) == 1 and "all 50 requests are cancelled" in found["unattainable"]


def test_a_mamba_hybrids_state_pages_are_not_tail_fragmentation(run_cli, tmp_path: Path) -> None:
    doc = run_cli("sim", "--config", str(write_config(tmp_path, "NEMOTRON_H_56B")), "--gpu", "H200", "--requests",
                  "30", "--rate", "4", "--json").json()
    tables = doc["group_blocks_mean"]  # 6 state tables, then the full one (kv_cache_groups' order)
    assert [g["block_tables"] for g in doc["kv_cache_groups"]["groups"]] == [6, 1]
    blocks = doc["memory_plan"]["free_blocks"]  # the shares are of the ids the pool hands out (126 less the null block)
    memory = doc["memory"]
    # the attention tail can waste at most the full table's blocks; the state pages are in use, whatever their count
    assert memory["tail_fragmentation"] <= tables[-1] / blocks + 1e-9
    assert memory["useful"] >= sum(tables[:-1]) / blocks - 1e-9
    # mode none: one state page a request in each state table (state_pages), wholly useful; the occupied slots are
    # the useful ones and the full table's tail: useful + tail = Σ tables' mean blocks / pool (0.3605 + 0.0523 =
    # 7 · 7.4304 / 125 on this run: 6 state tables of one page a request, prompts within one 4,128-token block)
    assert abs(memory["useful"] + memory["tail_fragmentation"] - sum(tables) / blocks) < 1e-9


def test_a_long_request_on_a_small_mamba_hybrid_pool_runs_or_is_rejected(run_cli, tmp_path: Path) -> None:
    doc = run_cli("sim", "--config", str(write_config(tmp_path, "NEMOTRON_H_56B")), "--gpu-memory", "111.5GiB",
                  "--bandwidth", "4.8e12", "--flops", "989e12", "--memory-utilization", "1", "--max-model-len", "32768",
                  "--requests", "1", "--prompt-dist", "uniform:low=20000,high=20000", "--output-dist",
                  "uniform:low=10,high=10", "--json").json()
    assert doc["memory_plan"]["num_blocks"] == 19
    # B 4,128: full ceil(20,010 / 4,128) = 5 blocks + one state page in each of the 6 state tables (mode none) = 11
    assert (doc["completed"], doc["rejected"]) == (1, 0)


def test_reservation_policies_run_as_many_as_their_reservations_fit(run_cli) -> None:
    # OPT-13B on an A100-40GB: 790 blocks of 16 = 12,640 token slots for every policy. At rate inf, 40 requests of
    # 100 + 28 tokens: reserve-max holds 2,048 (max_position_embeddings) each, 12,640 // 2,048 = 6 at once;
    # reserve-oracle and reserve-pow2 hold 128 each, and 40 · 128 = 5,120 fit at once
    doc = run_cli("sim", "--rate", "inf", "--requests", "40", "--compare", "reserve-max,reserve-oracle,reserve-pow2",
                  "--prompt-dist", "uniform:low=100,high=100", "--output-dist", "uniform:low=28,high=28",
                  "--json").json()
    assert doc["memory_plan"]["capacity_tokens"] == 790 * 16 == 12_640
    peaks = {name: p["peak_running"] for name, p in doc["policies"].items()}
    assert peaks == {"reserve-max": 12_640 // 2_048, "reserve-oracle": 40, "reserve-pow2": 40}


def test_gemma3_alone_reads_only_the_window_of_its_sliding_layers(run_cli) -> None:
    # Gemma-3-27B (preset: 27,009,346,304 params; 62 layers of which 52 slide over W = 1,024; 32 heads of 128; 16 KV
    # heads: 62 · 16 · 128 · 2 · 2 = 507,904 B of KV a token), 54 GB of weights on a 1 TB/s, 1 PFLOP/s GPU
    doc = run_cli("sim", "--model", "gemma-3-27b", "--gpu-memory", "141GiB", "--bandwidth", "1e12", "--flops", "1e15",
                  "--weights-bytes", "54GB", "--requests", "1", "--prompt-dist", "uniform:low=4000,high=4000",
                  "--output-dist", "uniform:low=11,high=11", "--json").json()
    p, attn, kv, w, share = 27_009_346_304, 4 * 62 * 32 * 128, 507_904, 1024, 52 / 62
    assert doc["memory_plan"]["kv_bytes_per_token"] == kv

    def step(tokens: int, positions: float, moved: float) -> float:
        return max((2 * p * tokens + attn * positions) / 6e14, 54e9 / 8e11 + moved * kv / 8e11) + 0.5e-3

    # prefill: query q attends min(q, W) positions in a sliding layer: 52/62 of the layers skip Σ_{q>W} (q − W) =
    # 1 + ... + 2,976 positions; it reads its 4,000 new tokens and writes them (nothing cached is beyond the window)
    ttft = step(4000, 4000 * 4001 / 2 - share * 2976 * 2977 / 2, 8000)
    # decode at context c: the sliding layers attend and read only W of the c tokens
    decodes = [step(1, c - share * (c - w), c + 1 - share * (c - w)) for c in range(4001, 4011)]
    assert doc["ttft_s"]["mean"] == pytest.approx(ttft, rel=1e-12)
    assert doc["tpot_s"]["mean"] == pytest.approx(sum(decodes) / 10, rel=1e-12)


def test_a_prompt_longer_than_the_token_budget_is_prefilled_in_chunks(run_cli) -> None:
    # --max-batched-tokens 300: the 1,000-token prompt runs as chunks of 300, 300, 300, 100 (each after s cached:
    # s·m + m(m+1)/2 positions, s + m read, m written), then 10 decode steps: 14 steps
    doc = run_cli("sim", *CUSTOM, *ONE_REQUEST, "--max-batched-tokens", "300", "--max-seqs", "4", "--json").json()
    p, attn, kv = 8_030_261_248, 4 * 32 * 32 * 128, 131_072

    def step(tokens: int, positions: float, moved: int) -> float:
        return max((2 * p * tokens + attn * positions) / 6e14, 16e9 / 8e11 + moved * kv / 8e11) + 0.5e-3

    chunks = ((0, 300), (300, 300), (600, 300), (900, 100))
    assert doc["ttft_s"]["mean"] == pytest.approx(sum(step(m, s * m + m * (m + 1) / 2, s + 2 * m) for s, m in chunks),
                                                  rel=1e-12)
    assert doc["steps"] == 4 + 10


@pytest.mark.parametrize("policies", [("--policy", "reserve-max"), ("--compare", "reserve-oracle,reserve-pow2")])
def test_swap_with_only_reservation_policies_is_refused(run_cli, policies) -> None:
    # a reservation holds the request's whole length from admission, so growth never needs memory and nothing is
    # ever preempted: --preempt swap (and its --swap-bandwidth) changed nothing and ran silently
    line = _one_error_line(run_cli("sim", "--requests", "5", *policies, "--preempt", "swap"))
    assert line.startswith(f"error: --preempt swap moves a preempted request's blocks, and {' '.join(policies)} ")
    both = run_cli("sim", "--requests", "5", "--compare", "paged,reserve-max", "--preempt", "swap", "--json")
    assert both.exit_code == 0, both.stderr


@pytest.mark.parametrize("workload", [("--requests", "5"), ("--trace", "azure", "AZURE")])
def test_no_prefix_caching_without_prefix_ids_is_refused(run_cli, tmp_path: Path, workload) -> None:
    # constructed requests and Azure traces say nothing of their content: no block can hit, and --no-prefix-caching
    # changed nothing without a word
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,10\n")
    args = [str(azure) if a == "AZURE" else a for a in workload]
    line = _one_error_line(run_cli("sim", *args, "--no-prefix-caching"))
    assert line.startswith("error: --no-prefix-caching: the workload has no prefix ids")


def test_tier_sizes_of_gpt_oss_120b_in_cached_blocks(run_cli, tmp_path: Path) -> None:
    # gpt-oss-120b at tp 2: 36 layers (18 sliding, 18 full) of 8 KV heads of 64 in bf16, 4 heads a GPU: a cached
    # block of 16 tokens is 16 · 36 · 4 · 64 · 2 · 2 = 589,824 B per GPU, so 100 GiB hold 182,044 blocks and 1 TiB
    # 1,864,135; the GPU pool as a cache is the block ids it hands out (all but vLLM's null block) over the 2 groups'
    # tables (a block in each)
    trace = _mooncake(tmp_path / "t.jsonl", [(1200, 4, [1, 2, 3]), (1300, 4, [1, 2, 4]), (700, 2, [1, 5])])
    doc = run_cli("sim", "--config", str(write_config(tmp_path, "GPT_OSS_120B")), "--gpu", "H200", "--tp", "2",
                  "--trace", "mooncake", str(trace), "--host-cache", "100GiB", "--disk-cache", "1TiB", "--json").json()
    tiers = doc["tiers"]
    assert tiers["bytes_per_block"] == 16 * 36 * 4 * 64 * 2 * 2 == 589_824
    assert tiers["gpu_cache_blocks"] == (doc["memory_plan"]["num_blocks"] - 1) // 2
    last = tiers["rungs"][-1]
    assert (last["host_cache_blocks"], last["disk_cache_blocks"]) == (100 * 2**30 // 589_824, 2**40 // 589_824)
    assert (last["host_cache_blocks"], last["disk_cache_blocks"]) == (182_044, 1_864_135)
    assert last["host_cache_bytes"] == 182_044 * 589_824


@pytest.mark.parametrize("arrival", [("--arrival", "gamma"), ("--arrival", "gamma", "--burstiness", "2"),
                                     ("--arrival", "poisson")])
def test_an_arrival_process_at_rate_inf_is_refused_unless_a_search_rescales_it(run_cli, arrival) -> None:
    # --rate inf sends every request at time 0: --arrival gamma --burstiness 2 changed nothing and ran silently.
    # With --max-rate the seeded unit-rate arrivals are what each tried rate divides, so there they count
    line = _one_error_line(run_cli("sim", "--requests", "5", "--rate", "inf", *arrival))
    assert line.startswith(f"error: {arrival[0]} {arrival[1]} with --rate inf")
    searched = run_cli("sim", "--requests", "5", "--rate", "inf", *arrival, "--max-rate", "--slo", "ttft=2", "--json")
    assert searched.exit_code == 0, searched.stderr
