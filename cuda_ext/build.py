"""Build the CUDA extension with nvcc at first use, cache it, and load it with ctypes.

The shared library is cached under `$KVCALC_CACHE_DIR` (default `~/.cache/kvcalc`) in a file named by a
hash of the sources, the flags, `nvcc --version` and the target architectures, so a change to any of
them rebuilds and nothing stale is ever loaded. A file lock (fcntl) makes concurrent first uses compile
once; the library is written to a temporary name and renamed into place. The ptxas report
(`-Xptxas -v`: registers, stack frame, spills per kernel) is kept beside the library as `<key>.log`.

The library exposes a small C ABI (csrc/decode_attention.cu) and does not link against torch, so CI —
nvcc but no GPU — can compile it, load it and check the "no CUDA device" path.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import CudaUnavailableError

CSRC_DIR = Path(__file__).parent / "csrc"
SOURCES = ("decode_attention.cu", "decode_attention.cuh", "decode_params.h", "intrinsics_cuda.cuh")
ABI_VERSION = 1
# Warnings are errors in our code (host and device); ptxas reports registers and spills for every kernel.
NVCC_FLAGS = (
    "-O3",
    "-std=c++17",
    "-shared",
    "-Xcompiler",
    "-fPIC,-Wall,-Wextra,-Werror",
    "-Werror",
    "all-warnings",
    "-Xptxas",
    "-v",
    "--threads",
    "2",  # the architectures compile in parallel
)


@dataclass(frozen=True)
class KernelResources:
    """One kernel's line of the ptxas report for one architecture."""

    name: str
    arch: str
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


@dataclass(frozen=True)
class BuildResult:
    library_path: Path
    archs: tuple[str, ...]
    ptxas_log: str
    compile_s: float  # 0.0 when the cached library was used
    cached: bool

    @property
    def kernels(self) -> list[KernelResources]:
        return parse_ptxas_report(self.ptxas_log)


def cache_dir() -> Path:
    return Path(os.environ.get("KVCALC_CACHE_DIR") or Path.home() / ".cache" / "kvcalc")


def find_nvcc() -> Path:
    """nvcc from $CUDA_HOME/bin, then PATH, then /usr/local/cuda/bin; CudaUnavailableError if none."""
    candidates = []
    if os.environ.get("CUDA_HOME"):
        candidates.append(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise CudaUnavailableError(
        "nvcc (the CUDA compiler) was not found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin; "
        "install the CUDA toolkit, or use --device cpu"
    )


def nvcc_version(nvcc: Path) -> str:
    proc = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def gencode_flags(archs: Sequence[str]) -> list[str]:
    """`-gencode` for each architecture's own machine code (e.g. "90" -> sm_90), plus PTX of the newest
    so that a newer GPU can still JIT it."""
    flags = []
    for arch in archs:
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    newest = max(archs, key=int)
    return [*flags, "-gencode", f"arch=compute_{newest},code=compute_{newest}"]


def cache_key(archs: Sequence[str], nvcc_version_text: str, flags: Sequence[str] = NVCC_FLAGS) -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode())
        digest.update((CSRC_DIR / name).read_bytes())
    digest.update("\0".join(flags).encode())
    digest.update(nvcc_version_text.encode())
    digest.update(",".join(archs).encode())
    return digest.hexdigest()[:24]


def build_library(archs: Sequence[str], directory: Path | None = None) -> BuildResult:
    """Compiles (or reuses) the extension for the given compute capabilities, e.g. ("80", "90")."""
    if not archs or not all(a.isdigit() for a in archs):
        raise ValueError(f"architectures must be compute capabilities such as '90', got {list(archs)}")
    archs = tuple(sorted(set(archs), key=int))
    nvcc = find_nvcc()
    key = cache_key(archs, nvcc_version(nvcc))
    directory = directory or cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    library, log_path = directory / f"kvcalc_decode_{key}.so", directory / f"kvcalc_decode_{key}.log"
    with open(directory / f"kvcalc_decode_{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the library built
        if library.exists() and log_path.exists():
            return BuildResult(library, archs, log_path.read_text(), 0.0, True)
        tmp = directory / f".kvcalc_decode_{key}.{os.getpid()}.so"
        cmd = [str(nvcc), *NVCC_FLAGS, *gencode_flags(archs), "-o", str(tmp), str(CSRC_DIR / "decode_attention.cu")]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        compile_s = time.perf_counter() - start
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{proc.stdout}{proc.stderr}")
        log_path.write_text(proc.stdout + proc.stderr)
        os.replace(tmp, library)
        return BuildResult(library, archs, log_path.read_text(), compile_s, False)


_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>sm_\d+a?)'")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<store>\d+) bytes spill stores, (?P<load>\d+) bytes spill loads"
)
_REGS = re.compile(r"Used (?P<regs>\d+) registers")


def parse_ptxas_report(log: str) -> list[KernelResources]:
    """One KernelResources per 'Compiling entry function' block of `nvcc -Xptxas -v` output."""
    kernels: list[KernelResources] = []
    name = arch = None
    frame: re.Match[str] | None = None
    for line in log.splitlines():
        if match := _ENTRY.search(line):
            name, arch, frame = match["name"], match["arch"], None
        elif (match := _FRAME.search(line)) and name:
            frame = match
        elif (match := _REGS.search(line)) and name and arch:
            kernels.append(KernelResources(
                name=name,
                arch=arch,
                registers=int(match["regs"]),
                stack_bytes=int(frame["stack"]) if frame else 0,
                spill_store_bytes=int(frame["store"]) if frame else 0,
                spill_load_bytes=int(frame["load"]) if frame else 0,
            ))
            name = arch = None
    return kernels


def load_library(path: Path) -> ctypes.CDLL:
    """Loads the library and declares the C ABI's argument types (see csrc/decode_attention.cu)."""
    lib = ctypes.CDLL(str(path))
    c_int, c_float, ptr = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    lib.kvcalc_abi_version.restype = c_int
    lib.kvcalc_device_count.restype = c_int
    lib.kvcalc_error_string.restype = ctypes.c_char_p
    lib.kvcalc_error_string.argtypes = [c_int]
    lib.kvcalc_decode_paged.restype = c_int
    lib.kvcalc_decode_paged.argtypes = [ptr] * 8 + [c_int] * 7 + [c_float, c_int, ptr]
    lib.kvcalc_decode_contiguous.restype = c_int
    lib.kvcalc_decode_contiguous.argtypes = [ptr] * 7 + [c_int] * 6 + [c_float, c_int, ptr]
    if lib.kvcalc_abi_version() != ABI_VERSION:
        raise RuntimeError(f"{path} has ABI {lib.kvcalc_abi_version()}, expected {ABI_VERSION}; delete it")
    return lib


def require_device(lib: ctypes.CDLL) -> int:
    """The number of CUDA devices the library's runtime sees; CudaUnavailableError if there is none."""
    count = lib.kvcalc_device_count()
    if count <= 0:
        reason = lib.kvcalc_error_string(-count).decode() if count < 0 else "no device"
        raise CudaUnavailableError(f"no CUDA device is available ({reason}); use --device cpu")
    return count
