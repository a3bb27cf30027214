"""Round-4 QA: `size --gpu` with a token budget below the running-request limit. vLLM refuses to start when
max_num_batched_tokens < max_num_seqs (SchedulerConfig._verify_args: "max_num_batched_tokens (512) must be
greater than or equal to max_num_seqs (1024)"), and `vllm serve` on an H100 defaults max_num_seqs to 1,024, so
`--max-num-batched-tokens 512` alone does not start. kvcalc printed a plan (and a concurrency) for it, as it did
for `--max-num-seqs 1e9` (a 14.59 GiB sampler warm-up planned for a billion requests). Like the other start-up
refusals it is now a warning on stderr, a note, and gpu_plan.start_refusals in the JSON (exit 0: the memory
figures are still what the flags give)."""

from __future__ import annotations

from pathlib import Path

import pytest
from real_configs import write_config


@pytest.mark.parametrize(("flags", "seqs", "tokens"), [
    (("--max-num-batched-tokens", "512"), 1024, 512),  # H100's default max_num_seqs 1,024
    (("--max-num-seqs", "16384"), 16384, 8192),  # the default budget 8,192
])
def test_vllm_would_not_start(run_cli, tmp_path: Path, flags: tuple[str, str], seqs: int, tokens: int) -> None:
    folder = str(write_config(tmp_path, "NEMOTRON_H_56B"))
    result = run_cli("size", "--config", folder, "--gpu", "H200", *flags, "--json")
    assert result.exit_code == 0, result.stderr
    refusals = result.json()["gpu_plan"]["start_refusals"]
    expected = (f"max_num_batched_tokens {tokens:,} is below max_num_seqs {seqs:,} (vLLM needs at least one token "
                "a step for every running request); raise --max-num-batched-tokens or lower --max-num-seqs")
    assert refusals == [expected]
    assert f"warning: vLLM would not start: {expected}" in result.stderr


def test_equal_limits_start(run_cli, tmp_path: Path) -> None:
    folder = str(write_config(tmp_path, "GEMMA3_27B"))
    doc = run_cli("size", "--config", folder, "--gpu", "H100-SXM", "--max-model-len", "8192",
                  "--max-num-batched-tokens", "1024", "--max-num-seqs", "1024", "--json").json()
    assert "start_refusals" not in doc["gpu_plan"]
