"""A hybrid pool in `kvcalc sim`: what a swap moves (every group's pages, the state included), Mooncake keys on a
block forced past 512 tokens, and hits under mamba_cache_mode align. Expected figures worked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.sim.engine import Engine
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.paged_groups import GroupedPagedPolicy
from kvcalc.core.sim.run import SimSetup, make_policy
from kvcalc.core.sim.scheduler import SchedulerConfig
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.steptime import StepTimeExecutor, StepTimeModel
from kvcalc.core.sim.workload import Workload

B, P = 16, 1_000_000  # block tokens, bytes of one block id (a page in every layer slot of a table)
FULL, STATE, SLIDING = PoolGroup("full"), PoolGroup("state"), PoolGroup("sliding", 20)
TRACES = Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"


def policy(groups, mode: str = "none", blocks: int = 64) -> GroupedPagedPolicy:
    return GroupedPagedPolicy(blocks, B, groups, mode, 4, page_bytes=P)


@pytest.mark.parametrize(("groups", "mode", "grow_to", "pages", "pool_pages"), [
    # 40 tokens written (a prefill of 40): full ceil(40/16) = 3 blocks; state none: the page of token 39, 1 -> 4
    ((FULL, STATE), "none", None, 4, 4),
    # then 9 more (49 written): full ceil(49/16) = 4; state: the one page moved in place from block 2 to block
    # 3 = (49 − 1) // 16 (vLLM's one state block a request): 4 + 1 = 5, all the pool holds
    ((FULL, STATE), "none", 49, 5, 5),
    # align at 40, one step 0 -> 40 ending mid-block: as vLLM's aligned split runs it (0 -> 32, 32 -> 40) the pool
    # holds the page saved at 32 (1) and the step's last, (40 − 1) // 16 = 2: 3 + 2 = 5; the next step resumes from
    # page 2 and frees page 1 (get_num_skipped_tokens(40) = 39, 39 // 16 = 2), so a swap moves 3 + 1 = 4
    ((FULL, STATE), "align", None, 4, 5),
    # sliding W 20 at 40 written: the next token (40) reads 21..40, blocks 21 // 16 = 1 .. 2; the prefill step
    # needed block 0 too (token 19 reads 0..19) and the pool frees it at the next step: 3 + 2 = 5 (pool: 3 + 3)
    ((FULL, SLIDING), "none", None, 5, 6),
])
def test_a_swap_moves_each_groups_pages_by_hand(groups, mode, grow_to, pages, pool_pages):
    pol = policy(groups, mode)
    assert pol.admit(0, 0, 40)
    if grow_to is not None:
        assert pol.grow(0, grow_to)
    assert sum(pol.pool.swap_bytes(0, P)) == pool_pages * P
    assert pol.swap_bytes(0) == pages * P
    tokens = pol.pool.num_tokens(0)
    pol.release(0, "preempted")
    # the swap-in takes exactly the blocks that were moved out: the same request back at `tokens` written
    assert pol.admit(0, tokens, tokens, from_swap=True)
    assert sum(pol.pool.held_blocks(0)) == pages
    assert pol.swap_bytes(0) == pages * P


class Recorder(StepTimeExecutor):
    """The step-time model, recording each step's swaps and duration."""

    def __init__(self, model: StepTimeModel) -> None:
        super().__init__(model)
        self.steps: list = []

    def execute(self, plan):
        out = super().execute(plan)
        self.steps.append((plan.events, out.duration_s))
        return out


def state_pages(c: int) -> int:
    return -(-c // B) + 1  # full ceil(c / 16) + the running state page (mode none)


def window_pages(c: int) -> int:
    return 2 * -(-c // B) - max(0, c - 20 + 1) // B  # full ceil(c / 16) + sliding W 20 from max(0, c − 19) // 16


@pytest.mark.parametrize(("other", "pages"), [(STATE, state_pages), (SLIDING, window_pages)])
def test_swap_preemption_times_the_pools_bytes(other, pages):
    # full + Mamba state (none) or sliding W 20, 14 blocks of 16; four requests of prompt 40, output 60 at t = 0 need
    # 4 · (ceil(99 / 16) = 7 + 1 or 2) ≥ 32 blocks at their peak, so some are swapped out. Every step takes 10 ms
    # plus its swap bytes over 1e9 B/s: a preempted request with c tokens written moves pages(c) pages of 1e6 B out
    # (1 ms each), and the same bytes back at its swap-in.
    steptime = StepTimeModel(0.0, 0.0, 1, 0.0, 0.0, 0.0, 0.010, 1e9)
    setup = SimSetup(14, B, steptime, SchedulerConfig(max_model_len=512, preempt="swap"), groups=(FULL, other),
                     state_mode="none", page_bytes=P, prefix_caching=False)
    n = 4
    workload = Workload(np.zeros(n), np.full(n, 40, np.int64), np.full(n, 60, np.int64), "constructed", "test")
    pol = make_policy("paged", workload, setup)
    rec = Recorder(steptime)
    Engine(workload, pol, rec, setup.scheduler).run()
    pol.check_whole()
    out: dict[int, int] = {}
    swaps = 0
    for events, duration in rec.steps:
        moved = 0
        for p in events.preempted:
            assert p.num_bytes == pages(p.num_tokens) * P, p
            out[p.request_id] = p.num_bytes
            moved += p.num_bytes
        for s in events.swapped_in:
            assert s.num_bytes == out.pop(s.request_id), s
            moved += s.num_bytes
            swaps += 1
        assert duration == pytest.approx(0.010 + moved / 1e9, abs=1e-12)
    assert swaps > 0 and not out


def test_gemma3_swap_page_is_the_layouts_block_id():
    # Gemma-3-27B: 10 full + 52 sliding layers, 16 KV heads of 128 in bf16 = 8,192 B per token per layer; G = 10,
    # one block id = 10 · 16 · 8,192 = 1,310,720 B: what a swap moves per block of any table
    setup = build(SimOptions(model="gemma-3-27b", gpu="H200", preempt="swap"))
    assert setup.sim.page_bytes == 1_310_720
    assert setup.sim.groups is not None and len(setup.sim.groups) == 7  # full x1, sliding ceil(52 / 10) = 6


# ---- Mooncake keys on a forced block, align hits ---------------------------------------------------------------
def two_requests(tmp_path: Path) -> Path:
    # the same 9,000-token prompt (18 ids of 512) twice, the second long after the first has finished
    path = tmp_path / "t.jsonl"
    ids = list(range(1, 19))
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 9000, "output_length": 4, "hash_ids": ids})
                            + "\n" for t in (0, 1_000_000)))
    return path


def hits_of(setup, chunks: list | None = None) -> dict[int, int]:
    """Each admitted request's prefix-cache hit; `chunks` gets request 0's tokens of every step it is in."""
    seen: dict[int, int] = {}

    class Hits(StepTimeExecutor):
        def execute(self, plan):
            seen.update(plan.prefix_hit_tokens)
            if chunks is not None and 0 in (rows := plan.request_ids.tolist()):
                chunks.append(int(plan.num_new_tokens[rows.index(0)]))
            return super().execute(plan)

    pol = make_policy("paged", setup.workload, setup.sim)
    Engine(setup.workload, pol, Hits(setup.sim.steptime), setup.sim.scheduler).run()
    pol.check_whole()
    return seen


@pytest.mark.parametrize(("mode", "hit", "steps"), [
    # Nemotron-H-56B's block is forced to 4,128 tokens (not a divisor of 512): block j is keyed by the id of its
    # last token, ids[(4,128·(j + 1) − 1) // 512] = ids[8], ids[16]. Under align request 1's prefill is split at
    # block boundaries (budget 8,192): 0 -> 4,128 (8,192 ends before the last boundary 8,256: cut to one block),
    # 4,128 -> 8,256 (passes it: ends on it), 8,256 -> 9,000, then 3 decode steps; the state is saved at 4,128 and
    # 8,256. Request 2 may hit (9,000 − 1) // 4,128 = 2 blocks: both full blocks are cached and the state at 8,256
    # was saved: 8,256. Mode none saves no state: no hit, and the prefill is 8,192 then 808.
    ("align", 8_256, [4128, 4128, 744, 1, 1, 1]),
    ("none", 0, [8192, 808, 1, 1, 1]),
])
def test_nemotron_h_mooncake_hits_on_a_forced_block(tmp_path, mode, hit, steps):
    setup = build(SimOptions(model="nemotron-h-56b", gpu="H200", trace=("mooncake", str(two_requests(tmp_path))),
                             mamba_cache_mode=mode, max_batched_tokens=8192, max_model_len=16384))
    assert setup.plan.block_size == 4128
    chunks: list[int] = []
    assert hits_of(setup, chunks) == {0: 0, 1: hit}
    assert chunks == steps
    assert any("keyed by the id holding its last token" in n and "lower bound" in n for n in setup.notes)
    groups_note = next(n for n in setup.notes if n.startswith("KV cache groups"))
    assert ("not modelled" not in groups_note) and (("saved" in groups_note) == (mode == "align"))


@pytest.mark.skipif(not (TRACES / "mooncake_conversation.jsonl").exists(), reason="../shared/traces not present")
def test_nemotron_h_runs_a_real_mooncake_trace():
    # the conversation trace's turns share prefixes: under align some requests hit, each a whole number of blocks
    setup = build(SimOptions(model="nemotron-h-56b", gpu="H200", limit=60, mamba_cache_mode="align",
                             max_model_len=131072, trace=("mooncake", str(TRACES / "mooncake_conversation.jsonl"))))
    seen = hits_of(setup)
    assert len(seen) == 60 and all(h % 4128 == 0 for h in seen.values()) and any(seen.values())


def test_cli_runs_the_forced_block_and_says_the_lower_bound(run_cli, tmp_path):
    # no --block given: the 4,128-token block is the layout's, so no error may name --block; the JSON says the hits
    # are a lower bound (a single-group model keyed exactly says nothing of it: no kv_cache_groups)
    args = ("sim", "--model", "nemotron-h-56b", "--gpu", "H200", "--trace", "mooncake", str(two_requests(tmp_path)),
            "--mamba-cache-mode", "align", "--max-model-len", "16384", "--json")
    result = run_cli(*args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["kv_cache_groups"]["block_size"] == 4128 and doc["kv_cache_groups"]["prefix_hits_lower_bound"]
    plain = json.loads(run_cli(*args[:2], "llama-3-8b", *args[3:8], "--json").stdout)
    assert plain["kv_cache_groups"] is None


def test_align_needs_a_block_per_step(tmp_path):
    # the split at block boundaries needs one block (4,128 tokens) in a step's budget: 2,048 is refused by name
    from kvcalc.core.errors import ParameterError

    with pytest.raises(ParameterError, match="mamba_cache_mode align splits prefill") as e:
        build(SimOptions(model="nemotron-h-56b", gpu="H200", trace=("mooncake", str(two_requests(tmp_path))),
                         mamba_cache_mode="align", max_batched_tokens=2048, max_model_len=16384))
    assert e.value.params == ("mamba_cache_mode", "max_batched_tokens")
