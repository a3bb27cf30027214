"""Round-8 QA, issue 19: `sim --trace mooncake` prefix hits on a Mamba hybrid (Falcon-H1-0.5B) under
mamba_cache_mode all (round 6 checked none and align), by hand from config.json and vLLM v1's rules.

Falcon-H1-0.5B: 403,968 B of Mamba-2 state and 512 B of attention KV a token per layer; mamba_chunk_size 128:
under all vLLM's block is lcm(128, 16) · ceil(403,968 / 512 / 128) = 128 · ceil(789 / 128) = 896 tokens (800 under
none/align: 16 · ceil(403,968 / (16 · 512))), and a state is saved at every block boundary.
Trace: 1,024 tokens (ids 1, 2), the same again, then 1,500 tokens (ids 1, 2, 3), 5 output tokens each; a block of
896 does not tile the 512-token ids, so it is keyed by the id of its last token (the hits a lower bound).
"""

from __future__ import annotations

from pathlib import Path

from real_configs import write_config

GPU = ("--gpu-memory", "2890MiB", "--bandwidth", "4.8e12", "--flops", "989e12", "--weights-bytes", "1GiB",
       "--workspace-bytes", "1", "--memory-utilization", "1")


def test_sim_all_mode_hits_at_every_block_boundary(run_cli, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {t}, "input_length": {n}, "output_length": 5, "hash_ids": {ids}}}\n'
                             for t, n, ids in [(0, 1024, [1, 2]), (1000, 1024, [1, 2]), (2000, 1500, [1, 2, 3])]))
    config = write_config(tmp_path, "FALCON_H1_05B", "test_architecture_configs")
    doc = run_cli("sim", "--config", str(config), *GPU, "--trace", "mooncake", str(trace), "--mamba-cache-mode", "all",
                  "--json").json()
    cache, layout = doc["prefix_cache"], doc["kv_cache_groups"]
    assert (layout["block_size"], layout["prefix_hits_lower_bound"]) == (896, True)
    # request 2: one whole block of 1,024 (895 // 512 = id 1, cached by request 1) with its state: 896 (a hit never
    # covers the prompt's last token: 1,023 // 896 = 1 block); request 3: 1,499 // 896 = 1 block, the same key: 896
    assert (cache["prompt_tokens"], cache["hit_tokens"]) == (1024 + 1024 + 1500, 896 + 896)
    assert [g["hit_tokens"] for g in cache["groups"]] == [1792, 1792]
