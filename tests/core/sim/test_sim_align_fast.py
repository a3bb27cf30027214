"""`kvcalc sim` under mamba_cache_mode align without prefix keys runs on the private pool's paths (HybridPool.private:
decode growth kept as counts, group_counts; runs of decode steps in closed form; chunks through advance_private, a
jump's resumed page held past the table) and gives, byte for byte, what stepping every operation on the pool gave
before align was private (the reference here: HybridPrivate.private False under align, as it was). Prompts of
several blocks under a budget of two make prefill chunks that jump over state pages (Falcon-H1-0.5B, block 800,
budget 2,048: chunks of 1,600 tokens), tight memory makes preemptions by recompute and by swap."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from real_configs import write_config

from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid_layout import HybridLayout
from kvcalc.core.pool.hybrid_private import HybridPrivate
from kvcalc.core.sim import group_counts
from kvcalc.core.sim.paged_groups import GroupedPagedPolicy

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


@st.composite
def align_ops(draw):
    B = draw(st.sampled_from([2, 4]))
    groups = (PoolGroup("full"), PoolGroup("state"), *draw(st.sampled_from([(), (PoolGroup("state"),)])))
    blocks = draw(st.integers(len(groups) * 3, len(groups) * 14))
    ops = draw(st.lists(st.tuples(st.sampled_from(["admit", "step", "chunk", "run", "release"]), st.integers(0, 7),
                                  st.integers(1, 4 * B), st.booleans()), min_size=1, max_size=40))
    return B, groups, blocks, ops


def _apply(policy: GroupedPagedPolicy, op: tuple, running: list[int], tokens: dict[int, int], B: int) -> object:
    """One operation as the scheduler asks it (its running list and tokens updated); returns the policy's answer."""
    what, arg, n, boundary = op
    if what == "admit":
        rid = max(tokens, default=-1) + 1
        if (fits := policy.can_admit(rid, 0, n)) and policy.admit(rid, 0, n):
            running.append(rid)
            tokens[rid] = n
        return fits
    if not running:
        return None
    rid = running[arg % len(running)]
    if what == "release":
        running.remove(rid)
        policy.release(rid, "finished")
        return rid
    if what == "run":
        k, form = policy.decode_run(np.array([tokens[r] for r in running]), arg + 2, waiting=False)
        if k >= 2 and form is not None:
            policy.advance_run(np.array(running), np.array([tokens[r] for r in running]), k, form)
            for r in running:
                tokens[r] += k
        return k
    ids = running if what == "step" else [rid]  # a decode step of all, or one request's chunk (a jump past B)
    add = 1 if what == "step" else (-tokens[rid] % B + B * (1 + n % 3) if boundary else n)
    grown = policy.grow_many(np.array(ids), np.array([tokens[r] + add for r in ids]))
    if grown:
        for r in ids:
            tokens[r] += add
    return grown


@settings(max_examples=150, deadline=None)
@given(align_ops())
def test_counts_keep_a_jumps_resumed_page_as_the_pool_does(layout) -> None:
    """The counts (group_counts) against the pool changed at once (`lazy_counts = False`) under align, with chunks
    that jump over state pages: the same answers, memory parts, blocks per group and, settled, the same pool."""
    B, groups, blocks, ops = layout
    lazy, eager = (GroupedPagedPolicy(blocks, B, groups, "align", 64) for _ in range(2))
    eager.lazy_counts = False
    state: list[tuple[list[int], dict[int, int]]] = [([], {}), ([], {})]
    for op in ops:
        answers = [_apply(policy, op, *s, B) for policy, s in zip((lazy, eager), state, strict=True)]
        assert answers[0] == answers[1], op
        assert state[0] == state[1]
        for a, b in zip(lazy.parts(np.zeros(0, np.int64), None), eager.parts(np.zeros(0, np.int64), None),
                        strict=True):
            assert np.array_equal(a, b), op
        assert lazy.group_blocks() == eager.group_blocks() and lazy.num_used() == eager._pool.num_used
    pool, other = lazy.pool, eager._pool  # (settled)
    assert (pool.num_free_blocks, pool.store.useful_tokens, pool.state_slack()) == (
        other.num_free_blocks, other.store.useful_tokens, other.state_slack())
    assert {r: pool.held_blocks(r) for r in pool.seq_ids} == {r: other.held_blocks(r) for r in other.seq_ids}
    pool.check_invariants()
