"""Round-6 QA, issue 19: concurrency at rate inf when memory binds on models whose local layers free blocks as a
request advances (sliding windows: gpt-oss-20b, Command-R7B; chunked attention: Llama-4-Scout) or hold a state
page (Nemotron-3-Nano, Falcon-H1, MiniMax-M1, Kimi-Linear, LFM2), against a model of vLLM v1's scheduler
written here, plus Llama-4-Scout's chunked groups in size and frag.

The engine model (vllm/v1/core/sched/scheduler.py, kv_cache_manager.py, single_type_kv_cache_manager.py,
re-derived): every request arrives at t = 0. A step first schedules the running requests in order, each
`min(tokens it still lacks, budget left)` tokens: allocate_slots frees ITS blocks that a local group no longer
reads (remove_skipped_blocks: sliding, before (n − W + 1) // B; chunked, before n // C · C // B, n computed) and
then takes the blocks its new tokens need in every table, or fails; on failure the last running request is
preempted (all its blocks freed, back to the front of the queue, recomputed) until it fits or is itself the
victim. Then, unless the step preempted, waiting requests are admitted in order while the budget, max_num_seqs and
the free ids allow (a chunk of a prompt is scheduled when the budget ends inside it). A request samples a token
when its computed tokens reach its length, and returns every block after its last token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_configs import real_config, write_config

GiB, MiB = 2**30, 2**20
FIXED = 1 * GiB + 256 * MiB + 860 * MiB + 1  # weights, vLLM 0.21's non-torch and CUDA graphs, a 1-byte workspace
B = 16


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Engine:
    """Identical requests of `prompt` + `output` tokens sent at once to `ids` free block ids of `block` tokens;
    tables are (kind, span) pairs: ("full", 0), ("sliding", W), ("chunked", C), ("state", 0)."""

    def __init__(self, tables: list[tuple[str, int]], ids: int, requests: int, prompt: int, output: int,
                 block: int = B) -> None:
        self.tables, self.free, self.prompt, self.output, self.block = tables, ids, prompt, output, block
        self.waiting, self.running = list(range(requests)), []
        self.computed, self.outputs = [0] * requests, [0] * requests
        self.held = [[[0, 0] for _ in tables] for _ in range(requests)]  # [first, end) block a table

    def _skip(self, kind: str, span: int, n: int) -> int:
        if kind == "sliding":
            return max(0, (n - span + 1) // self.block)
        return n // span * span // self.block if kind == "chunked" else 0

    def allocate(self, r: int, new: int) -> bool:
        for (kind, span), held in zip(self.tables, self.held[r], strict=True):
            first = min(max(held[0], self._skip(kind, span, self.computed[r])), held[1])
            self.free, held[0] = self.free + first - held[0], first
        # a state table (mamba_cache_mode none) holds one page from the first chunk to the end, whatever the length
        need = [max((1 if kind == "state" else _cdiv(self.computed[r] + new, self.block)) - held[1], 0)
                for (kind, _), held in zip(self.tables, self.held[r], strict=True)]
        if sum(need) > self.free:
            return False
        self.free -= sum(need)
        for held, n in zip(self.held[r], need, strict=True):
            held[1] += n
        return True

    def release(self, r: int) -> None:
        self.free += sum(end - first for first, end in self.held[r])
        self.held[r] = [[0, 0] for _ in self.tables]

    def step(self, budget: int, max_seqs: int) -> tuple[list[tuple[int, int]], int]:
        scheduled, preempted, index = [], 0, 0
        while index < len(self.running) and budget > 0:
            r = self.running[index]
            new = min(self.prompt + self.outputs[r] - self.computed[r], budget)
            while not self.allocate(r, new):
                victim = self.running.pop()
                self.release(victim)
                self.computed[victim], preempted = 0, preempted + 1
                self.waiting.insert(0, victim)
                if victim == r:
                    return scheduled, preempted
            scheduled.append((r, new))
            budget, index = budget - new, index + 1
        while not preempted and self.waiting and budget > 0 and len(self.running) < max_seqs:
            r = self.waiting[0]
            new = min(self.prompt + self.outputs[r] - self.computed[r], budget)
            if not self.allocate(r, new):
                break
            self.running.append(self.waiting.pop(0))
            scheduled.append((r, new))
            budget -= new
        return scheduled, preempted

    def run(self, budget: int, max_seqs: int = 256) -> tuple[int, int, int]:
        """(peak running, steps, preemptions)."""
        peak = steps = preemptions = 0
        while self.waiting or self.running:
            scheduled, preempted = self.step(budget, max_seqs)
            steps, preemptions, peak = steps + 1, preemptions + preempted, max(peak, len(self.running))
            for r, new in scheduled:
                self.computed[r] += new
                if self.computed[r] == self.prompt + self.outputs[r]:
                    self.outputs[r] += 1
                    if self.outputs[r] == self.output:
                        self.running.remove(r)
                        self.release(r)
        return peak, steps, preemptions


GPT_OSS = [("full", 0), ("sliding", 128)]  # gpt-oss-20b: 12 full + 12 sliding layers (W 128), group size 12
COMMAND_R7B = [("full", 0)] + [("sliding", 4096)] * 3  # 8 full + 24 sliding (W 4,096) layers, group size 8
SCOUT = [("full", 0)] + [("chunked", 8192)] * 3  # Llama-4-Scout: 12 full + 36 chunked (C 8,192), group size 12
# a block id: gpt-oss-20b 12 slots · 16 · (8 KV heads · 64 · 2 · 2 B = 2,048) = 393,216 B; Command-R7B 8 · 16 ·
# 4,096 = 524,288 B; Llama-4-Scout 12 · 16 · 4,096 = 786,432 B. The pool: (MiB − FIXED) // block id.
SOURCES = {"gpt-oss-20b": (("--model", "gpt-oss-20b"), GPT_OSS, 393_216),
           "COMMAND_R7B": (("--config", "COMMAND_R7B"), COMMAND_R7B, 524_288),
           "Llama-4-Scout": (("--model", "Llama-4-Scout"), SCOUT, 786_432)}
CASES = [
    # name, MiB, requests, prompt, output, token budget, (peak running, steps, preemptions) of the engine model.
    # A prompt of 64 · 16 + 1 (or 512 · 16 + 1) tokens and 15 outputs: the full table never grows past the
    # prompt's blocks, and the first decode frees all but the window's (9 of 65 blocks at W 128, 257 of 513 at
    # W 4,096) or the current chunk's (1 of 513): an engine holding every layer's tokens runs 15, 14 and 9 at once
    ("gpt-oss-20b", 2890, 200, 1025, 15, 65536, (26, 127, 0)),
    ("COMMAND_R7B", 17140, 60, 8193, 15, 65536, (22, 48, 0)),
    ("Llama-4-Scout", 17140, 60, 8193, 15, 65536, (35, 37, 0)),
    # issue 19's scenario: 40 GiB (− 1 B) of KV, prompts of 32,768 (+ 1) tokens at rate inf, chunks of 131,072
    # (the fourth prompt of a step is a chunk: 131,072 − 3 · 32,769 = 32,765 tokens)
    ("COMMAND_R7B", 40 * 1024 + 2140, 60, 32769, 15, 131072, (27, 48, 0)),
    ("Llama-4-Scout", 40 * 1024 + 2140, 60, 32769, 15, 131072, (23, 53, 0)),
    # longer outputs: full tables grow, chunks of 8,192 split prompts, one preemption by recompute
    ("gpt-oss-20b", 2300, 60, 1000, 300, 8192, (5, 4501, 1)),
    ("COMMAND_R7B", 12140, 40, 6000, 300, 8192, (17, 906, 0)),
    ("Llama-4-Scout", 12140, 40, 9000, 300, 8192, (16, 916, 0)),
]


def _sim(run_cli, tmp_path: Path, name: str, mib: int, requests: int, prompt: int, output: int, budget: int) -> dict:
    source = SOURCES[name][0]
    if source[0] == "--config":
        source = ("--config", str(write_config(tmp_path, name)))
    result = run_cli("sim", *source, "--gpu-memory", f"{mib}MiB", "--bandwidth", "4.8e12", "--flops", "989e12",
                     "--weights-bytes", "1GiB", "--workspace-bytes", "1", "--memory-utilization", "1", "--rate", "inf",
                     "--requests", str(requests), "--prompt-dist", f"uniform:low={prompt},high={prompt}",
                     "--output-dist", f"uniform:low={output},high={output}", "--max-batched-tokens", str(budget),
                     "--max-model-len", str(prompt + output), "--json")  # the default length would not fit (vLLM)
    assert result.exit_code == 0, result.stderr
    return result.json()


@pytest.mark.parametrize(("name", "mib", "requests", "prompt", "output", "budget", "expected"), CASES)
def test_sim_concurrency_when_local_layers_free_blocks(run_cli, tmp_path: Path, name: str, mib: int, requests: int,
                                                       prompt: int, output: int, budget: int,
                                                       expected: tuple[int, int, int]) -> None:
    _, tables, block_id = SOURCES[name]
    ids = (mib * MiB - FIXED) // block_id
    # the engine model, with every id free and with vLLM's null block (block 0, never handed out) taken away: the
    # same answer, so the check does not depend on it
    assert Engine(tables, ids, requests, prompt, output).run(budget) == expected
    assert Engine(tables, ids - 1, requests, prompt, output).run(budget) == expected
    if output == 15:  # the windows matter: every layer holding every token runs fewer at once
        assert Engine([("full", 0)] * len(tables), ids, requests, prompt, output).run(budget)[0] < expected[0]
    doc = _sim(run_cli, tmp_path, name, mib, requests, prompt, output, budget)
    assert (doc["memory_plan"]["num_blocks"], doc["kv_cache_groups"]["block_bytes"]) == (ids, block_id)
    assert doc["memory_plan"]["max_num_seqs"] == 256
    assert (doc["peak_running"], doc["steps"], doc["preemptions"]) == expected
    assert (doc["completed"], doc["rejected"]) == (requests, 0)


@pytest.mark.parametrize(("name", "tables", "block", "block_id", "mib", "prompt", "output", "budget", "expected"), [
    # Nemotron-3-Nano: 1 full + 4 state tables, block 2,096, a block id 6 · 2,096 · 1,024 = 12,877,824 B, 78 ids in
    # (3,100 MiB − FIXED); 40 requests, growing past a block, preempted by recompute
    ("NEMOTRON3_NANO", [("full", 0)] + [("state", 0)] * 4, 2096, 12_877_824, 3100, 3000, 1500, 8192, (12, 6003, 3)),
    ("NEMOTRON3_NANO", [("full", 0)] + [("state", 0)] * 4, 2096, 12_877_824, 3100, 1000, 3000, 8192, (15, 10613, 7)),
    # Falcon-H1: 1 full + 1 state table, block 800, a block id 36 · 800 · 512 = 14,745,600 B: 39 and 25 ids
    ("FALCON_H1_05B", [("full", 0), ("state", 0)], 800, 14_745_600, 2700, 1000, 2000, 8192, (12, 10000, 18)),
    ("FALCON_H1_05B", [("full", 0), ("state", 0)], 800, 14_745_600, 2500, 500, 3000, 4096, (12, 22160, 65)),
    # MiniMax-M1: 1 full + 7 lightning-state tables, block 512, a block id 10 · 512 · 4,096 = 20,971,520 B: 47 ids
    ("MINIMAX_M1", [("full", 0)] + [("state", 0)] * 7, 512, 20_971_520, 3100, 600, 900, 8192, (5, 8100, 8)),
    # Kimi-Linear's layers: 1 MLA + 3 KDA-state tables, block 1,888, a block id 7 · 1,888 · 1,152 = 15,224,832 B
    ("KIMI_K3", [("full", 0)] + [("state", 0)] * 3, 1888, 15_224_832, 3100, 1500, 3000, 8192, (16, 12002, 17)),
    # LFM2: 1 full + 2 short-conv tables, block 16, a block id 6 · 16 · 2,048 = 196,608 B: 53 ids
    ("LFM2_12B", [("full", 0)] + [("state", 0)] * 2, 16, 196_608, 2150, 100, 200, 8192, (5, 2567, 49)),
])
def test_sim_mamba_hybrid_preemption_against_the_engine_model(run_cli, tmp_path: Path, name: str, tables, block: int,
                                                               block_id: int, mib: int, prompt: int, output: int,
                                                               budget: int, expected: tuple[int, int, int]) -> None:
    # vLLM's null block (block 0, never handed out) leaves ids − 1 free; these small pools are sensitive to it, e.g.
    # Nemotron-3-Nano's first case runs 13 at once with every id free, 12 with the 77 vLLM hands out
    ids = (mib * MiB - FIXED) // block_id
    assert Engine(tables, ids - 1, 40, prompt, output, block).run(budget) == expected
    config = write_config(tmp_path, name, "test_real_configs" if name == "MINIMAX_M1" else "test_architecture_configs")
    result = run_cli("sim", "--config", str(config), "--gpu-memory", f"{mib}MiB", "--bandwidth", "4.8e12", "--flops",
                     "989e12", "--weights-bytes", "1GiB", "--workspace-bytes", "1", "--memory-utilization", "1",
                     "--rate", "inf", "--requests", "40", "--prompt-dist", f"uniform:low={prompt},high={prompt}",
                     "--output-dist", f"uniform:low={output},high={output}", "--max-batched-tokens", str(budget),
                     "--max-model-len", str(prompt + output), "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert (doc["memory_plan"]["num_blocks"], doc["kv_cache_groups"]["block_size"]) == (ids, block)
    assert (doc["peak_running"], doc["steps"], doc["preemptions"], doc["completed"]) == (*expected, 40)


@pytest.mark.parametrize(("mib", "expected"), [(2300, (5, 122, 0)), (2400, (9, 76, 0))])
def test_sim_gemma3n_shared_kv_layers_take_no_table(run_cli, tmp_path: Path, mib: int,
                                                    expected: tuple[int, int, int]) -> None:
    # Gemma-3n-E4B: 16 sliding (W 512) + 4 full layers keep KV, the 15 KV-shared ones none: 4 sliding tables + 1
    # full of 4 slots, a block id 4 · 16 · 2,048 = 131,072 B; (2,300 MiB − FIXED) // 131,072 = 1,279 ids, 2,079 at
    # 2,400 MiB. Prompts of 1,025: 65 blocks in each of 5 tables (325) until the first decode frees (1,025 − 511)
    # // 16 = 32 in each sliding table. The trimmed public config gives no vision/audio tower dimensions, which
    # sim's parameter count needs even with --weights-bytes: typical ones are added (they change no KV)
    config = real_config("GEMMA3N_E4B")
    config = {**config, "vision_config": {**config["vision_config"], "hidden_size": 2048, "num_hidden_layers": 12},
              "audio_config": {**config["audio_config"], "hidden_size": 1536, "num_hidden_layers": 12}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    tables = [("full", 0)] + [("sliding", 512)] * 4
    ids = (mib * MiB - FIXED) // 131_072
    assert Engine(tables, ids, 40, 1025, 15).run(65536) == Engine(tables, ids - 1, 40, 1025, 15).run(65536) == expected
    doc = run_cli("sim", "--config", str(tmp_path), "--gpu-memory", f"{mib}MiB", "--bandwidth", "4.8e12", "--flops",
                  "989e12", "--weights-bytes", "1GiB", "--workspace-bytes", "1", "--memory-utilization", "1", "--rate",
                  "inf", "--requests", "40", "--prompt-dist", "uniform:low=1025,high=1025", "--output-dist",
                  "uniform:low=15,high=15", "--max-batched-tokens", "65536", "--max-model-len", "1040", "--json").json()
    assert [(g["kind"], g["block_tables"]) for g in doc["kv_cache_groups"]["groups"]] == [("sliding", 4), ("full", 1)]
    assert doc["memory_plan"]["num_blocks"] == ids
    assert (doc["peak_running"], doc["steps"], doc["preemptions"], doc["completed"]) == (*expected, 40)


def test_sim_frees_window_blocks_request_by_request(run_cli, tmp_path: Path) -> None:
    # gpt-oss-20b, 159 ids, 40 requests of 300 + 200 tokens. At step 257 one id is free; the 4th running request
    # (336 cached) needs a new block in both tables, and only the 5th (335 cached) would free one (its block 12
    # leaves the window). vLLM's allocate_slots runs remove_skipped_blocks for the request it schedules only, so
    # the 4th does not fit and the 5th is preempted; kvcalc frees the 5th's block first and preempts nobody. Over
    # the run: 10 preemptions in vLLM's order, 4 in kvcalc's
    ids = (2200 * MiB - FIXED) // 393_216
    expected = Engine(GPT_OSS, ids, 40, 300, 200).run(8192)
    assert expected == Engine(GPT_OSS, ids - 1, 40, 300, 200).run(8192) == (5, 2019, 10)
    doc = _sim(run_cli, tmp_path, "gpt-oss-20b", 2200, 40, 300, 200, 8192)
    assert (doc["peak_running"], doc["steps"], doc["preemptions"]) == expected


def test_size_chunked_blocks_per_request(run_cli) -> None:
    # Llama-4-Scout, 40 GiB, max_model_len 32,768, max_num_batched_tokens 2,048: 40 GiB // 786,432 = 54,613 ids; a
    # chunked table ceil(min(8,192 + 2,048, 32,768) / 16) = 640 blocks a request, the full one 2,048: 3 · 640 + 2,048
    plan = run_cli("size", "--model", "Llama-4-Scout", "--kv-memory", "40GiB", "--max-model-len", "32768",
                   "--max-num-batched-tokens", "2048", "--json").json()["gpu_plan"]
    assert (plan["block_bytes"], plan["num_blocks"]) == (786_432, 40 * GiB // 786_432) == (786_432, 54_613)
    assert [(g["kind"], g["blocks_per_request"]) for g in plan["groups"]] == [("chunked", 640)] * 3 + [("full", 2048)]
    assert plan["blocks_per_request"] == 3968
    assert plan["kv_cache_tokens"] == 54_613 * 32_768 // 3968 == 450_997


def test_frag_chunked_tables_keep_the_current_chunk(run_cli) -> None:
    # the chunk of a sequence's last token (n − 1) starts at (n − 1) // 8,192 · 8,192: n = 100 keeps its 7 blocks,
    # 8,192 its 512, 8,193 only block 512 (its chunk holds 1 token), 20,000 blocks 1,024..1,249 (3,616 tokens): 746
    lengths = (100, 8192, 8193, 20000)
    paged = run_cli("frag", "--model", "Llama-4-Scout", "--lengths", ",".join(map(str, lengths)), "--block", "16",
                    "--json").json()["paged"][0]
    groups = {g["kind"]: g for g in paged["groups"]}
    kept = [(n - 1) // 16 - (n - 1) // 8192 * 8192 // 16 + 1 for n in lengths]
    assert kept == [7, 512, 1, 226]
    assert (groups["chunked"]["block_tables"], groups["chunked"]["blocks"]) == (3, 3 * 746)
    assert groups["chunked"]["allocated_bytes"] == 3 * 746 * 786_432
    # useful: the tokens of the current chunk, 36 layers · 4,096 B each
    assert groups["chunked"]["useful_bytes"] == (100 + 8192 + 1 + 3616) * 36 * 4096
    assert groups["full"]["blocks"] == 7 + 512 + 513 + 1250


def _mooncake(path: Path) -> Path:
    # three requests a second apart: 1,024 tokens of hash ids [1, 2] twice, then 1,500 of [1, 2, 3] (512 tokens an id)
    lines = [(0, 1024, [1, 2]), (1000, 1024, [1, 2]), (2000, 1500, [1, 2, 3])]
    path.write_text("".join(f'{{"timestamp": {t}, "input_length": {n}, "output_length": 5, "hash_ids": {ids}}}\n'
                            for t, n, ids in lines))
    return path


@pytest.mark.parametrize("name", ["gpt-oss-20b", "Llama-4-Scout", "COMMAND_R7B"])
def test_sim_prefix_hits_per_group_of_local_layers(run_cli, tmp_path: Path, name: str) -> None:
    # nothing is evicted (the pool holds all three), so a block freed when it left the window (or chunk) stays
    # cached: every group serves the hit. The 2nd request hits (1,024 − 1) // 16 = 63 blocks (the last token is
    # always computed): 1,008 tokens; the 3rd all 64 blocks of ids 1 and 2: 1,024. 2,032 of 1,024 + 1,024 + 1,500
    source = SOURCES[name][0]
    if source[0] == "--config":
        source = ("--config", str(write_config(tmp_path, name)))
    doc = run_cli("sim", *source, "--gpu-memory", "2890MiB", "--bandwidth", "4.8e12", "--flops", "989e12",
                  "--weights-bytes", "1GiB", "--workspace-bytes", "1", "--memory-utilization", "1", "--trace",
                  "mooncake", str(_mooncake(tmp_path / "t.jsonl")), "--max-model-len", "2048", "--json").json()
    cache = doc["prefix_cache"]
    assert (cache["prompt_tokens"], cache["hit_tokens"]) == (3548, 1008 + 1024)
    assert [g["hit_tokens"] for g in cache["groups"]] == [2032, 2032]


def test_sim_evicts_in_the_order_blocks_were_freed(run_cli, tmp_path: Path) -> None:
    # gpt-oss-20b, 426 ids. A (1,024 tokens, ids [1, 2], 20 out) takes 66 + 66 ids over its life: its first decode
    # frees sliding blocks 55, 54, ..., 0 (that order: remove_skipped_blocks walks back from the window), a later
    # one block 56; at its end the rest, among them 4 without a hash (blocks 64 and 65 of each table). B (2,368
    # tokens, 1 out) then takes 2 · 148 = 296 ids: vLLM pops the 294 never used and then the two oldest freed,
    # sliding 55 and 54, evicting them (a third, 53, with vLLM's null block: 293 never used). C repeats A's prompt:
    # the full table hits 63 blocks, the sliding one needs 8 cached blocks in a row (the window's 127 tokens) and,
    # scanning back from block 62, finds 62..56 then a gap: 46..53 -> 54 blocks, 864 tokens (53, 848 with the null
    # block). A plain-first pool (kvcalc before round 8) handed B the 4 hash-less ids first and C hit 1,008
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {t}, "input_length": {n}, "output_length": {o}, "hash_ids": {ids}}}\n'
                             for t, n, o, ids in [(0, 1024, 20, [1, 2]), (1000, 2368, 1, [3, 4, 5, 6, 7]),
                                                  (2000, 1024, 5, [1, 2])]))
    doc = run_cli("sim", "--model", "gpt-oss-20b", "--gpu-memory", "2300MiB", "--bandwidth", "4.8e12", "--flops",
                  "989e12", "--weights-bytes", "1GiB", "--workspace-bytes", "1", "--memory-utilization", "1",
                  "--trace", "mooncake", str(trace), "--max-model-len", "2400", "--json").json()
    assert doc["memory_plan"]["num_blocks"] == (2300 * MiB - FIXED) // 393_216 == 426
    assert doc["prefix_cache"]["hit_tokens"] in (864, 848)
