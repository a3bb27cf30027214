"""Round-8 QA, issue 19: `size --memory`'s "what fits" on a Mamba hybrid (max tokens with a state counted), a
sliding model and a chunked one, by hand from config fields.

Nemotron-H-56B: 10 attention layers, 8 KV heads of 128, bf16: 2 · 8 · 128 · 2 = 4,096 B a token a layer, 40,960 B
for the 10; 54 Mamba-2 layers of 16,900,096 B = 912,605,184 B of state a sequence. vLLM's block 16 · ceil(16,900,096
/ (16 · 4,096)) = 4,128; a block id = 10 layer slots · 4,128 · 4,096 B = 169,082,880 B.
gpt-oss-20b: 12 full + 12 sliding (128) layers of 2 · 8 · 64 · 2 = 2,048 B a token: 49,152 B a token for all 24.
Llama-4-Scout: 12 full + 36 chunked (8,192) layers of 2 · 8 · 128 · 2 = 4,096 B a token: 196,608 B for all 48.
"""

from __future__ import annotations

GiB = 2**30


def _capacity(run_cli, model: str, memory: str, tokens: str) -> dict:
    result = run_cli("size", "--model", model, "--memory", memory, "--tokens", tokens, "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()["capacity"]


def test_max_tokens_counts_one_state_on_a_mamba_hybrid(run_cli) -> None:
    cap = _capacity(run_cli, "nemotron-h-56b", "40GiB", "8192")
    # (40 GiB − one state 912,605,184) // 40,960 = 42,037,067,776 // 40,960 = 1,026,295 (every attention layer holds
    # every token; more sequences each need their own state, so it is the most tokens any split can hold)
    assert cap["max_tokens"] == (40 * GiB - 912_605_184) // 40_960 == 1_026_295
    assert cap["max_tokens_counts_state"] is True and cap["max_tokens_is_lower_bound"] is False
    # whole sequences: 8,192 · 40,960 + 912,605,184 = 1,248,149,504 B each: 40 GiB // that = 34
    assert cap["max_seqs"] == 40 * GiB // (8192 * 40_960 + 912_605_184) == 34
    # vLLM's block ids: 42,949,672,960 // 169,082,880 = 254
    assert (cap["vllm_block_size"], cap["vllm_num_blocks"]) == (4128, 254)


def test_max_tokens_ignores_windows_max_seqs_applies_them(run_cli) -> None:
    cap = _capacity(run_cli, "gpt-oss-20b", "10GiB", "100000")
    # every layer every token: 10 GiB // 49,152 = 218,453 (a lower bound: the sliding layers hold 128 at most)
    assert (cap["max_tokens"], cap["max_tokens_is_lower_bound"]) == (10 * GiB // 49_152, True) == (218_453, True)
    # a sequence of 100,000: (12 · 100,000 + 12 · 128) · 2,048 = 2,460,745,728 B; 10 GiB // that = 4
    assert cap["max_seqs"] == 10 * GiB // ((12 * 100_000 + 12 * 128) * 2048) == 4


def test_chunked_sequences_counted_at_their_chunk_peak(run_cli) -> None:
    # 100,000 tokens hold the current chunk, 100,000 − 12 · 8,192 = 1,696 tokens (2 such sequences need
    # 2 · (36 · 1,696 + 12 · 100,000) · 4,096 = 10,330,570,752 B < 11 GiB = 11,811,160,064), but on the way each
    # held a whole chunk at 98,304 tokens (positions 90,112 .. 98,303): (36 · 8,192 + 12 · 98,304) · 4,096 =
    # 6,039,797,760 B: 11 GiB holds 1
    cap = _capacity(run_cli, "llama-4-scout", "11GiB", "100000")
    assert cap["max_seqs"] == 11 * GiB // ((36 * 8192 + 12 * 98_304) * 4096) == 1
    assert cap["max_tokens"] == 11 * GiB // 196_608 == 60_074
