"""Round-8 QA, issue 19: frag's "best block size" (fewest bytes held: KV and state allocated + exact block tables,
4 B an int32 entry) under --layout ideal and vllm, worked by hand from the models' config fields.

gpt-oss-20b: 24 layers alternating sliding (window 128) and full, 8 KV heads of 64, bf16: 2 · 8 · 64 · 2 = 2,048 B a
token a layer, 12 layers a type: 24,576 B a token a type. Both layouts page it alike (buckets 12 and 12: group size
12, a block id = 12 pages of B · 2,048 B = one block of B · 24,576 B in each type's table).
Nemotron-H-56B: 10 attention layers (8 KV heads of 128: 4,096 B a token a layer, 40,960 B for the 10), 54 Mamba-2
layers of 16,900,096 B (912,605,184 B a sequence).
"""

from __future__ import annotations

import pytest


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _frag(run_cli, model: str, lengths: str, layout: str) -> dict:
    result = run_cli("frag", "--model", model, "--lengths", lengths, "--block", "16", "--block", "32", "--block", "64",
                     "--layout", layout, "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()


def _sliding_blocks(n: int, block: int, window: int = 128) -> int:
    # the blocks holding one of the last W positions (the step that wrote position n − 1 reads n − W .. n − 1)
    return (n - 1) // block - max(n - window, 0) // block + 1


@pytest.mark.parametrize("layout", ["ideal", "vllm"])
def test_gpt_oss_20b_best_block_by_hand(run_cli, layout: str) -> None:
    lengths = (100, 1000, 5000)
    doc = _frag(run_cli, "gpt-oss-20b", "100,1000,5000", layout)
    held = {}
    for paged in doc["paged"]:
        B = paged["block_size"]
        full = sum(_cdiv(n, B) for n in lengths)  # 16: 7 + 63 + 313 = 383; 32: 4 + 32 + 157 = 193; 64: 2 + 16 + 79
        sliding = sum(_sliding_blocks(n, B) for n in lengths)  # 16: 7 + 9 + 9 = 25; 32: 4 + 5 + 5; 64: 2 + 3 + 3
        assert [g["blocks"] for g in paged["groups"]] == [full, sliding]
        # a sliding table keeps its length (freed entries are null): 2 tables of Σ ceil(n / B) entries
        tables = 2 * 4 * full
        assert paged["block_table_bytes_exact"] == tables
        assert paged["held_bytes"] == (full + sliding) * B * 24_576 + tables
        held[B] = paged["held_bytes"]
    # 16: 408 · 393,216 + 3,064 = 160,435,192; 32: 207 · 786,432 + 1,544 = 162,792,968; 64: 105 · 1,572,864 + 776
    assert held == {16: 160_435_192, 32: 162_792_968, 64: 165_151_496}
    best = doc["best_block_size"]
    assert (best["block_size"], best["held_bytes"], best["among"]) == (16, 160_435_192, [16, 32, 64])


def test_nemotron_h_ideal_block_tables_decide(run_cli) -> None:
    # ideal: lengths 1,024 and 2,048 fill whole blocks at 16, 32 and 64: KV 3,072 · 40,960 = 125,829,120 B at each,
    # the states exact (2 · 912,605,184 = 1,825,210,368 B); only the tables differ: full Σ n / B entries + 1 state
    # entry a sequence: 4 · (192 + 2) = 776, 4 · (96 + 2) = 392, 4 · (48 + 2) = 200 B: B = 64 holds the fewest
    doc = _frag(run_cli, "nemotron-h-56b", "1024,2048", "ideal")
    kv, states = 125_829_120, 1_825_210_368
    assert [(p["block_size"], p["held_bytes"]) for p in doc["paged"]] == [
        (16, kv + states + 776), (32, kv + states + 392), (64, kv + states + 200)]
    assert (doc["best_block_size"]["block_size"], doc["best_block_size"]["held_bytes"]) == (64, 1_951_039_688)


def test_nemotron_h_vllm_forced_blocks_decide(run_cli) -> None:
    # vllm: B becomes B · ceil(16,900,096 / (B · 4,096)): 16 -> 16 · 258 = 4,128, 32 -> 32 · 129 = 4,128, 64 ->
    # 64 · 65 = 4,160; a block id = 10 layer slots · B' · 4,096 B (4,128: 169,082,880; 4,160: 170,393,600). Each
    # sequence: 1 full block (2,048 < B') + 1 page in each of the 6 state groups = 7 ids, 14 in all; 4 B · 14 = 56
    doc = _frag(run_cli, "nemotron-h-56b", "1024,2048", "vllm")
    assert [(p["used_block_size"], p["held_bytes"]) for p in doc["paged"]] == [
        (4128, 14 * 169_082_880 + 56), (4128, 14 * 169_082_880 + 56), (4160, 14 * 170_393_600 + 56)]
    # 16 and 32 tie (the same forced block): the first given is named
    best = doc["best_block_size"]
    assert (best["block_size"], best["used_block_size"], best["held_bytes"]) == (16, 4128, 2_367_160_376)
