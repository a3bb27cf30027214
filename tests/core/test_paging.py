"""Equations 2–3 (core/paging.py) against hand-computed values, a plain-Python reference and properties."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core import paged_bytes, paging
from kvcalc.core.model.kv_groups import kv_layout
from kvcalc.core.model.layers import LayerGroup
from kvcalc.core.model.models import ModelSpec, get_preset
from kvcalc.core.model.state import RecurrentState
from kvcalc.core.units import format_percent

WORKED = np.array([37, 91, 128, 201, 511], dtype=np.int64)


def _reference(lengths: list[int], block_size: int, max_len: int) -> dict[str, int]:
    """Equations 2–3 written out per sequence in plain Python (the independent reference)."""
    blocks = sum(math.ceil(n / block_size) for n in lengths)
    return {
        "useful": sum(lengths),
        "blocks": blocks,
        "allocated": block_size * blocks,
        "fixed_allocated": len(lengths) * max_len,
        "dense_entries": len(lengths) * math.ceil(max_len / block_size),
    }


def test_worked_example_exactly():
    fixed = paging.fixed_reservation(WORKED, 512)
    b16, b32 = paging.paged_allocations(WORKED, [16, 32], 512)
    assert fixed.useful_tokens == 968  # 37 + 91 + 128 + 201 + 511
    assert fixed.allocated_tokens == 2560  # 5 · 512
    # B = 16: ceil(n/16) = 3, 6, 8, 13, 32 -> 62 blocks -> 992 positions
    assert (b16.num_blocks, b16.allocated_tokens, b16.waste_tokens) == (62, 992, 24)
    # B = 32: ceil(n/32) = 2, 3, 4, 7, 16 -> 32 blocks -> 1024 positions
    assert (b32.num_blocks, b32.allocated_tokens, b32.waste_tokens) == (32, 1024, 56)
    assert fixed.utilization == Fraction(968, 2560)
    assert b16.utilization == Fraction(968, 992)
    assert [format_percent(r.utilization) for r in (fixed, b16, b32)] == ["37.81 %", "97.58 %", "94.53 %"]
    # block tables: exact 62 · 4 B = 248 B; dense 5 sequences · ceil(512/16) = 32 entries · 4 B = 640 B
    assert (b16.block_table_bytes_exact, b16.block_table_bytes_dense) == (248, 640)
    assert (b32.block_table_bytes_exact, b32.block_table_bytes_dense) == (128, 320)  # 32 · 4; 5 · 16 · 4


def test_non_power_of_two_block_by_hand():
    lengths = np.array([1, 10, 11, 25], dtype=np.int64)
    (b10,) = paging.paged_allocations(lengths, [10], 32)
    # ceil: 1 + 1 + 2 + 3 = 7 blocks = 70 positions; useful 47; waste 23; dense 4 · ceil(32/10)=4 · 4 B = 64 B
    assert (b10.num_blocks, b10.allocated_tokens, b10.useful_tokens, b10.waste_tokens) == (7, 70, 47, 23)
    assert b10.block_table_bytes_dense == 64


def test_per_sequence_rows_by_hand():
    rows = paging.per_sequence(WORKED, [16], 512)
    assert rows.allocated[16].tolist() == [48, 96, 128, 208, 512]  # 16 · (3, 6, 8, 13, 32)
    assert rows.waste[16].tolist() == [11, 5, 0, 7, 1]
    assert rows.reservation_waste.tolist() == [475, 421, 384, 311, 1]  # 512 − n


def test_default_max_len_is_next_power_of_two():
    assert [paging.default_max_len(n) for n in (1, 2, 3, 511, 512, 513)] == [1, 2, 4, 512, 512, 1024]


@pytest.mark.parametrize("block_size", [0, -1, -16])
def test_block_size_must_be_positive(block_size):
    with pytest.raises(ValueError, match=f"block_size {block_size}"):
        paging.paged_allocations(WORKED, [block_size], 512)


def test_length_above_max_len_names_it():
    with pytest.raises(ValueError, match=r"length 511 \(item 5\) is above max_len 256"):
        paging.fixed_reservation(WORKED, 256)


def test_exact_sum_does_not_wrap_where_numpy_does():
    lengths = np.full(10**7, 10**12, dtype=np.int64)  # Σ = 10^19 > 2^63 − 1 ≈ 9.22 · 10^18
    assert int(lengths.sum()) != 10**19  # numpy's own int64 sum wraps silently: the reason exact_sum exists
    assert paging.exact_sum(lengths) == 10**19
    fixed = paging.fixed_reservation(lengths, 2**40)
    assert fixed.useful_tokens == 10**19 and fixed.allocated_tokens == 10**7 * 2**40
    (b1,) = paging.paged_allocations(lengths, [1], 2**40)
    assert b1.num_blocks == 10**19 and b1.utilization == 1


def test_block_counts_exact_near_the_int64_limit():
    lengths = np.array([2**62, 2**62, 2**62 - 1, 3], dtype=np.int64)
    b1, b7 = paging.paged_allocations(lengths, [1, 7], 2**62)
    assert b1.num_blocks == 3 * 2**62 + 2  # 2^62 + 2^62 + (2^62 − 1) + 3
    assert b7.num_blocks == sum(-(-n // 7) for n in lengths.tolist())


lengths_lists = st.lists(st.integers(1, 5000), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(lengths_lists, st.integers(1, 300))
def test_against_plain_python_reference(lengths, block_size):
    tokens = np.array(lengths, dtype=np.int64)
    max_len = paging.default_max_len(max(lengths))
    ref = _reference(lengths, block_size, max_len)
    fixed = paging.fixed_reservation(tokens, max_len)
    (paged,) = paging.paged_allocations(tokens, [block_size], max_len)
    assert fixed.allocated_tokens == ref["fixed_allocated"]
    assert (paged.useful_tokens, paged.num_blocks, paged.allocated_tokens) == (
        ref["useful"], ref["blocks"], ref["allocated"])
    assert paged.block_table_bytes_dense == 4 * ref["dense_entries"]


@settings(max_examples=150, deadline=None)
@given(lengths_lists, st.integers(1, 300))
def test_properties_of_each_sequence(lengths, block_size):
    tokens = np.array(lengths, dtype=np.int64)
    rows = paging.per_sequence(tokens, [block_size], paging.default_max_len(max(lengths)))
    allocated, waste = rows.allocated[block_size], rows.waste[block_size]
    assert (allocated >= tokens).all()  # A >= n
    assert ((waste >= 0) & (waste < block_size)).all()  # 0 <= W < B
    assert (allocated % block_size == 0).all()


@settings(max_examples=150, deadline=None)
@given(lengths_lists, st.lists(st.integers(1, 300), min_size=1, max_size=4))
def test_totals_equal_sum_of_rows_and_utilisation_in_range(lengths, block_sizes):
    tokens = np.array(lengths, dtype=np.int64)
    max_len = paging.default_max_len(max(lengths))
    rows = paging.per_sequence(tokens, block_sizes, max_len)
    fixed = paging.fixed_reservation(tokens, max_len)
    assert fixed.waste_tokens == sum(rows.reservation_waste.tolist())
    for paged in paging.paged_allocations(tokens, block_sizes, max_len):
        assert paged.allocated_tokens == sum(rows.allocated[paged.block_size].tolist())
        assert paged.waste_tokens == sum(rows.waste[paged.block_size].tolist())
        assert 0 < paged.utilization <= 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 200), min_size=1, max_size=40), st.integers(1, 64))
def test_utilisation_is_one_when_block_divides_every_length(multiples, block_size):
    tokens = np.array([k * block_size for k in multiples], dtype=np.int64)
    (paged,) = paging.paged_allocations(tokens, [block_size], paging.default_max_len(int(tokens.max())))
    assert paged.utilization == 1 and paged.waste_tokens == 0


@settings(max_examples=150, deadline=None)
@given(lengths_lists, st.integers(0, 8), st.integers(0, 3))
def test_paged_waste_at_most_fixed_waste_when_block_divides_max_len(lengths, log2_block, extra_doublings):
    max_len = paging.default_max_len(max(lengths)) << extra_doublings
    block_size = min(2**log2_block, max_len)  # B <= M and B | M (both powers of two)
    tokens = np.array(lengths, dtype=np.int64)
    (paged,) = paging.paged_allocations(tokens, [block_size], max_len)
    assert paged.waste_tokens <= paging.fixed_reservation(tokens, max_len).waste_tokens


def test_paged_waste_can_exceed_fixed_waste_when_block_does_not_divide_max_len():
    # The property above needs B | M, not just B <= M: n = 9, M = 10, B = 4 -> A = 12, paged waste 3 > M − n = 1.
    tokens = np.array([9], dtype=np.int64)
    (paged,) = paging.paged_allocations(tokens, [4], 10)
    assert paged.waste_tokens == 3 and paging.fixed_reservation(tokens, 10).waste_tokens == 1


# --- bytes for a model ---------------------------------------------------------------------------------

TOY_HYBRID = ModelSpec(  # 2 full + 2 sliding layers (window 10); 2 · 1 KV head · d 4 = 8 scalars per layer-token
    name="toy-hybrid", layers=4, num_attention_heads=2, kv_heads=1, head_dim=4, hidden_size=8,
    max_position_embeddings=None, sliding_window=10, num_sliding_layers=2,
)


def test_model_bytes_full_attention_by_hand():
    spec = get_preset("llama-3-8b")  # 32 layers · 2 · 8 KV heads · 128 · 2 B = 131072 B per token at fp16
    fixed = paging.fixed_reservation(WORKED, 512)
    layout = kv_layout(spec, 16, 16)
    kv = paged_bytes.paged_kv_bytes(WORKED, layout, 512)
    assert kv.useful_kv_bytes == 968 * 131072
    assert kv.allocated_kv_bytes == 992 * 131072 and kv.waste_kv_bytes == 24 * 131072
    assert (kv.padding_bytes, kv.state_bytes, kv.allocated_state_bytes) == (0, 0, 0)
    assert (kv.block_table_bytes_exact, kv.block_table_bytes_dense) == (248, 640)  # one KV-cache group
    assert kv.held_bytes == 992 * 131072 + 248
    fixed_kv = paged_bytes.fixed_kv_bytes(layout, fixed, kv)
    assert fixed_kv.allocated_kv_bytes == 2560 * 131072 and fixed_kv.waste_kv_bytes == 1592 * 131072


def test_model_bytes_sliding_window_by_hand():
    tokens = np.array([25], dtype=np.int64)
    layout = kv_layout(TOY_HYBRID, 16, 4)  # fp16: 8 scalars · 2 B = 16 B per layer-position; G = 2, two groups
    kv = paged_bytes.paged_kv_bytes(tokens, layout, 32)
    # useful: full layers 2 · 25 + sliding layers 2 · min(25, 10) = 70 layer-positions -> 1120 B
    assert kv.useful_kv_bytes == 70 * 16
    # full layers: 2 · A_4(25) = 2 · 28 = 56. Sliding: the last 10 positions are 15..24, in blocks
    # floor(15/4) = 3 … ceil(25/4) − 1 = 6 -> 4 blocks = 16 positions, 2 layers -> 32. Total 88 -> 1408 B.
    assert kv.allocated_kv_bytes == 88 * 16
    # two KV-cache groups (full, sliding), each table ceil(25/4) = 7 entries (the 3 blocks the window freed stay
    # as null entries): exact 2 · 7 · 4 B = 56 B; dense 2 · ceil(32/4) · 4 B = 64 B
    assert (kv.block_table_bytes_exact, kv.block_table_bytes_dense) == (56, 64)
    fixed_kv = paged_bytes.fixed_kv_bytes(layout, paging.fixed_reservation(tokens, 32), kv)
    assert fixed_kv.allocated_kv_bytes == (2 * 32 + 2 * 10) * 16  # sliding layers reserve a ring of 10


def test_model_bytes_chunked_and_state_by_hand():
    # 1 chunked layer (C = 8) + 1 full layer, 8 B per layer-token (fp16, 1 KV head of 2), and 1 recurrent layer
    # whose state is 100 B; the ideal layout (no alignment): block 4.
    spec = ModelSpec.from_groups("toy", (
        LayerGroup("chunked", 1, window=8, kv_heads=1, k_head_dim=2, v_head_dim=2),
        LayerGroup("full", 1, kv_heads=1, k_head_dim=2, v_head_dim=2),
        LayerGroup("none", 1, state=RecurrentState("short_conv", "bf16", "bf16", d_inner=50, d_conv=2))),
        num_attention_heads=1, hidden_size=2, max_position_embeddings=None)
    layout = kv_layout(spec, 16, 4, layout="ideal")
    tokens = np.array([19, 8], dtype=np.int64)
    kv = paged_bytes.paged_kv_bytes(tokens, layout, 32)
    # n = 19: the last token's chunk starts at 8 · floor(18/8) = 16: holds 16..18 (3 tokens) in block 4 only (the
    # last C = 8 tokens would have been 11..18, blocks 2..4); n = 8: chunk 0..7, blocks 0, 1.
    chunked, full, state = kv.groups
    assert (chunked.blocks, chunked.held_tokens) == (1 + 2, 3 + 8)
    assert (full.blocks, full.held_tokens) == (5 + 2, 27)
    assert (state.blocks, state.held_tokens) == (2, 2)
    assert kv.useful_kv_bytes == (11 + 27) * 8 and kv.allocated_kv_bytes == (3 + 7) * 4 * 8
    # the state: short conv 50 · (2 − 1) scalars · 2 B = 100 B per sequence, one page each (ideal: no padding)
    assert kv.state_bytes == kv.allocated_state_bytes == 2 * 100
    # table entries: chunked and full ceil(n/4) = 5 + 2 each, the state 1 per sequence: (7 + 7 + 2) · 4 B
    assert kv.block_table_bytes_exact == 16 * 4


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=20), st.integers(1, 40), st.integers(1, 30))
def test_sliding_blocks_against_position_by_position_reference(lengths, block_size, window):
    spec = ModelSpec(
        name="toy-sliding", layers=1, num_attention_heads=1, kv_heads=1, head_dim=4, hidden_size=4,
        max_position_embeddings=None, sliding_window=window, num_sliding_layers=1,
    )
    tokens = np.array(lengths, dtype=np.int64)
    kv = paged_bytes.paged_kv_bytes(tokens, kv_layout(spec, 8, block_size), 128)  # 8 scalars per position, int8
    # reference: the set of blocks that hold at least one of the last min(n, window) positions
    blocks = sum(len({p // block_size for p in range(max(n - window, 0), n)}) for n in lengths)
    assert kv.allocated_kv_bytes == blocks * block_size * 8
    assert kv.useful_kv_bytes == sum(min(n, window) for n in lengths) * 8


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=20), st.integers(1, 40), st.integers(1, 30))
def test_chunked_blocks_against_position_by_position_reference(lengths, block_size, chunk):
    spec = ModelSpec.from_groups("toy-chunked", (LayerGroup("chunked", 1, window=chunk, kv_heads=1, k_head_dim=2,
                                                            v_head_dim=2),), num_attention_heads=1, hidden_size=2,
                                 max_position_embeddings=None)
    tokens = np.array(lengths, dtype=np.int64)
    kv = paged_bytes.paged_kv_bytes(tokens, kv_layout(spec, 8, block_size), 128)  # 4 scalars, int8: 4 B
    # reference: the positions of the last token's chunk, and the blocks that hold one of them
    kept = [range(chunk * ((n - 1) // chunk), n) for n in lengths]
    assert kv.allocated_kv_bytes == sum(len({p // block_size for p in r}) for r in kept) * block_size * 4
    assert kv.useful_kv_bytes == sum(len(r) for r in kept) * 4


def test_analyse_and_block_sizes():
    from kvcalc.core.frag import analyse, block_sizes_for

    assert block_sizes_for(None, sweep=False) == [16, 32]
    assert block_sizes_for([48, 16], sweep=True) == [1, 2, 4, 8, 16, 32, 48, 64, 128, 256]
    with pytest.raises(ValueError, match=r"^block_size 0"):
        block_sizes_for([0], sweep=False)
    result = analyse(WORKED, [16, 32], per_sequence=True, spec=get_preset("llama-3-8b"), dtype_bits=16)
    assert result.fixed.max_len == 512  # next power of two above 511
    assert [p.allocated_tokens for p in result.paged] == [992, 1024]
    assert result.per_sequence is not None and result.per_sequence.records()[0] == {
        "n": 37, "reservation_waste": 475, "allocated_b16": 48, "waste_b16": 11, "allocated_b32": 64, "waste_b32": 27
    }
    assert result.model_bytes is not None and result.model_bytes.paged[1].allocated_kv_bytes == 1024 * 131072
    assert analyse(WORKED, [16]).model_bytes is None and analyse(WORKED, [16]).per_sequence is None


# --- the two ways of counting blocks, chunked passes, progress ---------------------------------------------


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=200), st.lists(st.integers(1, 300), min_size=1, max_size=5))
@settings(max_examples=60, deadline=None)
def test_histogram_and_passes_give_the_plain_python_sums(lengths, block_sizes):
    tokens = np.array(lengths, dtype=np.int64)
    reference = [sum(-(-n // b) for n in lengths) for b in block_sizes]  # Σ ceil(n/B), Python ints
    longest = max(lengths)
    assert paging.block_counts_by_histogram(tokens, block_sizes, longest) == reference
    assert paging.block_counts_by_passes(tokens, block_sizes, longest) == reference


def test_chunked_passes_cover_every_length_and_report_progress(monkeypatch):
    monkeypatch.setattr(paging, "PASS_CHUNK", 7)  # 100 lengths in 15 chunks, the last one of 2
    monkeypatch.setattr(paging, "HISTOGRAM_CHUNK", 9)
    tokens = np.arange(1, 101, dtype=np.int64)
    # Σ ceil(n/B) over 1..100: B = 1: 5050; B = 3: 3·(1 + … + 33) + 34 = 1717; B = 16: 16·(1 + … + 6) + 4·7 = 364
    reference = [5050, 1717, 364]
    for count in (paging.block_counts_by_passes, paging.block_counts_by_histogram):
        done: list[int] = []
        assert count(tokens, [1, 3, 16], 100, done.append) == reference
        assert sum(done) == 100 and len(done) == (15 if count is paging.block_counts_by_passes else 12)


def test_analyse_reports_progress_over_every_length():
    from kvcalc.core.frag import analyse

    tokens = np.tile(np.array([37, 91, 128, 201, 511], dtype=np.int64), 100_000)  # 500,000: two chunks
    done: list[int] = []
    result = analyse(tokens, [16, 32], progress=done.append)
    assert sum(done) == tokens.size
    assert [p.allocated_tokens for p in result.paged] == [992 * 100_000, 1024 * 100_000]  # the worked example


def test_sliding_window_bytes_in_chunks(monkeypatch):
    monkeypatch.setattr(paged_bytes, "PASS_CHUNK", 3)  # up to 20 lengths: several chunks, a short last one
    test_sliding_blocks_against_position_by_position_reference()
    test_chunked_blocks_against_position_by_position_reference()


def test_per_sequence_rows_that_cannot_fit_are_refused_before_allocating(monkeypatch):
    from kvcalc.core import host_memory
    from kvcalc.core.frag import analyse, memory_needed

    # 5 rows × (3 + 2·2) values × (8 + 150) bytes = 5,530 bytes
    assert memory_needed(5, 2, per_sequence=True, lengths_held=True) == 5_530
    assert memory_needed(5, 2, per_sequence=False, lengths_held=False) == 40  # the lengths alone
    monkeypatch.setattr(host_memory, "available_bytes", lambda: 5_529)
    with pytest.raises(ValueError) as info:
        analyse(WORKED, [16, 32], per_sequence=True)
    assert str(info.value) == ("5 lengths with per-sequence rows would take 5.40 KiB of memory; this machine has "
                               "5.40 KiB available: drop per_sequence or give fewer lengths")
    assert analyse(WORKED, [16, 32]).paged[0].allocated_tokens == 992  # without rows: nothing to refuse
