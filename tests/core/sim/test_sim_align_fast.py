"""`kvcalc sim` under mamba_cache_mode align without prefix keys runs on the private pool's paths (HybridPool.private:
decode growth kept as counts, group_counts; runs of decode steps in closed form; chunks through advance_private, a
jump's resumed page held past the table) and gives, byte for byte, what stepping every operation on the pool gave
before align was private (the reference here: HybridPrivate.private False under align, as it was). Prompts of
several blocks under a budget of two make prefill chunks that jump over state pages (Falcon-H1-0.5B, block 800,
budget 2,048: chunks of 1,600 tokens), tight memory makes preemptions by recompute and by swap."""

from __future__ import annotations

import pytest
from real_configs import write_config

from kvcalc.core.pool.hybrid_layout import HybridLayout
from kvcalc.core.pool.hybrid_private import HybridPrivate
from kvcalc.core.sim import group_counts

FALCON = ("--bandwidth", "4.8e12", "--flops", "989e12", "--workspace-bytes", "1", "--weights-bytes", "1GiB",
          "--memory-utilization", "1", "--gpu-memory", "2300MiB", "--max-model-len", "7200", "--max-batched-tokens",
          "2048", "--prompt-dist", "lognormal:mean=3000,sigma=1")
CASES = {
    "falcon recompute": (*FALCON, "--requests", "40", "--rate", "5"),
    "falcon swap": (*FALCON, "--requests", "40", "--rate", "5", "--preempt", "swap"),
    "falcon offline, stepped": (*FALCON, "--requests", "30", "--rate", "inf", "--no-fast-forward"),
    "nemotron default": ("--model", "nemotron-h-56b", "--gpu", "h200", "--requests", "60", "--rate", "4"),
}


def _stepping(self) -> bool:
    """HybridPrivate.private as it was before align was private (never under align)."""
    store = self.store
    if store.enable_prefix_caching or store.counters["forks"] or self.mixed or self.weighted or (
            self.jumps_hold_resumed):
        return False
    return not any(pool.spec.tracked for pool in self.pools)


@pytest.mark.parametrize("case", list(CASES))
def test_align_runs_on_the_private_paths_as_stepping_runs(run_cli, monkeypatch, tmp_path, case):
    args = list(CASES[case])
    if args[0] != "--model":
        args = ["--config", str(write_config(tmp_path, "FALCON_H1_05B", "test_architecture_configs")), *args]
    cmd = ("sim", *args, "--mamba-cache-mode", "align", "--json", "--timeline")
    seen = {"resumed": 0, "counted": 0}
    resume, step = HybridLayout._resume, group_counts.PrivateCounts.step

    def resuming(self, *a):
        seen["resumed"] += 1
        return resume(self, *a)

    def counting(self, *a, **kw):
        done = step(self, *a, **kw)
        seen["counted"] += done
        return done

    monkeypatch.setattr(HybridLayout, "_resume", resuming)
    monkeypatch.setattr(group_counts.PrivateCounts, "step", counting)
    fast = run_cli(*cmd, str(tmp_path / "fast.csv"))
    assert fast.exit_code == 0, fast.stderr
    assert seen["counted"] >= 10, "the counts took almost no decode step"
    if "--prompt-dist" in args:
        assert seen["resumed"] > 0, "no chunk jumped over a state page"
    monkeypatch.setattr(HybridPrivate, "private", property(_stepping))
    seen["counted"] = 0
    slow = run_cli(*cmd, str(tmp_path / "slow.csv"))
    assert slow.exit_code == 0, slow.stderr
    assert not seen["counted"]
    assert fast.stdout == slow.stdout
    assert (tmp_path / "fast.csv").read_bytes() == (tmp_path / "slow.csv").read_bytes()
