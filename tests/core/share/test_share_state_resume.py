"""share --trace on a Mamba hybrid (Falcon-H1-0.5B's config) under mamba_cache_mode align: a prefill chunk that
jumps over state pages holds the page it resumes from through the step, as vLLM v1's MambaManager does (worked by
hand from config.json and vLLM's rules — vllm/v1/core/single_type_kv_cache_manager.py MambaManager and
sched/scheduler.py _mamba_block_aligned_split, read at vLLM commits 129ab7c6 and b4622cf9 — never from kvcalc).

Falcon-H1-0.5B (tests/qa/test_round8_share_states.py): one full group (36 attention layers) and one state group
(36 Mamba-2 mixers), block 16 · ceil(403,968 / (16 · 512)) = 800 tokens under align; prompts run 8,192 tokens a step.
"""

from __future__ import annotations

import json
from pathlib import Path

from real_configs import write_config


def _share(run_cli, tmp_path: Path, rows: list[dict], *extra: str) -> dict:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = write_config(tmp_path, "FALCON_H1_05B", "test_architecture_configs")
    result = run_cli("share", "--trace", "mooncake", str(path), "--config", str(config), "--memory", "2GiB",
                     "--mamba-cache-mode", "align", *extra, "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()


def test_a_chunk_that_jumps_holds_the_page_it_resumes_from(run_cli, tmp_path: Path) -> None:
    # One request of 12,000 prompt tokens (ids 0..23) and 1 output token (sampled, never written: 12,000 positions).
    # vLLM, align, B = 800: the prompt's last boundary L = 12,000 − 12,000 mod 800 = 12,000.
    #   step 0 -> 8,000      8,192 ends before L: cut to 8,192 // 800 = 10 blocks. allocate_new_blocks(8,000):
    #                        cdiv(8,000, 800) = 10 entries, 9 null and page 9      full 10 + state 1 = 11 blocks
    #   step 8,000 -> 12,000  8,000 + 8,192 passes L: ends on L. remove_skipped_blocks(8,000): (8,000 − 1) // 800
    #                        = 9, entry 8 is null (nothing freed); allocate cdiv(12,000, 800) = 15 entries:
    #                        last_state_block_idx = 9 (page 9 kept), nulls 10..13, page 14
    #                                                                       full 15 + state 2 = 17 blocks
    # The request's peak is 17 = 15 + 2, MambaSpec's two pages (kvcalc let page 9 go at the jump: 16)
    doc = _share(run_cli, tmp_path, [{"timestamp": 0, "input_length": 12000, "output_length": 1,
                                      "hash_ids": list(range(24))}])
    assert doc["block_size"] == 800
    assert doc["peak_used_blocks"] == 15 + 2
    assert doc["largest_request_blocks"] == 15 + 2


def test_a_first_chunk_that_jumps_from_a_hit_holds_the_hit_page(run_cli, tmp_path: Path) -> None:
    # Request 1 as above (states saved at 8,000: page 9, and 12,000: page 14), released, cached. Request 2: 12,000
    # tokens sharing ids 0..15 (8,192 tokens), then ids 100..107. Its full group hits the blocks whose last token
    # lies in ids 0..15: 800 (j + 1) − 1 <= 8,191 -> 10 blocks = 8,000 tokens; the state group holds a state at
    # 8,000 (page 9): the hit is 8,000. vLLM: allocate_new_computed_blocks skips (8,000 − 1) // 800 = 9 entries
    # (null) and touches page 9; the first chunk 8,000 -> 12,000 (passes L = 12,000) allocates cdiv(12,000, 800) = 15
    # entries: last_state_block_idx = 9 (the hit page, kept), nulls 10..13, page 14: full 15 + state 2 = 17 blocks
    # (kvcalc did not hold the hit page: 16)
    rows = [{"timestamp": 0, "input_length": 12000, "output_length": 1, "hash_ids": list(range(24))},
            {"timestamp": 1000, "input_length": 12000, "output_length": 1,
             "hash_ids": list(range(16)) + list(range(100, 108))}]
    doc = _share(run_cli, tmp_path, rows)
    assert doc["hit_tokens"] == 8000
    assert doc["peak_used_blocks"] == 15 + 2
