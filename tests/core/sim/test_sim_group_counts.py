"""A private hybrid pool's decode growth kept as counts (core/sim/group_counts.py) decides and reports exactly what the
pool itself does: a policy with the counts and one without (`lazy_counts = False`, the pool changed at once) give the
same answers to every call, the same memory parts and blocks per group after each, and, settled, the same pool; whole
`kvcalc sim` runs are byte-identical either way (JSON and timeline), where memory is tight too (preemptions by
recompute and by swap, whose swap bytes read the settled pool)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hybrid_layouts import hybrid_groups
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.sim import group_counts
from kvcalc.core.sim.paged_groups import GroupedPagedPolicy


@st.composite
def layouts(draw):
    B, groups, mode = draw(hybrid_groups())
    blocks = draw(st.integers(len(groups) * 3, len(groups) * 14))
    # each operation: (what, a request or a step count, tokens)
    ops = draw(st.lists(st.tuples(st.sampled_from(["admit", "step", "run", "one", "release"]), st.integers(0, 7),
                                  st.integers(1, 6 * B)), min_size=1, max_size=40))
    return B, groups, mode, blocks, ops


def pool_state(policy: GroupedPagedPolicy) -> tuple:
    pool = policy.pool  # settled (the property)
    seqs = {rid: [(p.seqs[rid].num_tokens, p.seqs[rid].num_blocks, p.seqs[rid].num_skipped) for p in pool.pools]
            for rid in pool.pools[0].seqs}
    return (pool.num_free_blocks, pool.store.useful_tokens, pool.state_slack(), [p.logical_blocks for p in pool.pools],
            seqs)


def apply(policy: GroupedPagedPolicy, op: tuple[str, int, int], running: list[int], tokens: dict[int, int]) -> object:
    """One operation on `policy` (its running list and tokens updated as the scheduler would); returns its answer."""
    what, arg, n = op
    if what == "admit":
        rid = max(tokens, default=-1) + 1
        fits = policy.can_admit(rid, 0, n)
        if fits:
            assert policy.admit(rid, 0, n)
            running.append(rid)
            tokens[rid] = n
        return fits
    if not running:
        return None
    if what == "release":
        rid = running.pop(arg % len(running))
        policy.release(rid, "finished")
        return rid
    if what == "step":  # the engine's decode step of every running request
        grown = policy.grow_many(np.array(running), np.array([tokens[r] + 1 for r in running]))
        if grown:
            for r in running:
                tokens[r] += 1
        return grown
    if what == "one":  # the scheduler's one-by-one pass: each grows or the last is preempted
        rid = running[arg % len(running)]
        grown = policy.grow(rid, tokens[rid] + 1)
        if grown:
            tokens[rid] += 1
        return grown
    if not policy.runs_decode:  # (align with a state group: runs step by step, as the engine asks runs_decode)
        return 0
    k, form = policy.decode_run(np.array([tokens[r] for r in running]), arg + 2, waiting=False)  # a run
    if k >= 2 and form is not None:
        policy.advance_run(np.array(running), np.array([tokens[r] for r in running]), k, form)
        for r in running:
            tokens[r] += k
    return k


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_counts_answer_and_report_as_the_pool_does(layout) -> None:
    B, groups, mode, blocks, ops = layout
    lazy, eager = (GroupedPagedPolicy(blocks, B, groups, mode, 64) for _ in range(2))
    eager.lazy_counts = False
    state: list[tuple[list[int], dict[int, int]]] = [([], {}), ([], {})]
    for op in ops:
        answers = [apply(policy, op, *s) for policy, s in zip((lazy, eager), state, strict=True)]
        assert answers[0] == answers[1], op
        assert state[0] == state[1]
        for a, b in zip(lazy.parts(np.zeros(0, np.int64), None), eager.parts(np.zeros(0, np.int64), None),
                        strict=True):
            assert np.array_equal(a, b), op
        assert lazy.group_blocks() == eager.group_blocks()
        assert lazy.num_used() == eager._pool.num_used
    # (align with a state group too: a jump's resumed page, HybridLayout._resume, is counted until its next step)
    assert eager._counts is None and lazy._counts is not None
    assert pool_state(lazy) == pool_state(eager)  # the lazy one settled: the same tables, counters and sums
    lazy.pool.check_invariants()


def test_a_count_that_misses_a_free_is_caught_when_the_pool_settles(monkeypatch) -> None:
    """A planted bug: a run that leaves each kind's first block where it was. The counts then say a sliding
    table holds blocks the pool freed, and settling says so."""
    monkeypatch.setattr(group_counts.PrivateCounts, "run", lambda self, ids, k: [
        self._add(self.tokens[r], self.skipped[r], -1) or self._add(self.tokens[r] + k, self.skipped[r], 1)
        or self.tokens.__setitem__(r, self.tokens[r] + k) for r in ids])
    policy = GroupedPagedPolicy(40, 4, (PoolGroup("full"), PoolGroup("sliding", 5)), "none", 4)
    assert policy.admit(0, 0, 6)
    k, form = policy.decode_run(np.array([6]), 8, waiting=False)
    assert k == 8 and form is not None
    with pytest.raises(AssertionError):
        policy.advance_run(np.array([0]), np.array([6]), k, form)  # check_run: the counts disagree with the form


CASES = [  # a tight pool (memory utilization 0.4) starts only with a max length it holds (vLLM's start check)
    ("gemma-3-27b", "--requests", "80"),
    ("gemma-3-27b", "--requests", "80", "--rate", "inf", "--memory-utilization", "0.4", "--max-model-len", "1088"),
    ("gemma-3-27b", "--requests", "60", "--rate", "inf", "--memory-utilization", "0.4", "--max-model-len", "1088",
     "--preempt", "swap"),  # preemptions by recompute above, by swap here
    ("gpt-oss-120b", "--tp", "2", "--requests", "80", "--cancel-fraction", "0.2"),
    ("llama-4-scout", "--tp", "2", "--requests", "60", "--rate", "4", "--max-model-len", "131072"),  # chunked
    ("nemotron-h-56b", "--requests", "60", "--rate", "4"),  # Mamba state pages, align
    ("nemotron-h-56b", "--requests", "60", "--rate", "inf", "--mamba-cache-mode", "none"),
    ("nemotron-h-56b", "--requests", "40", "--rate", "inf", "--mamba-cache-mode", "all"),
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: "-".join(a[:1] + a[3:6]))
def test_whole_runs_with_and_without_the_counts_are_byte_identical(run_cli, monkeypatch, tmp_path, args):
    model, *rest = args
    cmd = ("sim", "--model", model, "--gpu", "h200", *rest, "--json", "--timeline")
    steps: list[bool] = []
    real = group_counts.PrivateCounts.step
    monkeypatch.setattr(group_counts.PrivateCounts, "step", lambda self, *a, **kw: (
        steps.append(result := real(self, *a, **kw)), result)[1])
    counted = run_cli(*cmd, str(tmp_path / "counted.csv"))
    assert counted.exit_code == 0, counted.stderr
    assert sum(steps) >= 10, "the counts took almost no decode step"
    monkeypatch.setattr(GroupedPagedPolicy, "lazy_counts", False)
    steps.clear()
    pool = run_cli(*cmd, str(tmp_path / "pool.csv"))
    assert pool.exit_code == 0, pool.stderr
    assert not steps
    assert counted.stdout == pool.stdout
    if "--memory-utilization" in rest:  # the tight pools: growth refused, requests preempted (the counts settled)
        assert json.loads(counted.stdout)["preemptions"] > 0
    assert (tmp_path / "counted.csv").read_bytes() == (tmp_path / "pool.csv").read_bytes()
