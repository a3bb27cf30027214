"""Timers for the benchmark: CUDA events with an L2 flush, a device-to-device copy ceiling, CPU wall time.

Every GPU sample: flush L2 (overwrite a buffer larger than it), run `prepare` (e.g. poison the output),
record a start event, run the op, record an end event. The median over samples is reported, after
`warmup` untimed runs. Times are in microseconds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

L2_FLUSH_BYTES = 256 * 2**20  # > 4x the 60 MB L2 of an H200 / 50 MB of an H100
COPY_BYTES = 2 * 2**30  # the copy ceiling: 2 GiB read + 2 GiB written


class CudaTimer:
    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.flush_buffer = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def median_us(self, op: Callable[[], Any], prepare: Callable[[], Any] | None = None, *, iters: int,
                  warmup: int) -> float:
        torch = self.torch
        for _ in range(warmup):
            if prepare:
                prepare()
            op()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in events:
            self.flush_buffer.fill_(0)
            if prepare:
                prepare()
            start.record()
            op()
            end.record()
        torch.cuda.synchronize(self.device)
        samples = [start.elapsed_time(end) * 1e3 for start, end in events]
        return statistics.median(samples)

    def copy_tbps(self, iters: int, warmup: int) -> float:
        """Device-to-device copy bandwidth (bytes read + bytes written per second, in TB/s = 1e12 B/s)."""
        torch = self.torch
        src = torch.empty(COPY_BYTES // 2, dtype=torch.int16, device=self.device).random_()
        dst = torch.empty_like(src)
        us = self.median_us(lambda: dst.copy_(src), iters=iters, warmup=warmup)
        return 2 * COPY_BYTES / (us * 1e-6) / 1e12


def cpu_median_us(op: Callable[[], Any], prepare: Callable[[], Any] | None = None, *, iters: int,
                  warmup: int) -> float:
    for _ in range(warmup):
        op()
    samples = []
    for _ in range(iters):
        if prepare:
            prepare()
        start = time.perf_counter()
        op()
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples)
