"""Accelerators: memory, bandwidth and dense FLOP/s, for `sim`'s step-time model and `size --gpu`.

Memory is what the serving engine sees: the total that cudaMemGetInfo / torch.cuda.mem_get_info reports,
which vLLM multiplies by gpu_memory_utilization. Where no log or measurement of that total was found, it is
DERIVED, and the preset says so: nominal capacity in GiB × 79.19 / 80, the share of its 80 GiB of HBM that an
H100 80GB shows the engine (vLLM 0.19.0's logs in ../shared/vllm_startup: total_memory=79.19GiB). Bandwidth
and dense (no sparsity) BF16 FLOP/s are the datasheets' (SXM / OAM parts):

- A100: "NVIDIA A100 Tensor Core GPU" datasheet (2021): 40GB HBM2 1,555 GB/s; 80GB HBM2e 2,039 GB/s;
  BF16 Tensor Core 312 TFLOPS (624 with sparsity). Memory MEASURED, both with CUDA driver 12.2 (R535, the one
  driver for which both totals were found), as CUDA's deviceQuery prints it (its totalGlobalMem, the total that
  cudaMemGetInfo and torch report: on an H100 80GB HBM3 with driver 12.8 it prints 85,028,896,768 B = 79.19 GiB,
  vLLM 0.19's total_memory above): 42,298,834,944 B (40,339.3 MiB, 39.39 GiB, not the nominal 40,960 MiB) on an
  A100-SXM4-40GB (bottlerocket-os/bottlerocket PR #3873; A100-PCIE-40GB logs with 12.2 print the same bytes);
  84,987,740,160 B (81,050.6 MiB, 79.15 GiB, not 81,920) on an A100-SXM4-80GB (maximilianmbeck/vlstm_cuda's
  README). The driver moves it a little: driver 12.5 prints 85,100,068,864 B (81,158 MiB, +0.13 %) on the 80GB
  (thamada/nvidia-smi, nvsim/A100SXMx4_deviceQuery.py), as 12.7 prints 81,106 MiB on the H100 against 12.8's
  81,090 (same repository, H100SXMx8_deviceQuery.py): a spread well inside size --gpu's 1 % goal.
- H100 SXM: "NVIDIA H100 Tensor Core GPU" datasheet (2023): 80GB HBM3, 3.35 TB/s; BF16 1,979 TFLOPS
  with sparsity, i.e. 989.5 TFLOPS dense.
- H200 SXM: "NVIDIA H200 Tensor Core GPU" datasheet (2024): 141GB HBM3e, 4.8 TB/s; BF16 1,979 TFLOPS with
  sparsity (989.5 dense).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ParameterError


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: memory (bytes), HBM bandwidth (bytes/s), peak dense bf16 (FLOP/s)."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    peak_flops: float
    source: str = ""


def _gib(text: str) -> int:
    """A logged GiB figure (two decimals) in bytes, to the MiB."""
    return round(float(text) * 1024) * 2**20


def _derived(nominal_gib: int) -> int:
    """Nominal capacity (GiB of memory) × 79.19 / 80: the H100's engine-visible share (see the docstring)."""
    return round(nominal_gib * 79.19 / 80 * 1024) * 2**20


GPU_PRESETS: dict[str, GpuSpec] = {
    g.name.lower(): g
    for g in (
        # measured: deviceQuery's total on A100-SXM4-40GB, driver 12.2 (see the docstring); 39.39 GiB.
        GpuSpec("A100-40GB", 42_298_834_944, 1.555e12, 312e12,
                "deviceQuery, driver 12.2 (memory); NVIDIA A100 datasheet, SXM4 40GB"),
        # measured: deviceQuery's total on A100-SXM4-80GB, driver 12.2 (see the docstring); 79.15 GiB.
        GpuSpec("A100-80GB", 84_987_740_160, 2.039e12, 312e12,
                "deviceQuery, driver 12.2 (memory); NVIDIA A100 datasheet, SXM4 80GB"),
        # measured: vLLM 0.19.0's "total_memory=79.19GiB" on H100 80GB HBM3 (llm-d planner logs); 79.19 GiB.
        GpuSpec("H100-SXM", _gib("79.19"), 3.35e12, 989.5e12, "vLLM 0.19.0 logs (memory); H100 datasheet, SXM5 80GB"),
        # 141 GB HBM3e; the engine's total not found in a log here: DERIVED 141 × 79.19 / 80 = 139.57 GiB.
        GpuSpec("H200", _derived(141), 4.8e12, 989.5e12, "derived memory; NVIDIA H200 datasheet, SXM 141GB"),
        # B200 (HGX, 180 GB HBM3e usable per GPU), 8 TB/s, 2.25 PFLOPS dense BF16: DERIVED 180 × 79.19 / 80.
        GpuSpec("B200", _derived(180), 8e12, 2.25e15, "derived memory; NVIDIA HGX B200 datasheet"),
        # B300 (Blackwell Ultra, 288 GB HBM3e), 8 TB/s, ~2.25 PFLOPS dense BF16: DERIVED 288 × 79.19 / 80.
        GpuSpec("B300", _derived(288), 8e12, 2.25e15, "derived memory; NVIDIA HGX B300 datasheet"),
        # GB200 NVL72 (186 GB HBM3e per Blackwell GPU), 8 TB/s, 2.5 PFLOPS dense BF16: DERIVED 186 × 79.19 / 80.
        GpuSpec("GB200", _derived(186), 8e12, 2.5e15, "derived memory; NVIDIA GB200 NVL72 datasheet (per GPU)"),
        # AMD Instinct MI300X: 192 GB HBM3, 5.3 TB/s, 1.307 PFLOPS dense BF16: DERIVED 192 × 79.19 / 80.
        GpuSpec("MI300X", _derived(192), 5.3e12, 1.307e15, "derived memory; AMD Instinct MI300X datasheet"),
        # AMD Instinct MI355X: 288 GB HBM3E, 8 TB/s, 2.5 PFLOPS dense BF16: DERIVED 288 × 79.19 / 80.
        GpuSpec("MI355X", _derived(288), 8e12, 2.5e15, "derived memory; AMD Instinct MI355X datasheet"),
        # NVIDIA L40S: 48 GB GDDR6, 864 GB/s, 362 TFLOPS dense BF16: DERIVED 48 × 79.19 / 80.
        GpuSpec("L40S", _derived(48), 0.864e12, 362e12, "derived memory; NVIDIA L40S datasheet"),
        # NVIDIA RTX PRO 6000 Blackwell: 96 GB GDDR7, 1.792 TB/s, ~500 TFLOPS dense BF16: DERIVED 96 × 79.19 / 80.
        GpuSpec("RTX-6000-Pro", _derived(96), 1.792e12, 500e12, "derived memory; NVIDIA RTX PRO 6000 Blackwell "
                                                                 "datasheet"),
    )
}


def get_gpu(name: str, otherwise: str | None = "or give {gpu_memory} {bandwidth} {flops}") -> GpuSpec:
    """A preset by name (any case); ValueError listing the presets (first those whose name starts with `name`:
    H100 -> H100-SXM) and then `otherwise` (an "or ..." clause, or a parenthesis; None: nothing)."""
    gpu = GPU_PRESETS.get(name.strip().lower())
    if gpu is None:
        names = ", ".join(g.name for g in GPU_PRESETS.values())
        close = [g.name for key, g in GPU_PRESETS.items() if name.strip() and key.startswith(name.strip().lower())]
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        tail = "" if otherwise is None else (" " if otherwise.startswith("(") else ", ") + otherwise
        raise ParameterError(f"unknown GPU {name!r}: {hint}choose one of {names}{tail}", "gpu", "gpu_memory",
                             "bandwidth", "flops")  # the options of a custom GPU, marked in the default `otherwise`
    return gpu


def custom_gpu(memory_bytes: int, bandwidth_bytes_per_s: float, peak_flops: float) -> GpuSpec:
    for what, value in (("memory_bytes", memory_bytes), ("bandwidth_bytes_per_s", bandwidth_bytes_per_s),
                        ("peak_flops", peak_flops)):
        if not value > 0:
            raise ParameterError(f"{what} must be positive, got {value}", what)
    return GpuSpec("custom", int(memory_bytes), float(bandwidth_bytes_per_s), float(peak_flops), "given")
