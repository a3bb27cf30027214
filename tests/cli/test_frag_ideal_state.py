"""`frag --layout ideal` on a Mamba hybrid whose state is thousands of the layout's units (the share and pool side of
which runs on weighted tables): each type's bytes on its own page, the state its own column, worked by hand."""

from __future__ import annotations


def test_nemotron_h_ideal_bytes(run_cli):
    # Nemotron-H-56B, bf16, block 16, ideal: attention 10 layers · 8 KV heads · 128 · 2 (K, V) · 2 B = 40,960 B a
    # token -> a block 655,360 B; state 54 layers · 16,900,096 B = 912,605,184 B a sequence (no padding).
    # Lengths 1,000 and 5,000: ceil(1,000 / 16) + ceil(5,000 / 16) = 63 + 313 = 376 blocks = 246,415,360 B (useful
    # 6,000 · 40,960 = 245,760,000); 2 states = 1,825,210,368 B; tables: 376 + 2 entries · 4 B = 1,512 B
    result = run_cli("frag", "--model", "Nemotron-H-56B", "--lengths", "1000,5000", "--block", "16", "--layout",
                     "ideal", "--json")
    assert result.exit_code == 0, result.stderr
    paged = result.json()["paged"][0]
    assert (paged["blocks"], paged["allocated_kv_bytes"], paged["useful_kv_bytes"]) == (376, 246_415_360, 245_760_000)
    assert paged["state_bytes"] == paged["allocated_state_bytes"] == 2 * 912_605_184
    assert paged["block_table_bytes_exact"] == 1_512
    assert paged["held_bytes"] == 246_415_360 + 2 * 912_605_184 + 1_512
    full, state = paged["groups"]
    assert (full["block_bytes"], full["blocks"], full["block_tables"]) == (655_360, 376, 1)
    assert (state["block_bytes"], state["blocks"], state["padding_bytes"]) == (912_605_184, 2, 0)
