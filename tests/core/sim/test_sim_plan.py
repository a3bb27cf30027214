"""The scheduler's plans: a tiny run by hand (block ids, slots, copy-on-write), a shadow KV store that a model
runner would be (swaps, copies and prefix hits must serve every request its own tokens), and that plans with
exact block tables change none of `kvcalc sim`'s results."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvcalc.core.sim.metrics import latencies
from kvcalc.core.sim.plan import StepOutcome, StepPlan
from kvcalc.core.sim.record import COMPLETED
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.settings import token_block_keys
from kvcalc.core.sim.steptime import StepTimeExecutor
from kvcalc.core.sim.workload import Workload, from_token_ids

from .test_sim_engine import assert_same_run, constant_steptime, make_setup, opt13b_steptime, random_workload


def token_of(rid: int, position: int) -> int:
    """The token request `rid` samples at `position`: any fixed rule will do, this one is easy to read."""
    return 100 * (rid + 1) + position


class Recorder:
    """Every step takes 10 ms; records the plans; request r samples token_of(r, position)."""

    def __init__(self) -> None:
        self.plans: list[StepPlan] = []

    def execute(self, plan: StepPlan) -> StepOutcome:
        self.plans.append(plan)
        tokens = {}
        for rid, start, new, samples in zip(plan.request_ids.tolist(), plan.num_computed_tokens.tolist(),
                                            plan.num_new_tokens.tolist(), plan.samples.tolist(), strict=True):
            if samples:
                tokens[rid] = token_of(rid, start + new)
        for parent, child in plan.events.forks:
            tokens[child] = token_of(child, plan.num_computed_tokens[plan.request_ids.tolist().index(parent)]
                                     + plan.num_new_tokens[plan.request_ids.tolist().index(parent)])
        return StepOutcome(0.01, tokens)


# ---- a run by hand -----------------------------------------------------------------------------------------------
def test_tiny_run_plans_by_hand():
    # Pool of 8 blocks of B = 4, handed out lowest id first. Every step 10 ms.
    #   row 0: prompt 1..6, 3 tokens, n = 2 (row 1 is its parallel sample); row 2: prompt 7 8 9 at 15 ms, 2 tokens
    #   step 0 (0 ms):  row 0 prefills 6 tokens into blocks [0, 1] (slots 0..5); samples; forks row 1 (shares [0, 1])
    #   step 1 (10 ms): rows 0, 1 decode position 6 into block 1, which both hold with 2 of 4 slots filled: row 0
    #                   copies it first (copy-on-write 1 -> 2; slot 2·4 + 2 = 10), row 1, its last holder, writes in
    #                   place (slot 1·4 + 2 = 6)
    #   step 2 (20 ms): rows 0, 1 decode position 7 (slots 11, 7); row 2 arrived at 15 ms: prefills 3 tokens into
    #                   block 3 (slots 12..14); rows 0, 1 reach 3 tokens and leave
    #   step 3 (30 ms): row 2 decodes position 3 (slot 15), reports the releases of rows 0 and 1; leaves at 40 ms
    w = from_token_ids([[1, 2, 3, 4, 5, 6], [7, 8, 9]], [3, 2], arrival_s=[0.0, 0.015], num_samples=[2, 1])
    assert w.fork_parent.tolist() == [-1, 0, -1]
    recorder = Recorder()
    record = run_policy(w, "paged", make_setup(8, 4, constant_steptime(0.01)), executor=recorder)
    plans = recorder.plans
    assert [p.request_ids.tolist() for p in plans] == [[0], [0, 1], [0, 1, 2], [2]]
    assert [p.num_computed_tokens.tolist() for p in plans] == [[0], [6, 6], [7, 7, 0], [3]]
    assert [p.num_new_tokens.tolist() for p in plans] == [[6], [1, 1], [1, 1, 3], [1]]
    assert [p.num_running for p in plans] == [0, 2, 2, 1]
    assert [p.blocks.slot_mapping.tolist() for p in plans] == [[0, 1, 2, 3, 4, 5], [10, 6], [11, 7, 12, 13, 14], [15]]
    assert [[t.tolist() for t in p.blocks.block_tables] for p in plans] == [[[0, 1]], [[0, 2], [0, 1]],
                                                                            [[0, 2], [0, 1], [3]], [[3]]]
    assert [p.blocks.cow_copies for p in plans] == [(), ((1, 2),), (), ()]
    assert plans[0].events.forks == ((0, 1),)
    assert plans[0].prefix_hit_tokens == {0: 0} and plans[2].prefix_hit_tokens == {2: 0}
    assert plans[3].events.released == ((0, "finished"), (1, "finished"))
    # the tokens each step computes: the prompt, then each sample's own tokens
    assert plans[0].token_ids == ((1, 2, 3, 4, 5, 6),)
    assert plans[1].token_ids == ((token_of(0, 6),), (token_of(1, 6),))
    assert plans[2].token_ids == ((token_of(0, 7),), (token_of(1, 7),), (7, 8, 9))
    assert record.generated_token_ids == [[token_of(0, 6), token_of(0, 7), token_of(0, 8)],
                                          [token_of(1, 6), token_of(1, 7), token_of(1, 8)],
                                          [token_of(2, 3), token_of(2, 4)]]
    lat = latencies(record)
    assert lat.ttft_s == pytest.approx([0.01, 0.01, 0.015])  # row 2: first token at 30 ms, arrived at 15
    assert lat.e2e_s == pytest.approx([0.03, 0.03, 0.025])
    assert record.steps == 4 and np.all(record.status == COMPLETED)


def test_prefix_hits_from_token_ids():
    # B = 4. Row 1 shares row 0's first 8 tokens and arrives after row 0 has left: its two full blocks are hits
    # (keys are the blocks' token ids), so it computes only its ninth token; row 2 differs in token 5: one hit block.
    shared = [5, 6, 7, 8, 9, 10, 11, 12]
    w = from_token_ids([[*shared, 1], [*shared, 2], [5, 6, 7, 8, 0, 10, 11, 12, 3]], [2, 2, 2],
                       arrival_s=[0.0, 1.0, 2.0])
    assert token_block_keys((1, 2, 3, 4, 5, 6, 7, 8, 9), 4) == [(1, 2, 3, 4), (5, 6, 7, 8)]
    recorder = Recorder()
    run_policy(w, "paged", make_setup(10, 4, constant_steptime(0.01)), executor=recorder)
    hits = {rid: hit for p in recorder.plans for rid, hit in p.prefix_hit_tokens.items()}
    assert hits == {0: 0, 1: 8, 2: 4}
    first_chunks = {int(p.request_ids[-1]): int(p.num_new_tokens[-1]) for p in recorder.plans if p.num_running == 0}
    assert first_chunks == {0: 9, 1: 1, 2: 5}


def test_end_of_sequence_from_the_executor_finishes_a_request():
    class StopsAtTwo(Recorder):
        def execute(self, plan):
            outcome = super().execute(plan)
            ended = frozenset(r for r, t in outcome.token_ids.items() if t == token_of(0, 4))  # row 0's 2nd token
            return StepOutcome(outcome.duration_s, outcome.token_ids, ended)

    w = from_token_ids([[1, 2, 3], [4, 5, 6]], [5, 5])
    record = run_policy(w, "paged", make_setup(8, 4, constant_steptime(0.01)), executor=StopsAtTwo())
    assert record.generated.tolist() == [2, 5] and np.all(record.status == COMPLETED)


def test_token_ids_need_an_executor_that_makes_tokens():
    w = from_token_ids([[1, 2, 3]], [2])
    with pytest.raises(ValueError, match="needs an executor that produces tokens"):
        run_policy(w, "paged", make_setup(8, 4))


def test_forks_need_the_paged_policy():
    w = from_token_ids([[1, 2, 3]], [2], num_samples=[2])
    with pytest.raises(ValueError, match="use the paged policy, not reserve-max"):
        run_policy(w, "reserve-max", make_setup(8, 4), executor=Recorder())


# ---- a shadow KV store: what a model runner reads is what was written ---------------------------------------------
class ShadowExecutor:
    """A model runner without a model. Each step: swap-outs copy their blocks' slots to the host, swap-ins write
    them back into the new blocks, copy-on-write copies run, every new token's id goes into its slot, and then every
    scheduled request reads its whole context back through its block table and must find its own tokens (prompt,
    then what it sampled). A block reused too early, a copy skipped or a wrong prefix-cache hit shows here even when
    every count is right. A sample ends early when its token is a multiple of 29 (an end of sequence)."""

    def __init__(self, workload: Workload, num_blocks: int, block_size: int) -> None:
        self.B = block_size
        self.store = np.full(num_blocks * block_size, -1, dtype=np.int64)
        self.host: dict[int, np.ndarray] = {}
        self.sequence = [list(p) for p in workload.prompt_token_ids]
        self.events = {"cow": 0, "swap_out": 0, "swap_in": 0, "hits": 0, "forks": 0, "eos": 0}

    def _slots(self, block_ids) -> np.ndarray:
        return (np.asarray(block_ids)[:, None] * self.B + np.arange(self.B)).ravel()

    def execute(self, plan: StepPlan) -> StepOutcome:
        events = plan.events
        for p in events.preempted:
            if p.mode == "swap":
                self.host[p.request_id] = self.store[self._slots(p.block_ids)][: p.num_tokens].copy()
                self.events["swap_out"] += 1
        for s in events.swapped_in:
            self.store[self._slots(s.block_ids)[: s.num_tokens]] = self.host.pop(s.request_id)
            self.events["swap_in"] += 1
        for src, dst in plan.blocks.cow_copies:
            self.store[self._slots([dst])] = self.store[self._slots([src])]
            self.events["cow"] += 1
        self.events["hits"] += sum(1 for hit in plan.prefix_hit_tokens.values() if hit)
        self.store[plan.blocks.slot_mapping] = np.concatenate([np.array(t, np.int64) for t in plan.token_ids])
        tokens, ended = {}, set()
        rows = zip(plan.request_ids.tolist(), plan.num_computed_tokens.tolist(), plan.num_new_tokens.tolist(),
                   plan.samples.tolist(), plan.blocks.block_tables, plan.token_ids, strict=True)
        for rid, start, new, samples, table, new_ids in rows:
            context = start + new
            positions = np.arange(context)
            read = self.store[table[positions // self.B] * self.B + positions % self.B]
            assert read.tolist() == self.sequence[rid][:context], f"request {rid} reads {read.tolist()}"
            assert list(new_ids) == self.sequence[rid][start:context]
            if samples:
                tokens[rid] = (rid * 31 + context * 17) % 1000
        for parent, child in events.forks:
            tokens[child] = (child * 31 + len(self.sequence[parent]) * 17) % 1000
            self.events["forks"] += 1
        for rid, token in tokens.items():
            self.sequence[rid].append(token)
            if token % 29 == 0:
                ended.add(rid)
        for rid, _ in events.released:
            self.host.pop(rid, None)
        self.events["eos"] += len(ended)
        return StepOutcome(0.01, tokens, frozenset(ended))


def shared_prefix_workload(seed: int, count: int = 40) -> Workload:
    """Prompts from 3 system prompts of 10-30 tokens plus their own 1-20 tokens; 1-3 samples each."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 1000, rng.integers(10, 31)).tolist() for _ in range(3)]
    prompts = [systems[rng.integers(3)] + rng.integers(0, 1000, rng.integers(1, 21)).tolist() for _ in range(count)]
    return from_token_ids(prompts, rng.integers(1, 40, count).tolist(),
                          arrival_s=np.sort(rng.uniform(0, 1.0, count)).tolist(),
                          num_samples=rng.integers(1, 4, count).tolist())


@pytest.mark.parametrize("preempt", ["recompute", "swap"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_request_reads_its_own_tokens_through_the_plans(preempt, seed):
    w = shared_prefix_workload(seed)
    setup = make_setup(24, 4, constant_steptime(0.01), preempt=preempt, max_batched_tokens=64, max_model_len=200)
    shadow = ShadowExecutor(w, 24, 4)
    record = run_policy(w, "paged", setup, executor=shadow)  # the pool is checked whole at the end
    assert np.all(record.status == COMPLETED)
    assert record.preemptions.sum() > 0
    for key in ("cow", "hits", "forks", "eos", *(("swap_out", "swap_in") if preempt == "swap" else ())):
        assert shadow.events[key] > 0, (key, shadow.events)
    # what each request generated is what the executor sampled for it, up to its length or its end of sequence
    for rid, tokens in enumerate(record.generated_token_ids):
        assert tokens == shadow.sequence[rid][len(w.prompt_token_ids[rid]):]
        assert len(tokens) == w.output_tokens[rid] or tokens[-1] % 29 == 0


@pytest.mark.parametrize("skip", ["cow", "swap_in"])
def test_the_shadow_store_catches_a_skipped_copy(skip):
    # planted bugs: an executor that ignores the plan's copies (or swap-ins) makes a request read wrong tokens
    class Careless(ShadowExecutor):
        def execute(self, plan):
            if skip == "cow":
                plan = replace(plan, blocks=replace(plan.blocks, cow_copies=()))
            else:
                plan = replace(plan, events=replace(plan.events, swapped_in=()))
            return super().execute(plan)

    w = shared_prefix_workload(1)
    setup = make_setup(24, 4, constant_steptime(0.01), preempt="swap", max_batched_tokens=64, max_model_len=200)
    with pytest.raises(AssertionError, match="reads"):
        run_policy(w, "paged", setup, executor=Careless(w, 24, 4))


# ---- sim's results do not depend on block detail -------------------------------------------------------------------
@pytest.mark.parametrize(("blocks", "preempt", "cancel", "timeout"), [
    (2000, "recompute", 0.0, None),
    (60, "recompute", 0.2, None),
    (60, "swap", 0.0, 3.0),
])
def test_exact_block_tables_change_no_result(blocks, preempt, cancel, timeout):
    # the default run (blocks owed between steps, fast-forwarded) against plans with exact block tables, one per step
    w = random_workload(60, 4.0, seed=3)
    setup = make_setup(blocks, 16, opt13b_steptime(), cancel_fraction=cancel, seed=5, preempt=preempt,
                       timeout_s=timeout)
    default = run_policy(w, "paged", setup)
    exact = run_policy(w, "paged", setup, executor=StepTimeExecutor(setup.steptime))
    assert default.segments > 0 and exact.segments == 0
    assert_same_run(default, exact)


def test_exact_block_tables_change_no_result_with_prefix_caching():
    # Mooncake-style prefix ids under memory pressure: evictions, hits and preemptions, with and without block detail
    rng = np.random.default_rng(4)
    n = 80
    ids_per_request = rng.integers(1, 4, n)
    hash_ids = rng.integers(0, 6, int(ids_per_request.sum()))
    offsets = np.concatenate([[0], np.cumsum(ids_per_request)])
    w = Workload(np.sort(rng.uniform(0, 10, n)), np.minimum(ids_per_request * 512, 1500).astype(np.int64),
                 rng.integers(1, 200, n), "real", "prefix test", hash_ids=hash_ids, hash_offsets=offsets)
    setup = make_setup(300, 16, opt13b_steptime(), max_model_len=4096)
    default = run_policy(w, "paged", setup)
    exact = run_policy(w, "paged", setup, executor=StepTimeExecutor(setup.steptime))
    assert default.preemptions.sum() > 0
    assert_same_run(default, exact)
