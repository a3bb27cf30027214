"""Round-3 QA of `kvcalc share`: each test one defect found by running it on real traces and bad inputs."""

from __future__ import annotations

import pytest


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines
    return lines[0]


@pytest.mark.parametrize(("args", "named"), [
    (("--plot", "hits.png"), "--plot applies"),
    (("--gpu", "H100-SXM", "--tp", "2"), "--gpu, --tp apply"),
    (("--capacity", "1M"), "--capacity applies"),
])
def test_a_replay_flag_without_a_trace_names_the_flags_given(run_cli, args: tuple[str, ...], named: str) -> None:
    # was "--capacity and the tier options replay a trace" whichever of them was given (e.g. --plot alone)
    line = _one_error_line(run_cli("share", *args))
    assert line.startswith(f"error: {named} to a trace's prefix-cache replay") and "add --trace mooncake FILE" in line


def _mooncake(tmp_path, lines: list[tuple[int, int]]):
    """A Mooncake trace of (input_length, output_length) requests with distinct hash ids."""
    import json

    path, next_id, rows = tmp_path / "t.jsonl", 0, []
    for i, (prompt, output) in enumerate(lines):
        ids = list(range(next_id, next_id + -(-prompt // 512)))
        next_id += len(ids)
        rows.append(json.dumps({"timestamp": i, "input_length": prompt, "output_length": output, "hash_ids": ids}))
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("prompt", [1000, 1017, 2050, 3333])
def test_a_hybrid_pool_too_small_for_one_request_suggests_values_the_flags_take(run_cli, tmp_path, prompt) -> None:
    # was "... (vllm layout, chunks of 8,192): give at least 3.13 GiB" for gpt-oss (sliding windows, not chunks:
    # the chunks are the prompt's prefill chunks), a --memory value that --memory refuses (not whole bytes), and a
    # size in bytes for --capacity-blocks, a count of blocks
    trace = _mooncake(tmp_path, [(prompt, 10)])
    # gpt-oss-120b, vllm layout: 18 full + 18 sliding (128) layers, G = 18 slots of 16 tokens · 2,048 B = 576 KiB a
    # block id (whole MiB only when the blocks are a multiple of 4: 576 KiB · 100 / 1 MiB = 56.25)
    line = _one_error_line(run_cli("share", "--trace", "mooncake", str(trace), "--model", "gpt-oss-120b",
                                   "--capacity-blocks", "3"))
    need = int(line.split("fewer than the ")[1].split(" ")[0].replace(",", ""))
    assert "prompts computed in chunks of 8,192 tokens" in line
    least = (need + 1) * 576 * 1024  # and vLLM's null block, which a --memory pool keeps (block 0)
    # exact to two decimals of MiB (need a multiple of 4 blocks: 576 KiB · 4 = 2.25 MiB), else the exact KiB
    size = f"{least / 2**20:.2f}".removesuffix(".00") + "MiB" if least * 100 % 2**20 == 0 else f"{least // 1024}KiB"
    assert line.endswith(f"give --capacity-blocks {need:,} or --memory {size} or more")
    ok = run_cli("share", "--trace", "mooncake", str(trace), "--model", "gpt-oss-120b", "--memory", size)
    assert ok.exit_code == 0, ok.stderr  # the suggestion is a value --memory takes, and it is enough
    assert run_cli("share", "--trace", "mooncake", str(trace), "--model", "gpt-oss-120b", "--capacity-blocks",
                   str(need)).exit_code == 0


def test_a_plain_pool_too_small_for_one_request_suggests_a_size_memory_takes(run_cli, tmp_path) -> None:
    # Qwen2.5-7B: 28 layers · 4 KV heads · 128 · 2 · 2 B = 57,344 B a token, 896 KiB a block of 16; a request of
    # 1,120 + 10 tokens needs ceil(1130 / 16) = 71 blocks = 63,616 KiB = 62.125 MiB, said "give at least 62.12 MiB"
    # (refused by --memory: not whole bytes); now "63616KiB", the exact least
    trace = _mooncake(tmp_path, [(1120, 10)])
    line = _one_error_line(run_cli("share", "--trace", "mooncake", str(trace), "--model", "qwen2.5-7b",
                                   "--memory", "10MiB"))
    suggested = line.split("give at least ")[1].split(" (")[0].replace(" ", "")
    ok = run_cli("share", "--trace", "mooncake", str(trace), "--model", "qwen2.5-7b", "--memory", suggested)
    assert ok.exit_code == 0, ok.stderr
