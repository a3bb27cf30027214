"""A hybrid `kvcalc sim` costs at most 2x a plain one of the same workload (issue 19's "Done when"; run with
`python -m pytest -m perf tests/perf/test_sim_hybrid_perf.py -s`, which prints every model's ratio).

Whole processes, CPU time (user + system) from the kernel's accounting (os.wait4), each the best of five, the
hybrid runs and the plain ones interleaved round by round in one run, so that load on the machine affects both.
The default workload (1,000 requests, Poisson 1/s) on one H200 (two for the models of 80B and more), each hybrid
model against a full-attention model of about its size:

    vs Qwen3-32B (1 GPU)        Gemma-3-27B (sliding 1,024), Nemotron-H-56B (Mamba-2, 4,128-token blocks),
                                Granite-4.0-H-Small (Mamba-2, 528), Jamba-1.5-Mini (Mamba-1, 80)
    vs Llama-3-70B (2 GPUs)     gpt-oss-120b (sliding 128), Llama-4-Scout (chunked 8,192), Qwen3-Next-80B (Gated
                                DeltaNet, 544)

Granite, Jamba and Qwen3-Next have no preset: their public config.json files are written to a temporary folder
(Jamba's and Qwen3-Next's as tests/core/model/test_real_configs.py keeps them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from real_configs import real_config

pytestmark = pytest.mark.perf
SIM = [sys.executable, "-m", "kvcalc", "sim", "--gpu", "h200", "--json"]
ROUNDS = 5
# issue 19's 2x. Round 8 (a private pool's decode growth and admissions kept as counts, core/sim/group_counts.py;
# MoE runs timed in one call; few-chunk excess in plain ints) on a machine at load 6-8 on 2 cores, five runs (four
# best of 3, one of 5): Gemma-3 1.39-1.62, Nemotron-H 1.57-1.75, Granite 1.23-1.65, Jamba 1.20-1.66, gpt-oss
# 1.47-2.10, Scout 1.44-1.83, Qwen3-Next 1.50-1.96 (1.69-2.00 before; the same tree's runs vary by +-0.3 under that
# load): the goal of 1.8 is met in most runs but not with a margin that load cannot take, so the bound stays 2x
LIMIT = 2.0
GRANITE_4_H_SMALL = real_config("GRANITE_4_H_SMALL")  # tests/core/model/test_real_configs.py
# Llama-4-Scout's 10,485,760 positions do not fit two H200s, so vLLM (and sim) would not start; at 524,288 a request
# needs 32,768 full + 3 · 1,024 chunked blocks of the 53,060 (no request here is that long: the runs are unchanged)
SCOUT = ["--model", "llama-4-scout", "--tp", "2", "--max-model-len", "524288"]


def cpu_s(args: list[str]) -> float:
    """CPU seconds (user + system) of one child process."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, " ".join(args)
    return usage.ru_utime + usage.ru_stime


def interleaved_ratios(base: list[str], plains: dict[str, list[str]], hybrids: dict[str, tuple[list[str], str]],
                       rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """(best CPU s of each run, each hybrid's ratio to its plain run): `base` + each plain's arguments, then the
    hybrids measured against it, round after round (interleaved, so load drifts reach both sides alike)."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for plain, args in plains.items():
            best[plain] = min(best.get(plain, float("inf")), cpu_s([*base, *args]))
            for name, (hybrid_args, against) in hybrids.items():
                if against == plain:
                    best[name] = min(best.get(name, float("inf")), cpu_s([*base, *hybrid_args]))
    return best, {name: best[name] / best[plain] for name, (_, plain) in hybrids.items()}


def test_every_hybrid_sim_costs_at_most_twice_a_plain_one(tmp_path):
    folders = {}
    for name, config in (("granite-4.0-h-small", GRANITE_4_H_SMALL), ("jamba-1.5-mini", real_config("JAMBA_15_MINI")),
                         ("qwen3-next-80b", real_config("QWEN3_NEXT"))):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "config.json").write_text(json.dumps(config))
    plains = {"qwen3-32b": ["--model", "qwen3-32b"], "llama-3-70b": ["--model", "llama-3-70b", "--tp", "2"]}
    hybrids = {  # name -> (its arguments, its plain counterpart)
        "gemma-3-27b": (["--model", "gemma-3-27b"], "qwen3-32b"),
        "nemotron-h-56b": (["--model", "nemotron-h-56b"], "qwen3-32b"),
        "granite-4.0-h-small": (["--config", str(folders["granite-4.0-h-small"])], "qwen3-32b"),
        "jamba-1.5-mini": (["--config", str(folders["jamba-1.5-mini"])], "qwen3-32b"),
        "gpt-oss-120b": (["--model", "gpt-oss-120b", "--tp", "2"], "llama-3-70b"),
        "llama-4-scout": (SCOUT, "llama-3-70b"),
        "qwen3-next-80b": (["--config", str(folders["qwen3-next-80b"]), "--tp", "2"], "llama-3-70b"),
    }
    best, ratios = interleaved_ratios(SIM, plains, hybrids, ROUNDS)
    print()
    for name, (_, plain) in hybrids.items():
        print(f"{name:>20}: {best[name]:.2f} s CPU vs {plain} {best[plain]:.2f} s, ratio {ratios[name]:.2f}")
    over = {name: round(r, 2) for name, r in ratios.items() if r > LIMIT}
    assert not over, f"hybrid runs costing more than {LIMIT}x a plain one: {over}"


MOONCAKE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_conversation.jsonl"
# each hybrid with prefix caching -> the plain run of the same requests it is measured against: Llama-3.1-8B and
# -70B serve all 100 (Llama-3-8B's 8,192-token limit refuses 59 of them, so it is Gemma's workload no more); the
# 8,192-token Nemotron-H-56B refuses the same 59 and is measured against Llama-3-8B
PREFIX_PLAINS = {"llama-3.1-8b": ["--model", "llama-3.1-8b"],
                 "llama-3.1-70b": ["--model", "llama-3.1-70b", "--tp", "2"], "llama-3-8b": ["--model", "llama-3-8b"]}
PREFIX_HYBRIDS = {
    "gemma-3-27b": (["--model", "gemma-3-27b"], "llama-3.1-8b"),
    "gpt-oss-120b": (["--model", "gpt-oss-120b", "--tp", "2"], "llama-3.1-70b"),
    "llama-4-scout": (SCOUT, "llama-3.1-70b"),
    "nemotron-h-56b": (["--model", "nemotron-h-56b"], "llama-3-8b"),
}
# issue 19's 2x for every model. Round 9 at the end, machine at load < 3 (this test's own run): Gemma-3 1.89, gpt-oss
# 1.31, Scout 1.20, Nemotron-H 1.41; best of 5 interleaved (whole processes): Gemma-3 1.274 s vs Llama-3.1-8B
# 0.679 s = 1.88x. At load 7-10 on 2 cores single runs of Gemma-3 still reach 1.98-2.14x: run it on a quiet machine
PREFIX_LIMITS = {"gemma-3-27b": 2.0, "gpt-oss-120b": 2.0, "llama-4-scout": 2.0, "nemotron-h-56b": 2.0}


def test_hybrid_sim_with_prefix_caching_on_a_real_trace():
    """Hybrids with prefix caching on the Mooncake conversation trace's first 100 requests (the trace's hash ids),
    each against a plain model serving the same requests (PREFIX_HYBRIDS), interleaved, best of two: the hybrid
    pool's hits across groups, anchored blocks and per-group usage against a plain pool's.

    Measured on one loaded machine (CPU s, whole process, best of 3-5 interleaved; ratios to the same tree's plain
    run; "this round" is the range over this round's last measurements and test runs):
                        round 6    this round (runs of decode steps with prefix caching: core/pool/hybrid_runs.py)
        Gemma-3-27B     3.0-3.8x   1.84-2.17x   Llama-3.1-8B
        gpt-oss-120b    1.9-2.3x   1.25-1.34x   Llama-3.1-70B
        Llama-4-Scout   2.4-3.5x   1.52-1.69x   Llama-3.1-70B
        Nemotron-H-56B  1.2-1.5x   1.18-1.28x   Llama-3-8B  (state groups: still step by step)
    Round 8, test runs at load 5-10 on 2 cores (the plain runs alone took 0.72-1.18 s CPU): Gemma-3 2.10-2.74x,
    gpt-oss 1.18-1.41x, Scout 1.53-1.75x, Nemotron-H 1.18-1.85x. Instructions (valgrind callgrind, independent of
    load): Gemma-3 8.74 G -> 8.33 G (index rebuilds' lost keys placed in batch rounds, stale anchored blocks sorted
    only when found), Llama-3.1-8B 3.82 G: 2.18x. Gemma-3 stays above 2x: its prefill registers ~3,000 anchored
    blocks a chunk (558k in all, ~530k evicted again: 8 index rebuilds), and each step walks 7 tables a request.
    A run of k decode steps is planned from counts (blocks opened, freed at their last reference, evicted) and
    applied only where blocks change; while a request waits, only as long as its refusal provably stands (no block
    its look-up found evicted and no more blocks free than at the start, or fewer free than its need's floor). A
    first chunk's look-up comes from its whole prompt's. What remains on Gemma-3: its 177 prefill steps (7 tables,
    six of them windows indexed block by block: ~5x a plain step) and ~60 steps in which the waiting head's own
    cached blocks are evicted with more blocks free than its floor (each re-checked by stepping).
    Round 9 (anchored blocks in a dense map, not the hash index: anchored_map.py; kept look-ups re-checked, not
    redone; decode runs applied at once: hybrid_apply.py), three test runs at load 6-8: Gemma-3 1.93 / 2.51 / 2.14x,
    gpt-oss 1.39-1.49x, Scout 1.37-1.61x, Nemotron-H 1.33-1.65x; Gemma-3 CPU best of 5 interleaved at load ~5:
    2.24 s (04ea4a4) -> 1.61 s, Llama-3.1-8B 0.86-0.94 s (2.38x -> 1.87x). Still not reliably under 2x when loaded.
    PREFIX_LIMITS bounds each with room for a loaded machine."""
    if not MOONCAKE.exists():
        pytest.skip(f"{MOONCAKE} is absent (the shared traces are not checked in)")
    trace = [*SIM, "--trace", "mooncake", str(MOONCAKE), "--limit", "100"]
    best, ratios = interleaved_ratios(trace, PREFIX_PLAINS, PREFIX_HYBRIDS, 2)
    print()
    for name, (_, plain) in PREFIX_HYBRIDS.items():
        print(f"prefix caching, Mooncake conversation x100: {name} {best[name]:.2f} s CPU vs {plain} "
              f"{best[plain]:.2f} s, ratio {ratios[name]:.2f}")
    over = {name: round(r, 2) for name, r in ratios.items() if r > PREFIX_LIMITS[name]}
    assert not over, f"hybrid runs with prefix caching costing more than their bound {PREFIX_LIMITS}: {over}"
