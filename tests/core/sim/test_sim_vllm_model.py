"""kvcalc's sim step by step against an independent model of vLLM v1's scheduler + KV cache manager
(tests/vllm_model.py, written from vLLM's source, not from kvcalc's).

Both run the same explicit request list (Mooncake-style hash ids, one per 512 prompt tokens, prefix-chained) on the
same pool: `capacity_blocks` free block ids for kvcalc = the model's ids less vLLM's null block. Every step takes 1 s
(a constant executor on kvcalc's side), so arrivals meet the same steps on both sides. Compared after every step's
scheduling (what the executor sees): which requests run, from which computed token, how many new tokens (prefix-cache
hits are the admitted requests' computed tokens), who was preempted, and the distinct blocks each group's tables hold;
at the end the finish order and each request's preemptions.

The comparisons are against vLLM proper (compare's defaults: every full block hashed, sampled tokens included; a hash
cached in several blocks). kvcalc's old choices are the model's switches (hash_outputs=False, one_block_per_hash=True),
kept for the hand cases' history (test_sim_vllm_*_cases.py: each disagreement found here, worked by hand).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from vllm_compare import compare
from vllm_workloads import BUDGETS, MAX_LEN, SETTINGS, B, pool_blocks, requests


@SETTINGS
@given(reqs=requests(), data=st.data(), caching=st.booleans())
def test_full_attention_model(reqs, data, caching):
    budget = data.draw(st.sampled_from(BUDGETS))
    num_blocks = pool_blocks(data.draw, MAX_LEN // B)
    compare(reqs, [("full", 0)], num_blocks, B, budget=budget, max_seqs=data.draw(st.integers(1, 8)),
            max_model_len=MAX_LEN, caching=caching)


@SETTINGS
@given(reqs=requests(), data=st.data(), caching=st.booleans())
def test_sliding_hybrid_model(reqs, data, caching):
    # Gemma-3-like: full and sliding tables, windows below, at and above a block
    window = data.draw(st.sampled_from([100, 128, 129, 300, 512, 1000]))
    kinds = data.draw(st.sampled_from([[("full", 0), ("sliding", window)],
                                       [("sliding", window), ("sliding", window), ("full", 0)]]))
    budget = data.draw(st.sampled_from(BUDGETS))
    num_blocks = pool_blocks(data.draw, len(kinds) * MAX_LEN // B)
    compare(reqs, kinds, num_blocks, B, budget=budget, max_seqs=data.draw(st.integers(1, 8)),
            max_model_len=MAX_LEN, caching=caching)


@SETTINGS
@given(reqs=requests(), data=st.data(), caching=st.booleans())
def test_chunked_hybrid_model(reqs, data, caching):
    # Llama-4-Scout-like: full and chunked-local tables, chunks of whole blocks
    chunk = data.draw(st.sampled_from([256, 512, 1024]))
    kinds = [("full", 0)] + [("chunked", chunk)] * data.draw(st.integers(1, 3))
    budget = data.draw(st.sampled_from(BUDGETS))
    num_blocks = pool_blocks(data.draw, len(kinds) * MAX_LEN // B)
    compare(reqs, kinds, num_blocks, B, budget=budget, max_seqs=data.draw(st.integers(1, 8)),
            max_model_len=MAX_LEN, caching=caching)


@SETTINGS
@given(reqs=requests(), data=st.data(), align=st.booleans())
def test_state_hybrid_model(reqs, data, align):
    # a Mamba hybrid under mamba_cache_mode none (no prefix caching): one state page a request for its life; or under
    # align with prefix caching: a state page at the step's last token, saved (cached) where a step ends on a block
    # boundary, prefill chunks cut to whole blocks (a budget under one block would never schedule a prompt past it)
    kinds = [("full", 0)] + [("state", 0)] * data.draw(st.integers(1, 3))
    budget = data.draw(st.sampled_from(BUDGETS[1:] if align else BUDGETS))
    num_blocks = pool_blocks(data.draw, MAX_LEN // B + 2 * len(kinds))
    compare(reqs, kinds, num_blocks, B, budget=budget, max_seqs=data.draw(st.integers(1, 8)),
            max_model_len=MAX_LEN, caching=align, state_mode="align" if align else "none")


@SETTINGS
@given(reqs=requests(), data=st.data())
def test_several_full_groups_model(reqs, data):
    # vLLM's layout gives a model more than one full group when its full layers outnumber a group (padding aside):
    # 2-3 full groups and 1-3 sliding or chunked ones, in any order; a hit needs every full group's chain
    other = data.draw(st.sampled_from([("sliding", 129), ("sliding", 512), ("chunked", 256), ("chunked", 512)]))
    kinds = data.draw(st.permutations([("full", 0)] * data.draw(st.integers(2, 3)) + [other] * data.draw(
        st.integers(1, 3))))
    budget = data.draw(st.sampled_from(BUDGETS))
    num_blocks = pool_blocks(data.draw, len(kinds) * MAX_LEN // B)
    compare(reqs, kinds, num_blocks, B, budget=budget, max_seqs=data.draw(st.integers(1, 8)),
            max_model_len=MAX_LEN, caching=True)
