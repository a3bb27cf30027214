"""CI checks of the CUDA extension without a GPU: nvcc compiles it for sm_80 and sm_90 with warnings as
errors, no kernel spills to local memory (the ptxas report is captured: shown on failure), the real loader loads it, and
with no device the op and the CLI fail cleanly (CudaUnavailableError, exit 3)."""

from __future__ import annotations

import shutil

import pytest

from kvcalc.core.errors import CudaUnavailableError
from kvcalc.cuda_ext import build

pytestmark = pytest.mark.nvcc

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not build.Path("/usr/local/cuda/bin/nvcc").exists(),
                                reason="nvcc is not installed: the CUDA sources cannot be compiled here")

PTXAS_SAMPLE = """\
ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90'
ptxas info    : Function properties for _Z6kernelPf
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers
ptxas info    : Compiling entry function '_Z5otherv' for 'sm_80'
ptxas info    : Function properties for _Z5otherv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers
"""


def test_parse_ptxas_report_reads_registers_stack_and_spills():
    kernels = build.parse_ptxas_report(PTXAS_SAMPLE)
    assert kernels == [
        build.KernelResources("_Z6kernelPf", "sm_90", 255, 16, 8, 4),
        build.KernelResources("_Z5otherv", "sm_80", 40, 0, 0, 0),
    ]
    assert [k.spills for k in kernels] == [True, False]


def test_cache_key_depends_on_arch_flags_and_compiler():
    base = build.cache_key(("80", "90"), "nvcc 13.0")
    assert base == build.cache_key(("80", "90"), "nvcc 13.0")
    assert base != build.cache_key(("90",), "nvcc 13.0")
    assert base != build.cache_key(("80", "90"), "nvcc 12.4")
    assert base != build.cache_key(("80", "90"), "nvcc 13.0", (*build.NVCC_FLAGS, "-G"))


def test_gencode_targets_each_arch_and_ptx_of_the_newest():
    assert build.gencode_flags(["80", "90"]) == [
        "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
        "-gencode", "arch=compute_90,code=compute_90",
    ]


def test_bad_arch_is_a_value_error():
    with pytest.raises(ValueError, match="compute capabilities"):
        build.build_library(["sm_90"])


def test_missing_nvcc_is_cuda_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(build, "Path", _NoLocalCuda)
    with pytest.raises(CudaUnavailableError, match="nvcc"):
        build.find_nvcc()


class _NoLocalCuda(type(build.Path())):
    def is_file(self) -> bool:  # hides /usr/local/cuda/bin/nvcc
        return False


@pytest.fixture(scope="session")
def built() -> build.BuildResult:
    """One build for the whole session (and across sessions: the cache is keyed by sources and flags)."""
    result = build.build_library(["80", "90"])
    assert result.library_path.exists()
    return result


@needs_nvcc
def test_compiles_for_sm80_and_sm90_without_spills(built):
    kernels = built.kernels
    archs = {k.arch for k in kernels}
    assert archs == {"sm_80", "sm_90"}
    # 2 dtypes x 3 head dims x (paged, contiguous) decode kernels + 2 merge kernels, per architecture
    assert len(kernels) == 2 * (12 + 2)
    lines = [f"ptxas report ({'cached build' if built.cached else f'compiled in {built.compile_s:.1f} s'}):"]
    lines += [f"  {k.arch} {k.registers:3d} regs, stack {k.stack_bytes} B, spill st/ld "
              f"{k.spill_store_bytes}/{k.spill_load_bytes} B  {k.name}" for k in kernels]
    print("\n".join(lines))  # captured: pytest shows it when the test fails, or with -s (-rP: after a pass)
    spilled = [k.name for k in kernels if k.spills or k.stack_bytes]
    assert not spilled, "kernels use local memory: {}\n{}".format(spilled, "\n".join(lines))


@needs_nvcc
def test_second_build_is_cached(built):
    again = build.build_library(["90", "80"])
    assert again.cached and again.library_path == built.library_path
    assert again.compile_s == 0.0


@needs_nvcc
def test_library_loads_and_reports_no_device(built):
    lib = build.load_library(built.library_path)
    assert lib.kvcalc_abi_version() == build.ABI_VERSION
    assert lib.kvcalc_error_string(-3).decode() == "block_size must be a power of two in 1..256"
    if lib.kvcalc_device_count() > 0:
        pytest.skip("a CUDA device is present: the no-device path cannot be exercised")
    with pytest.raises(CudaUnavailableError, match="no CUDA device"):
        build.require_device(lib)


@needs_nvcc
def test_abi_rejects_bad_parameters_before_touching_the_device(built):
    # Parameter checks (make_decode_params) run before any CUDA call, so they work without a GPU.
    lib = build.load_library(built.library_path)
    null = build.ctypes.c_void_p(0)
    # head_dim 96 -> -1; 6 query heads over 4 KV heads -> -2; block size 3 -> -3; 0 splits -> -4
    args = dict(dtype=0, batch=1, hq=8, hkv=2, d=128, bs=16, mb=4, splits=1)
    for change, code in (({"d": 96}, -1), ({"hq": 6, "hkv": 4}, -2), ({"bs": 3}, -3), ({"splits": 0}, -4),
                         ({"dtype": 7}, -6)):
        a = {**args, **change}
        rc = lib.kvcalc_decode_paged(null, null, null, null, null, null, null, null, a["dtype"], a["batch"], a["hq"],
                                     a["hkv"], a["d"], a["bs"], a["mb"], 1.0, a["splits"], null)
        assert rc == code


FAKE_NVCC = """#!/usr/bin/env python3
import pathlib, sys, time
log = pathlib.Path(sys.argv[0]).with_name("calls.txt")
if "--version" in sys.argv:
    print("Cuda compilation tools, fake nvcc 0.0")
    sys.exit(0)
with open(log, "a") as f:
    f.write("compile\\n")
time.sleep(1.0)  # long enough for the second builder to arrive while the first holds the lock
out = sys.argv[sys.argv.index("-o") + 1]
pathlib.Path(out).write_bytes(b"not really a library")
print("ptxas info    : Compiling entry function 'k' for 'sm_90'")
print("    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
print("ptxas info    : Used 32 registers, used 0 barriers")
"""


def test_concurrent_first_builds_compile_once(monkeypatch, tmp_path):
    # A fake nvcc counts its compilations: two builders racing for the same key compile once, under the lock.
    import threading

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    results: list[build.BuildResult] = []
    threads = [threading.Thread(target=lambda: results.append(build.build_library(["90"], tmp_path / "cache")))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (bin_dir / "calls.txt").read_text() == "compile\n"
    assert sorted(r.cached for r in results) == [False, True]
    assert results[0].library_path == results[1].library_path
    assert results[0].kernels == [build.KernelResources("k", "sm_90", 32, 0, 0, 0)]
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # the temporary output was renamed into place


def test_op_library_without_a_gpu_is_cuda_unavailable():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    from kvcalc.cuda_ext import ops

    with pytest.raises(CudaUnavailableError, match="no CUDA device"):
        ops.library()
