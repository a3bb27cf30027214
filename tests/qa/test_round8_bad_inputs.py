"""Round-8 QA, issue 19: bad inputs across every command, on hybrids first (Mamba, sliding-window, chunked): each is
refused with exactly one `error:` line on stderr that names the option or the bad value (a trace's file and line),
exit 2, no traceback. The fixture's files: TRACE a valid Mooncake trace, BADJSON a line cut short, EMPTY no
request, NEG a negative input_length."""

from __future__ import annotations

import json

import pytest

# (what the one error line names, the command line)
CASES = [
    ('--mamba-cache-mode', 'size --model nemotron-h-56b --gpu H200 --mamba-cache-mode sometimes'),
    ('--mamba-cache-mode', 'sim --model nemotron-h-56b --gpu H200 --mamba-cache-mode ALL2'),
    ('--mamba-cache-mode', 'share --trace mooncake TRACE --model nemotron-h-56b --memory 80GiB --mamba-cache-mode x'),
    ('--mamba-cache-mode', 'frag --model nemotron-h-56b --mamba-cache-mode yes'),
    ('--mamba-cache-mode', 'sim --model llama-3-8b --gpu H100-SXM --mamba-cache-mode all'),
    ('--mamba-cache-mode', 'share --trace mooncake TRACE --model llama-3-8b --mamba-cache-mode align'),
    ('--mamba-cache-mode', 'frag --model llama-3-8b --mamba-cache-mode all'),
    ('--mamba-cache-mode', 'size --model gpt-oss-20b --gpu H200 --mamba-cache-mode align'),
    ('--layout', 'size --model gemma-3-27b --gpu H200 --layout best'),
    ('--layout', 'sim --model gemma-3-27b --gpu H200 --layout VLLM2'),
    ('--layout', 'frag --model gemma-3-27b --layout none'),
    ('--layout', 'share --model gemma-3-27b --layout x'),
    ('--layout', 'share --trace mooncake TRACE --layout ideal'),
    ('--layout', 'frag --layout ideal --lengths 100'),
    ('--memory', 'share --trace mooncake TRACE --model nemotron-h-56b --memory 1KiB'),
    ('--memory', 'share --trace mooncake TRACE --model nemotron-h-56b --memory -5GiB'),
    ('--memory', 'share --trace mooncake TRACE --model nemotron-h-56b --memory lots'),
    ('--memory', 'share --trace mooncake TRACE --model nemotron-h-56b --memory 0'),
    ('--capacity-blocks', 'share --trace mooncake TRACE --model nemotron-h-56b --capacity-blocks 0'),
    ('--capacity-blocks', 'share --trace mooncake TRACE --model nemotron-h-56b --capacity-blocks 3'),
    ('--capacity-blocks', 'share --trace mooncake TRACE --model nemotron-h-56b --capacity-blocks -1'),
    ('--memory', 'share --trace mooncake TRACE --model nemotron-h-56b --memory 80GiB --capacity-blocks 100'),
    ('/nonexistent.jsonl', 'share --trace mooncake /nonexistent.jsonl --model gemma-3-27b --memory 40GiB'),
    ('bad.jsonl:1', 'share --trace mooncake BADJSON --model gemma-3-27b --memory 40GiB'),
    ('empty.jsonl', 'share --trace mooncake EMPTY --model gemma-3-27b --memory 40GiB'),
    ('neg.jsonl:1', 'share --trace mooncake NEG --model gemma-3-27b --memory 40GiB'),
    ("'parquet'", 'share --trace parquet TRACE'),
    ('neg.jsonl:1', 'sim --model gemma-3-27b --gpu H200 --trace mooncake NEG'),
    ('empty.jsonl', 'sim --model gemma-3-27b --gpu H200 --trace mooncake EMPTY'),
    ('bad.jsonl:1', 'sim --model gemma-3-27b --gpu H200 --trace mooncake BADJSON'),
    ('--trace', 'sim --model gemma-3-27b --gpu H200 --trace azure TRACE'),
    ('--limit', 'share --trace mooncake TRACE --limit 0'),
    ('--limit', 'sim --model gemma-3-27b --gpu H200 --trace mooncake TRACE --limit -1'),
    ('--block', 'share --trace mooncake TRACE --model gemma-3-27b --memory 40GiB --block 0'),
    ('--block', 'sim --model gemma-3-27b --gpu H200 --block 0'),
    ('--block', 'sim --model gemma-3-27b --gpu H200 --block 7'),
    ('--block', 'sim --model nemotron-h-56b --gpu H200 --block -16'),
    ('--block', 'frag --model gemma-3-27b --block 0'),
    ('--block', 'frag --model gemma-3-27b --block -4'),
    ('--block', 'size --model gemma-3-27b --gpu H200 --block 7'),
    ('--block', 'size --model gemma-3-27b --gpu H200 --block 0'),
    ('--dtype', 'sim --model gemma-3-27b --gpu H200 --dtype int4'),
    ('--dtype', 'sim --model nemotron-h-56b --gpu H200 --dtype fp4x'),
    ('--dtype', 'size --model nemotron-h-56b --dtype fp9'),
    ('--dtype', 'share --model gemma-3-27b --dtype bogus'),
    ('--dtype', 'frag --model gpt-oss-20b --dtype q4'),
    ('--tp', 'size --model nemotron-h-56b --gpu H200 --tp 0'),
    ('--tp', 'size --model nemotron-h-56b --gpu H200 --tp 3'),
    ('--tp', 'sim --model gemma-3-27b --gpu H200 --tp 0'),
    ('--tp', 'sim --model gpt-oss-20b --gpu H200 --tp -2'),
    ('--tp', 'share --trace mooncake TRACE --model gemma-3-27b --capacity 1GiB --tp 0'),
    ('--tp', 'plan --model gpt-oss-20b --gpu-cost H200=5 --tp 0 --slo ttft=1'),
    ('--tp', 'plan --model gpt-oss-20b --gpu-cost H200=5 --tp 1,x --slo ttft=1'),
    ('--gpu', 'sim --model gemma-3-27b --gpu H900'),
    ("'h2000'", 'size --model gemma-3-27b --gpu h2000'),
    ('--gpu', 'plan --model gpt-oss-20b --gpu-cost H900=5 --slo ttft=1'),
    ('--gpu-cost', 'plan --model gpt-oss-20b --gpu-cost H200=-5 --slo ttft=1'),
    ('--gpu-cost', 'plan --model gpt-oss-20b --gpu-cost H200 --slo ttft=1'),
    ('--gpu-cost', 'plan --model gpt-oss-20b --gpu-cost H200=abc --slo ttft=1'),
    ('--slo', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=-1'),
    ('--slo', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo latency=1'),
    ('--slo', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1,ttft=2'),
    ('--slo', 'sim --model gpt-oss-20b --gpu H200 --slo tpot=1parsec'),
    ('--attainment', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --attainment 1.5'),
    ('--attainment', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --attainment 0'),
    ('--attainment', 'sim --model gpt-oss-20b --gpu H200 --slo ttft=1 --attainment -0.1'),
    ('--replicas', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --replicas 0'),
    ('--block', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --block 0'),
    ('--max-batched-tokens', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --max-batched-tokens 0'),
    ('--dtype', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --dtype int3'),
    ('--jobs', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --jobs 0'),
    ('--max-model-len', 'sim --model gemma-3-27b --gpu H200 --max-model-len 0'),
    ('--max-model-len', 'sim --model nemotron-h-56b --gpu H200 --max-model-len -5'),
    ('--max-model-len', 'size --model gemma-3-27b --gpu H200 --max-model-len 0'),
    ('--max-model-len', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --max-model-len 0'),
    ('--max-seqs', 'sim --model gemma-3-27b --gpu H200 --max-seqs 0'),
    ('--max-batched-tokens', 'sim --model gemma-3-27b --gpu H200 --max-batched-tokens 0'),
    ('--max-batched-tokens',
     'sim --model nemotron-h-56b --gpu H200 --max-batched-tokens 16 --trace mooncake TRACE --mamba-cache-mode align'),
    ('--rate', 'sim --model gemma-3-27b --gpu H200 --rate -1'),
    ('--rate', 'sim --model gemma-3-27b --gpu H200 --rate fast'),
    ('--rate', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --rate 0'),
    ('--requests', 'sim --model gemma-3-27b --gpu H200 --requests 0'),
    ('--requests', 'sim --model gemma-3-27b --gpu H200 --requests 10000001'),
    ('high=2', 'sim --model gemma-3-27b --gpu H200 --prompt-dist uniform:low=5,high=2'),
    ("'gauss'", 'sim --model gemma-3-27b --gpu H200 --prompt-dist gauss:mean=5'),
    ('low=0', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --prompt-dist uniform:low=0,high=0'),
    ('--timeline', 'sim --model gemma-3-27b --gpu H200 --timeline /nonexistent/dir/t.csv'),
    ('--timeout', 'sim --model gemma-3-27b --gpu H200 --timeout -1'),
    ('--timeout', 'sim --model gemma-3-27b --gpu H200 --timeout 1parsec'),
    ('--memory-utilization', 'sim --model gemma-3-27b --gpu H200 --memory-utilization 1.5'),
    ('--memory-utilization', 'size --model nemotron-h-56b --gpu H200 --memory-utilization 0'),
    ('--memory-utilization', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --memory-utilization 2'),
    ('--kv-memory', 'size --model nemotron-h-56b --kv-memory -1GiB'),
    ('--memory', 'size --model nemotron-h-56b --memory abc'),
    ('--tokens', 'size --model nemotron-h-56b --tokens 0'),
    ('--tokens', 'size --model nemotron-h-56b --tokens -5'),
    ('--host-cache', 'sim --model nemotron-h-56b --gpu H200 --trace mooncake TRACE --host-cache -1GiB'),
    ('--host-cache', 'sim --model gpt-oss-20b --gpu H200 --trace mooncake TRACE --host-cache lots'),
    ('--host-bw', 'sim --model gpt-oss-20b --gpu H200 --trace mooncake TRACE --host-cache 1GiB --host-bw 0'),
    ('--gpu-cache', 'share --trace mooncake TRACE --model nemotron-h-56b --gpu-cache -4GiB --gpu H200'),
    ('--host-cache', 'share --trace mooncake TRACE --model nemotron-h-56b --host-cache 4GiB --gpu H200'),
    ('--tier-mode', 'share --trace mooncake TRACE --gpu-cache 1M --host-cache 4M --tier-mode lru'),
    ('--host-bw', 'share --trace mooncake TRACE --gpu-cache 1M --host-cache 4M --host-bw 0'),
    ('--capacity', 'share --trace mooncake TRACE --model nemotron-h-56b --capacity 4GiB:1GiB'),
    ('--capacity', 'share --trace mooncake TRACE --capacity 1M:4M:0'),
    ('--blocks', 'share --trace mooncake TRACE --capacity 1M --blocks 16,0'),
    ('--blocks', 'share --trace mooncake TRACE --capacity 1M --blocks 16,abc'),
    ('--plot', 'share --trace mooncake TRACE --capacity 1M --plot out.bmp'),
    ('--prefix', 'share --model gemma-3-27b --prefix -1'),
    ('--branches', 'share --model gemma-3-27b --branches 0'),
    ('--gen', 'share --model nemotron-h-56b --gen -3'),
    ('--mode', 'share --model gemma-3-27b --mode tree'),
    ('--seed', 'share --model gemma-3-27b --mode beam --seed -1'),
    ('--lengths', 'frag --model gemma-3-27b --lengths 100,-5'),
    ('--lengths', 'frag --model nemotron-h-56b --lengths 100,abc'),
    ('--lengths', 'frag --model gpt-oss-20b --lengths 0'),
    ('--dist', 'frag --model gemma-3-27b --dist uniform:low=10'),
    ('--count', 'frag --model gemma-3-27b --dist uniform:low=10,high=20 --count 0'),
    ('--spec-tokens', 'frag --model nemotron-h-56b --lengths 100 --spec-tokens -1'),
    ('--max-len', 'frag --model gemma-3-27b --lengths 100 --max-len 50'),
    ('empty.jsonl', 'frag --model gemma-3-27b --trace mooncake EMPTY'),
    ('/nonexistent/config.json', 'size --config /nonexistent/config.json'),
    ('no config.json', 'sim --config NOCONFIG --gpu H200'),
    ('--model', 'size --model not-a-model'),
    ('--model', 'frag --model nemotron-h-57b --lengths 100'),
    ('--layers', 'size --model gemma-3-27b --layers 0'),
    ('--kv-heads', 'size --model nemotron-h-56b --kv-heads 0'),
    ('--head-dim', 'frag --model gpt-oss-20b --head-dim -64 --lengths 100'),
    ('--config', 'size --model gemma-3-27b --config FALCON'),
    ('--inject', 'verify --model hybrid-tiny --inject early-free'),
    ('--inject', 'verify --model hybrid-tiny --inject bogus'),
    ('--scenario', 'verify --model hybrid-tiny --scenario ragged'),
    ('--scenario', 'verify --model hybrid-tiny --scenario hybrid-bogus'),
    ('--inject', 'verify --inject swa-early-free'),
    ('--model', 'verify --model hybrid-huge'),
    ('--dtype', 'verify --model hybrid-tiny --dtype fp8'),
    ("--device 'tpu'", 'verify --model hybrid-tiny --device tpu'),
    ('--hf-model', 'verify --model hybrid-tiny --hf-model /tmp'),
    ('--seed', 'verify --model hybrid-tiny --seed -1'),
    ('--device', 'bench --device tpu'),
    ('--dtype', 'bench --device cpu --dtype int2'),
    ('--spec-tokens', 'sim --model nemotron-h-56b --gpu H200 --spec-tokens 3'),
    ('--preempt', 'sim --model gemma-3-27b --gpu H200 --preempt drop'),
    ('reserve-x', 'sim --model gemma-3-27b --gpu H200 --policy reserve-x'),
    ('--cancel-fraction', 'sim --model gemma-3-27b --gpu H200 --cancel-fraction 1.5'),
    ('--time-scale', 'sim --model gemma-3-27b --gpu H200 --trace mooncake TRACE --time-scale 0'),
    ('--burstiness', 'sim --model gemma-3-27b --gpu H200 --arrival gamma --burstiness 0'),
    ('--arrival', 'sim --model gemma-3-27b --gpu H200 --arrival pareto'),
    ('--mamba-cache-mode', 'sim --model gemma-3-27b --gpu H200 --mamba-cache-mode align'),
    ('--requests', 'plan --model nemotron-h-56b --gpu-cost H200=5 --slo ttft=1 --requests 0'),
    ('--limit', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --trace mooncake TRACE --limit 0'),
    ('--spec-tokens', 'size --model nemotron-h-56b --spec-tokens -2'),
    ('--lengths', 'frag --model llama-4-scout --lengths 5,,6'),
    ('--count', 'frag --model gpt-oss-20b --dist uniform:low=1,high=5 --count -3'),
    ('--max-len', 'frag --model nemotron-h-56b --lengths 100 --max-len 0'),
    ('--prefix', 'share --model nemotron-h-56b --prefix 0 --branches 2 --gen 10 --layout ideal'),
    ('--branches', 'share --model gpt-oss-20b --branches -1'),
    ('--time-scale', 'plan --model gpt-oss-20b --gpu-cost H200=5 --slo ttft=1 --trace mooncake TRACE --time-scale -2'),
    ('--scenario', 'verify --model hybrid-tiny --scenario hybrid-ragged --scenario hybrid-ragged'),
    ('--format', 'sim --model gemma-3-27b --gpu H200 --format yaml'),
    ('--format', 'frag --model nemotron-h-56b --lengths 100 --format html'),
    ('--format', 'verify --model hybrid-tiny --format xml'),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("inputs")
    rows = [(0, 10240, list(range(20))), (1000, 10240, list(range(20))), (2000, 9000, list(range(18)))]
    texts = {
        "TRACE": "".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 10, "hash_ids": ids}) + "\n"
                         for t, n, ids in rows),
        "BADJSON": '{"timestamp": 0, "input_length": 10\n',
        "EMPTY": "",
        "NEG": '{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": [1]}\n',
    }
    names = {"TRACE": "t.jsonl", "BADJSON": "bad.jsonl", "EMPTY": "empty.jsonl", "NEG": "neg.jsonl"}
    for key, text in texts.items():
        (folder / names[key]).write_text(text)
    (folder / "sw").mkdir()  # a folder without config.json
    return {key: str(folder / name) for key, name in names.items()} | {"NOCONFIG": str(folder / "sw")}


@pytest.mark.parametrize(("names", "command"), CASES, ids=[c for _, c in CASES])
def test_bad_input_is_one_named_error_line(run_cli, files: dict[str, str], names: str, command: str) -> None:
    args = [files.get(word, word) for word in command.split()]
    result = run_cli(*args)
    assert result.exit_code == 2, (result.exit_code, result.stdout[-300:], result.stderr[-1000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines
    assert names in lines[0], lines[0]


def _one_line(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout[-300:], result.stderr[-1000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines
    return lines[0]


def test_share_align_on_the_ideal_layout_runs(run_cli, files) -> None:
    # was refused (weighted tables did not page align's states); they now page them as vLLM (tests/core/share/
    # test_share_weighted.py holds the numbers by hand)
    result = run_cli("share", "--trace", "mooncake", files["TRACE"], "--model", "nemotron-h-56b", "--memory", "80GiB",
                     "--mamba-cache-mode", "align", "--layout", "ideal", "--json")
    assert result.exit_code == 0 and result.json()["mamba_cache_mode"] == "align", result.stderr


def test_sim_names_which_length_distribution_is_bad(run_cli) -> None:
    # both given, the output one bad: the line names --output-dist (not --prompt-dist) and the family's rule
    line = _one_line(run_cli("sim", "--model", "gpt-oss-20b", "--gpu", "H200", "--prompt-dist",
                             "uniform:low=100,high=200", "--output-dist", "lognormal:mean=-3,sigma=1"))
    assert line.startswith("error: --output-dist 'lognormal:mean=-3,sigma=1': ") and "--prompt-dist" not in line
    assert "mean > 0" in line
    # a missing parameter (core marks it as {dist}): the example is written with the option at fault
    line = _one_line(run_cli("sim", "--model", "gpt-oss-20b", "--gpu", "H200", "--prompt-dist", "lognormal:sigma=1",
                             "--output-dist", "uniform:low=1,high=9"))
    assert line.startswith("error: --prompt-dist ") and "e.g. --prompt-dist lognormal:" in line, line
    assert "--output-dist" not in line and "{" not in line, line


def test_share_vllm_layout_refuses_a_block_vllm_does_not_page(run_cli, files) -> None:
    line = _one_line(run_cli("share", "--trace", "mooncake", files["TRACE"], "--model", "gemma-3-27b", "--memory",
                             "40GiB", "--block", "24"))
    assert "--block 24" in line


def test_sim_ideal_block_larger_than_the_pool_names_block_and_the_largest_that_fits(run_cli) -> None:
    # Nemotron-H-56B's 10 full-attention layers, 8 KV heads of 128, bf16: 10 * 2 (K, V) * 8 * 128 * 2 B = 40,960 B
    # a token; under --layout ideal a block of B tokens is 40,960 * B bytes (the Mamba state, 870 MiB, is its own
    # block), so the largest block that fits is the pool's bytes // 40,960, whatever the pool (read from a run)
    base = ("sim", "--model", "nemotron-h-56b", "--gpu", "H200", "--layout", "ideal", "--requests", "1")
    ok = run_cli(*base, "--block", "16", "--json")
    assert ok.exit_code == 0, ok.stderr[-500:]
    pool = json.loads(ok.stdout)["memory_plan"]["kv_pool_bytes"]
    largest = pool // 40_960  # 21,370,049,290 // 40,960 = 521,729 on H200 (vLLM 0.21's plan)
    line = _one_line(run_cli(*base, "--block", "100000000"))
    assert line.startswith("error: --block 100000000: one block of Nemotron-H-56B's full layers needs 3814.70 GiB")
    # 100,000,000 * 40,960 B = 4,096,000,000,000 B = 3,814.70 GiB
    assert f"use --block {largest} or smaller" in line and "--gpu-memory" in line and "--tp" in line, line
    assert "weighted pool" not in line and "units" not in line, line
    line = _one_line(run_cli(*base, "--block", str(largest + 1)))
    assert line.startswith(f"error: --block {largest + 1}: ") and f"use --block {largest} or smaller" in line, line
    edge = run_cli(*base, "--block", str(largest), "--json")  # the block it names runs (the one request is
    assert edge.exit_code == 0, edge.stderr[-500:]  # refused there for want of room beside its state, but runs)
    assert json.loads(edge.stdout)["memory_plan"]["num_blocks"] >= 1
