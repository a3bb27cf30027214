"""Accelerators: memory, bandwidth and dense FLOP/s, for `sim`'s step-time model and `size --gpu`.

Memory is the capacity the driver reports (nvidia-smi MiB) for the datasheet's size; bandwidth and dense
(no sparsity) BF16 Tensor Core FLOP/s are the SXM figures of NVIDIA's datasheets:

- A100: "NVIDIA A100 Tensor Core GPU" datasheet (2021): 40GB HBM2 1,555 GB/s; 80GB HBM2e 2,039 GB/s;
  BF16 Tensor Core 312 TFLOPS (624 with sparsity).
- H100 SXM: "NVIDIA H100 Tensor Core GPU" datasheet (2023): 80GB HBM3, 3.35 TB/s; BF16 1,979 TFLOPS
  with sparsity, i.e. 989.5 TFLOPS dense.
- H200 SXM: "NVIDIA H200 Tensor Core GPU" datasheet (2024): 141GB HBM3e, 4.8 TB/s; BF16 1,979 TFLOPS with
  sparsity (989.5 dense).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: memory (bytes), HBM bandwidth (bytes/s), peak dense bf16 (FLOP/s)."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    peak_flops: float
    source: str = ""


GPU_PRESETS: dict[str, GpuSpec] = {
    g.name.lower(): g
    for g in (
        GpuSpec("A100-40GB", 40_960 * 2**20, 1.555e12, 312e12, "NVIDIA A100 datasheet, SXM4 40GB"),
        GpuSpec("A100-80GB", 81_920 * 2**20, 2.039e12, 312e12, "NVIDIA A100 datasheet, SXM4 80GB"),
        GpuSpec("H100-SXM", 81_559 * 2**20, 3.35e12, 989.5e12, "NVIDIA H100 datasheet, SXM5 80GB"),
        GpuSpec("H200", 143_771 * 2**20, 4.8e12, 989.5e12, "NVIDIA H200 datasheet, SXM 141GB"),
    )
}


def get_gpu(name: str, otherwise: str = "or give --gpu-memory --bandwidth --flops") -> GpuSpec:
    """A preset by name (any case); ValueError listing the presets and then `otherwise`."""
    gpu = GPU_PRESETS.get(name.strip().lower())
    if gpu is None:
        names = ", ".join(g.name for g in GPU_PRESETS.values())
        raise ValueError(f"unknown GPU {name!r}: choose one of {names}, {otherwise}")
    return gpu


def custom_gpu(memory_bytes: int, bandwidth_bytes_per_s: float, peak_flops: float) -> GpuSpec:
    for what, value in (("--gpu-memory", memory_bytes), ("--bandwidth", bandwidth_bytes_per_s),
                        ("--flops", peak_flops)):
        if not value > 0:
            raise ValueError(f"{what} must be positive, got {value}")
    return GpuSpec("custom", int(memory_bytes), float(bandwidth_bytes_per_s), float(peak_flops), "given")
