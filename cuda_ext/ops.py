"""torch-facing decode-attention ops: validate every tensor, then launch the CUDA kernel on the current stream.

Shapes (see csrc/decode_params.h; T is torch.float16 or torch.bfloat16):

    q              [batch, num_q_heads, head_dim]                        T, CUDA, contiguous
    k_cache/v_cache [num_blocks, block_size, num_kv_heads, head_dim]     T   (paged, vLLM flash layout)
    k/v            [batch, max_len, num_kv_heads, head_dim]              T   (contiguous baseline)
    block_tables   [batch, max_blocks_per_seq]                           int32, physical block ids
    seq_lens       [batch]                                               int32, 0 <= len <= table capacity
    returns out    [batch, num_q_heads, head_dim]                        T

head_dim is 64, 128 or 256; num_q_heads = group * num_kv_heads with group 1..16 (query head h reads KV
head h // group); block_size is a power of two in 1..256. Bad input raises ValueError naming the value.
"""

from __future__ import annotations

import ctypes
import math
from functools import lru_cache
from typing import Any

from ..core.errors import CudaUnavailableError

HEAD_DIMS = (64, 128, 256)
MAX_GROUP = 16
MAX_BLOCK_SIZE = 256
MAX_SPLITS = 64
MIN_TOKENS_PER_SPLIT = 256  # below this the merge and the per-CTA set-up outweigh the extra parallelism
RESIDENT_CTAS_PER_SM = 4  # 128 threads and 41-51 KiB of shared memory per CTA: 4 fit in 228 KiB (H100/H200)


def _torch() -> Any:
    import torch

    return torch


def choose_num_splits(batch: int, num_kv_heads: int, max_len: int, sm_count: int) -> int:
    """Split-KV partitions per sequence. One CTA per (sequence, KV head) fills the GPU once there are at
    least two per SM; below that, each sequence is cut into slices of >= MIN_TOKENS_PER_SPLIT tokens, as
    many as keep all CTAs within one wave of RESIDENT_CTAS_PER_SM per SM (a partial second wave would
    leave most SMs idle at the end)."""
    ctas = batch * num_kv_heads
    if ctas == 0 or ctas >= 2 * sm_count:
        return 1
    wanted = RESIDENT_CTAS_PER_SM * sm_count // ctas
    useful = max(1, max_len // MIN_TOKENS_PER_SPLIT)
    return max(1, min(wanted, useful, MAX_SPLITS))


def _check_tensor(name: str, t: Any, dtype: Any, ndim: int, device: Any, require_cuda: bool) -> None:
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}, expected {dtype}; convert it with .to({dtype})")
    if t.dim() != ndim:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {ndim} dimensions")
    if require_cuda and t.device.type != "cuda":
        raise ValueError(f"{name} is on {t.device}, expected a CUDA device; move it with .cuda()")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}; put all tensors on one device")
    if not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous; call .contiguous() first")


def _check_q(q: Any, require_cuda: bool) -> tuple[int, int, int]:
    torch = _torch()
    if not isinstance(q, torch.Tensor) or q.dtype not in (torch.float16, torch.bfloat16):
        got = q.dtype if isinstance(q, torch.Tensor) else type(q).__name__
        raise ValueError(f"q must be a float16 or bfloat16 tensor, got {got}")
    _check_tensor("q", q, q.dtype, 3, q.device, require_cuda)
    batch, num_q_heads, head_dim = q.shape
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} is not supported; use one of {HEAD_DIMS}")
    return batch, num_q_heads, head_dim


def _check_heads(num_q_heads: int, num_kv_heads: int) -> None:
    if num_kv_heads < 1 or num_q_heads % num_kv_heads or not 1 <= num_q_heads // num_kv_heads <= MAX_GROUP:
        raise ValueError(
            f"{num_q_heads} query heads over {num_kv_heads} KV heads is not a GQA group of 1..{MAX_GROUP}; "
            "num_q_heads must be num_kv_heads times 1..16"
        )


def _check_kv(k_name: str, k: Any, v_name: str, v: Any, q: Any, require_cuda: bool) -> None:
    """K and V: 4-d, q's dtype and device, contiguous, and the same shape."""
    for name, t in ((k_name, k), (v_name, v)):
        _check_tensor(name, t, q.dtype, 4, q.device, require_cuda)
    if k.shape != v.shape:
        raise ValueError(f"{k_name} {tuple(k.shape)} and {v_name} {tuple(v.shape)} differ in shape")


def validate_paged(q, k_cache, v_cache, block_tables, seq_lens, *, require_cuda: bool = True) -> None:
    """Every check the paged op makes before it launches (reads block_tables and seq_lens on the host)."""
    torch = _torch()
    batch, num_q_heads, head_dim = _check_q(q, require_cuda)
    _check_kv("k_cache", k_cache, "v_cache", v_cache, q, require_cuda)
    num_blocks, block_size, num_kv_heads, kv_dim = k_cache.shape
    if kv_dim != head_dim:
        raise ValueError(f"k_cache head_dim {kv_dim} differs from q's {head_dim}")
    if block_size < 1 or block_size > MAX_BLOCK_SIZE or block_size & (block_size - 1):
        raise ValueError(f"block_size {block_size} is not a power of two in 1..{MAX_BLOCK_SIZE}")
    _check_heads(num_q_heads, num_kv_heads)
    _check_tensor("block_tables", block_tables, torch.int32, 2, q.device, require_cuda)
    _check_tensor("seq_lens", seq_lens, torch.int32, 1, q.device, require_cuda)
    if block_tables.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(
            f"block_tables has {block_tables.shape[0]} rows and seq_lens {seq_lens.shape[0]} entries, "
            f"but q has batch {batch}"
        )
    lens = seq_lens.cpu().to(torch.int64)
    capacity = block_tables.shape[1] * block_size
    if batch and (int(lens.min()) < 0 or int(lens.max()) > capacity):
        raise ValueError(
            f"seq_lens must lie in 0..{capacity} (max_blocks_per_seq {block_tables.shape[1]} x block_size "
            f"{block_size}), got {int(lens.min())}..{int(lens.max())}"
        )
    needed = (lens + block_size - 1) // block_size  # live blocks per sequence: only those are read
    live = torch.arange(block_tables.shape[1])[None, :] < needed[:, None]
    ids = block_tables.cpu()[live]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_blocks):
        raise ValueError(
            f"block_tables holds block id {int(ids.min()) if int(ids.min()) < 0 else int(ids.max())} for a live "
            f"token, outside 0..{num_blocks - 1} (k_cache has {num_blocks} blocks)"
        )


def validate_contiguous(q, k, v, seq_lens, *, require_cuda: bool = True) -> None:
    torch = _torch()
    batch, num_q_heads, head_dim = _check_q(q, require_cuda)
    _check_kv("k", k, "v", v, q, require_cuda)
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k has shape {tuple(k.shape)}, expected [{batch}, max_len, num_kv_heads, {head_dim}]")
    _check_heads(num_q_heads, k.shape[2])
    _check_tensor("seq_lens", seq_lens, torch.int32, 1, q.device, require_cuda)
    if seq_lens.shape[0] != batch:
        raise ValueError(f"seq_lens has {seq_lens.shape[0]} entries but q has batch {batch}")
    lens = seq_lens.cpu()
    if batch and (int(lens.min()) < 0 or int(lens.max()) > k.shape[1]):
        raise ValueError(
            f"seq_lens must lie in 0..{k.shape[1]} (max_len of k), got {int(lens.min())}..{int(lens.max())}"
        )


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """Builds (first use) or loads the extension for this GPU's architecture; CudaUnavailableError if
    there is no GPU, no driver or no nvcc."""
    torch = _torch()
    if not torch.cuda.is_available():
        built_with = torch.version.cuda or "no CUDA (a CPU-only build)"
        raise CudaUnavailableError(
            f"no CUDA device is available to torch {torch.__version__} (built with {built_with}); use --device cpu"
        )
    from .build import build_library, load_library, require_device

    major, minor = torch.cuda.get_device_capability()
    lib = load_library(build_library([f"{major}{minor}"]).library_path)
    require_device(lib)
    return lib


def _ptr(t: Any) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() if t is not None else 0)


def _run(
    paged: bool, q, k, v, block_tables, seq_lens, scale: float | None, num_splits: int | None, out
) -> Any:
    torch = _torch()
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale {scale} must be finite")
    max_len = block_tables.shape[1] * k.shape[1] if paged else k.shape[1]
    if num_splits is None:
        sm_count = torch.cuda.get_device_properties(q.device).multi_processor_count
        num_splits = choose_num_splits(batch, num_kv_heads, max_len, sm_count)
    if not 1 <= num_splits <= 1024:
        raise ValueError(f"num_splits {num_splits} must lie in 1..1024")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or not out.is_contiguous():
        raise ValueError("out must be a contiguous tensor with q's shape, dtype and device")
    partial_o = partial_lse = None
    if num_splits > 1:
        partial_o = torch.empty(batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        partial_lse = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
    lib = library()
    dtype_code = 1 if q.dtype == torch.bfloat16 else 0
    stream = ctypes.c_void_p(torch.cuda.current_stream(q.device).cuda_stream)
    with torch.cuda.device(q.device):
        if paged:
            rc = lib.kvcalc_decode_paged(
                _ptr(q), _ptr(k), _ptr(v), _ptr(block_tables), _ptr(seq_lens), _ptr(out), _ptr(partial_o),
                _ptr(partial_lse), dtype_code, batch, num_q_heads, num_kv_heads, head_dim, k.shape[1],
                block_tables.shape[1], scale, num_splits, stream,
            )
        else:
            rc = lib.kvcalc_decode_contiguous(
                _ptr(q), _ptr(k), _ptr(v), _ptr(seq_lens), _ptr(out), _ptr(partial_o), _ptr(partial_lse),
                dtype_code, batch, num_q_heads, num_kv_heads, head_dim, k.shape[1], scale, num_splits, stream,
            )
    if rc != 0:
        raise RuntimeError(f"decode kernel launch failed: {lib.kvcalc_error_string(rc).decode()} (code {rc})")
    return out


def paged_decode_attention(
    q, k_cache, v_cache, block_tables, seq_lens, scale: float | None = None, num_splits: int | None = None,
    out=None, *, validate: bool = True,
):
    """Decode attention through block tables. `validate=False` skips the checks (and their host sync);
    the benchmark validates once, then times unchecked launches."""
    if validate:
        validate_paged(q, k_cache, v_cache, block_tables, seq_lens)
    return _run(True, q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, out)


def contiguous_decode_attention(
    q, k, v, seq_lens, scale: float | None = None, num_splits: int | None = None, out=None, *, validate: bool = True
):
    """The same kernel over a contiguous cache [batch, max_len, num_kv_heads, head_dim] (the baseline)."""
    if validate:
        validate_contiguous(q, k, v, seq_lens)
    return _run(False, q, k, v, None, seq_lens, scale, num_splits, out)
