"""Round-8 QA, issue 19: `sim --timeline`'s per-group columns on a sliding (gpt-oss-20b) and a chunked (Llama-4-Scout)
model, step by step by hand from vLLM v1's rules, and the columns summing to the pool.

One request alone (rate inf), block 16. A step's row shows the blocks each table holds while the step runs: the
prefill allocates cdiv(P, 16) in every table; a decode step of a sequence with n computed tokens first frees what
its layers no longer read (single_type_kv_cache_manager.remove_skipped_blocks: sliding, the blocks before
(n − W + 1) // 16; chunked, before n // C · C // 16) and then takes cdiv(n + 1, 16). A sequence of P + O samples O
tokens: the prefill samples the first, O − 1 decode steps write positions P .. P + O − 2.
useful = written positions in the blocks held (a block left in a window still counts the positions it holds),
tail = the held blocks' unwritten slots; group<i>_blocks · 16 = useful + tail with nothing reserved.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest


def _rows(run_cli, tmp_path: Path, model: str, prompt: int, output: int, *extra: str, requests: int = 1,
          rate: str = "inf") -> tuple[list[dict], dict]:
    timeline = tmp_path / "t.csv"
    result = run_cli("sim", "--model", model, "--gpu", "H200", *extra, "--requests", str(requests), "--rate", rate,
                     "--prompt-dist", f"uniform:low={prompt},high={prompt}", "--output-dist",
                     f"uniform:low={output},high={output}", "--timeline", str(timeline), "--json")
    assert result.exit_code == 0, result.stderr
    return list(csv.DictReader(timeline.open())), result.json()


def _check_pool_sums(rows: list[dict], groups: int, plan: dict, block: int = 16) -> None:
    slots = ("useful_slots", "tail_fragmentation_slots", "reservation_waste_slots", "external_fragmentation_slots",
             "cached_free_slots", "free_slots")
    usable = plan["num_blocks"] - plan.get("null_blocks", 0)  # vLLM's null block holds nothing
    for row in rows:
        held = sum(int(row[f"group{i}_blocks"]) for i in range(groups))
        assert held * block == int(row["useful_slots"]) + int(row["tail_fragmentation_slots"])
        assert sum(int(row[k]) for k in slots) == usable * block


def test_sliding_window_frees_blocks_step_by_step(run_cli, tmp_path: Path) -> None:
    # gpt-oss-20b: tables full, sliding 128. P = 300, O = 5.
    # prefill: cdiv(300, 16) = 19 in each, useful 2 · 300, tail 2 · 4
    # n = 300: sliding frees before (300 − 127) // 16 = 10: 9 held (positions 160..300 = 141), full 19 (301): 442, 6
    # n = 301: 173 + 1 = 174 // 16 = 10: 9 (142), full 302: 444, 4; n = 302: 175 // 16 = 10: 9 (143) + 303: 446, 2
    # n = 303: 176 // 16 = 11: 8 (positions 176..303 = 128), full 304 = 19 · 16: 432, 0
    rows, doc = _rows(run_cli, tmp_path, "gpt-oss-20b", 300, 5)
    kinds = [g["kind"] for g in doc["kv_cache_groups"]["groups"]]
    full, sliding = kinds.index("full"), kinds.index("sliding")
    got = [(int(r[f"group{full}_blocks"]), int(r[f"group{sliding}_blocks"]), int(r["useful_slots"]),
            int(r["tail_fragmentation_slots"])) for r in rows]
    assert got == [(19, 19, 600, 8), (19, 9, 442, 6), (19, 9, 444, 4), (19, 9, 446, 2), (19, 8, 432, 0)]
    _check_pool_sums(rows, 2, doc["memory_plan"])


def test_chunked_attention_drops_the_whole_chunk_at_its_boundary(run_cli, tmp_path: Path) -> None:
    # Llama-4-Scout tp 4: 12 full layers, 36 chunked (C = 8,192) in 3 tables. P = 8,190, O = 5.
    # prefill: cdiv(8,190, 16) = 512 in all 4 tables: useful 4 · 8,190, tail 4 · 2
    # n = 8,190, 8,191: nothing before 0 // 16 to free, cdiv(n + 1, 16) = 512: useful 4 · (n + 1), tail
    # 4 · (8,192 − n − 1)
    # n = 8,192: the chunked tables free before 8,192 // 16 = 512 (all 512) and take block 512: 1 each (position 8,192),
    # full 513: useful 8,193 + 3 · 1 = 8,196, tail 4 · 15; n = 8,193: 8,194 + 3 · 2 = 8,200, tail 4 · 14
    rows, doc = _rows(run_cli, tmp_path, "llama-4-scout", 8190, 5, "--tp", "4", "--max-model-len", "16384")
    tables = [g["kind"] for g in doc["kv_cache_groups"]["groups"] for _ in range(g["block_tables"])]
    assert sorted(tables) == ["chunked"] * 3 + ["full"]
    got = [(tuple(int(r[f"group{i}_blocks"]) for i in range(4)), int(r["useful_slots"]),
            int(r["tail_fragmentation_slots"])) for r in rows]
    full = tables.index("full")
    blocks = [512, 512, 512, 513, 513]
    chunked = [512, 512, 512, 1, 1]
    assert [g[0] for g in got] == [tuple(b if i == full else c for i in range(4)) for b, c in zip(blocks, chunked,
                                                                                                  strict=True)]
    assert [g[1:] for g in got] == [(32760, 8), (32764, 4), (32768, 0), (8196, 60), (8200, 56)]
    _check_pool_sums(rows, 4, doc["memory_plan"])


@pytest.mark.parametrize("model", ["gpt-oss-20b", "nemotron-h-56b"])
def test_group_columns_sum_to_the_pool_under_load(run_cli, tmp_path: Path, model: str) -> None:
    # 60 requests arriving at 20/s: whatever runs, waits or is cached, every row's slots add up to the pool and
    # the held blocks are the useful and tail slots (no reservation in a paged run)
    rows, doc = _rows(run_cli, tmp_path, model, 3000, 200, "--max-model-len", "16384", requests=60, rate="20")
    layout = doc["kv_cache_groups"]
    groups = sum(g["block_tables"] for g in layout["groups"])
    assert len(rows[0]) == 11 + groups and max(int(r["running"]) for r in rows) > 1
    # a state page's slots all count as useful (it holds a state, not tokens): the same sums at the layout's block
    _check_pool_sums(rows, groups, doc["memory_plan"], layout["block_size"])
