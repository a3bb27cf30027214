"""Round-8 QA, issue 19: `share --trace` on a Mamba hybrid (Falcon-H1-0.5B's config), per-group hits and the
state pages a request holds under vLLM's mamba_cache_mode none / align / all, worked by hand from config.json and
vLLM v1's rules, never from kvcalc's output.

Falcon-H1-0.5B (tests/core/model/test_architecture_configs.py): 36 parallel layers, each one attention layer (2 KV
heads of 64, bf16: 2 · 2 · 64 · 2 = 512 B a token) and one Mamba-2 mixer (conv (4 − 1) · (1,536 + 2 · 1 · 128) =
5,376 + SSM 24 · 64 · 128 = 196,608 bf16 scalars = 403,968 B); mamba_chunk_size 128.
* none / align: block 16 · ceil(403,968 / (16 · 512)) = 16 · 50 = 800 (vLLM _align_hybrid_block_size);
* all: 403,968 / 512 = 789 tokens of one layer's KV; lcm(128, 16) · ceil(789 / 128) = 128 · 7 = 896.
Buckets 36 and 36 (36 < 1.5 · 36): one full group, one state group.

The trace: request 1, 12,100 prompt tokens (ids 0..23, 512 tokens an id) and 1 output token (12,100 positions
written: the last sampled token writes no KV); request 2, 12,100 tokens sharing only ids 0..19 (10,240 tokens),
then ids 100..103. Blocks of 800 / 896 do not tile the 512-token ids: a block is keyed by the id of its last token.

vLLM's rules used (vllm/v1/core/sched/scheduler.py _mamba_block_aligned_split, single_type_kv_cache_manager.py
MambaManager), prompts computed 8,192 tokens a step (as the replay says):
* align: a chunk that ends before the prompt's last block boundary L = P − P mod B is cut to whole blocks; one that
  passes L ends on L. Request 1: L = 12,100 − 100 = 12,000; 0 → 8,000 (8,192 // 800 = 10 blocks), 8,000 → 12,000
  (8,000 + 8,192 passes L), 12,000 → 12,100. States cached at 8,000 and 12,000 (each step's last block).
* the hit is the longest prefix every group serves; a Mamba group hits only at a block whose state was cached.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_configs import write_config


def _trace(tmp_path: Path) -> str:
    path = tmp_path / "t.jsonl"
    rows = [{"timestamp": 0, "input_length": 12100, "output_length": 1, "hash_ids": list(range(24))},
            {"timestamp": 1000, "input_length": 12100, "output_length": 1,
             "hash_ids": list(range(20)) + list(range(100, 104))}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _share(run_cli, tmp_path: Path, mode: str, *extra: str) -> dict:
    config = write_config(tmp_path, "FALCON_H1_05B", "test_architecture_configs")
    result = run_cli("share", "--trace", "mooncake", _trace(tmp_path), "--config", str(config), "--memory", "2GiB",
                     "--mamba-cache-mode", mode, *extra, "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()


@pytest.mark.parametrize(("mode", "block", "full_hit", "state_hit"), [
    # none: no state is ever saved, prefix caching is off for the model: nothing hits in any group
    ("none", 800, 0, 0),
    # align, block 800: request 2's blocks keep request 1's keys while their last token lies in ids 0..19:
    # 800 (j + 1) − 1 <= 10,239 -> 12 blocks = 9,600 tokens in the full group; the state group resumes only where a
    # state was cached (8,000 and 12,000): 8,000 <= 9,600. The hit (every group) is 8,000
    ("align", 800, 9600, 8000),
    # all, block 896: a state at every block boundary; 896 (j + 1) − 1 <= 10,239 -> 11 blocks = 9,856 in both
    ("all", 896, 9856, 9856),
])
def test_trace_hits_per_group_only_where_a_state_was_saved(run_cli, tmp_path: Path, mode: str, block: int,
                                                           full_hit: int, state_hit: int) -> None:
    doc = _share(run_cli, tmp_path, mode)
    assert (doc["block_size"], doc["mamba_cache_mode"]) == (block, mode)
    assert doc["prompt_tokens"] == 2 * 12100
    assert [(g["kind"], g["hit_tokens"]) for g in doc["groups"]] == [("full", full_hit), ("state", state_hit)]
    assert doc["hit_tokens"] == min(full_hit, state_hit)
    assert doc["token_hit_rate"] == pytest.approx(min(full_hit, state_hit) / 24200, abs=1e-12)


def test_trace_one_state_page_under_none(run_cli, tmp_path: Path) -> None:
    # none: a request holds ceil(12,100 / 800) = 16 full blocks and one state page (vLLM's one block of
    # max_model_len tokens): 17, one request at a time
    doc = _share(run_cli, tmp_path, "none")
    assert doc["peak_used_blocks"] == doc["largest_request_blocks"] == 16 + 1


def test_trace_align_holds_two_state_pages(run_cli, tmp_path: Path) -> None:
    # vLLM, align, request 1: step 0 -> 8,000 allocates cdiv(8,000, 800) = 10 entries, 9 of them null, 1 page (the
    # state at 8,000); step 8,000 -> 12,000: entries 10..13 null, page 14, page 9 kept (last_state_block_idx);
    # step 12,000 -> 12,100: remove_skipped_blocks frees page 9 (9 < cdiv(12,000, 800) − 1 = 14), page 15 taken.
    # At most 2 state pages beside the 16 full blocks: 18. Request 2 (hit 8,000) likewise: 16 + 2. (kvcalc's pool,
    # outside a step window, lets page 9 go at the jump to 12,000 rather than at the next step: 15 + 1 there; the
    # peak, at the last step, is the same.)
    doc = _share(run_cli, tmp_path, "align", "--limit", "1")
    assert doc["peak_used_blocks"] == 16 + 2
    assert doc["largest_request_blocks"] == 16 + 2


def test_trace_all_frees_state_pages_behind_the_last_token(run_cli, tmp_path: Path) -> None:
    # vLLM, all, block 896, request 1: step 0 -> 8,192 allocates cdiv(8,192, 896) = 10 state pages beside 10 full
    # blocks = 20; step 8,192 -> 12,100: remove_skipped_blocks(8,192) frees the pages before block 8,191 // 896 = 9
    # (pages 0..8, cached, free), then cdiv(12,100, 896) = 14 entries: pages 9..13 = 5 beside 14 full = 19.
    # The request's peak is 20 (kvcalc: all 14 pages kept, 28)
    doc = _share(run_cli, tmp_path, "all", "--limit", "1")
    assert doc["peak_used_blocks"] == 20
