"""Benchmark: the whole Azure LLM 2023 conversation trace through `kvcalc sim`.

19,366 requests, ~4.1 M output tokens, ~3,500 s of arrivals at the trace's own rate; paged, block 16,
Llama-3-8B on one H100-SXM. Goal: at most 10 s of wall time on the 2-core CI machines. Reports wall
time and simulated output tokens per wall second, and the fast-forward's share of steps. Run with
`python -m pytest -m perf tests/perf/test_sim_perf.py -s`. The trace is not in the repository: get it
from https://github.com/Azure/AzurePublicDataset (AzureLLMInferenceTrace_conv) into ../shared/traces/.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvcalc.core.sim.metrics import Slo, summarize
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.setup import build

TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure_llm_2023_conv.csv"


@pytest.mark.perf
def test_azure_conversation_trace_paged_b16_llama3_8b_h100():
    if not TRACE.is_file():
        pytest.skip(f"the Azure conversation trace is not at {TRACE} (not shipped; see the module docstring)")
    started = time.perf_counter()
    setup = build(SimOptions(trace=("azure", TRACE), model="Llama-3-8B", gpu="H100-SXM", block_size=16))
    loaded = time.perf_counter()
    cpu_start = time.process_time()
    record = run_policy(setup.workload, "paged", setup.sim)
    wall = time.perf_counter() - loaded
    cpu = time.process_time() - cpu_start
    summary = summarize(record, Slo(), setup.plan.kv_bytes_per_token)
    tokens = summary.generated_tokens
    print(
        f"\nAzure conv: {len(setup.workload):,} requests, {tokens:,} output tokens, {record.steps:,} steps "
        f"({record.segments:,} fast-forwarded runs); read {loaded - started:.2f} s, simulate {wall:.2f} s "
        f"(CPU {cpu:.2f} s) "
        f"= {tokens / wall:,.0f} simulated tokens/s; simulated span {record.end_s:,.0f} s"
    )
    assert summary.completed + summary.rejected == len(setup.workload)
    assert wall + (loaded - started) <= 10.0, f"{wall:.1f} s simulate + {loaded - started:.1f} s read > 10 s"
