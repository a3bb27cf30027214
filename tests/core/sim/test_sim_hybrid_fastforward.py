"""Runs of decode steps on a hybrid pool done at once (GroupedPagedPolicy.decode_run, and past finishes when
nobody waits: fastforward_groups) give the figures of stepping, byte for byte: the JSON of `kvcalc sim` with the
runs on and off (`fast_runs = False`, the step-by-step reference) on sliding (Gemma-3, gpt-oss), chunked
(Llama-4-Scout) and Mamba (Nemotron-H) hybrids, with preemption by recompute and swap, timeouts, cancellations
and a timeline; and the engine really took runs, requests finishing inside them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcalc.core.sim import fastforward_groups
from kvcalc.core.sim.paged_groups import GroupedPagedPolicy


def spy_runs(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """(k of each run stopped at a finish or arrival, requests finishing inside each run through finishes)."""
    segments: list[int] = []
    finishing: list[int] = []
    real = GroupedPagedPolicy.advance_run
    monkeypatch.setattr(GroupedPagedPolicy, "advance_run",
                        lambda self, *a: (segments.append(a[2]), real(self, *a))[1])
    real_pool = fastforward_groups._advance_pool

    def through(ff, run, remaining, k, ends, form):
        finishing.append(int((remaining <= k).sum()))
        return real_pool(ff, run, remaining, k, ends, form)

    monkeypatch.setattr(fastforward_groups, "_advance_pool", through)
    return segments, finishing

CASES = [
    ("gemma-3-27b", "--gpu", "h200", "--requests", "150"),
    # a tight pool of 485 blocks; vLLM starts only with a max length it holds: 7 · ceil(1,088 / 16) + 6 = 482 blocks
    # (1 full + 6 sliding tables), so the 8 requests longer than 1,088 tokens are rejected
    ("gemma-3-27b", "--gpu", "h200", "--requests", "120", "--rate", "inf", "--memory-utilization", "0.4",
     "--preempt", "swap", "--max-model-len", "1088"),  # 170 preemptions by swap
    ("gemma-3-27b", "--gpu", "h200", "--requests", "120", "--rate", "20", "--memory-utilization", "0.4",
     "--cancel-fraction", "0.2", "--max-model-len", "1088"),  # 155 preemptions by recompute, 23 cancellations
    ("gpt-oss-120b", "--gpu", "h200", "--tp", "2", "--requests", "150", "--block", "32"),
    ("llama-4-scout", "--gpu", "h200", "--tp", "2", "--requests", "100", "--rate", "4", "--max-model-len", "131072"),
    ("nemotron-h-56b", "--gpu", "h200", "--requests", "100", "--rate", "4"),  # Mamba state pages
    ("nemotron-h-56b", "--gpu", "h200", "--requests", "100", "--rate", "inf", "--mamba-cache-mode", "none"),
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: "-".join(a[:1] + a[3:6]))
def test_runs_of_decode_steps_match_stepping_byte_for_byte(run_cli, monkeypatch, tmp_path, args):
    model, *rest = args
    cmd = ("sim", "--model", model, *rest, "--json", "--timeline")
    segments, finishing = spy_runs(monkeypatch)
    fast = run_cli(*cmd, str(tmp_path / "fast.csv"))
    assert fast.exit_code == 0, fast.stderr
    assert segments or finishing, "no run of decode steps was fast-forwarded"
    if "inf" not in rest and "--memory-utilization" not in rest:  # the queue empties: runs go past finishes
        assert sum(finishing) >= 10, f"only {sum(finishing)} requests finished inside a run"
    monkeypatch.setattr(GroupedPagedPolicy, "fast_runs", False)
    slow = run_cli(*cmd, str(tmp_path / "slow.csv"))
    assert slow.exit_code == 0, slow.stderr
    assert fast.stdout == slow.stdout
    assert (tmp_path / "fast.csv").read_bytes() == (tmp_path / "slow.csv").read_bytes()


TRACE = Path(__file__).resolve().parents[4] / "shared" / "traces" / "mooncake_conversation.jsonl"


PREFIX_CASES = [  # (model and its flags, --limit): sliding (Gemma-3, gpt-oss), chunked (Llama-4-Scout)
    (("gemma-3-27b", "--gpu", "h200"), 150),
    (("gemma-3-27b", "--gpu", "h200", "--memory-utilization", "0.5", "--preempt", "swap"), 100),  # swap-ins wait
    (("gpt-oss-120b", "--gpu", "h200", "--tp", "2"), 100),
    (("llama-4-scout", "--gpu", "h200", "--tp", "2", "--max-model-len", "131072"), 100),  # 10M would not start
    (("gemma-3-27b", "--gpu", "h200", "--memory-utilization", "0.5", "--timeout", "5"), 100),  # the head times out
    (("llama-4-scout", "--gpu", "h200", "--tp", "2", "--max-model-len", "131072", "--cancel-fraction", "0.2",
      "--timeout", "2"), 100),
]


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize(("model", "limit"), PREFIX_CASES, ids=lambda a: "-".join(a[:1] + a[3:]) if
                         isinstance(a, tuple) else str(a))
def test_a_mooncake_trace_with_and_without_prefix_caching(run_cli, monkeypatch, tmp_path, caching, model, limit):
    # with prefix caching a block may be in several tables and a hit's blocks come back from the LRU cache: the runs
    # are planned from counts and applied where blocks change (core/pool/hybrid_runs.py), also while a request
    # waits refused; without it the closed form. Either way the same bytes as stepping
    if not TRACE.is_file():
        pytest.skip(f"the Mooncake conversation trace is not at {TRACE} (see ../shared/traces/README.md)")
    cmd = ("sim", "--model", *model, "--trace", "mooncake", str(TRACE), "--limit", str(limit),
           "--json", *(() if caching else ("--no-prefix-caching",)), "--timeline")
    segments, finishing = spy_runs(monkeypatch)
    fast = run_cli(*cmd, str(tmp_path / "fast.csv"))
    assert fast.exit_code == 0, fast.stderr
    assert segments or finishing, "no run of decode steps was fast-forwarded"
    assert not caching or sum(segments) >= 100, f"with prefix caching only {sum(segments)} steps were taken in runs"
    monkeypatch.setattr(GroupedPagedPolicy, "fast_runs", False)
    assert run_cli(*cmd, str(tmp_path / "slow.csv")).stdout == fast.stdout
    assert (tmp_path / "fast.csv").read_bytes() == (tmp_path / "slow.csv").read_bytes()
