"""Where kvcalc's sim and vLLM v1 disagreed on a Mamba hybrid under mamba_cache_mode align, each a minimal request
list worked by hand, found by random examples of test_sim_vllm_model.py's align comparison.

vLLM's rules as in tests/vllm_model.py and tests/vllm_pool.py (Group.align): the scheduler cuts a prefill chunk to
whole blocks, or to end at the last block boundary of the request's tokens (_mamba_block_aligned_split); the state
group's table holds one block, at the step's last token (nulls before it), and the block of a step that ends on a
boundary is cached under the state group's key of that block, like any full block; a look-up takes the full group's
longest cached prefix, then the last block before it whose state is cached (MambaManager.find_longest_cache_hit).
Block 128 tokens, one step 1 s; block ids are the model's (1..N-1 free; kvcalc numbers them from 0). The model of vLLM
proper and with kvcalc's two old choices both give the hand numbers; a strict xfail until 0348c2f.
"""

from __future__ import annotations

from vllm_compare import run_kvcalc, run_model
from vllm_model import Req

B = 128
ALIGN = [("full", 0), ("state", 0)]

# A state page saved beside a duplicate full block is cached by its content.
# Pool 11 ids (free 1..10), max_model_len 512, budget 2,048.
#   step 0: R0 (384 of id 1, 1 out) 384 tokens (ends on a boundary: not cut): full [1, 2, 3], all cached; state
#     [null, null, 4]: 4 holds the state at 384, cached as the state group's block 2.
#     R1 (262 of id 1, 2 out) looks up 261 tokens (2 blocks): full 1, 2 (R0's, cached by this step's allocation),
#     but no state at 256 or 128: hit 0; its 262 tokens are cut at the last boundary, 256: full [5, 6] (repeat 1, 2),
#     state [null, 7]: 7 holds the state at 256 and is cached by vLLM (the state group's block 1: the only copy).
#     R0 leaves (one token out): free [8, 9, 10, 3, 2, 1, 4].
#     kvcalc anchors R1's state page to R1's full block at its position, 6, a duplicate left unindexed (one block per
#     hash); the cached blocks R1 recomputes (group_hits.Canonical) are looked up from its chunk's 256 tokens, at
#     most (256 - 1) // 128 = 1 block, so block 1 has no cached anchor either: the page is never registered.
#   step 1: R1 256..262 (6, the tail: not cut) into 8 (full) and 9 (state). R2 (262 of id 1, 1 out, t 1): vLLM finds
#     full 1, 2 and R1's state 7 -> 256 computed, 6 new; kvcalc: 0 computed, 256 new (cut at 256).
SAVED = [Req(0, 0.0, 384, 1, (1,)), Req(1, 0.0, 262, 2, (1,)), Req(2, 1.0, 262, 1, (1,))]
SAVED_POOL = dict(num_blocks=11, block=B, budget=2048, max_seqs=4, max_model_len=512, caching=True,
                  state_mode="align")


def test_the_model_gives_the_hand_numbers():
    for kvcalc_choices in (False, True):
        model = run_model(SAVED, ALIGN, **SAVED_POOL, hash_outputs=not kvcalc_choices,
                          one_block_per_hash=kvcalc_choices)
        assert [s["scheduled"] for s in model.steps[:2]] == [[(0, 0, 384), (1, 0, 256)], [(1, 256, 6), (2, 256, 6)]]
        assert model.steps[0]["groups"] == [5, 2]  # R0's 1, 2, 3 and R1's 5, 6; states 4 and 7


# kvcalc anchored a state page to its own unindexed duplicate (Canonical capped at (256 - 1) // 128 blocks) until
# 0348c2f (anchored blocks by content class since).
def test_a_state_page_beside_a_duplicate_full_block_is_cached():
    steps, _ = run_kvcalc(SAVED, ALIGN, **SAVED_POOL)
    assert steps[0]["scheduled"] == [(0, 0, 384), (1, 0, 256)]
    assert steps[1]["scheduled"] == [(1, 256, 6), (2, 256, 6)]


# A request the token budget leaves unscheduled keeps the state page its first step resumed from.
# Pool 40 ids, budget 256, max_model_len 2048; vLLM's running loop stops when the budget is spent, so a request after
# that point gets no allocate_slots, hence no remove_skipped_blocks, that step.
#   step 0: A (384 of id 1, 2 out) 0..256 (cut to whole blocks before the boundary 384): the whole budget.
#   step 1: A 256..384: full [1, 2, 4], state [null, 3, 5]; 5 holds the state at 384 (cached). C (2000 of its own ids,
#     1 out) gets the 128 left: full [6], state [7].
#   step 2: A decodes (255 left); C gets 255 // 128 * 128 = 128; R (429 of id 1, 5 out) gets 127: it finds A's full
#     1, 2, 4 and the state at 384, page 5 -> 384 computed, 45 new (its last block's tail: not cut); its state table
#     [null, null, 5, 13]: it resumes from 5 (MambaManager.last_state_block_idx) and holds it until its next
#     allocate_slots. A's second token: A leaves (its reference to 5 goes).
#   step 3: C takes 256 (256..512), the whole budget: R is not scheduled and still holds 5. The state group holds
#     C's 11 (its last state, kept until its next step) and 16, R's 5 and 13: 4 blocks in vLLM; kvcalc let 5 go
#     (3 blocks) until feb6dd6, its batch growth skipping every running request, the unscheduled ones too.
RESUMED = [Req(0, 0.0, 384, 2, (1,)), Req(1, 0.0, 2000, 1, (2000, 2001, 2002, 2003)), Req(2, 0.0, 429, 5, (1,))]
RESUMED_POOL = dict(num_blocks=40, block=B, budget=256, max_seqs=4, max_model_len=2048, caching=True,
                    state_mode="align")
RESUMED_STEPS = [[(0, 0, 256)], [(0, 256, 128), (1, 0, 128)], [(0, 384, 1), (1, 128, 128), (2, 384, 45)],
                 [(1, 256, 256)]]


def test_the_model_gives_the_hand_numbers_of_the_unscheduled_case():
    model = run_model(RESUMED, ALIGN, **RESUMED_POOL)
    assert [s["scheduled"] for s in model.steps[:4]] == RESUMED_STEPS
    assert [s["groups"] for s in model.steps[:4]] == [[2, 1], [4, 3], [7, 5], [8, 4]]


def test_an_unscheduled_request_keeps_the_page_it_resumed_from():
    steps, _ = run_kvcalc(RESUMED, ALIGN, **RESUMED_POOL)
    assert [s["scheduled"] for s in steps[:4]] == RESUMED_STEPS
    assert [s["groups"] for s in steps[:4]] == [[2, 1], [4, 3], [7, 5], [8, 4]]
