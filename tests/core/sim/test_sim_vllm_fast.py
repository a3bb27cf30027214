"""kvcalc's sim as `kvcalc sim` runs it (the step-time executor with fast-forward, closed-form decode runs and the lean
loop where they apply) against the independent model of vLLM v1 (tests/vllm_model.py), every step 1 s.

test_sim_vllm_model.py compares sim's plain stepping with the model step by step; the fast paths skip the steps, so
here the run's record is compared: each request's first-token and finish times (the end of the step that sampled its
first and its last token), its preemptions, and the prefix-cache hit tokens of all admissions and of re-admissions
(a request preempted by recompute looking itself up again). Workloads, pools and layouts as test_sim_vllm_model.py's.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from vllm_compare import run_kvcalc_fast, run_model
from vllm_model import Req
from vllm_workloads import BUDGETS, MAX_LEN, SETTINGS, B, pool_blocks, requests

LAYOUTS = {
    "full": [("full", 0)],
    "sliding": [("full", 0), ("sliding", 129)],
    "sliding x2": [("sliding", 512), ("sliding", 512), ("full", 0)],
    "chunked": [("full", 0), ("chunked", 256), ("chunked", 256)],
    "align": [("full", 0), ("state", 0), ("state", 0)],
}


def _same_record(reqs, kinds, num_blocks, **kw) -> None:
    record = run_kvcalc_fast(reqs, kinds, num_blocks, B, **kw)
    model = run_model(reqs, kinds, num_blocks, B, **kw)
    theirs = model.reqs
    assert record.first_token_s.tolist() == [r.first_token_s for r in theirs], "first-token times"
    assert record.finish_s.tolist() == [r.finish_s for r in theirs], "finish times"
    assert record.preemptions.tolist() == [r.preemptions for r in theirs], "preemptions"
    if kw["caching"]:
        hits = sum(sum(r.hits) for r in theirs), sum(sum(r.hits[1:]) for r in theirs)
        assert (record.prefix.hit_tokens, record.prefix.readmitted_hit_tokens) == hits, "hit tokens"


@SETTINGS
@given(reqs=requests(), data=st.data(), layout=st.sampled_from(sorted(LAYOUTS)), caching=st.booleans())
def test_the_default_sim_path_gives_vllms_times(reqs, data, layout, caching):
    kinds = LAYOUTS[layout]
    align = layout == "align" and caching  # mamba_cache_mode align goes with prefix caching (none without)
    per_request = MAX_LEN // B + 2 * (len(kinds) - 1) if layout == "align" else len(kinds) * MAX_LEN // B
    _same_record(reqs, kinds, pool_blocks(data.draw, per_request), budget=data.draw(
        st.sampled_from(BUDGETS[1:] if align else BUDGETS)), max_seqs=data.draw(st.integers(1, 8)),
        max_model_len=MAX_LEN, caching=caching, state_mode="align" if align else "none")


# A request preempted right after its decode filled a block holding sampled tokens hits that block again.
# Plain model, pool 33 ids (32 free), block 128, budget 200, max_seqs 4, max_model_len 2048.
#   R0 (881 of ids 1, 2; 46 out, t 0): chunks of 200 at steps 0-4, decodes from step 5, its 46th token at step 49.
#   R1 (1783 of ids 1, 2, 2000, 2001; 40 out, t 4.5): step 5 hits R0's 6 full blocks of ids 1, 2 (768 tokens).
#   R2 (1891 of its own ids, 31 out, t 4.5): prefill reaches 1891 at step 19 (its block 14 = tokens 1792..1919 taken
#     then); decodes 1892, 1893, ...: step 48 computes token 1920 and fills block 14 (99 prompt + 29 sampled tokens)
#     without a new block; vLLM caches it at that allocation (its key: R2's, sampled tokens).
#   R3 (71 of its own id, 1 out, t 4.5): admitted at step 19, preempted at step 20 by R2's growth.
#   step 49: R0's 926th token needs a block, none is free: R2, the last running, is preempted (1920 computed).
#   step 50 (R0, R1 finished): R2 has 1891 + 30 = 1921 tokens, looks up 1920 (15 blocks): vLLM finds its 14 prompt
#     blocks and block 14 -> 1920 computed, 1 new. kvcalc's pool was told R2's tokens last at 1891 (its last block
#     taken): the release settles only requests that owe a block or a prompt block's append, so committed_tokens is
#     1891 there, block 14 gets no key and is not registered: 1792 computed, 129 new. The times are the same (the
#     budget covers both); the re-admissions' hit tokens are 1920 (vLLM) and 1792 (kvcalc).
FILLED = [Req(0, 0.0, 881, 46, (1, 2)), Req(1, 4.5, 1783, 40, (1, 2, 2000, 2001)),
          Req(2, 4.5, 1891, 31, (3000, 3001, 3002, 3003)), Req(3, 4.5, 71, 1, (4000,))]
FILLED_POOL = dict(num_blocks=33, budget=200, max_seqs=4, max_model_len=MAX_LEN, caching=True)


def test_the_model_gives_the_hand_numbers():
    model = run_model(FILLED, [("full", 0)], block=B, **FILLED_POOL)
    assert model.steps[48]["scheduled"][2] == (2, 1919, 1) and model.steps[49]["preempted"] == [2]
    assert model.steps[50]["scheduled"] == [(2, 1920, 1), (3, 0, 71)]
    assert [r.hits for r in model.reqs] == [[0], [768], [0, 1920], [0, 0]]


def test_a_block_filled_by_decode_before_a_preemption_is_hit_again():
    _same_record(FILLED, [("full", 0)], **FILLED_POOL)
