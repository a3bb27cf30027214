"""Where kvcalc's sim and vLLM v1 disagreed, each a minimal request list worked by hand (vLLM's rules as in
tests/vllm_model.py: get_computed_blocks looks up at most num_tokens - 1 tokens; allocate_slots caches every full
block of the first min(computed + new, num_tokens) tokens; a freed table goes to the free queue's tail last entry
first; a hand-out pops the head and drops that block's hash). Block 128 tokens (4 a Mooncake id), one step 1 s.

Each test runs kvcalc (run_kvcalc) and asserts vLLM's numbers; the model of vLLM proper agrees with them
(test_the_model_gives_the_hand_numbers), and the model with kvcalc's old choices (hash_outputs=False,
one_block_per_hash=True) gives the numbers kvcalc gave before. All three were strict xfails until fixed: sampled blocks
keyed in 51e20da (core/sim/output_keys.py, core/pool/register_full.py), several blocks a hash and anchored blocks by
content class in 0348c2f (core/pool/dup_lists.py, group_hits.py).
"""

from __future__ import annotations

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


def test_a_recomputed_request_hits_its_own_sampled_blocks():
    steps, _ = run_kvcalc(OWN_OUTPUT, [("full", 0)], **OWN_OUTPUT_POOL)
    assert steps[129]["preempted"] == [1]
    assert _scheduled(steps, 150) == [(1, 128, 101)]


# kvcalc cached a hash in one block only until 0348c2f (prefix_lookup._register -> index.insert_absent).
def test_a_duplicate_block_serves_a_hit_after_the_first_copy_is_evicted():
    steps, _ = run_kvcalc(DUPLICATE, [("full", 0)], **DUPLICATE_POOL)
    assert [s["scheduled"] for s in steps[:3]] == [[(0, 0, 256)], [(1, 128, 128)], [(2, 0, 256)]]
    assert _scheduled(steps, 3) == [(3, 256, 128)]


# In a hybrid, a window group's block is cached by its own content, whatever the full group's block beside it.
# Full + chunked C = 256 (2 blocks), pool 11 ids (free 1..10), max_model_len 512 (vLLM's start-up check: full 4 +
# chunked cdiv(min(256 + 128, 512), 128) = 3 <= 11), budget 128; each allocation takes the full block, then the chunked.
#   A (300 of id 1, 100 out, t 0): steps 0-2 chunks 128, 128, 44: full [1, 3, 5]; chunked [2, 4, 6], then at 256
#     computed its chunk-0 blocks 2, 4 are freed (cached): queue [7, 8, 9, 10, 4, 2]; decodes from step 3 on
#   D (384 of id 7000, 1 out, t 4): chunks of 127 at steps 4-6 take 7, 8 | 9, 10 | 4, 2 (A's chunked copies of id 1's
#     blocks 0 and 1: evicted); step 7: 3 tokens, its chunk-0 blocks 10, 8 freed (queue [10, 8]), it leaves after Q's
#     admission: queue [4, 9, 7, 2]
#   Q (200 of id 1, 1 out, t 5) waits for budget until step 7: hit 0 (the full group has A's block 0, the chunked group
#     none: 199 // 128 = 1 block looked up), 124 tokens into 10 (full) and 8 (chunked), no block full yet
#   step 8: A 1, Q 124..199 (76): block 0 full now, cached in both groups (the full one beside A's; the chunked one the
#     only copy); R (200 of id 1, t 7) admitted with 128 - 1 - 76 = 51 tokens: vLLM finds A's full block 0 and Q's
#     chunked block 0 -> 128 computed, 51 new. kvcalc: 0 computed, 51 new.
ANCHORED = [Req(0, 0.0, 300, 100, (1,)), Req(1, 4.0, 384, 1, (7000,)), Req(2, 5.0, 200, 1, (1,)),
            Req(3, 7.0, 200, 1, (1,))]
ANCHORED_POOL = dict(num_blocks=11, block=B, budget=128, max_seqs=4, max_model_len=512, caching=True)
ANCHORED_STEPS = [[(0, 0, 128)], [(0, 128, 128)], [(0, 256, 44)], [(0, 300, 1)], [(0, 301, 1), (1, 0, 127)],
                  [(0, 302, 1), (1, 127, 127)], [(0, 303, 1), (1, 254, 127)], [(0, 304, 1), (1, 381, 3), (2, 0, 124)]]


def test_the_model_gives_the_hand_numbers_of_the_chunked_case():
    for kvcalc_choices in (False, True):
        model = run_model(ANCHORED, [("full", 0), ("chunked", 256)], **ANCHORED_POOL,
                          hash_outputs=not kvcalc_choices, one_block_per_hash=kvcalc_choices)
        assert [s["scheduled"] for s in model.steps[:8]] == ANCHORED_STEPS
        assert model.steps[8]["scheduled"] == [(0, 305, 1), (2, 124, 76), (3, 128, 51)]


# kvcalc registered an anchored group's block only beside the indexed full block until 0348c2f
# (group_hits.register_anchored; Canonical noted from the first chunk's keys, which here hold no full block).
def test_a_chunked_block_beside_a_duplicate_full_block_is_cached():
    steps, _ = run_kvcalc(ANCHORED, [("full", 0), ("chunked", 256)], **ANCHORED_POOL)
    assert [s["scheduled"] for s in steps[:8]] == ANCHORED_STEPS
    assert _scheduled(steps, 8) == [(0, 305, 1), (2, 124, 76), (3, 128, 51)]
