"""Speculative decoding's accounting: the step rule, the peak per request, frag's sums and size's figures,
against hand-computed values, a step-by-step replay of vLLM's reservation rule, and the block pool itself."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core import frag as frag_module
from kvcalc.core import paging
from kvcalc.core.errors import ParameterError
from kvcalc.core.frag import analyse, peak_block_counts
from kvcalc.core.model.presets import get_preset
from kvcalc.core.pool.block_pool import BlockPool
from kvcalc.core.spec_decode import Speculation, speculation_from, speculative_size

WORKED = np.array([37, 91, 128, 201, 511], dtype=np.int64)


def replay_peak(num_tokens: int, prompt: int, speculation: Speculation, block_size: int,
                accepted: list[int], max_model_len: int | None = None) -> int:
    """The most blocks a request holds, step by step as vLLM's scheduler reserves them: with L committed
    tokens a step asks allocate_slots for L + (1 + K) + λ slots (trimmed at max_model_len) and commits
    1 + j of them; the request ends once n tokens are committed. `accepted` gives each step's j."""
    committed, peak = prompt, -(-prompt // block_size)
    for j in accepted:
        if committed >= num_tokens:
            break
        slots = committed + 1 + speculation.spec_tokens + speculation.lookahead_slots
        if max_model_len is not None:
            slots = min(slots, max_model_len)
        peak = max(peak, -(-slots // block_size))
        committed = min(committed + 1 + j, num_tokens)
    return peak


# ---- the step rule and the peak ------------------------------------------------------------------------
def test_slots_per_step_as_vllm_reserves_them() -> None:
    draft, ngram = Speculation(4), Speculation(4, "ngram")
    # draft model / EAGLE / MTP: num_lookahead_tokens = K -> 1 + 4 + 4 = 9 slots, 8 past plain decoding
    assert (draft.lookahead_slots, draft.slots_per_step, draft.extra_slots) == (4, 9, 8)
    # n-gram: no lookahead -> 1 + 4 = 5, 4 past plain decoding
    assert (ngram.lookahead_slots, ngram.slots_per_step, ngram.extra_slots) == (0, 5, 4)
    assert draft.formula == "ceil((n + 2·4) / B)" and ngram.formula == "ceil((n + 4) / B)"
    plain = Speculation(0)
    assert plain.slots_per_step == 1 and plain.peak_blocks(100, 16) == -(-100 // 16)


def test_peak_by_hand() -> None:
    draft = Speculation(4)
    # n = 4,096, B = 16: 4,096 + 8 = 4,104 slots -> ceil(4,104 / 16) = 257 blocks (256 without)
    assert draft.peak_slots(4096) == 4104 and draft.peak_blocks(4096, 16) == 257
    # n = 4,088: 4,096 slots fill 256 blocks exactly, the same as ceil(4,088 / 16) = 256
    assert draft.peak_blocks(4088, 16) == 256
    # vLLM trims at max_model_len: 131,072 + 8 -> 131,072, no block more; never below n itself
    assert draft.peak_slots(131072, 131072) == 131072 and draft.peak_slots(131070, 131072) == 131072
    assert draft.peak_slots(200000, 131072) == 200000


@settings(max_examples=300, deadline=None)
@given(
    num_tokens=st.integers(2, 400), prompt_share=st.floats(0, 1), spec_tokens=st.integers(0, 9),
    method=st.sampled_from(["draft", "ngram"]), block_size=st.sampled_from([1, 2, 3, 16, 32]),
    seed=st.integers(0, 2**32 - 1), cap_gap=st.one_of(st.none(), st.integers(0, 20)),
)
def test_the_peak_is_the_worst_step_of_a_replay(num_tokens: int, prompt_share: float, spec_tokens: int,
                                                method: str, block_size: int, seed: int, cap_gap: int | None) -> None:
    """No acceptance path holds more than ceil((n + K + λ) / B); rejecting every draft reaches it exactly."""
    speculation = Speculation(spec_tokens, method)
    prompt = 1 + int(prompt_share * (num_tokens - 2))
    cap = None if cap_gap is None else num_tokens + cap_gap
    rng = random.Random(seed)
    paths = [[rng.randint(0, spec_tokens) for _ in range(num_tokens)] for _ in range(5)]
    formula = speculation.peak_blocks(num_tokens, block_size, cap)
    assert all(replay_peak(num_tokens, prompt, speculation, block_size, p, cap) <= formula for p in paths)
    assert replay_peak(num_tokens, prompt, speculation, block_size, [0] * num_tokens, cap) == formula


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_the_pool_under_vllm_steps_reaches_the_formula(method: str) -> None:
    """The block pool driven by the same steps (reserve 1 + K + λ, commit 1 + j; policy keep, as vLLM) holds
    at most the formula's blocks, and exactly that many when every draft is rejected."""
    speculation, B, n, prompt = Speculation(3, method), 4, 30, 9
    for accepted in ([0] * n, [3, 1, 0, 2, 3, 0, 1] * 5):
        pool = BlockPool(64, B, rollback_policy="keep")
        pool.allocate("r", prompt)
        high = 0
        for j in accepted:
            committed = pool.num_tokens("r")
            if committed >= n:
                break
            pool.reserve("r", speculation.slots_per_step)
            high = max(high, len(pool.block_table("r")) + len(pool.kept_blocks("r")))
            pool.commit("r", min(1 + j, n - committed))
            pool.check_invariants()
        assert high <= speculation.peak_blocks(n, B)
        if accepted[0] == 0:
            assert high == speculation.peak_blocks(n, B)  # every draft rejected: the last step runs from n − 1


@pytest.mark.parametrize(("spec_tokens", "method", "message", "params"), [
    (-1, "draft", "spec_tokens -1 is not a number of drafts", ("spec_tokens",)),
    (1.5, "draft", "spec_tokens 1.5 is not a number of drafts", ("spec_tokens",)),
    (True, "draft", "spec_tokens True is not a number of drafts", ("spec_tokens",)),
    (2, "medusa", "spec_method 'medusa' is not a drafting method: use draft, eagle or mtp", ("spec_method",)),
])
def test_bad_speculation_is_refused_by_name(spec_tokens: object, method: str, message: str,
                                            params: tuple[str, ...]) -> None:
    with pytest.raises(ParameterError, match=message) as info:
        Speculation(spec_tokens, method)  # type: ignore[arg-type]
    assert info.value.params == params


def test_a_method_without_drafts_is_refused() -> None:
    assert speculation_from(None) is None and speculation_from(3) == Speculation(3, "draft")
    with pytest.raises(ParameterError, match="spec_method 'ngram' applies to speculative decoding") as info:
        speculation_from(None, "ngram")
    assert info.value.params == ("spec_method", "spec_tokens")


# ---- frag: sums over lengths -----------------------------------------------------------------------------
def test_frag_worked_example_by_hand() -> None:
    result = analyse(WORKED, [16, 32], speculation=Speculation(4))
    peaks = result.speculative
    assert peaks is not None
    # n + 8 = 45, 99, 136, 209, 519
    # B = 16: 3 + 7 + 9 + 14 + 33 = 66 (plain 3 + 6 + 8 + 13 + 32 = 62)
    # B = 32: 2 + 4 + 5 + 7 + 17 = 35 (plain 2 + 3 + 4 + 7 + 16 = 32)
    assert [(p.plain.num_blocks, p.peak.num_blocks, p.extra_blocks) for p in peaks.block_sizes] == \
        [(62, 66, 4), (32, 35, 3)]
    assert peaks.block_sizes[0].peak.allocated_tokens == 66 * 16 == 1056
    assert peaks.block_sizes[0].concurrency == pytest.approx(62 / 66)
    # the fixed reservation must hold 511 + 8 = 519: the next power of two is 1,024
    assert result.fixed.max_len == 1024
    ngram = analyse(WORKED, [16], speculation=Speculation(2, "ngram")).speculative
    assert ngram is not None
    # n + 2 = 39, 93, 130, 203, 513: 3 + 6 + 9 + 13 + 33 = 64
    assert ngram.block_sizes[0].peak.num_blocks == 64


def test_frag_without_drafts_is_plain() -> None:
    result = analyse(WORKED, [16, 32], speculation=Speculation(0))
    assert result.fixed.max_len == 512
    assert [p.peak.num_blocks for p in result.speculative.block_sizes] == [p.num_blocks for p in result.paged]


def test_frag_refuses_a_reservation_that_cannot_hold_the_peak() -> None:
    with pytest.raises(ParameterError, match="max_len 512 cannot hold the speculative peak") as info:
        analyse(WORKED, [16], max_len=512, speculation=Speculation(4))
    assert info.value.params == ("max_len", "spec_tokens")
    assert analyse(WORKED, [16], max_len=519, speculation=Speculation(4)).fixed.max_len == 519
    with pytest.raises(ParameterError, match="passes 2\\^62") as info:
        analyse(WORKED, [16], speculation=Speculation(2**61))
    assert info.value.params == ("spec_tokens",)


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=60),
    block_sizes=st.lists(st.integers(1, 300), min_size=1, max_size=4, unique=True),
    extra=st.integers(0, 70),
    chunk=st.sampled_from([1, 7, paging.PASS_CHUNK]),
)
def test_peak_block_counts_against_a_plain_sum(lengths: list[int], block_sizes: list[int], extra: int,
                                               chunk: int) -> None:
    tokens = np.array(lengths, dtype=np.int64)
    saved = paging.PASS_CHUNK
    paging.PASS_CHUNK = chunk  # chunk boundaries anywhere
    try:
        counts = peak_block_counts(tokens, sorted(block_sizes), extra)
    finally:
        paging.PASS_CHUNK = saved
    assert counts == [sum(-(-(n + extra) // b) for n in lengths) for b in sorted(block_sizes)]


def test_frag_peak_bytes_with_windows_against_a_per_sequence_sum() -> None:
    """Gemma-3-12B: 8 full layers (65,536 B a token) hold every block; 40 sliding ones (327,680 B a token,
    window 1,024) hold the blocks from the one of position n − 1,024 on, counted on the committed n."""
    spec = get_preset("gemma-3-12b")
    tokens = np.array([5, 700, 1030, 4000], dtype=np.int64)
    result = analyse(tokens, [16, 64], spec=spec, dtype_bits=16, speculation=Speculation(3))
    for p in result.speculative.block_sizes:
        b = p.block_size
        expected = 0
        for n in tokens.tolist():
            blocks = -(-(n + 6) // b)
            expected += 65536 * b * blocks + 327680 * b * (blocks - max(n - 1024, 0) // b)
        assert p.peak_bytes.allocated_kv_bytes == expected
        assert p.extra_kv_bytes == expected - p.plain_bytes.allocated_kv_bytes > 0


def test_frag_progress_counts_both_passes() -> None:
    done: list[int] = []
    tokens = np.arange(1, 1001, dtype=np.int64)
    analyse(tokens, [16, 32], progress=done.append, speculation=Speculation(1))
    assert sum(done) == 2 * tokens.size
    assert frag_module.peak_block_counts(tokens[:0], [16], 3) == [0]


# ---- size: one sequence, capacity ---------------------------------------------------------------------
def test_size_by_hand() -> None:
    spec = get_preset("llama-3.1-8b")
    groups = spec.layer_groups
    # 131,072 B a token; 4,096 tokens: 256 blocks of 16 (512 MiB); peak 4,104 slots: 257 blocks (514 MiB)
    size = speculative_size(groups, Speculation(4), 4096, 16, 16, memory_bytes=40 * 2**30)
    assert (size.plain_blocks, size.peak_blocks, size.extra_blocks) == (256, 257, 1)
    assert (size.plain_bytes_per_seq, size.peak_bytes_per_seq) == (256 * 16 * 131072, 257 * 16 * 131072)
    # 40 GiB = 20,480 blocks of 2 MiB: 20,480 // 256 = 80 sequences; 20,480 // 257 = 79 (257 · 80 = 20,560)
    assert (size.plain_max_seqs, size.peak_max_seqs) == (80, 79)
    # at the model's max length vLLM trims the peak: no block more
    full = speculative_size(groups, Speculation(4), 131072, 16, 16, max_model_len=131072)
    assert full.trimmed and full.extra_blocks == 0
    # tp = 2: each GPU holds 4 of the 8 KV heads, half the bytes
    half = speculative_size(groups, Speculation(4), 4096, 16, 16, tp=2)
    assert half.peak_bytes_per_seq == size.peak_bytes_per_seq // 2


def test_size_with_windows_and_state() -> None:
    # Gemma-3-12B at 8,192 tokens, n-gram K = 3: 8,195 slots -> 513 blocks (512 without)
    # full: 513 · 16 · 65,536 = 537,919,488; sliding: (513 − (8,192 − 1,024) // 16 = 65) · 16 · 327,680
    # = 340,787,200; together 878,706,688 (plain: 536,870,912 + 64 · 16 · 327,680 = 872,415,232)
    gemma = speculative_size(get_preset("gemma-3-12b").layer_groups, Speculation(3, "ngram"), 8192, 16, 16)
    assert (gemma.plain_bytes_per_seq, gemma.peak_bytes_per_seq) == (872415232, 878706688)
    # a recurrent state counts once a sequence, with or without speculation
    nemotron = get_preset("nemotron-h-56b")
    with_state = speculative_size(nemotron.layer_groups, Speculation(2), 1000, 16, 16)
    state_bytes = nemotron.state_bits() // 8
    assert with_state.plain_bytes_per_seq - state_bytes == 63 * 16 * nemotron.bytes_per_token(16)


def test_chunked_layers_free_before_the_current_chunk() -> None:
    # Llama-4-Scout, 20,000 committed tokens, B = 16, 4 drafts + 4 lookahead slots: 12 full layers hold
    # ceil(20,000/16) = 1,250 blocks (peak ceil(20,008/16) = 1,251); 36 chunked layers (C 8,192) free the blocks
    # before the current chunk's start 8,192 · floor(19,999/8,192) = 16,384, i.e. 1,024 blocks: 226 (peak 227)
    # blocks, not the 512 + 1 that "the last C tokens" would keep. A block: 16 tokens · 4,096 B per layer.
    size = speculative_size(get_preset("Llama-4-Scout").layer_groups, Speculation(4, "draft"), 20_000, 16, 16)
    assert size.plain_bytes_per_seq == (12 * 1250 + 36 * 226) * 16 * 4096
    assert size.peak_bytes_per_seq == (12 * 1251 + 36 * 227) * 16 * 4096
