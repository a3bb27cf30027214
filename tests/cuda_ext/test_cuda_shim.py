"""Runs the CUDA kernel's own source (cuda_ext/csrc/decode_attention.cuh) on the CPU and compares it with
the torch reference.

tests/cuda_shim/shim.h maps every CUDA construct the header uses onto host C++ (one std::thread per
CUDA thread, std::barrier for __syncthreads and for the two halves of a warp shuffle, a per-block shared
memory buffer poisoned with NaN before every CTA, fp16/bf16 emulated with round-to-nearest-even). The
kernel is compiled with 64 threads per CTA (two warps) so that the small cases still exercise several
rows, several warps, token subsets (small groups) and several heads per row (large groups).
"""

from __future__ import annotations

import math
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.reference import (  # noqa: E402
    decode_attention_reference,
    paged_decode_attention_reference,
)

SHIM_DIR = Path(__file__).parent / "cuda_shim"
CSRC_DIR = Path(__file__).parents[2] / "cuda_ext" / "csrc"
MAGIC = 0x6B766331
# The kernel accumulates in float32 from fp16/bf16 inputs and rounds the output once to fp16/bf16: the
# error against float64 is dominated by that final rounding (2^-11 and 2^-8 relative).
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


def build_shim(directory: Path, threads: int) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed: the CPU shim of the CUDA kernel cannot be built")
    binary = directory / f"shim_main_{threads}"
    cmd = [compiler, "-std=c++20", "-O1", "-pthread", "-Wall", "-Wextra", "-Werror", f"-DSHIM_THREADS={threads}",
           f"-I{SHIM_DIR}", f"-I{CSRC_DIR}", str(SHIM_DIR / "shim_main.cpp"), "-o", str(binary)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return binary


@pytest.fixture(scope="module")
def shim_binary(tmp_path_factory) -> Path:
    """64 threads per CTA: small enough to run many cases quickly."""
    return build_shim(tmp_path_factory.mktemp("shim"), 64)


@pytest.fixture(scope="module")
def shim_binary_gpu_config(tmp_path_factory) -> Path:
    """128 threads per CTA, exactly what decode_attention.cu launches."""
    return build_shim(tmp_path_factory.mktemp("shim128"), 128)


def run_shim(binary: Path, tmp_path: Path, q, k, v, seq_lens, block_tables=None, num_splits=1, scale=None):
    """Writes one case, runs the kernel through the shim, returns out [B, Hq, D] in q's dtype."""
    batch, num_q_heads, head_dim = q.shape
    paged = block_tables is not None
    num_kv_heads = k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    header = [MAGIC, 1 if q.dtype == torch.bfloat16 else 0, int(paged), head_dim, batch, num_q_heads, num_kv_heads,
              k.shape[1] if paged else 1, block_tables.shape[1] if paged else 0, k.shape[0] if paged else 0,
              0 if paged else k.shape[1], num_splits, 0, 0, 0, 0]
    parts = [struct.pack("<16i", *header), struct.pack("<f", scale)]
    for tensor in (q, k, v):
        parts.append(tensor.contiguous().view(torch.int16).numpy().tobytes())
    if paged:
        parts.append(block_tables.to(torch.int32).contiguous().numpy().tobytes())
    parts.append(seq_lens.to(torch.int32).numpy().tobytes())
    case, out_file = tmp_path / "case.bin", tmp_path / "out.bin"
    case.write_bytes(b"".join(parts))
    proc = subprocess.run([str(binary), str(case), str(out_file)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    raw = torch.frombuffer(bytearray(out_file.read_bytes()), dtype=torch.int16)
    return raw.view(q.dtype).reshape(batch, num_q_heads, head_dim).clone()


def make_paged_case(dtype, head_dim, group, block_size, seq_lens, num_kv_heads=2, seed=0, shared_prefix_blocks=0):
    """Random q/K/V; physical blocks in shuffled order; the first `shared_prefix_blocks` logical blocks
    of every sequence point at the same physical blocks (a shared prefix); unused table entries are -1."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    blocks_needed = [math.ceil(n / block_size) for n in seq_lens]
    max_blocks = max(max(blocks_needed), 1)
    num_blocks = sum(max(b - shared_prefix_blocks, 0) for b in blocks_needed) + shared_prefix_blocks + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    shared = [order.pop() for _ in range(shared_prefix_blocks)]
    tables = torch.full((len(seq_lens), max_blocks), -1, dtype=torch.int32)
    for i, needed in enumerate(blocks_needed):
        for j in range(needed):
            tables[i, j] = shared[j] if j < shared_prefix_blocks else order.pop()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(len(seq_lens), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    return q, k, v, tables, lens


def relative_error(out, ref) -> float:
    return float((out.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


CASES = [
    # dtype, head_dim, group, block_size, lengths, splits
    (torch.float16, 64, 1, 1, [0, 1, 7], 1),
    (torch.bfloat16, 64, 4, 16, [37, 0, 16, 65], 1),
    (torch.float16, 64, 16, 256, [300, 5], 1),
    (torch.bfloat16, 128, 2, 4, [33, 70, 0], 3),
    (torch.float16, 128, 8, 8, [129, 1], 4),
    (torch.bfloat16, 256, 3, 2, [19, 40], 1),
    (torch.float16, 256, 16, 32, [50, 0, 33], 2),
]


@pytest.mark.parametrize(("dtype", "head_dim", "group", "block_size", "lengths", "splits"), CASES)
def test_shim_paged_kernel_matches_reference(shim_binary, tmp_path, dtype, head_dim, group, block_size, lengths,
                                             splits):
    q, k, v, tables, lens = make_paged_case(dtype, head_dim, group, block_size, lengths)
    out = run_shim(shim_binary, tmp_path, q, k, v, lens, tables, num_splits=splits)
    ref = paged_decode_attention_reference(q, k, v, tables, lens)
    assert not torch.isnan(out).any(), "a position of the output was never written"
    assert relative_error(out, ref) < TOLERANCE[dtype]
    for i, n in enumerate(lengths):
        if n == 0:
            assert torch.count_nonzero(out[i]) == 0, "length 0 must give zeros"


def to_contiguous(cache, tables, lens, max_len):
    """The same K or V in the contiguous layout [B, max_len, Hkv, D]; positions past a length hold noise,
    which the kernel must never read."""
    from kvcalc.cuda_ext.reference import gather_paged_kv

    dense = gather_paged_kv(cache, tables, lens, max_len)
    live = torch.arange(max_len)[None, :] < lens[:, None]
    noise = torch.full_like(dense, float("nan"))
    return torch.where(live[:, :, None, None], dense, noise)


@pytest.mark.parametrize(("dtype", "head_dim", "group", "block_size", "lengths", "splits"), [
    (torch.bfloat16, 64, 2, 8, [0, 45, 128], 1),
    (torch.float16, 128, 4, 16, [77, 3], 2),
])
def test_shim_contiguous_is_bit_identical_to_paged(shim_binary, tmp_path, dtype, head_dim, group, block_size,
                                                    lengths, splits):
    # Same tiles, same accumulation order, only the address computation differs: outputs must be equal bits.
    q, k, v, tables, lens = make_paged_case(dtype, head_dim, group, block_size, lengths, seed=1)
    max_len = max(lengths) + 5
    kc, vc = to_contiguous(k, tables, lens, max_len), to_contiguous(v, tables, lens, max_len)
    paged = run_shim(shim_binary, tmp_path, q, k, v, lens, tables, num_splits=splits)
    contiguous = run_shim(shim_binary, tmp_path, q, kc, vc, lens, num_splits=splits)
    assert torch.equal(paged.view(torch.int16), contiguous.view(torch.int16))
    ref = decode_attention_reference(q, kc.nan_to_num(0.0), vc.nan_to_num(0.0), lens)
    assert relative_error(contiguous, ref) < TOLERANCE[dtype]


def test_shim_shared_prefix_blocks_and_custom_scale(shim_binary, tmp_path):
    # Three tables share their first two physical blocks (a shared prefix) and diverge after it.
    q, k, v, tables, lens = make_paged_case(torch.float16, 64, 4, 16, [40, 33, 64], shared_prefix_blocks=2, seed=2)
    assert (tables[:, :2] == tables[0, :2]).all()
    out = run_shim(shim_binary, tmp_path, q, k, v, lens, tables, scale=0.3)
    ref = paged_decode_attention_reference(q, k, v, tables, lens, scale=0.3)
    assert relative_error(out, ref) < TOLERANCE[torch.float16]


def test_shim_block_table_window_switch(shim_binary, tmp_path):
    # Block size 1 and 600 tokens: the kernel stages 256 table entries at a time, so it must restage twice.
    q, k, v, tables, lens = make_paged_case(torch.bfloat16, 64, 1, 1, [600, 260], num_kv_heads=1, seed=3)
    out = run_shim(shim_binary, tmp_path, q, k, v, lens, tables, num_splits=1)
    ref = paged_decode_attention_reference(q, k, v, tables, lens)
    assert relative_error(out, ref) < TOLERANCE[torch.bfloat16]


def test_shim_more_splits_than_tiles(shim_binary, tmp_path):
    # 8 splits of sequences that have one or two tiles: most slices are empty (lse = -inf, weight 0).
    q, k, v, tables, lens = make_paged_case(torch.float16, 128, 2, 4, [5, 0, 40], seed=4)
    out = run_shim(shim_binary, tmp_path, q, k, v, lens, tables, num_splits=8)
    ref = paged_decode_attention_reference(q, k, v, tables, lens)
    assert not torch.isnan(out).any()
    assert relative_error(out, ref) < TOLERANCE[torch.float16]
    assert torch.count_nonzero(out[1]) == 0


@pytest.mark.parametrize(("dtype", "head_dim", "group", "block_size", "lengths", "splits"), [
    (torch.bfloat16, 128, 4, 16, [0, 77, 300], 3),   # the benchmark's 32/8 heads shape, split
    (torch.float16, 256, 16, 8, [45, 1], 1),         # 4 heads per row (16 heads over 4 rows)
    (torch.float16, 64, 2, 1, [270], 2),             # table window restaged inside a split
])
def test_shim_with_the_gpu_thread_count(shim_binary_gpu_config, tmp_path, dtype, head_dim, group, block_size,
                                        lengths, splits):
    q, k, v, tables, lens = make_paged_case(dtype, head_dim, group, block_size, lengths, seed=5)
    out = run_shim(shim_binary_gpu_config, tmp_path, q, k, v, lens, tables, num_splits=splits)
    ref = paged_decode_attention_reference(q, k, v, tables, lens)
    assert not torch.isnan(out).any()
    assert relative_error(out, ref) < TOLERANCE[dtype]


def test_shim_rounding_matches_torch_bit_for_bit(shim_binary, tmp_path):
    # Random magnitudes over the whole fp16 range and beyond, exact ties, subnormals, overflow, signed zero.
    gen = torch.Generator().manual_seed(0)
    values = torch.cat([
        torch.randn(20000, generator=gen) * torch.exp2(torch.randint(-30, 20, (20000,), generator=gen).float()),
        torch.tensor([0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e6, -1e6, 2.0**-24, 2.0**-25, 3 * 2.0**-25, 2.0**-14,
                      1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8, 1 + 3 * 2.0**-8, float("inf"), float("-inf")]),
    ])
    (tmp_path / "in.bin").write_bytes(values.numpy().tobytes())
    proc = subprocess.run([str(shim_binary), "--convert", str(tmp_path / "in.bin"), str(tmp_path / "out.bin")],
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    bits = torch.frombuffer(bytearray((tmp_path / "out.bin").read_bytes()), dtype=torch.int16)
    half_bits, bf16_bits = bits[: len(values)], bits[len(values):]
    assert torch.equal(half_bits, values.to(torch.float16).view(torch.int16))
    assert torch.equal(bf16_bits, values.to(torch.bfloat16).view(torch.int16))
