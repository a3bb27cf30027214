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
