"""`kvcalc sim` before and after a speed change of its engine: the same JSON on configurations that take every path
of the fast-forward (issue 18: "the same simulated figures, byte for byte, before and after").

The "before" package is the whole package at git revision KVCALC_SIM_BEFORE (default: BEFORE, the tree before this
round's engine speed work), unpacked from git; each configuration runs in it and in this working tree, in turn. Every
key of the before document must be in the after one with the same value, byte for byte as JSON writes it; keys only
the after document has (a report added since, such as prefix_cache) are allowed and listed. The ratio of their CPU
times is printed (both sides in one run).

Since the before revision, the pool leaves out vLLM's null block (block 0, never handed out): the after side runs
on num_blocks − 1 free blocks. The before side is given one block less to match, through --workspace-bytes: the
after side's activation peak plus one block's bytes (a block of a plain pool is block × KV bytes a token; of a
hybrid one, a block id's bytes), so its pool is one block smaller and everything the runs compute is compared;
the memory plan's figures that this moves (POOL_SHRINK) are left out of the comparison.
Run with `python -m pytest -m perf tests/perf/test_sim_exact_perf.py -s`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from package_at import run_kvcalc, unpack_package

pytestmark = pytest.mark.perf
REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "traces"
BEFORE = "b25049f7fba2a6a0c15d0c1a5710c24d345c09e2"
AZURE = TRACES / "azure_llm_2023_conv.csv"
CONFIGS = {
    "azure default (OPT-13B, A100-40GB), whole trace": ["--trace", "azure", str(AZURE)],
    "azure default, 4,000 requests": ["--trace", "azure", str(AZURE), "--limit", "4000"],
    "azure Llama-3-8B with a timeline": ["--trace", "azure", str(AZURE), "--limit", "6000", "--model", "Llama-3-8B",
                                         "--gpu", "A100-40GB", "--timeline", "timeline.csv"],
    "preemption-heavy (2,894 preemptions, 2,000 requests)": ["--requests", "2000", "--rate", "50"],
    "mooncake prefix caching": ["--trace", "mooncake", str(TRACES / "mooncake_conversation.jsonl"), "--limit", "800",
                                "--model", "Llama-3-8B", "--gpu", "A100-40GB"],
    "swap preemption, cancellations, timeout": ["--requests", "600", "--rate", "30", "--preempt", "swap",
                                                "--cancel-fraction", "0.2", "--timeout", "30"],
    "recompute storm at rate inf, 4 policies": ["--requests", "400", "--rate", "inf", "--compare",
                                                "paged,reserve-max,reserve-pow2,reserve-oracle"],
    "hybrid sliding window (Gemma-3-27B, H200)": ["--requests", "300", "--rate", "8", "--model", "gemma-3-27b",
                                                  "--gpu", "H200"],
    "hybrid Mamba (Nemotron-H-56B, H200)": ["--requests", "200", "--rate", "4", "--model", "nemotron-h-56b",
                                            "--gpu", "H200"],
}

# Report figures changed on purpose since BEFORE by work outside the engine (each with the commit that made it): they
# are left out of the comparison of that configuration only, and everything else must still match.
INTENDED = {
    # b8ce3c3: a hybrid layout's token slots are the tokens every attention group can hold at once (Gemma-3-27B:
    # blocks // Σ pages per block / block tokens), no longer blocks × block size; the simulation itself is unchanged
    "hybrid sliding window (Gemma-3-27B, H200)": {"/memory_plan/capacity_tokens"},
    # b475fe8: under mamba_cache_mode none a request holds one state page per state group, counted as a whole state
    # (tail fragmentation = the attention blocks' unused slots only): Nemotron-H's useful / tail split moves
    "hybrid Mamba (Nemotron-H-56B, H200)": {f"{top}/memory/{part}" for top in ("", "/policies/paged")
                                            for part in ("useful", "tail_fragmentation", "useful_of_occupied")},
}


# the memory plan's figures moved on the before side by its one-block-larger activation peak (see the docstring)
POOL_SHRINK = {f"/memory_plan/{key}" for key in ("workspace_bytes", "kv_pool_bytes", "num_blocks", "capacity_tokens")}


def one_block_less(after: dict) -> list[str]:
    """The before side's arguments that take one block from its pool: --workspace-bytes the after side's activation
    peak + one block's bytes."""
    plan, groups = after["memory_plan"], after.get("kv_cache_groups")
    block_bytes = groups["block_bytes"] if groups else plan["block_size"] * plan["kv_bytes_per_token"]
    assert plan["null_blocks"] == 1 and plan["free_blocks"] == plan["num_blocks"] - 1
    return ["--workspace-bytes", str(plan["workspace_bytes"] + block_bytes)]


@pytest.fixture(scope="module")
def before_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as it was at the "before" revision, unpacked from git."""
    return unpack_package(os.environ.get("KVCALC_SIM_BEFORE", BEFORE), tmp_path_factory.mktemp("before"))


def run_sim(args: list[str], pythonpath: Path, cwd: Path) -> tuple[str, float]:
    """(stdout, child CPU seconds) of `kvcalc sim ARGS --json` importing the package from `pythonpath`."""
    return run_kvcalc(["sim", *args, "--json"], pythonpath, cwd, dict(os.environ))


def differences(old: object, new: object, path: str = "") -> tuple[list[str], list[str]]:
    """(paths whose values differ as JSON writes them, paths only `new` has)."""
    if isinstance(old, dict) and isinstance(new, dict):
        changed: list[str] = []
        added = [f"{path}/{key}" for key in new if key not in old]
        for key, value in old.items():
            if key not in new:
                changed.append(f"{path}/{key} (gone)")
                continue
            more_changed, more_added = differences(value, new[key], f"{path}/{key}")
            changed += more_changed
            added += more_added
        return changed, added
    return ([] if json.dumps(old) == json.dumps(new) else [path]), []


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sim_json_is_byte_identical_before_and_after(name: str, before_package: Path, tmp_path: Path) -> None:
    args = CONFIGS[name]
    if any(str(TRACES) in a for a in args) and not TRACES.is_dir():
        pytest.skip(f"the traces are not at {TRACES} (see ../shared/traces/README.md)")
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    new, new_s = run_sim(args, REPO, tmp_path / "new")
    old, old_s = run_sim([*args, *one_block_less(json.loads(new))], before_package, tmp_path / "old")
    changed, added = differences(json.loads(old), json.loads(new))
    assert json.loads(old)["memory_plan"]["num_blocks"] == json.loads(new)["memory_plan"]["free_blocks"]
    print(f"\n{name}: before {old_s:.2f} s CPU, after {new_s:.2f} s CPU ({old_s / new_s:.2f}x faster)"
          + (f"; keys only after: {', '.join(added)}" if added else ""))
    intended = sorted(set(changed) & INTENDED.get(name, set()))
    if intended:
        print(f"changed on purpose since {BEFORE[:7]}: {', '.join(intended)}")
    changed = [path for path in changed if path not in INTENDED.get(name, set()) | POOL_SHRINK]
    assert not changed, f"figures changed: {changed}"
    if "--timeline" in args:  # the memory/queue timeline, row for row
        old_rows = (tmp_path / "old" / "timeline.csv").read_bytes()
        assert (tmp_path / "new" / "timeline.csv").read_bytes() == old_rows
