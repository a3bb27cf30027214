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


# A window block whose full block's content was evicted stays vLLM's first cached copy (found by its own hash).
# Full + sliding W 1000 (a hit of up to 8 blocks needs every sliding block), pool 29 ids (free 1..28), budget 128,
# max_seqs 2, max_model_len 1536. Id 1's blocks 0..3 in the full group are F0..F3, in the sliding group S0..S3.
#   R0 (1117 of ids 1, 1800, 1801; 12 out): chunks of 128 at steps 0-7 take full 1, 3, 5, 7, ... and sliding 2, 4, 6,
#     8, ...: F0..F3 = 1, 3, 5, 7, S0..S3 = 2, 4, 6, 8. R1 (634 of its own ids, 8 out) from step 8. At step 19 R0's
#     window lets S0 (2) go, R0 leaves: queue [2, 17, 15, 13, 11, 9, 7, 5, 3, 1, 18, 16, ..., 4].
#   step 20: R1's last block pair takes 2 (S0 evicted) and 17; R2 (384 of id 1, 1 out) finds F0, F1 but not S0: hit 0;
#     127 tokens into 15, 13. Step 21: 127..255 into 11, 9 (S0' = 13, cached). Step 22: 255..383 into 7 and 5:
#     F3 and F2 are evicted, F2's last copy; S2 = 6 stays cached (its own hash), F1' = 11, S1' = 9 are cached beside
#     F1 = 3, S1 = 4.
#   step 23: R2's last token fills its block 2: F2' = 7, S2' = 5 cached (S2 has two copies now, 6 first). R3 (385 of
#     id 1, 1 out) finds F0 = 1, F1 = 3, F2 = 7 and S0 = 13, S1 = 4, S2 = 6 (the first inserted) -> 384 computed,
#     1 new: the sliding group holds R2's 13, 9, 5 and R3's 13, 4, 6 and one new: 6 blocks. Until cce70b8 kvcalc
#     orphaned S2 = 6 when F2's last copy went (step 22) and gave R3 R2's 5: 5 blocks (the same hit, one fewer taken).
ORPHAN = [Req(0, 0.0, 1117, 12, (1, 1800, 1801)), Req(1, 0.0, 634, 8, (2000, 2001)), Req(2, 0.0, 384, 1, (1,)),
          Req(3, 0.0, 385, 1, (1,))]
ORPHAN_KINDS = [("full", 0), ("sliding", 1000)]
ORPHAN_POOL = dict(num_blocks=29, block=B, budget=128, max_seqs=2, max_model_len=1536, caching=True)


def test_the_model_gives_the_hand_numbers_of_the_orphan_case():
    model = run_model(ORPHAN, ORPHAN_KINDS, **ORPHAN_POOL)
    assert model.steps[20]["scheduled"] == [(1, 640, 1), (2, 0, 127)]
    assert model.steps[23]["scheduled"] == [(2, 383, 1), (3, 384, 1)] and model.steps[23]["groups"] == [6, 6]


def test_a_window_block_outlives_its_full_blocks_content():
    steps, _ = run_kvcalc(ORPHAN, ORPHAN_KINDS, **ORPHAN_POOL)
    assert steps[23]["scheduled"] == [(2, 383, 1), (3, 384, 1)]
    assert steps[23]["groups"] == [6, 6]
