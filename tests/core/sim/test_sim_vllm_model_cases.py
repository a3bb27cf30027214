"""Where kvcalc's sim and vLLM v1 disagree, each a minimal request list worked by hand (vLLM's rules as in
tests/vllm_model.py: get_computed_blocks looks up at most num_tokens - 1 tokens; allocate_slots caches every full
block of the first min(computed + new, num_tokens) tokens; a freed table goes to the free queue's tail last entry
first; a hand-out pops the head and drops that block's hash). Block 128 tokens (4 a Mooncake id), one step 1 s.

Each test runs kvcalc (run_kvcalc) and asserts vLLM's numbers; the model of vLLM proper agrees with them
(test_the_model_gives_the_hand_numbers), so the strict xfails fail only on kvcalc's side.
"""

from __future__ import annotations

import pytest
from vllm_compare import run_kvcalc, run_model
from vllm_model import Req

B = 128

# A request preempted by recompute re-admits from its own cached blocks, sampled tokens included.
# Pool 6 ids (null block + 5 free), max_model_len 640 (5 blocks, vLLM's start-up check), budget 2,048.
#   step 0: A (256 prompt, 150 out) 256 tokens -> 2 blocks; R (100 prompt, 300 out) 100 -> 1 block; 3 used
#   step s >= 1 decodes both: A needs its 3rd block at 256 + s = 257 (s = 1), R its 2nd at 100 + s = 129 (s = 29):
#   5 used. A's 4th at 256 + s = 385 (s = 129): none free -> R (last running) preempted with 100 + 128 = 228
#   computed, 129 sampled (229 tokens); R's 2 blocks go to the tail last first [r1, r0]; A takes r1 (no hash).
#   R's block 0 = 100 prompt + 28 sampled tokens, full, cached by vLLM when allocated (step 28).
#   R waits (vLLM: hit 128, 229 - 128 = 101 new, cdiv(229, 128) = 2 blocks: 1 new + its hit block, free in the queue
#   = 2 > 1 free) until A finishes: 150 tokens = step 0's + steps 1..149 -> A leaves at step 149 (4 blocks freed).
#   step 150: vLLM re-admits R at 128 computed with 101 new; kvcalc (prompt blocks keyed only: 100 < 128, none) at 0
#   with 229 new.
OWN_OUTPUT = [Req(0, 0.0, 256, 150, (1000,)), Req(1, 0.0, 100, 300, (2000,))]
OWN_OUTPUT_POOL = dict(num_blocks=6, block=B, budget=2048, max_seqs=4, max_model_len=640, caching=True)

# A duplicate block keeps its hash in vLLM. Pool 5 ids (free 1..4), max_model_len 512 (4 blocks), budget 2,048.
#   step 0: A (256 prompt of id 1, 1 out) takes 1, 2 (both cached) and leaves: queue [3, 4, 2, 1]
#   step 1: B (the same 256) hits block 0 only (255 // 128 = 1 block looked up) = id 1 (touched out of the queue),
#           computes 128..255 in 3 (popped): the same hash as 2; vLLM caches 3 too. B leaves: queue [4, 2, 3, 1]
#   step 2: D (256 of its own id 7000) pops 4 and 2: 2's hash goes; leaves: queue [3, 1, 2, 4]
#   step 3: C (384 of id 1) looks up 383 // 128 = 2 blocks: vLLM finds 1 and 3 -> 256 computed, 128 new;
#           kvcalc left 3 hash-less (one block per hash), its 2 is evicted -> 128 computed, 256 new.
DUPLICATE = [Req(0, 0.0, 256, 1, (1,)), Req(1, 1.0, 256, 1, (1,)), Req(2, 2.0, 256, 1, (7000,)),
             Req(3, 3.0, 384, 1, (1,))]
DUPLICATE_POOL = dict(num_blocks=5, block=B, budget=2048, max_seqs=4, max_model_len=512, caching=True)


def _scheduled(steps, k):
    return steps[k]["scheduled"]


def test_the_model_gives_the_hand_numbers():
    model = run_model(OWN_OUTPUT, [("full", 0)], **OWN_OUTPUT_POOL)
    assert model.steps[129]["preempted"] == [1] and model.steps[150]["scheduled"] == [(1, 128, 101)]
    model = run_model(DUPLICATE, [("full", 0)], **DUPLICATE_POOL)
    assert [s["scheduled"] for s in model.steps] == [[(0, 0, 256)], [(1, 128, 128)], [(2, 0, 256)], [(3, 256, 128)]]
    # kvcalc's choices taken by the model reproduce kvcalc's numbers (the switches of vllm_model.VllmEngine)
    model = run_model(OWN_OUTPUT, [("full", 0)], **OWN_OUTPUT_POOL, hash_outputs=False)
    assert model.steps[150]["scheduled"] == [(1, 0, 229)]
    model = run_model(DUPLICATE, [("full", 0)], **DUPLICATE_POOL, one_block_per_hash=True)
    assert model.steps[3]["scheduled"] == [(3, 128, 256)]


@pytest.mark.xfail(strict=True, reason="kvcalc keys only prompt blocks (kvcalc/core/sim/settings.py:57 "
                   "prompt_block_keys; kvcalc/core/sim/paged.py:113 and paged_groups.py:72 look up only those): a "
                   "request preempted by recompute never hits its own blocks holding sampled tokens, vLLM does")
def test_a_recomputed_request_hits_its_own_sampled_blocks():
    steps, _ = run_kvcalc(OWN_OUTPUT, [("full", 0)], **OWN_OUTPUT_POOL)
    assert steps[129]["preempted"] == [1]
    assert _scheduled(steps, 150) == [(1, 128, 101)]


@pytest.mark.xfail(strict=True, reason="kvcalc caches a hash in one block only (kvcalc/core/pool/prefix_lookup.py:11 "
                   "and :329, _register -> index.insert_absent: 'a block whose chain is already cached in another "
                   "block stays unindexed'); vLLM's BlockPool.cache_full_blocks caches the duplicate too, and it "
                   "serves a later hit once the first copy is evicted")
def test_a_duplicate_block_serves_a_hit_after_the_first_copy_is_evicted():
    steps, _ = run_kvcalc(DUPLICATE, [("full", 0)], **DUPLICATE_POOL)
    assert [s["scheduled"] for s in steps[:3]] == [[(0, 0, 256)], [(1, 128, 128)], [(2, 0, 256)]]
    assert _scheduled(steps, 3) == [(3, 256, 128)]
