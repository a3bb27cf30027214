"""The CUDA extension on a GPU against the float64 reference (marked `cuda`; skipped with a reason when
there is no GPU, nvcc or torch CUDA build). Run with `python -m pytest -m cuda tests/cuda_ext/test_cuda_gpu.py`."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.bench import TOLERANCE, make_inputs  # noqa: E402
from kvcalc.cuda_ext.reference import decode_attention_reference  # noqa: E402

pytestmark = pytest.mark.cuda  # skipped with a reason where there is no GPU or nvcc (tests/conftest.py)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def ops():
    from kvcalc.cuda_ext import ops as module

    return module


def run_both(x, num_splits=None, scale=None):
    paged = ops().paged_decode_attention(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens,
                                         scale=scale, num_splits=num_splits)
    contiguous = ops().contiguous_decode_attention(x.q, x.k, x.v, x.seq_lens, scale=scale,
                                                   num_splits=num_splits)
    return paged, contiguous


def rel_err(out, ref):
    return float((out.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 3, 8, 16])
@pytest.mark.parametrize("block_size", [1, 8, 16, 256])
def test_kernel_matches_float64_reference(dtype, head_dim, group, block_size):
    gen = torch.Generator(device="cuda").manual_seed(head_dim + group + block_size)
    lens = [0, 1, 2 * block_size + 3, 700, 1500]
    x = make_inputs(lens, 2 * group, 2, head_dim, block_size, DTYPES[dtype], "cuda", gen)
    paged, contiguous = run_both(x)
    ref = decode_attention_reference(x.q, x.k, x.v, x.seq_lens)
    assert rel_err(paged, ref) < TOLERANCE[dtype]
    assert torch.equal(paged, contiguous), "same kernel code and order: paged must equal contiguous bit for bit"
    assert torch.count_nonzero(paged[0]) == 0


@pytest.mark.parametrize("num_splits", [1, 2, 7, 64])
def test_forced_split_counts_agree(num_splits):
    gen = torch.Generator(device="cuda").manual_seed(num_splits)
    x = make_inputs([3000, 17, 0, 4096], 32, 8, 128, 16, torch.bfloat16, "cuda", gen)
    paged, contiguous = run_both(x, num_splits=num_splits)
    ref = decode_attention_reference(x.q, x.k, x.v, x.seq_lens)
    assert rel_err(paged, ref) < TOLERANCE["bf16"]
    assert torch.equal(paged, contiguous)


def test_shared_blocks_and_custom_scale():
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = make_inputs([64, 64, 40], 8, 2, 128, 16, torch.float16, "cuda", gen)
    x.block_tables[1, :2] = x.block_tables[0, :2]  # a shared two-block prefix
    x.block_tables[2, :2] = x.block_tables[0, :2]
    from kvcalc.cuda_ext.reference import paged_decode_attention_reference

    out = ops().paged_decode_attention(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens, 0.2)
    ref = paged_decode_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens, 0.2)
    assert rel_err(out, ref) < TOLERANCE["fp16"]


def test_runs_on_the_current_stream():
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = make_inputs([500, 9], 16, 4, 64, 32, torch.bfloat16, "cuda", gen)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = ops().paged_decode_attention(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens)
    stream.synchronize()
    ref = decode_attention_reference(x.q, x.k, x.v, x.seq_lens)
    assert rel_err(out, ref) < TOLERANCE["bf16"]


def test_bad_block_id_is_rejected_before_launch():
    gen = torch.Generator(device="cuda").manual_seed(2)
    x = make_inputs([40], 8, 2, 128, 16, torch.float16, "cuda", gen)
    x.block_tables[0, 1] = x.k_cache.shape[0]
    with pytest.raises(ValueError, match="outside"):
        ops().paged_decode_attention(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens)


def test_bench_cuda_smoke(run_cli):
    result = run_cli("bench", "--device", "cuda", "--batch", "4", "--context", "1024", "--iters", "5",
                     "--skip-correctness", "--no-flex", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["copy_tbps"] > 0 and doc["timing"][0]["paged_us"] > 0
