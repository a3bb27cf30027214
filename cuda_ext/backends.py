"""The two back ends of `kvcalc bench` and the entry point that wires one to the harness (bench.py).

`run_suite(config, tick, building)` checks what the device needs (GPU, nvcc) and raises
CudaUnavailableError, and refuses a run whose memory does not fit (ParameterError), before doing any
work; `building` is a context manager factory that the CLI uses to show a spinner while the extension
compiles on first use.
"""

from __future__ import annotations

import contextlib
import platform
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from ..core.errors import CudaUnavailableError
from .bench import CPU_LABEL, Backend, BenchConfig, DecodeInputs, pinned_cpu_threads, run_bench
from .flex_paged import flex_paged_op

CUDA_LABEL = "CUDA extension (kvcalc.cuda_ext, paged and contiguous decode kernels)"


def _into(x: DecodeInputs, result: Any) -> Any:
    if x.out is not None:
        x.out.copy_(result)
        return x.out
    return result


class CpuReferenceBackend(Backend):
    """The pure-torch references in float32, rounded to the input dtype like a kernel's output."""

    label = CPU_LABEL

    def paged(self, x: DecodeInputs, num_splits: int | None) -> Any:
        import torch

        from .reference import paged_decode_attention_reference

        out = paged_decode_attention_reference(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens,
                                               compute_dtype=torch.float32)
        return _into(x, out.to(x.q.dtype))

    def contiguous(self, x: DecodeInputs, num_splits: int | None) -> Any:
        import torch

        from .reference import decode_attention_reference

        out = decode_attention_reference(x.q, x.k, x.v, x.seq_lens, compute_dtype=torch.float32)
        return _into(x, out.to(x.q.dtype))


class CudaBackend(Backend):
    """The extension; validates on untimed calls (no `out`), launches unchecked on timed ones."""

    label = CUDA_LABEL

    def paged(self, x: DecodeInputs, num_splits: int | None) -> Any:
        from .ops import paged_decode_attention

        return paged_decode_attention(x.q, x.k_cache, x.v_cache, x.block_tables, x.seq_lens,
                                      num_splits=num_splits, out=x.out, validate=x.out is None)

    def contiguous(self, x: DecodeInputs, num_splits: int | None) -> Any:
        from .ops import contiguous_decode_attention

        return contiguous_decode_attention(x.q, x.k, x.v, x.seq_lens, num_splits=num_splits,
                                           out=x.out, validate=x.out is None)


def sdpa_op(x: DecodeInputs) -> Callable[[], Any]:
    """torch SDPA on the contiguous cache (timing inputs have one length, so no mask is needed)."""
    import torch.nn.functional as F

    context = int(x.seq_lens[0])
    q = x.q.unsqueeze(2)  # [B, Hq, 1, D]
    k = x.k[:, :context].transpose(1, 2)  # [B, Hkv, T, D], a view
    v = x.v[:, :context].transpose(1, 2)
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def _nvidia_driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                          text=True, check=False)
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else None


def cuda_device_info(device: Any) -> dict[str, Any]:
    import torch

    from .build import find_nvcc, nvcc_version

    props = torch.cuda.get_device_properties(device)
    return {
        "type": "cuda", "name": props.name, "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count, "memory_bytes": props.total_memory, "driver": _nvidia_driver(),
        "cuda": torch.version.cuda, "torch": torch.__version__, "nvcc": nvcc_version(find_nvcc()).splitlines()[-1],
    }


def cpu_device_info() -> dict[str, Any]:
    import torch

    return {"type": "cpu", "name": platform.processor() or platform.machine(), "label": CPU_LABEL,
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def run_suite(
    config: BenchConfig,
    tick: Callable[[str], None],
    building: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
) -> dict[str, Any]:
    import torch

    from .memory import check_run_fits

    if config.device == "cpu":
        from .timing import cpu_median_us

        check_run_fits(config)
        with pinned_cpu_threads() as threads:
            return run_bench(
                config, CpuReferenceBackend(), device=torch.device("cpu"), device_info={**cpu_device_info(), **threads},
                copy_tbps=None, tick=tick,
                time_op=lambda op, prepare: cpu_median_us(op, prepare, iters=config.iters, warmup=config.warmup),
            )
    if not torch.cuda.is_available():
        raise CudaUnavailableError(
            f"--device cuda needs a CUDA GPU, but torch {torch.__version__} sees none "
            f"({'built without CUDA' if torch.version.cuda is None else 'no device or driver'}); use --device cpu"
        )
    from . import ops
    from .build import find_nvcc
    from .timing import CudaTimer

    find_nvcc()
    device = torch.device("cuda", torch.cuda.current_device())
    free_bytes, _ = torch.cuda.mem_get_info(device)
    check_run_fits(config, (free_bytes, "free on the GPU, torch.cuda.mem_get_info"),
                   torch.cuda.get_device_properties(device).multi_processor_count)
    with building():
        ops.library()
    timer = CudaTimer(device)

    def time_op(op: Callable[[], Any], prepare: Callable[[], Any] | None) -> float:
        return timer.median_us(op, prepare, iters=config.iters, warmup=config.warmup)

    tick("device-to-device copy ceiling")
    copy_tbps = timer.copy_tbps(iters=config.iters, warmup=config.warmup)
    return run_bench(
        config, CudaBackend(), device=device, device_info=cuda_device_info(device), copy_tbps=copy_tbps, tick=tick,
        time_op=time_op, extra_timers={"sdpa_us": sdpa_op, **({"flex_paged_us": flex_paged_op} if config.flex else {})},
    )
