"""The scenarios added for the audit's planted bugs (issue 20): each one, run clean, passes with the events its
name promises; with a one-line bug of its kind planted in the pool or the paged policy, verify fails it.

    plant (monkeypatched for one test)                                   caught by
    the paged policy hands the pool the key of a block a prefill chunk   prefix-chunked (the pool refuses the key:
    has only partly written (⌈total/B⌉ instead of ⌊total/B⌋)             "N block keys for M completed blocks")
    the hit cap lets a cached block-aligned prompt hit its last block    aligned-repeat
    the fit check ignores copy-on-write copies                           fork-pressure (the pool runs out mid-step)
    a release queues a sequence's blocks head first (eviction order)     evict-return (the returning prefix misses)
    blocks released inside a step are freed at once (no step window)     async-cancel (a late read finds them
                                                                         overwritten), not cancel-reuse
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvcalc.core.blocks import ceil_div  # noqa: E402
from kvcalc.core.pool.prefix_lookup import PrefixIndex  # noqa: E402
from kvcalc.core.pool.store import BlockStore  # noqa: E402
from kvcalc.core.sim.paged import PagedPolicy  # noqa: E402
from kvcalc.core.sim.paged_exact import ExactPagedPolicy  # noqa: E402
from kvcalc.cuda_ext.verify.config import ModelConfig  # noqa: E402
from kvcalc.cuda_ext.verify.runner import run_scenario  # noqa: E402
from kvcalc.cuda_ext.verify.scenarios import BLOCK_SIZE, build, expected_hit  # noqa: E402
from kvcalc.cuda_ext.verify.weights import init_weights  # noqa: E402

SEED = 0
NEW = ("prefix-chunked", "aligned-repeat", "fork-pressure", "evict-return", "async-cancel")


@pytest.fixture(scope="module")
def weights():
    return init_weights(ModelConfig(), seed=SEED)


def run(name, weights):
    return run_scenario(build(name, weights.config.vocab_size, SEED), weights, seed=SEED,
                        attention_backend="torch-reference")


@pytest.mark.parametrize("name", NEW)
def test_each_new_scenario_passes_clean_with_its_events(weights, name):
    result = run(name, weights)
    assert result.status == "passed", (result.events, result.error, result.hit_error, result.first_content_error)
    assert all(result.events[e] > 0 for e in result.needs)


def _partial_block_key(self, rid):
    # the plant: ceil instead of floor, so a chunk ending inside a prompt block hands over that block's key
    old, total = int(self.pool_tokens[rid]), int(self.held_tokens[rid])
    self.owing.discard(rid)
    if old == total:
        return []
    keys = self._keys(rid)
    block_keys = None
    if keys is not None and old // self.block_size < len(keys):
        block_keys = keys[old // self.block_size : min(ceil_div(total, self.block_size), len(keys))]
    copies = self.pool.append(rid, total - old, block_keys)
    self.pool_tokens[rid] = total
    return copies


def test_prefix_chunked_catches_a_key_for_a_partly_written_block(weights, monkeypatch):
    monkeypatch.setattr(PagedPolicy, "_pool_append", _partial_block_key)
    result = run("prefix-chunked", weights)
    assert result.status == "failed" and "block keys for" in result.error


def test_aligned_repeat_catches_a_hit_on_the_last_prompt_block(weights, monkeypatch):
    probe = PrefixIndex.probe

    def off_by_one(self, num_tokens, block_keys, extra_key):
        # the plant: the cap (n - 1) // B written n // B for block-aligned prompts
        return probe(self, num_tokens + (num_tokens % self.store.block_size == 0), block_keys, extra_key)

    monkeypatch.setattr(PrefixIndex, "probe", off_by_one)
    result = run("aligned-repeat", weights)
    assert result.status == "failed"


def test_fork_pressure_catches_a_fit_check_without_copies(weights, monkeypatch):
    monkeypatch.setattr(ExactPagedPolicy, "_copies_needed", lambda self, rids, totals: 0)
    result = run("fork-pressure", weights)
    assert result.status == "failed" and "PoolExhaustedError" in result.error


def test_evict_return_catches_a_changed_eviction_order(weights, monkeypatch):
    drop = BlockStore.drop

    def head_first(self, blocks, num_tokens=None, *, defer=False):
        drop(self, np.asarray(blocks)[::-1], num_tokens, defer=defer)  # the plant: release order reversed

    monkeypatch.setattr(BlockStore, "drop", head_first)
    result = run("evict-return", weights)
    assert result.status == "failed" and "construction implies" in result.hit_error
    assert result.mismatched_tokens == 0 and result.content_errors == 0  # right tokens, wrong cache: only the hits


def test_async_cancel_catches_blocks_freed_inside_the_step_by_content(weights, monkeypatch):
    drop = BlockStore.drop

    def no_window(self, blocks, num_tokens=None, *, defer=False):
        drop(self, blocks, num_tokens, defer=False)  # the plant: the deferred free ignored

    monkeypatch.setattr(BlockStore, "drop", no_window)
    late = run("async-cancel", weights)
    assert late.status == "failed" and late.content_errors > 0
    assert "read one step late" in late.first_content_error
    # the synchronous executor has read everything before the releases: the same bug is invisible to it
    assert run("cancel-reuse", weights).mismatched_tokens == 0


def test_evict_return_expects_exactly_the_returning_prefix():
    scenario = build("evict-return", 256, SEED)
    b, b2 = scenario.requests.prompts[1], scenario.requests.prompts[3]
    # b and b2 share a 16-token system prompt, then differ: 4 whole blocks of 4, below b2's last token
    assert expected_hit(b, b2, BLOCK_SIZE) == 16 and scenario.expect_hits == ((3, 16),)
    # the pool: those 4 blocks plus z's peak, ceil((40 + 6 - 1) / 4) = 12 blocks
    assert scenario.num_blocks == 4 + 12


def test_expected_hit_never_covers_the_last_prompt_token():
    prompt = tuple(range(12))
    assert expected_hit(prompt, prompt, 4) == 8  # (12 - 1) // 4 * 4: the last block is recomputed
    assert expected_hit(prompt, (*prompt, 99), 4) == 12
    assert expected_hit(prompt, (0, 1, 2, 7), 4) == 0  # 3 common tokens: no whole block


def test_the_dry_run_schedules_as_the_model_run_does(weights):
    # fork-pressure's pool is picked by a model-free run of the scheduler: it must count the same CoW-decided
    # fits as the run with the model (tokens do not change the scheduling)
    from kvcalc.cuda_ext.verify.dry_run import cow_tight_fits

    scenario = build("fork-pressure", weights.config.vocab_size, SEED)
    r = scenario.requests
    dry = cow_tight_fits(r.prompts, r.max_new_tokens, r.arrival_s, r.num_samples, scenario.num_blocks, BLOCK_SIZE,
                         scenario.scheduler)
    assert dry > 0 and dry == run("fork-pressure", weights).events["cow_tight_fits"]
