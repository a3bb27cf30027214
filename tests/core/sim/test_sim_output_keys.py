"""Blocks holding sampled tokens are cached as vLLM v1 caches every full block it computes (core/sim/output_keys.py,
core/pool/register_full.py): a request preempted by recompute re-admits from its own blocks, output ones included.

One story on four pools, block B = 128 (4 a Mooncake id), one step 1 s, budget 2,048, max_model_len 640:
    A: 256 prompt (id 1000), 100 out: decodes from step 1, its tokens 256 + s at step s, 3 blocks a table from s = 1
       (tokens 256..355 never reach 384); its last token is sampled at step 99: it leaves after step 99
    R: 200 prompt (id 2000), 300 out: prompt block 0 keyed; block 1 = 72 prompt + 56 sampled tokens once full
R is preempted when it needs its third block (token 256) and nothing is free; it then holds 256 computed tokens and
has sampled 57 (257 tokens). Its re-admission looks up 256 // 128 = 2 blocks: vLLM (and kvcalc now) finds both, the
second holding sampled tokens, so 256 computed and 1 new; with prompt keys only kvcalc found block 0: 128 + 129 new.
A waiting request's own cached blocks are in the free queue and count against it (vLLM's num_evictable_computed_blocks):
it waits until A leaves.
"""

from __future__ import annotations

import numpy as np
from vllm_compare import Recorder, run_model, workload
from vllm_model import Req

from kvcalc.core.pool.block_pool import BlockPool, ReleaseReason
from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.register_full import register_full
from kvcalc.core.sim.engine import Engine
from kvcalc.core.sim.output_keys import sampled_keys
from kvcalc.core.sim.run import make_policy
from kvcalc.core.sim.scheduler import SchedulerConfig
from kvcalc.core.sim.settings import SimSetup

B = 128
STORY = [Req(0, 0.0, 256, 100, (1000,)), Req(1, 0.0, 200, 300, (2000,))]
LIMITS = dict(budget=2048, max_seqs=4, max_model_len=640)


def _run(reqs, kinds, num_blocks, mode="none"):
    """kvcalc's sim on `num_blocks` ids less the null block (as tests/vllm_compare.run_kvcalc, with a state mode);
    (steps, record, policy)."""
    groups = tuple(PoolGroup(k, w or None) for k, w in kinds)
    config = SchedulerConfig(max_batched_tokens=LIMITS["budget"], max_seqs=LIMITS["max_seqs"],
                             max_model_len=LIMITS["max_model_len"], fast_forward=False)
    setup = SimSetup(num_blocks - 1, B, None, config, prefix_caching=True,
                     groups=None if kinds == [("full", 0)] else groups, state_mode=mode, null_blocks=1)
    w = workload(reqs)
    policy = make_policy("paged", w, setup)
    recorder = Recorder(policy)
    record = Engine(w, policy, recorder, config).run(None, None)
    return recorder.steps, record, policy


def _agrees_with_vllm(steps, kinds, num_blocks):
    model = run_model(STORY, kinds, num_blocks, B, caching=True, hash_outputs=True, one_block_per_hash=False, **LIMITS)
    for k, (ours, theirs) in enumerate(zip(steps, model.steps, strict=True)):
        assert (ours["scheduled"], ours["preempted"], ours["groups"]) == (
            theirs["scheduled"], theirs["preempted"], theirs["groups"]), f"step {k}"


def test_plain_pool():
    # 6 ids (5 free). step 0: A 2 blocks, R 2 (200 tokens): 1 free. step 1: A's token 256 takes it: 0 free.
    # step 57: R's token 200 + 56 = 256 needs a third block: R (the last running) preempted, 256 computed: r0 (prompt)
    # and r1 (72 prompt + 56 sampled, registered under R's sampled key now) go to the queue's tail [r1, r0]; 2 free.
    # R (257 tokens) hits both, needs 1 new + its 2 cached = 3 > 2: waits. A leaves after step 99 (3 freed): step 100
    # R runs from 256 with 1 new token.
    steps, record, policy = _run(STORY, [("full", 0)], 6)
    assert steps[57]["preempted"] == [1] and steps[57]["scheduled"] == [(0, 312, 1)]
    assert steps[100]["scheduled"] == [(1, 256, 1)]
    prefix = record.prefix.to_dict()
    readmitted = (prefix["readmissions"], prefix["readmitted_prompt_tokens"], prefix["readmitted_hit_tokens"])
    assert readmitted == (1, 257, 256)
    assert prefix["recomputed_tokens"] == 0  # 256 dropped, all served again by the hit
    # at the end the cached blocks are R's 3 full ones (200 + 299 = 499 tokens: 3 full, the 4th partial) and A's
    # block 0: R took a2 (token 256) and then a1 (token 384) from the queue [a2, a1, a0] left after its hits,
    # evicting A's block 1; A's block 2 (256..355) never filled. Prompt keys only: R's block 0 and A's block 0
    assert policy.pool.store.queue.num_cached == 4
    _agrees_with_vllm(steps, [("full", 0)], 6)


def test_sliding_hybrid():
    # full + sliding W 128, 10 ids (9 free). step 0: A and R 2 + 2 blocks each: 8 used, 1 free. step 1: A's token 256
    # reads 129..256: its sliding block 0 is freed, then A takes block 2 in both groups (2 = 1 free + 1 freed).
    # step 56: R's token 255 reads 128..255: its sliding block 0 freed (groups [5, 3]), 1 free. step 57: R's token
    # 256 needs 2 blocks, 1 free: R preempted holding full r0, r1 and sliding s1 (registered beside r1 at the release).
    # R's look-up at 257 tokens: full r0, r1 and the window before 256 (tokens 129..255: s1) -> 256; 2 new + 3 cached
    # = 5 > 4 free: it waits for A (leaves after step 99). Prompt keys only: 128 computed, 129 new.
    kinds = [("full", 0), ("sliding", 128)]
    steps, record, _ = _run(STORY, kinds, 10)
    assert steps[56]["groups"] == [5, 3] and steps[57]["preempted"] == [1]
    assert steps[100]["scheduled"] == [(1, 256, 1)]
    assert record.prefix.to_dict()["group_hit_tokens"] == [256, 256]  # R's first admission hit nothing
    _agrees_with_vllm(steps, kinds, 10)


def test_chunked_hybrid():
    # full + chunked C 512 (4 blocks: no chunk ends in this story), 11 ids (10 free): every table as a full one's.
    # step 0: 4 + 4 used, 2 free; step 1: A's token 256 takes 2: 0 free. step 57: R's token 256 needs 2: preempted
    # holding r0, r1, c0, c1 (r1 and c1 registered at the release). Its look-up: r0, r1 and the chunk's c0, c1 -> 256;
    # 2 new + 4 cached = 6 > 4 free: waits for A. step 100: 256 computed, 1 new (prompt keys only: 128, 129).
    kinds = [("full", 0), ("chunked", 512)]
    steps, _, _ = _run(STORY, kinds, 11)
    assert steps[57]["preempted"] == [1] and steps[57]["groups"] == [3, 3]
    assert steps[100]["scheduled"] == [(1, 256, 1)]
    _agrees_with_vllm(steps, kinds, 11)


def test_mamba_align_hybrid():
    # full + state (mamba_cache_mode align: a state page is cached where a step ends on a block boundary), 9 ids (8
    # free). step 0: A's 256 in one chunk; R's 200 split at the block boundary (vLLM's block-aligned split): 128.
    # A holds 2 full + 1 page, R 1 + 1: [3, 2], 3 free. step 1: A's token 256 needs a full block and a page (2); R's
    # 128..199 a full block and a page (2): 4 > 3, R preempted (its block 0 and the state at 128 stay cached).
    # step 2: R hits 128 (block 0 and its state), computes 72. It decodes from step 3; step 58 computes token 255.
    # step 59: R's token 256 needs a full block and a page, none free: preempted holding r0, r1 (72 prompt + 56
    # sampled) and the page of the state at 256 (registered beside r1 at the release: the last step ended there).
    # Its look-up at 257 tokens: r0, r1 and the state at 256 -> 256; it waits for A (leaves after step 99): step 100
    # 256 computed, 1 new. Prompt keys only: 128 computed, 128 new (the chunk cut at the block boundary).
    steps, record, _ = _run(STORY, [("full", 0), ("state", 0)], 9, mode="align")
    assert steps[0]["scheduled"] == [(0, 0, 256), (1, 0, 128)] and steps[1]["preempted"] == [1]
    assert steps[2]["scheduled"] == [(0, 257, 1), (1, 128, 72)]
    assert steps[59]["preempted"] == [1] and steps[100]["scheduled"] == [(1, 256, 1)]
    prefix = record.prefix.to_dict()
    assert (prefix["readmissions"], prefix["readmitted_hit_tokens"], prefix["recomputed_tokens"]) == (2, 384, 0)


def test_sampled_keys_are_their_requests_own():
    # Mooncake ids are never negative: -1 - rid; token ids are tuples of ints: ("sampled", rid)
    assert sampled_keys(np.array([5, 6], dtype=np.int64), 3, 2).tolist() == [-4, -4]
    assert sampled_keys([(1, 2)], 3, 2) == [("sampled", 3), ("sampled", 3)]


def test_object_keys_register_and_hit_on_a_plain_pool():
    # token-id prompts key their blocks by tuples: a sequence of 40 tokens, B 16, prompt keys for block 0 only (its
    # prompt of 20 tokens); blocks 1 (4 prompt + 12 sampled tokens) registered under ("sampled", 7) at the release
    pool = BlockPool(8, 16, enable_prefix_caching=True)
    prompt = [tuple(range(16))]
    pool.allocate(7, 20, prompt)
    pool.append(7, 20)
    assert register_full(pool, 7, 0, sampled_keys(prompt, 7, 2)) == 0  # its chain is at block 1, not 0
    assert register_full(pool, 7, 1, sampled_keys(prompt, 7, 5)) == 1  # 40 // 16 = 2 full blocks: one past block 0
    pool.release(7, ReleaseReason.PREEMPTED)
    assert pool.store.queue.num_cached == 2
    # its re-admission at 41 tokens looks up 40 // 16 = 2 blocks: both found
    assert pool.hit_tokens(41, [*prompt, *sampled_keys(prompt, 7, 1)]) == 32
    assert pool.hit_tokens(41, [*prompt, *sampled_keys(prompt, 8, 1)]) == 16  # another request's key: block 0 only
