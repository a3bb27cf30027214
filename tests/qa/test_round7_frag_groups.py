"""`kvcalc frag`'s KV cache groups table: `block` is one block id's page of the group (one table's block), so
block × blocks held = allocated on every row, for a sliding, a chunked, a Mamba and a one-group model; worked by
hand from the config.json fields (bf16, 2 B a scalar; K and V: 2 × KV heads × head_dim scalars a layer a token)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

AZURE_CONV = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces" / "azure_llm_2023_conv.csv"
LENGTHS = (100, 5000)
MiB = 2**20

# name: [(kind, tables, block id bytes, blocks held = all the tables' blocks)], at --block 16, lengths 100 and 5,000.
# ceil(100 / 16) + ceil(5,000 / 16) = 7 + 313 = 320 blocks a table that keeps every block.
CASES = {
    # Gemma-3-27B: 62 layers, 16 KV heads × head_dim 128 -> 2 · 16 · 128 · 2 B = 8,192 B a layer a token;
    # sliding_window 1,024, one full layer in 6: 10 full + 52 sliding. vLLM's group size = 10 (the smaller type):
    # full 1 table, sliding ceil(52 / 10) = 6 tables (60 slots, 8 padding). Block id: 10 slots · 16 · 8,192 =
    # 1,310,720 B (1.25 MiB). Sliding keeps the blocks holding one of the last 1,024 tokens: n = 100 its 7;
    # n = 5,000 tokens 3,976..4,999 -> blocks 248..312 = 65; 72 a table, 6 · 72 = 432 ids.
    "gemma-3-27b": [("full", 1, 1_310_720, 320), ("sliding", 6, 1_310_720, 6 * 72)],
    # Llama-4-Scout: 48 layers, 8 KV heads × 128 -> 4,096 B a layer a token; attention_chunk_size 8,192, every
    # 4th layer full: 36 chunked + 12 full; group size 12: chunked 3 tables. Block id 12 · 16 · 4,096 = 786,432 B.
    # Both lengths lie in their first chunk: 320 blocks a table, 3 · 320 = 960 chunked ids.
    "llama-4-scout": [("chunked", 3, 786_432, 3 * 320), ("full", 1, 786_432, 320)],
    # Nemotron-H-56B: 10 attention layers of 8 KV heads × 128 (4,096 B a layer a token), 54 Mamba-2 layers of
    # 16,900,096 B of state. vLLM forces B = 16 · ceil(16,900,096 / (16 · 4,096)) = 4,128; group size 10: the
    # state spans ceil(54 / 10) = 6 tables. Block id 10 · 4,128 · 4,096 = 169,082,880 B. Full: ceil(100 / 4,128)
    # + ceil(5,000 / 4,128) = 1 + 2 = 3; state: one page per sequence per table, 2 · 6 = 12.
    "nemotron-h-56b": [("full", 1, 169_082_880, 3), ("state", 6, 169_082_880, 12)],
    # Llama-3-8B: 32 layers, 8 KV heads × 128; one group, one table: block 32 · 16 · 4,096 = 2,097,152 B (2 MiB).
    "llama-3-8b": [("full", 1, 2_097_152, 320)],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_group_block_times_blocks_held_is_allocated(run_cli, name: str) -> None:
    args = ("frag", "--model", name, "--lengths", ",".join(map(str, LENGTHS)), "--block", "16")
    paged = run_cli(*args, "--json").json()["paged"][0]
    got = [(g["kind"], g["block_tables"], g["block_bytes"], g["blocks"]) for g in paged["groups"]]
    assert got == CASES[name]
    for g in paged["groups"]:
        assert g["block_bytes"] * g["blocks"] == g["allocated_bytes"]
    total = sum(b * n for _, _, b, n in CASES[name])
    assert total == paged["allocated_kv_bytes"] + paged["allocated_state_bytes"]
    # the CSV of the groups table carries the same keys and numbers (a one-group model has no such table)
    sections = run_cli(*args, "--format", "csv").stdout.split("\n\n")
    titles = [s.split("\n", 1)[0] for s in sections]
    assert ("# KV cache groups — layout vllm" in titles) == (len(CASES[name]) > 1)
    if len(CASES[name]) == 1:
        return
    section = sections[titles.index("# KV cache groups — layout vllm")]
    rows = list(csv.DictReader(io.StringIO(section.split("\n", 1)[1])))
    assert [(r["kind"], int(r["block_bytes"]), int(r["blocks"])) for r in rows] == [(k, b, n) for k, _, b, n in
                                                                                      CASES[name]]


def test_gemma3_table_shows_one_block_id(run_cli) -> None:
    out = run_cli("frag", "--model", "gemma-3-27b", "--lengths", "100,5000", "--block", "16", "--format",
                  "markdown").stdout
    sliding = next(line for line in out.splitlines() if "sliding 1,024" in line)
    cells = [c.strip() for c in sliding.strip().strip("|").split("|")]
    # B, group, layers, padded to, tables, tokens per block, block, blocks held, useful, allocated: the block is
    # one block id, 1.25 MiB (not the 6 tables' 7.50 MiB); 432 · 1.25 MiB = 540 MiB allocated
    assert cells[:8] == ["16", "sliding 1,024", "52", "60", "6", "16", "1.25 MiB", "432"]
    assert cells[9] == "540.00 MiB"


@pytest.mark.skipif(not AZURE_CONV.exists(), reason=f"{AZURE_CONV} absent (the shared traces)")
def test_gemma3_on_the_azure_trace(run_cli) -> None:
    doc = run_cli("frag", "--model", "gemma-3-27b", "--trace", "azure", str(AZURE_CONV), "--json").json()
    for paged in doc["paged"]:
        groups = paged["groups"]
        assert sum(g["block_bytes"] * g["blocks"] for g in groups) == paged["allocated_kv_bytes"]
        assert all(g["block_bytes"] == 10 * paged["used_block_size"] * 8192 for g in groups)
