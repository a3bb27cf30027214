"""Where kvcalc's sim and vLLM v1 disagreed on a hybrid's prefix cache (full + sliding-window / chunked groups), each
a minimal request list worked by hand, found by random examples of test_sim_vllm_model.py's hybrid comparisons.

vLLM's rules as in tests/vllm_model.py (test_sim_vllm_model_cases.py's docstring has the pool's): a look-up takes the
full group's longest cached prefix, then a sliding group's blocks covering the last W - 1 tokens of it must be cached
too (by the sliding group's own content key, whoever computed them); every allocation caches each group's full blocks
of min(computed + new, num_tokens) tokens. Block 128 tokens (4 a Mooncake id), one step 1 s; block ids are the
model's (1..N-1 free; kvcalc numbers them from 0). Each test runs kvcalc and asserts vLLM's numbers; the model of vLLM
proper and the model with kvcalc's two old choices (hash_outputs=False, one_block_per_hash=True) both give them
(test_the_model_gives_the_hand_numbers), so the disagreement was neither of those. A strict xfail until 0348c2f.
"""

from __future__ import annotations

from vllm_compare import run_kvcalc, run_model
from vllm_model import Req

B = 128
SLIDING = [("full", 0), ("sliding", 129)]  # W 129: a hit of h blocks needs the sliding block h - 1 only

# A window block computed after a short first chunk is cached by its content.
# Pool 13 ids (free 1..12), max_model_len 512 (vLLM's start-up check: 4 + 4 <= 12), budget 128.
#   A (384 of id 1, 10 out, t 0): steps 0-2 chunks of 128: full [1, 3, 5], sliding [2, 4, 6], all cached; at step 2
#     (256 computed, 256 - 129 + 1 = 128 tokens skipped) sliding 2 leaves the window; at step 3 (384 computed, 256
#     skipped) sliding 4 does; A's 385th token takes 7, 8: queue [11, 12, 2, 4]. A decodes until step 12.
#   D (381 of its own id, 1 out, t 3): chunks of 127 (A decodes 1) at steps 3-5 take 9, 10 | 11, 12 | 2, 4 (A's
#     sliding blocks 0 and 1: evicted); D leaves after step 5: queue [2, 11, 9, 4, 12, 10].
#   R (300 of id 1, 1 out, t 5): no budget at step 5; step 6: looks up 299 tokens (2 blocks): full 1, 3 (A's, held),
#     but sliding 1 (a hit of 2 blocks) and 0 (a hit of 1) are gone: hit 0; 127 tokens into 2 (full), 11 (sliding).
#     Step 7: 127..254 into 9, 4: block 0 full; R's full 2 repeats A's 1; its sliding 11 is the only copy: vLLM
#     caches it. Step 8: 254..300 (46) into 12, 10: block 1 full; sliding 4 cached. R leaves.
#     kvcalc: R's 127-token first chunk holds no full block, so its admission looks up no key and never learns that
#     R's full blocks 0, 1 repeat A's cached ones (group_hits.Canonical); R's sliding blocks are anchored to R's own
#     full blocks, duplicates left unindexed, and are never cached.
#   S (300 of id 1, 1 out, t 9), step 9: vLLM: A's full 1, 3 + R's sliding 4 -> 256 computed, 44 new; kvcalc: 0, 127.
FIRST_CHUNK = [Req(0, 0.0, 384, 10, (1,)), Req(1, 3.0, 381, 1, (2000,)), Req(2, 5.0, 300, 1, (1,)),
               Req(3, 9.0, 300, 1, (1,))]
FIRST_CHUNK_POOL = dict(num_blocks=13, block=B, budget=128, max_seqs=4, max_model_len=512, caching=True)
FIRST_CHUNK_STEPS = [[(0, 0, 128)], [(0, 128, 128)], [(0, 256, 128)], [(0, 384, 1), (1, 0, 127)],
                     [(0, 385, 1), (1, 127, 127)], [(0, 386, 1), (1, 254, 127)], [(0, 387, 1), (2, 0, 127)],
                     [(0, 388, 1), (2, 127, 127)], [(0, 389, 1), (2, 254, 46)]]


def test_the_model_gives_the_hand_numbers():
    for kvcalc_choices in (False, True):
        model = run_model(FIRST_CHUNK, SLIDING, **FIRST_CHUNK_POOL, hash_outputs=not kvcalc_choices,
                          one_block_per_hash=kvcalc_choices)
        assert [s["scheduled"] for s in model.steps[:9]] == FIRST_CHUNK_STEPS
        assert model.steps[9]["scheduled"] == [(0, 390, 1), (3, 256, 44)]


# kvcalc noted a request's recomputed duplicates (group_hits.Canonical) from its first chunk's keys only and anchored
# window blocks to them until 0348c2f (anchored blocks by content class since).
def test_a_window_block_after_a_short_first_chunk_is_cached():
    steps, _ = run_kvcalc(FIRST_CHUNK, SLIDING, **FIRST_CHUNK_POOL)
    assert [s["scheduled"] for s in steps[:9]] == FIRST_CHUNK_STEPS
    assert steps[9]["scheduled"] == [(0, 390, 1), (3, 256, 44)]
