"""`kvcalc share --trace mooncake` against a plain-Python replay over hash ids, and the replays in-process (issue 18;
run with `python -m pytest -m perf tests/perf/test_share_perf.py -s`).

Whole processes, in turn, in one run: `kvcalc share ... --block B --json` and the plain replay
(tests/core/pool/id_replay.py run as a script: json + dicts, no numpy), each the best of three after one untimed
run of each; CPU time (user + system: the machine is shared, so wall time says more about the other processes than
about these) and peak resident memory from the kernel's accounting of each child (os.wait4). Bytecode is cached as
on a user's machine, under a temporary PYTHONPYCACHEPREFIX (with PYTHONDONTWRITEBYTECODE set, every run would
compile kvcalc's ~130 modules again, ~0.15-0.3 s). The fixed part of each side — interpreter, imports, output:
the same commands on the trace's first request alone, run in turn with the others — is measured too and
reported, with the ratio of what is left (the work that grows with the trace). Goals (issue 18): <= 1.5x the
plain replay, <= 128 MiB. Asserted: the same hits, the memory goal (resident memory does not depend on the load)
and the CPU goal, 1.5x whole and past the fixed part (a loaded 2-core machine moves a ratio by tens of percent: rerun
before reading one failure as a regression). Measured under load (Dec 2026), after `share` stopped importing numpy
for a trace this small (core/share/id_replay_lists.py) and sim's flags: 0.65-0.95x on the conversation trace,
0.99-1.08x on the synthetic one (whose plain replay takes 0.14-0.28 s in all), 59 and 32 MiB; share's fixed part
0.11-0.19 s (typer ~0.04, kvcalc's modules ~0.02, the interpreter 0.05; numpy's 0.11 before), the plain replay's
0.05-0.07 s; past the fixed parts 0.38-0.69x. Before (numpy on every trace): 0.98-1.36x and 1.84-2.66x.

Before and after: `share --json` of the package at BEFORE (the tree before the replay by ids), unpacked from git,
and of this working tree, byte for byte, on both traces at every block size, with a capacity and with a model.
Since the replay stopped writing the KV of a request's last output token (core/share/trace_blocks.written_outputs),
BEFORE reads the trace with every output_length one less (at least 0): it then holds what this tree holds, and
only the trace's output-token sum differs (by the requests with an output), which the comparison adds back.

In-process: the replay `share` runs (per hash id when nothing can be evicted, core/share/id_replay.py) against
the block pool on the same trace, bounded and not; the pool's fast path against its general path; beam search.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from package_at import run_kvcalc, unpack_package

from kvcalc.core.inputs.traces import read_trace
from kvcalc.core.pool.block_pool import BlockPool, ReleaseReason
from kvcalc.core.share.forks import ScenarioSpec, run_scenario
from kvcalc.core.share.replay import replay

pytestmark = pytest.mark.perf
REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "traces"
BEFORE = "b25049f7fba2a6a0c15d0c1a5710c24d345c09e2"  # every share replay through the block pool
MOONCAKE = TRACES / "mooncake_conversation.jsonl"
ID_REPLAY = Path(__file__).resolve().parents[1] / "core" / "pool" / "id_replay.py"
BOUNDED_BLOCKS = 20_480  # 40 GiB / (2 · 32 layers · 8 KV heads · 128 dims · 2 bytes · 16 tokens = 2 MiB)
GOAL_RATIO, GOAL_MIB = 1.5, 128
MAX_RATIO = MAX_RATIO_PAST_FIXED = GOAL_RATIO  # asserted (see the module docstring)
BLOCKS = [16, 64, 512, 4096]
NAMES = ["mooncake_conversation.jsonl", "mooncake_synthetic.jsonl"]

# Linux carries a process's peak RSS across exec, so a child forked from this test process (~60 MiB) would
# report at least that much: each command runs under a small launcher (a bare interpreter, ~10 MiB), which
# reports its child's CPU time, wall time and peak RSS (os.wait4) as its last line on stderr.
_LAUNCHER = (
    "import os, subprocess, sys, time; start = time.perf_counter(); p = subprocess.Popen(sys.argv[1:]); "
    "_, status, use = os.wait4(p.pid, 0); print(os.waitstatus_to_exitcode(status), use.ru_utime + use.ru_stime, "
    "time.perf_counter() - start, use.ru_maxrss, file=sys.stderr)"
)


Run = tuple[str, float, float, float]  # stdout, CPU seconds, wall seconds, peak MiB


def run_process(args: list[str], env: dict[str, str]) -> Run:
    """(stdout, CPU seconds, wall seconds, peak resident MiB) of one command (see _LAUNCHER)."""
    proc = subprocess.run([sys.executable, "-c", _LAUNCHER, *args], capture_output=True, text=True, env=env)
    err = proc.stderr.splitlines()
    code, cpu, wall, kib = err[-1].split()
    assert proc.returncode == 0 and code == "0", proc.stderr
    return proc.stdout, float(cpu), float(wall), int(kib) / 1024  # ru_maxrss is in KiB on Linux


def commands(path: Path, block_size: int) -> tuple[list[str], list[str]]:
    share = [sys.executable, "-m", "kvcalc", "share", "--trace", "mooncake", str(path), "--block", str(block_size),
             "--json"]
    return share, [sys.executable, str(ID_REPLAY), str(path), str(block_size)]


def best_in_turn(cmds: list[list[str]], env: dict[str, str], rounds: int = 3) -> list[Run]:
    """Each command once untimed (bytecode written, files in the page cache), then `rounds` times in turn (the
    same load on all): per command (the first stdout, least CPU, least wall, most MiB)."""
    for cmd in cmds:
        run_process(cmd, env)
    runs = [[run_process(cmd, env) for cmd in cmds] for _ in range(rounds)]
    return [_best([r[i] for r in runs]) for i in range(len(cmds))]


def _best(runs: list[Run]) -> Run:
    return runs[0][0], min(r[1] for r in runs), min(r[2] for r in runs), max(r[3] for r in runs)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    environ["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    return environ


@pytest.fixture(scope="module")
def first_requests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per trace, a file of its first request alone: what a run costs whatever the trace (start-up, imports,
    reading one line, output)."""
    out = {}
    for name in NAMES:
        if (TRACES / name).is_file():
            out[name] = tmp_path_factory.mktemp("one") / name
            with open(TRACES / name, encoding="utf-8") as f:
                out[name].write_text(f.readline())
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("block_size", BLOCKS)
def test_share_against_the_plain_replay(name: str, block_size: int, env: dict[str, str],
                                        first_requests: dict[str, Path]) -> None:
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"the Mooncake trace is not at {path} (see ../shared/traces/README.md)")
    runs = best_in_turn([*commands(path, block_size), *commands(first_requests[name], block_size)], env)
    (doc, cpu, wall, mib), (ref, ref_cpu, ref_wall, ref_mib), fixed_run, ref_fixed_run = runs
    got, expected = json.loads(doc), json.loads(ref)
    assert (got["hit_tokens"], got["hit_blocks"]) == (expected["hit_tokens"], expected["hit_blocks"])
    assert got["peak_cached_blocks"] == expected["cached_blocks"]
    fixed, ref_fixed = fixed_run[1], ref_fixed_run[1]
    ratio, past_fixed = cpu / ref_cpu, (cpu - fixed) / max(ref_cpu - ref_fixed, 1e-3)
    print(f"\n{name} block {block_size}: share {cpu:.2f} s CPU ({wall:.2f} s wall), {mib:.0f} MiB; plain replay "
          f"{ref_cpu:.2f} s CPU ({ref_wall:.2f} s wall), {ref_mib:.0f} MiB; ratio {ratio:.2f}x CPU (goal "
          f"{GOAL_RATIO}x; {wall / ref_wall:.2f}x wall); fixed part (one request) share {fixed:.2f} s, plain "
          f"{ref_fixed:.2f} s; past it {cpu - fixed:.2f} s against {ref_cpu - ref_fixed:.2f} s: {past_fixed:.2f}x")
    assert mib <= GOAL_MIB, f"share peaks at {mib:.0f} MiB (goal {GOAL_MIB})"
    assert ratio <= MAX_RATIO, f"share takes {ratio:.2f}x the plain replay's CPU time"
    assert past_fixed <= MAX_RATIO_PAST_FIXED, f"past the fixed part, share takes {past_fixed:.2f}x the plain replay"


@pytest.fixture(scope="module")
def before_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as it was at BEFORE, unpacked from git."""
    return unpack_package(BEFORE, tmp_path_factory.mktemp("before"))


# Not a bounded replay through the pool: the free queue hands out in vLLM's order since f1a53d2 (evictions differ
# from BEFORE's plain-first pool; test_mooncake_replay_by_ids_and_through_the_pool checks one against a model)
BYTE_CASES = [[name, str(block)] for name in NAMES for block in [16, 64, 512, 1024, 4096]] + [
    ["mooncake_synthetic.jsonl", "16", "--capacity-blocks", "100000000"],  # above every cacheable block: by ids
    ["mooncake_synthetic.jsonl", "16", "--model", "Llama-3-8B"],
    ["mooncake_synthetic.jsonl", "64", "--limit", "1000"],  # by ids on lists, the first 1,000 requests
]


@pytest.mark.parametrize("case", BYTE_CASES, ids=" ".join)
def test_share_json_is_byte_identical_before_and_after(case: list[str], before_package: Path, env: dict[str, str],
                                                       tmp_path: Path) -> None:
    path = TRACES / case[0]
    if not path.is_file():
        pytest.skip(f"the Mooncake trace is not at {path} (see ../shared/traces/README.md)")
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if "--limit" in case:
        lines = lines[: int(case[case.index("--limit") + 1])]
    outputs = sum(r["output_length"] for r in lines)
    written = sum(max(r["output_length"] - 1, 0) for r in lines)
    less = tmp_path / case[0]  # the same name: both sides print the trace as `mooncake <name>`
    less.write_text("".join(json.dumps({**r, "output_length": max(r["output_length"] - 1, 0)}) + "\n"
                            for r in lines), encoding="utf-8")
    args = ["--trace", "mooncake", case[0], "--block", *case[1:], "--json"]
    old, old_s = run_kvcalc(["share", *args], before_package, tmp_path, env)
    new, new_s = run_kvcalc(["share", *args], REPO, TRACES, env)
    print(f"\n{' '.join(case)}: before {old_s:.2f} s CPU, after {new_s:.2f} s CPU ({old_s / new_s:.1f}x faster)")
    assert f'"output_tokens": {written}' in old
    # the pool that never evicts (the first pool_blocks, the cached run's) holds every request's blocks since
    # f1a53d2 (vLLM's free-queue order; BEFORE: the distinct cacheable blocks + the largest request), P + O − 1
    # positions each, capped at the capacity given
    block = int(case[1])
    pool = sum(-(-(r["input_length"] + max(r["output_length"] - 1, 0)) // block) for r in lines)
    if "--capacity-blocks" in case:
        pool = min(pool, int(case[case.index("--capacity-blocks") + 1]))
    old = re.sub(r'"pool_blocks": \d+', f'"pool_blocks": {pool}', old, count=1)
    assert new == old.replace(f'"output_tokens": {written}', f'"output_tokens": {outputs}')


def timed(fn):
    start = time.perf_counter()
    cpu = time.process_time()
    result = fn()
    return result, time.perf_counter() - start, time.process_time() - cpu


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"the Mooncake trace is not at {MOONCAKE}")
def test_mooncake_replay_by_ids_and_through_the_pool() -> None:
    """`kvcalc share --trace mooncake ... --block 16` without a capacity (by ids: nothing can be evicted) and with
    20,480 blocks = 40 GiB of Llama-3-8B fp16 KV at 2 MiB a block (through the pool: LRU evictions); the
    unbounded replay through the pool too, every field equal."""
    trace, read_s, _ = timed(lambda: read_trace("mooncake", MOONCAKE))
    unbounded, _, cpu_s = timed(lambda: replay(trace, 16, None, True))
    pool, _, pool_cpu_s = timed(lambda: replay(trace, 16, None, True, by_ids=False))
    assert unbounded == pool
    # the numbers `kvcalc share` printed before the fast path existed (and an independent dict replay)
    assert (unbounded.requests, unbounded.prompt_tokens, unbounded.hit_tokens) == (12_031, 144_793_823, 54_097_440)
    assert (unbounded.hit_blocks, unbounded.peak_used_blocks) == (3_381_090, 7_908)
    assert (unbounded.peak_cached_blocks, unbounded.evictions) == (5_662_916, 0)
    bounded, _, bounded_cpu_s = timed(lambda: replay(trace, 16, BOUNDED_BLOCKS, True))
    # vLLM's free-queue order (f1a53d2): the independent model tests/core/share/test_share.reference_lru_replay (an
    # OrderedDict of the queue's entries, no pool, no hashing; ~45 s on this trace, run once) gives these hits,
    # evictions and the most cache entries free at a request's end; 6,268,240 / 16 = 391,765 hit blocks; the peak
    # in use is the largest request, ceil((P + O − 1) / 16) = 7,908, as before
    assert (bounded.hit_tokens, bounded.hit_blocks, bounded.evictions) == (6_268_240, 391_765, 8_632_318)
    assert (bounded.peak_used_blocks, bounded.peak_cached_blocks) == (7_908, 20_386)
    blocks = unbounded.prompt_tokens // 16
    print(f"\nmooncake conversation, B = 16: read {read_s:.2f} s; unbounded by ids {cpu_s:.3f} s CPU, through the "
          f"pool {pool_cpu_s:.2f} s CPU ({blocks / pool_cpu_s / 1e6:.2f} M prompt blocks/s, {pool_cpu_s / cpu_s:.0f}x)"
          f"; bounded to {BOUNDED_BLOCKS:,} blocks (pool): {bounded_cpu_s:.2f} s CPU, {bounded.evictions:,} evictions")


@pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"the Mooncake trace is not at {MOONCAKE}")
@pytest.mark.parametrize("capacity", [None, BOUNDED_BLOCKS])
def test_fast_replay_against_the_general_path(capacity: int | None) -> None:
    trace = read_trace("mooncake", MOONCAKE).head(3_000)
    fast, fast_s, _ = timed(lambda: replay(trace, 16, capacity, True, by_ids=False))
    general, general_s, _ = timed(lambda: replay(trace, 16, capacity, True, fast=False))
    assert fast == general
    print(f"\nfirst 3,000 requests, capacity {capacity or 'unlimited'}: fast path {fast_s:.2f} s, general path "
          f"{general_s:.2f} s ({general_s / fast_s:.1f}x)")


def beam_one_call_per_sequence(spec: ScenarioSpec) -> tuple[int, int, int]:
    """The beam scenario with one pool call per beam and operation (how run_scenario drove the pool before
    the batch calls): (physical blocks, copies, forks). The last step selects the final beams and writes nothing
    (the last generated token's KV is never computed)."""
    K = spec.branches
    pool = BlockPool(spec.pool_blocks, spec.block_size)
    pool.allocate(0, spec.prefix_tokens)
    for child in range(1, K):
        pool.fork(0, child)
    beams, next_id, rng = list(range(K)), K, np.random.default_rng(spec.seed)
    for step in range(spec.gen_tokens):
        if step > 0:
            picks = np.bincount(rng.integers(0, K, size=K), minlength=K)
            survivors = []
            for beam, count in zip(beams, picks.tolist(), strict=True):
                if count == 0:
                    pool.release(beam, ReleaseReason.CANCELLED)
                    continue
                survivors.append(beam)
                for _ in range(count - 1):
                    pool.fork(beam, next_id)
                    survivors.append(next_id)
                    next_id += 1
            beams = survivors
        if step + 1 < spec.gen_tokens:
            for beam in beams:
                pool.append(beam, 1)
    stats = pool.stats()
    return pool.usage().used_blocks, stats.cow_copies, stats.forks


def test_beam_search_scenario() -> None:
    """`kvcalc share --mode beam --branches 5000 --gen 500`, and the same steps one pool call per beam."""
    spec = ScenarioSpec(1000, 5000, 500, 16, mode="beam", seed=0)
    result, wall_s, cpu_s = timed(lambda: run_scenario(spec))
    # the numbers the one-call-per-beam driver gave (checked once against it on the whole run, ~29 s); 7,745 and
    # 865,994 while every beam wrote its 500th token: the last selection's forks now share their parent's blocks
    assert (result.physical_blocks, result.cow_copies, result.peak_blocks) == (5_935, 864_184, 10_609)
    assert (result.forks, result.dropped_branches, result.logical_blocks) == (923_005, 918_006, 470_000)
    short = ScenarioSpec(1000, 5000, 40, 16, mode="beam", seed=0)
    batched, batched_s, _ = timed(lambda: run_scenario(short))
    single, single_s, _ = timed(lambda: beam_one_call_per_sequence(short))
    assert single == (batched.physical_blocks, batched.cow_copies, batched.forks)
    appends = spec.branches * spec.gen_tokens
    print(f"\nbeam, 5,000 beams x 500 tokens: {wall_s:.2f} s wall ({cpu_s:.2f} s CPU, {appends / wall_s:,.0f} "
          f"appends/s, {result.forks:,} forks); 40 steps: batch calls {batched_s:.2f} s, one call per beam "
          f"{single_s:.2f} s ({single_s / batched_s:.1f}x)")
