"""The pure-torch references (what `--device cpu` runs and what GPU tests compare against), the ops'
input validation, the split heuristic and the byte count, all on the CPU."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvcalc.cuda_ext import ops  # noqa: E402
from kvcalc.cuda_ext.bench import bytes_moved, make_inputs  # noqa: E402
from kvcalc.cuda_ext.reference import (  # noqa: E402
    decode_attention_reference,
    gather_paged_kv,
    paged_decode_attention_reference,
)


def naive_decode(q, k_cache, v_cache, tables, lens, scale):
    """One (sequence, query head) at a time, token by token through the table: independent of the
    vectorised gather and einsum of reference.py."""
    batch, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.zeros(batch, num_q_heads, head_dim, dtype=torch.float64)
    for b in range(batch):
        n = int(lens[b])
        for h in range(num_q_heads):
            if n == 0:
                continue
            rows = [(int(tables[b, t // block_size]), t % block_size) for t in range(n)]
            keys = torch.stack([k_cache[blk, off, h // group] for blk, off in rows]).double()
            values = torch.stack([v_cache[blk, off, h // group] for blk, off in rows]).double()
            weights = torch.softmax(keys @ q[b, h].double() * scale, dim=0)
            out[b, h] = weights @ values
    return out


@pytest.mark.parametrize(("block_size", "group", "lengths"), [
    (1, 1, [0, 1, 5]),
    (4, 4, [13, 0, 8]),       # 13 ends mid-block, 8 on a boundary
    (16, 2, [40, 16]),
    (256, 8, [300, 1, 0]),   # one block holds a whole short sequence
])
def test_paged_reference_matches_token_by_token(block_size, group, lengths):
    gen = torch.Generator().manual_seed(block_size)
    x = make_inputs(lengths, 2 * group, 2, 64, block_size, torch.float32, "cpu", gen)
    out = paged_decode_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens)
    expected = naive_decode(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens, 1 / 8)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    for i, n in enumerate(lengths):
        if n == 0:
            assert torch.count_nonzero(out[i]) == 0


def test_paged_equals_contiguous_reference_exactly():
    gen = torch.Generator().manual_seed(7)
    x = make_inputs([37, 0, 91, 128], 8, 2, 128, 16, torch.bfloat16, "cpu", gen)
    paged = paged_decode_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens)
    contiguous = decode_attention_reference(x.q, x.k, x.v, x.seq_lens)
    assert torch.equal(paged, contiguous)


def test_shared_physical_blocks_read_the_same_prefix():
    # Two tables share physical blocks 3 and 1 (a 2-block prefix of 8 tokens) and diverge after; with
    # equal queries and a length of exactly the prefix, both sequences must give the same output.
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.randn(6, 4, 1, 64, generator=gen, dtype=torch.float64)
    v_cache = torch.randn(6, 4, 1, 64, generator=gen, dtype=torch.float64)
    tables = torch.tensor([[3, 1, 0], [3, 1, 5]], dtype=torch.int32)
    q = torch.randn(1, 2, 64, generator=gen, dtype=torch.float64).expand(2, 2, 64).contiguous()
    same = paged_decode_attention_reference(q, k_cache, v_cache, tables, torch.tensor([8, 8], dtype=torch.int32))
    assert torch.equal(same[0], same[1])
    diverged = paged_decode_attention_reference(q, k_cache, v_cache, tables, torch.tensor([12, 12], dtype=torch.int32))
    assert not torch.equal(diverged[0], diverged[1])
    torch.testing.assert_close(diverged, naive_decode(q, k_cache, v_cache, tables, [12, 12], 1 / 8))


def test_scale_parameter_and_single_token():
    # With one token the softmax weight is 1 whatever the scale: the output is that token's V exactly.
    gen = torch.Generator().manual_seed(0)
    x = make_inputs([1], 4, 1, 64, 16, torch.float64, "cpu", gen)
    out = paged_decode_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens, 5.0)
    v = x.v_cache[int(x.block_tables[0, 0]), 0, 0]
    torch.testing.assert_close(out[0], v.expand(4, 64))


def test_gather_zeroes_positions_past_the_length():
    cache = torch.arange(2 * 2 * 1 * 1, dtype=torch.float32).reshape(2, 2, 1, 1) + 1  # values 1..4
    tables = torch.tensor([[1, 0]], dtype=torch.int32)
    dense = gather_paged_kv(cache, tables, torch.tensor([3], dtype=torch.int32), 4)
    # logical 0,1 -> block 1 slots (3, 4); logical 2 -> block 0 slot 0 (1); logical 3 is past the length
    assert dense.flatten().tolist() == [3.0, 4.0, 1.0, 0.0]


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4), log2_block=st.integers(0, 4),
       group=st.sampled_from([1, 2, 3, 16]))
def test_property_paged_reference_matches_naive(lengths, log2_block, group):
    gen = torch.Generator().manual_seed(sum(lengths) + group)
    x = make_inputs(lengths, group, 1, 64, 2**log2_block, torch.float64, "cpu", gen)
    out = paged_decode_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens)
    expected = naive_decode(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens, 1 / 8)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


# --- the op's validation (CPU tensors; the device check itself is tested with require_cuda=True) ---


def good_inputs():
    gen = torch.Generator().manual_seed(0)
    return make_inputs([5, 20], 8, 2, 64, 4, torch.float16, "cpu", gen)


def check(x, **changes):
    y = dataclasses.replace(x, **changes)
    ops.validate_paged(y.q, y.k_cache, y.v_cache, y.block_tables, y.seq_lens, require_cuda=False)


def test_valid_inputs_pass():
    check(good_inputs())


@pytest.mark.parametrize(("change", "message"), [
    (lambda x: {"q": x.q.float()}, "float16 or bfloat16"),
    (lambda x: {"k_cache": x.k_cache.to(torch.bfloat16)}, "dtype torch.bfloat16"),
    (lambda x: {"q": x.q[:, :, :32].contiguous()}, "head_dim 32"),
    (lambda x: {"q": x.q.transpose(0, 1).contiguous().transpose(0, 1)}, "not contiguous"),
    (lambda x: {"k_cache": torch.cat([x.k_cache, x.k_cache[..., :1, :]], 2),  # 8 q heads over 3 KV heads
                "v_cache": torch.cat([x.v_cache, x.v_cache[..., :1, :]], 2)}, "GQA group"),
    (lambda x: {"block_tables": x.block_tables.long()}, "block_tables has dtype torch.int64"),
    (lambda x: {"block_tables": x.block_tables.clone().fill_(99)}, "block id 99"),
    (lambda x: {"block_tables": x.block_tables.clone().fill_(-1)}, "block id -1"),
    (lambda x: {"seq_lens": torch.tensor([5, 21], dtype=torch.int32)}, "seq_lens must lie in 0..20"),
    (lambda x: {"seq_lens": torch.tensor([-1, 3], dtype=torch.int32)}, "seq_lens must lie"),
    (lambda x: {"seq_lens": x.seq_lens[:1].contiguous()}, "but q has batch 2"),
    (lambda x: {"v_cache": x.v_cache[:3].contiguous()}, "differ in shape"),
    (lambda x: {"q": x.q.reshape(2, 4, 128)}, "differs from q's 128"),
])
def test_bad_inputs_name_the_value(change, message):
    x = good_inputs()
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        check(x, **change(x))


def test_unused_table_entries_may_hold_anything():
    x = good_inputs()
    tables = x.block_tables.clone()
    tables[0, 2:] = 12345  # sequence 0 (5 tokens, block size 4) reads only entries 0 and 1
    check(x, block_tables=tables)


def test_block_size_must_be_a_power_of_two():
    x = good_inputs()
    with pytest.raises(ValueError, match="block_size 3"):
        check(x, k_cache=x.k_cache[:, :3].contiguous(), v_cache=x.v_cache[:, :3].contiguous())


def test_cpu_tensors_are_rejected_by_the_op():
    x = good_inputs()
    with pytest.raises(ValueError, match="expected a CUDA device"):
        ops.paged_decode_attention(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens)
    with pytest.raises(ValueError, match="expected a CUDA device"):
        ops.contiguous_decode_attention(x.q, x.k, x.v, x.seq_lens)


def test_contiguous_validation():
    x = good_inputs()
    ops.validate_contiguous(x.q, x.k, x.v, x.seq_lens, require_cuda=False)
    with pytest.raises(ValueError, match=r"seq_lens must lie in 0..20"):
        ops.validate_contiguous(x.q, x.k, x.v, torch.tensor([1, 30], dtype=torch.int32), require_cuda=False)


@pytest.mark.parametrize(("batch", "kv_heads", "max_len", "sms", "expected"), [
    (64, 8, 4096, 132, 1),     # 512 CTAs >= 2 per SM: no split
    (1, 8, 32768, 132, 64),    # 4*132 // 8 = 66, capped by MAX_SPLITS = 64
    (8, 8, 8192, 132, 8),      # 528 // 64 = 8: 512 CTAs, one wave
    (32, 8, 4096, 132, 2),     # 528 // 256 = 2 (3 would make 768 CTAs, more than one wave of 528)
    (1, 8, 1000, 132, 3),      # capped by 1000 // 256 = 3 slices of >= 256 tokens
    (1, 1, 10**6, 132, 64),    # capped by MAX_SPLITS
    (0, 8, 100, 132, 1),
])
def test_choose_num_splits(batch, kv_heads, max_len, sms, expected):
    assert ops.choose_num_splits(batch, kv_heads, max_len, sms) == expected


def test_bytes_moved_by_hand():
    # lengths 17 and 3, 2 KV heads, 4 q heads, d 64, block 16, 2-byte elements:
    # K+V 2*20*2*64*2 = 10240; q+out 2*2*4*64*2 = 2048; tables (2 + 1) blocks * 4 = 12; seq_lens 2*4 = 8
    assert bytes_moved([17, 3], 4, 2, 64, 16) == 10240 + 2048 + 12 + 8
    assert bytes_moved([17, 3], 4, 2, 64, None) == 10240 + 2048 + 8  # contiguous: no block-table entries
    assert math.isclose(bytes_moved([4096] * 64, 32, 8, 128, 16) / 2**30, 1.0, rel_tol=1e-2)


def test_flex_paged_comparator_matches_reference_on_cpu():
    # The FlexAttention comparator of `kvcalc bench` (eager on the CPU): same answer as the reference.
    from kvcalc.cuda_ext.flex_paged import flex_paged_op

    gen = torch.Generator().manual_seed(0)
    x = make_inputs([40, 17, 64], 8, 2, 64, 16, torch.float32, "cpu", gen)
    op = flex_paged_op(x, compile=False)
    if op is None:
        pytest.skip(f"torch {torch.__version__} has no FlexAttention paged attention")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager flex warns that it is unfused
        out = op().squeeze(2)
    ref = paged_decode_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    small = make_inputs([5], 8, 2, 64, 8, torch.float32, "cpu", gen)
    assert flex_paged_op(small, compile=False) is None  # pages below 16 tokens are not supported by flex
