"""Equation 1 (core/sizing.py) against hand-computed values, closed forms and properties."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.model.models import PRESETS, ModelSpec, get_preset
from kvcalc.core.model.sizing import compute_size, kv_heads_per_gpu, preset_rows

GIB = 2**30


def test_llama_3_8b_hand_computed():
    r = compute_size(get_preset("Llama-3-8B"), "bf16", tokens=8192, seqs=32, block_size=16)
    assert r.bytes_per_token_per_layer == 2 * 8 * 128 * 2 == 4096
    assert r.bytes_per_token == 32 * 4096 == 131072
    assert r.bytes_per_block == 16 * 131072  # 2 MiB
    assert r.bytes_per_seq == 8192 * 131072 == GIB  # 2 · 32 · 8192 · 8 · 128 · 2 = 1 GiB
    assert r.total_bytes == r.per_gpu_bytes == 32 * GIB
    assert r.formula == "2 · 32 layers · 8,192 tokens · 8 KV heads · 128 dim · 2 B · 32 seqs = 32.00 GiB"


def test_default_tokens_is_the_models_max_length():
    assert compute_size(get_preset("Llama-2-7B")).tokens == 4096
    custom = ModelSpec(name="custom", layers=2, num_attention_heads=2, kv_heads=2, head_dim=4, hidden_size=8,
                       max_position_embeddings=None)
    with pytest.raises(ValueError, match="give tokens N"):
        compute_size(custom)


@pytest.mark.parametrize(
    ("dtype", "bits"), [("fp32", 32), ("fp16", 16), ("bf16", 16), ("fp8", 8), ("int8", 8), ("int4", 4)]
)
def test_dtypes(dtype, bits):
    r = compute_size(get_preset("Llama-3-8B"), dtype, tokens=1000)
    assert r.bits_per_scalar == bits
    assert r.bytes_per_seq == 2 * 32 * 1000 * 8 * 128 * bits // 8


def test_int4_is_exact_for_odd_token_counts():
    # OPT-13B int4: 2 · 40 · 40 · 128 · 4 bits = 1,638,400 bits = 204,800 B per token; 3 tokens: 614,400 B.
    r = compute_size(get_preset("OPT-13B"), "int4", tokens=3)
    assert r.bytes_per_token == 204_800 and r.bytes_per_seq == 614_400 and r.exact_bytes
    assert r.formula.endswith("· 0.5 B = 600.00 KiB")


def test_int4_half_byte_is_rounded_up_and_flagged():
    # A made-up MLA latent of 3 scalars, 1 layer, 1 token at int4: 12 bits -> 2 bytes, not exact.
    spec = ModelSpec(name="odd", layers=1, num_attention_heads=1, kv_heads=1, head_dim=2, hidden_size=2,
                     max_position_embeddings=None, kv_lora_rank=2, qk_rope_head_dim=1)
    r = compute_size(spec, "int4", tokens=1)
    assert r.total_bits == 12 and r.total_bytes == 2 and not r.exact_bytes
    assert r.formula.endswith("· 0.5 B = 1.50 B")  # the formula shows the exact 12 bits = 1.5 B, not 2 B


def test_huge_inputs_are_exact():
    # 10^12 tokens × 10^7 sequences of Llama-3-8B at bf16: 131072 · 10^19 bytes, beyond int64 and float.
    r = compute_size(get_preset("Llama-3-8B"), "bf16", tokens=10**12, seqs=10**7)
    assert r.total_bytes == 131072 * 10**19
    assert isinstance(r.total_bytes, int) and r.total_bytes > 2**63
    r4 = compute_size(get_preset("Llama-3-8B"), "int4", tokens=10**12 + 1, seqs=10**7)
    assert r4.total_bytes == 32768 * (10**12 + 1) * 10**7


def test_sliding_window_caps_tokens():
    mistral = get_preset("Mistral-7B-v0.1")
    # Beyond the 4096 window every layer holds 4096 tokens: 4096 · 128 KiB = 512 MiB at any length.
    assert compute_size(mistral, tokens=4096).bytes_per_seq == compute_size(mistral, tokens=10**9).bytes_per_seq
    assert compute_size(mistral, tokens=10**9).bytes_per_seq == 4096 * 131072
    gemma = get_preset("Gemma-2-9B")
    # 8192 tokens: 21 global layers × 8192 + 21 sliding layers × 4096, each token-layer 2·8·256·2 = 8192 B.
    r = compute_size(gemma, tokens=8192)
    assert r.bytes_per_seq == (21 * 8192 + 21 * 4096) * 8192
    assert "(21 layers · 8,192 tokens + 21 sliding layers · 4,096 window tokens)" in r.formula


def test_mla_latent():
    r = compute_size(get_preset("DeepSeek-V3"), "bf16", tokens=1000)
    assert r.bytes_per_seq == 61 * 1000 * 576 * 2
    assert r.formula == "61 layers · 1,000 tokens · (512 + 64) latent · 2 B = 67.02 MiB"


@pytest.mark.parametrize(
    ("name", "tp", "expected"),
    [
        ("Llama-3-8B", 1, 8),
        ("Llama-3-8B", 2, 4),
        ("Llama-3-8B", 8, 1),
        ("Llama-3-8B", 16, 1),  # replicated: each head on 2 GPUs
        ("Llama-3-8B", 64, 1),
        ("Falcon-7B", 8, 1),  # MQA: the one head on every GPU
        ("DeepSeek-V3", 8, 1),  # MLA: the latent on every GPU
        ("OPT-13B", 5, 8),
    ],
)
def test_tp_heads_per_gpu(name, tp, expected):
    assert kv_heads_per_gpu(get_preset(name), tp) == expected


@pytest.mark.parametrize(("tp", "message"), [(3, "does not divide the 8 KV heads"), (12, "not a multiple of 8"),
                                             (0, "positive number of GPUs"), (-2, "positive number of GPUs")])
def test_tp_errors(tp, message):
    with pytest.raises(ValueError, match=message):
        kv_heads_per_gpu(get_preset("Llama-3-8B"), tp)


def test_tp_per_gpu_bytes():
    spec = get_preset("Llama-3-70B")
    full = compute_size(spec, tokens=8192)
    assert compute_size(spec, tokens=8192, tp=8).per_gpu_bytes == full.total_bytes // 8  # 1 of 8 heads
    replicated = compute_size(spec, tokens=8192, tp=16)
    assert replicated.per_gpu_bytes == full.total_bytes // 8 and replicated.replicas_per_head == 2
    mla = compute_size(get_preset("DeepSeek-V3"), tokens=8192, tp=8)
    assert mla.per_gpu_bytes == mla.total_bytes and mla.replicas_per_head == 8


def test_capacity_hand_computed():
    # 80 GiB / 128 KiB = 655,360 tokens; / 1 GiB per 8K sequence = 80 sequences; / 2 MiB per block = 40,960.
    r = compute_size(get_preset("Llama-3-8B"), tokens=8192, seqs=32, memory_bytes=80 * GIB)
    assert (r.capacity.max_tokens, r.capacity.max_seqs, r.capacity.num_blocks) == (655_360, 80, 40_960)
    assert r.capacity.fits and not r.capacity.per_gpu
    # Per GPU with --tp 8 (Llama-3-70B, 1 head each = 40 KiB per token): 80 GiB / 40 KiB = 2,097,152 tokens.
    r = compute_size(get_preset("Llama-3-70B"), tokens=8192, tp=8, memory_bytes=80 * GIB)
    assert r.capacity.per_gpu and r.capacity.max_tokens == 80 * GIB // (40 * 1024) == 2_097_152
    # Too small a budget: nothing fits, and the batch does not.
    tiny = compute_size(get_preset("Llama-3-8B"), tokens=8192, memory_bytes=1000)
    assert (tiny.capacity.max_tokens, tiny.capacity.max_seqs, tiny.capacity.fits) == (0, 0, False)


def test_capacity_with_sliding_window():
    # Mistral: max_tokens ignores the window (32 GiB / 128 KiB = 262,144), max_seqs applies it (512 MiB each: 64).
    r = compute_size(get_preset("Mistral-7B-v0.1"), tokens=32768, memory_bytes=32 * GIB)
    assert r.capacity.max_tokens == 262_144 and r.capacity.max_seqs == 64


@pytest.mark.parametrize(("option", "kwargs"), [("tokens", {"tokens": 0}), ("seqs", {"seqs": -1}),
                                                ("block_size", {"block_size": 0})])
def test_non_positive_inputs(option, kwargs):
    with pytest.raises(ValueError, match=f"{option} must be a positive integer"):
        compute_size(get_preset("Llama-3-8B"), **{"tokens": 10, **kwargs})


def test_preset_rows_apply_windows():
    rows = {row.spec.name: row for row in preset_rows(list(PRESETS.values()), "fp16")}
    assert rows["Mistral-7B-v0.1"].bytes_per_seq[131072] == 4096 * 131072  # capped at the window
    assert rows["Llama-3-8B"].bytes_per_seq[32768] == 32768 * 131072
    assert rows["OPT-13B"].bytes_per_token == 819_200


specs = st.sampled_from(sorted(PRESETS.values(), key=lambda s: s.name))
dtypes = st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int8", "int4"])


@settings(max_examples=200, deadline=None)
@given(spec=specs, dtype=dtypes, a=st.integers(1, 4096), b=st.integers(1, 4096), seqs=st.integers(1, 10**7))
def test_linear_in_tokens_below_the_window_and_in_seqs(spec, dtype, a, b, seqs):
    # Below every window each token costs the same in every layer, so KV is proportional to tokens and seqs;
    # a hybrid's recurrent state is a constant per sequence on top of it (sequence totals include it).
    lo, hi = min(a, b), max(a, b)
    if spec.sliding_window is not None and hi > spec.sliding_window:
        return
    r_lo = compute_size(spec, dtype, tokens=lo, seqs=seqs)
    r_hi = compute_size(spec, dtype, tokens=hi, seqs=seqs)
    state = seqs * r_lo.state_bits_per_seq
    assert r_hi.state_bits_per_seq == r_lo.state_bits_per_seq
    assert (r_lo.total_bits - state) * hi == (r_hi.total_bits - state) * lo
    assert r_lo.total_bits - state == seqs * lo * r_lo.bits_per_token


@settings(max_examples=200, deadline=None)
@given(spec=specs, tokens=st.integers(1, 10**12), big=st.integers(1, 10**12))
def test_longer_context_never_costs_less(spec, tokens, big):
    if any(g.kind == "chunked" for g in spec.layer_groups):  # a new chunk starts empty: see the test below
        return
    assert compute_size(spec, tokens=tokens + big).total_bits >= compute_size(spec, tokens=tokens).total_bits


def test_chunked_layers_hold_the_current_chunk():
    # Llama-4-Scout: 36 chunked layers (C 8,192) and 12 full, 4,096 B per token per layer at bf16. At 8,192
    # tokens the chunked layers hold the whole first chunk; at 8,193 only the new chunk's one token; at 20,000
    # the chunk that starts at 8,192 · floor(19,999 / 8,192) = 16,384: 3,616 tokens.
    spec = get_preset("Llama-4-Scout")
    for tokens, chunk in ((8192, 8192), (8193, 1), (20_000, 3616)):
        assert compute_size(spec, tokens=tokens).kv_bytes_per_seq == (36 * chunk + 12 * tokens) * 4096


@settings(max_examples=200, deadline=None)
@given(spec=specs, tokens=st.integers(1, 10**6), seqs=st.integers(1, 1000), exponent=st.integers(0, 8))
def test_tp_split_sums_back(spec, tokens, seqs, exponent):
    tp = 2**exponent
    try:
        r = compute_size(spec, "bf16", tokens=tokens, seqs=seqs, tp=tp)
    except ValueError:
        assert spec.kv_heads % tp and tp % spec.kv_heads  # only an uneven split is refused
        return
    if spec.is_mla:
        assert r.per_gpu_bits == r.total_bits
    else:
        # Every head is on replicas_per_head GPUs: the GPUs together hold that many copies of the whole KV.
        # A hybrid's recurrent state splits by its own heads (replicated Mamba groups: tests/core/model/test_state.py).
        kv_per_gpu = r.per_gpu_kv_bits_per_seq * seqs
        assert kv_per_gpu * tp == (r.total_bits - seqs * r.state_bits_per_seq) * r.replicas_per_head
        assert r.per_gpu_bits == kv_per_gpu + seqs * spec.state_bits(tp)
        if tp <= spec.kv_heads:
            assert r.replicas_per_head == 1


@settings(max_examples=200, deadline=None)
@given(spec=specs, tokens=st.integers(1, 10**6), memory=st.integers(1, 2**45), block=st.integers(1, 256))
def test_capacity_is_the_largest_count_that_fits(spec, tokens, memory, block):
    r = compute_size(spec, "fp8", tokens=tokens, block_size=block, memory_bytes=memory)
    cap, bits = r.capacity, memory * 8
    assert cap.max_seqs * r.bits_per_seq <= bits < (cap.max_seqs + 1) * r.bits_per_seq
    # max tokens after one sequence's recurrent state (0 without recurrent layers)
    after_state = max(bits - spec.state_bits(), 0)
    assert cap.max_tokens * r.bits_per_token <= after_state < (cap.max_tokens + 1) * r.bits_per_token
    assert cap.num_blocks * block * r.bits_per_token <= bits < (cap.num_blocks + 1) * block * r.bits_per_token
