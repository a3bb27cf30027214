"""share under vLLM's layout pages as vLLM does: trace and scenario modes with a model refuse a block size vLLM's
pool does not take (as sim and size --gpu do); --layout ideal (kvcalc's own pool) and capacity mode (bytes of B
tokens, which 512-token Mooncake ids need) take any."""

from __future__ import annotations


def test_block_sizes_under_each_layout(run_cli, tmp_path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 2, "hash_ids": [1, 2]}\n')
    refused = run_cli("share", "--model", "llama-3-8b", "--block", "24")  # scenario mode
    assert refused.exit_code == 2 and refused.stderr.startswith("error: --block 24: vLLM pages blocks of 1, 8, 16")
    assert "--layout ideal" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert run_cli("share", "--model", "llama-3-8b", "--block", "24", "--layout", "ideal", "--json").exit_code == 0
    assert run_cli("share", "--model", "llama-3-8b", "--block", "24", "--json").exit_code == 2
    assert run_cli("share", "--block", "24", "--json").exit_code == 0  # no model: token blocks, no layout
    capacity = run_cli("share", "--trace", "mooncake", str(trace), "--block", "512", "--capacity", "1GiB",
                       "--model", "llama-3-8b", "--json")
    assert capacity.exit_code == 0, capacity.stderr
