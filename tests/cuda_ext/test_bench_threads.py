"""`bench --device cpu` pins torch to one thread for its timings (issue 18: with torch's default threads
the same shape swung 1.15-3.3x between runs on a shared 2-core machine) and says so; the setting is
restored afterwards."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.backends import run_suite  # noqa: E402
from kvcalc.cuda_ext.bench import CPU_TIMING_THREADS, BenchConfig, pinned_cpu_threads  # noqa: E402


def test_pinned_threads_inside_and_restored_after() -> None:
    before = torch.get_num_threads()
    with pinned_cpu_threads() as info:
        assert torch.get_num_threads() == CPU_TIMING_THREADS == info["threads"] == 1
        assert info["threads_default"] == before and info["threads_pinned"] is True
        assert "not a performance figure" in info["timing_note"]
    assert torch.get_num_threads() == before


def test_cpu_run_times_on_one_thread_and_says_so() -> None:
    seen = []
    config = BenchConfig(device="cpu", shapes=((2, 40),), iters=1, warmup=0, correctness=False)
    before = torch.get_num_threads()
    doc = run_suite(config, lambda description: seen.append(torch.get_num_threads()))
    assert seen and set(seen) == {1}  # every timed step ran pinned
    assert doc["device"]["threads"] == 1 and doc["device"]["threads_default"] == before
    assert "pinned to 1 thread" in doc["device"]["timing_note"]
    assert torch.get_num_threads() == before
