"""`kvcalc bench` refuses a run that cannot fit before allocating it: the byte estimate against the tensors
it makes (exact) and against the peak memory a CPU run reaches (measured), and the one-line refusal."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from kvcalc.core.errors import ParameterError  # noqa: E402
from kvcalc.cuda_ext.bench import BenchConfig, make_inputs  # noqa: E402
from kvcalc.cuda_ext.memory import check_run_fits, shape_bytes  # noqa: E402


@pytest.mark.parametrize(("batch", "context", "block_size"), [(1, 16, 16), (3, 40, 16), (2, 1000, 1), (4, 257, 256)])
def test_input_bytes_are_the_bytes_of_the_tensors_made(batch, context, block_size):
    x = make_inputs([context] * batch, 8, 2, 64, block_size, torch.bfloat16, "cpu", torch.Generator().manual_seed(0))
    tensors = [getattr(x, f.name) for f in dataclasses.fields(x) if f.name != "out"]  # out is None here
    made = sum(t.nbytes for t in tensors) + 2 * x.q.nbytes  # + out and the expected output
    assert shape_bytes(batch, context, block_size, 8, 2, 64, "cpu").input_bytes == made


def test_one_block_by_hand():
    # batch 1, context 16, block 16, 32/8 heads of 128, bf16: one token of K is 8 x 128 x 2 = 2,048 B.
    # caches 2 x (1 + 1) blocks x 16 x 2,048 = 131,072; contiguous 2 x 16 x 2,048 = 65,536;
    # q/out/expected 3 x 32 x 128 x 2 = 24,576; table 4, seq_lens 4 -> inputs 221,192.
    # cpu adds: a gathered copy 32,768; indices 3 x 16 x 8 = 384; the reference's gathers 65,536,
    # float32 K/V and einsum's copy 3 x 16 x 8 x 128 x 4 = 196,608, scores 3 x 32 x 16 x 4 = 6,144.
    cpu = shape_bytes(1, 16, 16, 32, 8, 128, "cpu")
    assert cpu.input_bytes == 221_192
    assert (cpu.device_bytes, cpu.host_bytes) == (0, 221_192 + 32_768 + 384 + 65_536 + 196_608 + 6_144)
    # cuda: the inputs and the gathered copy on the device, the indices on the host; 4 splits of
    # 32 x (128 + 1) x 4 B = 16,512 each
    cuda = shape_bytes(1, 16, 16, 32, 8, 128, "cuda", num_splits=4)
    assert (cuda.device_bytes, cuda.host_bytes) == (221_192 + 32_768 + 4 * 16_512, 384)


_PEAK = """
import sys, torch
from kvcalc.cuda_ext.backends import CpuReferenceBackend
from kvcalc.cuda_ext.bench import BenchConfig, run_bench
from kvcalc.cuda_ext.timing import cpu_median_us

def run(batch, context):
    config = BenchConfig(device="cpu", shapes=((batch, context),), iters=1, warmup=0, correctness=False)
    run_bench(config, CpuReferenceBackend(), device=torch.device("cpu"), device_info=dict(), copy_tbps=None,
              tick=lambda _: None, time_op=lambda op, prepare: cpu_median_us(op, prepare, iters=1, warmup=0))

def peak():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))

torch.set_num_threads(1)
run(1, 16)  # torch's own first-use allocations, outside the measurement
before = peak()
run({batch}, {context})
print(peak() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak resident memory from /proc")
@pytest.mark.parametrize(("batch", "context"), [(2, 4096), (1, 16384)])
def test_the_estimate_is_within_a_quarter_of_the_measured_peak(batch, context):
    proc = subprocess.run([sys.executable, "-c", _PEAK.format(batch=batch, context=context)], capture_output=True,
                          text=True, check=True, timeout=300)
    measured = int(proc.stdout.split()[-1])
    estimate = shape_bytes(batch, context, 16, 32, 8, 128, "cpu").host_bytes
    assert 0.7 <= measured / estimate <= 1.3, (measured, estimate)


def test_a_run_that_does_not_fit_the_gpu_is_refused_naming_the_shape():
    config = BenchConfig(device="cuda", shapes=((1, 1024), (64, 65536)))
    check_run_fits(BenchConfig(device="cuda", shapes=((1, 1024),)), (2**30, "a test GPU"), sm_count=132)
    with pytest.raises(ParameterError, match=r"^batch 64 and context 65,536 \(block size 16\) need .* of GPU memory"
                                             r".* but 1.00 GiB is available \(a test GPU\): lower batch or context$"):
        check_run_fits(config, (2**30, "a test GPU"), sm_count=132)


def test_cli_refuses_a_context_of_a_billion_before_allocating(run_cli):
    result = run_cli("bench", "--device", "cpu", "--batch", "1", "--context", "1e9")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: --batch 1 and --context 1,000,000,000 (block size 16) need ")
    assert "of host memory at once" in result.stderr and "is available (MemAvailable of the host)" in result.stderr
    assert result.stderr.rstrip().endswith("lower --batch or --context")


def test_a_cuda_run_is_checked_against_the_free_gpu_memory_before_the_extension_loads(monkeypatch):
    # The CUDA branch of run_suite on a CPU machine: a GPU with 1 GiB free and 132 SMs stands in; the
    # refusal must come before ops.library() (the nvcc build) or any allocation.
    from types import SimpleNamespace

    from kvcalc.cuda_ext import backends, build, ops

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(build, "find_nvcc", lambda: "/usr/bin/nvcc")

    def no_build():
        raise AssertionError("the extension was loaded before the memory check")

    monkeypatch.setattr(ops, "library", no_build)
    config = BenchConfig(device="cuda", shapes=((64, 65536),))
    with pytest.raises(ParameterError, match=r"of GPU memory .* \(free on the GPU, torch.cuda.mem_get_info\)"):
        backends.run_suite(config, tick=lambda _: None)
