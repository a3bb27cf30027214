"""Chunked local attention (Llama-4) in the step-time model: a query at position q attends (q − 1) mod C + 1
positions (its own chunk), not min(q, C) as in a sliding window; the excess closed forms (core/sim/step_sums.py)
against hand values and a plain per-query sum, both kinds; fast-forward equals stepping on a chunked model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from real_configs import write_config

from kvcalc.core.errors import ParameterError
from kvcalc.core.model.layers import LayerGroup
from kvcalc.core.model.model_spec import ModelSpec
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.steptime import StepTimeModel, window_kind

from .test_sim_engine import assert_same_run, make_setup, opt13b_steptime, random_workload


def windowed(window: int, kind: str) -> StepTimeModel:
    return StepTimeModel(0, 0, 0, 0, 0, 0, 0, 1, window_tokens=window, sliding_share=1.0, window_kind=kind)


def test_chunk_excess_by_hand():
    m = windowed(4, "chunked")  # C = 4: query q attends (q − 1) mod 4 + 1, so its excess is 4·floor((q − 1)/4)
    # 5 tokens after 2 cached: q = 3..7 attend 3, 4, 1, 2, 3 of 3, 4, 5, 6, 7: excess 0 + 0 + 4 + 4 + 4 = 12; the
    # first query (3) is in chunk 0, so nothing cached lies before its chunk: reads 4·floor(2/4) = 0
    assert m.chunk_excess(np.array([2]), np.array([5])) == (12.0, 0.0)
    # decode at context 10 (9 cached): q = 10 attends 9 mod 4 + 1 = 2, excess 8 = 4·floor(9/4), positions and reads
    assert m.chunk_excess(np.array([9]), np.array([1])) == (8.0, 8.0)
    # 6 after 3 cached: q = 4..9, floor((q − 1)/4) = 0, 1, 1, 1, 1, 2: 4·6 = 24; reads 4·floor(3/4) = 0; all three
    # chunks summed: (12 + 8 + 24, 0 + 8 + 0)
    assert m.chunk_excess(np.array([2, 9, 3]), np.array([5, 1, 6])) == (44.0, 8.0)
    # the same chunk of 5 after 2 in a sliding window of 4: max(q − 4, 0) for q = 3..7 = 0 + 0 + 1 + 2 + 3 = 6
    assert windowed(4, "sliding").chunk_excess(np.array([2]), np.array([5])) == (6.0, 0.0)


def test_decode_excess_by_hand():
    m = windowed(4, "chunked")
    # contexts 3 and 6 in step 0, C = 4: request 1 at 3, 4, 5, 6 → 4·floor((c − 1)/4) = 0, 0, 4, 4;
    # request 2 at 6, 7, 8, 9 → 4, 4, 4, 8; summed 4, 4, 8, 12
    assert m.decode_excess(np.array([3, 6]), 4).tolist() == [4.0, 4.0, 8.0, 12.0]
    # request 2 runs only in steps 0 and 1: 4, 4, 4, 4; nobody in step 0 (alive 0) adds nothing
    assert m.decode_excess(np.array([3, 6]), 4, np.array([4, 2])).tolist() == [4.0, 4.0, 4.0, 4.0]
    assert m.decode_excess(np.array([3, 6]), 2, np.array([0, 0])).tolist() == [0.0, 0.0]
    # sliding W = 4: max(c − 4, 0): request 1: 0, 0, 1, 2; request 2: 2, 3, 4, 5; summed 2, 3, 5, 7
    assert windowed(4, "sliding").decode_excess(np.array([3, 6]), 4).tolist() == [2.0, 3.0, 5.0, 7.0]


def per_query(q: int, window: int, kind: str) -> int:
    """Positions beyond what query q (1-based) attends: q − min(q, W), or q − ((q − 1) mod C + 1)."""
    return q - (min(q, window) if kind == "sliding" else (q - 1) % window + 1)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["sliding", "chunked"]), window=st.integers(1, 20),
       chunks=st.lists(st.tuples(st.integers(0, 120), st.integers(1, 60)), min_size=1, max_size=6))
def test_chunk_excess_equals_the_per_query_sum(kind, window, chunks):
    start, count = (np.array(v, np.int64) for v in zip(*chunks, strict=True))
    positions = sum(per_query(q, window, kind) for s, m in chunks for q in range(s + 1, s + m + 1))
    reads = sum(per_query(s + 1, window, kind) for s, _ in chunks)  # the KV before the first query's window
    assert windowed(window, kind).chunk_excess(start, count) == (float(positions), float(reads))


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["sliding", "chunked"]), window=st.integers(1, 20), k=st.integers(1, 50),
       reqs=st.lists(st.tuples(st.integers(1, 120), st.integers(0, 60)), min_size=1, max_size=8),
       all_alive=st.booleans())
def test_decode_excess_equals_stepping(kind, window, k, reqs, all_alive):
    contexts, alive = (np.array(v, np.int64) for v in zip(*reqs, strict=True))
    steps = [sum(per_query(c + j, window, kind) for c, a in reqs if all_alive or j < a) for j in range(k)]
    got = windowed(window, kind).decode_excess(contexts, k, None if all_alive else alive)
    assert got.tolist() == [float(v) for v in steps]  # exact integers
    # and one step at a time, as the engine's plain step computes it (chunk_excess of m = 1 each)
    model = windowed(window, kind)
    for j in range(k):
        on = [c + j - 1 for c, a in reqs if all_alive or j < a]
        assert model.chunk_excess(np.array(on, np.int64), np.ones(len(on), np.int64))[0] == got[j]


def test_the_kind_comes_from_the_layer_groups(tmp_path):
    from kvcalc.core.model.hf_config import load_config

    assert window_kind(load_config(write_config(tmp_path, "LLAMA4_SCOUT"))) == "chunked"
    assert window_kind(load_config(write_config(tmp_path, "GPT_OSS_120B"))) == "sliding"
    both = ModelSpec.from_groups("mixed", (LayerGroup("sliding", 2, 8, 128, 128, window=512),
                                           LayerGroup("chunked", 2, 8, 128, 128, window=1024),
                                           LayerGroup("full", 2, 8, 128, 128)), num_attention_heads=32,
                                  hidden_size=4096, max_position_embeddings=8192)
    with pytest.raises(ParameterError, match="mixed has both sliding-window and chunked local attention layers"):
        window_kind(both)


@pytest.mark.parametrize(("blocks", "preempt"), [(2000, "recompute"), (60, "swap")])
def test_fast_forward_equals_step_by_step_with_chunks(blocks, preempt):
    steptime = dataclasses.replace(opt13b_steptime(), window_tokens=64, sliding_share=0.5, window_kind="chunked")
    w = random_workload(60, 4.0, seed=3)
    runs = [run_policy(w, "paged", make_setup(blocks, 16, steptime, seed=5, preempt=preempt, fast_forward=ff))
            for ff in (True, False)]
    assert runs[0].segments > 0
    assert_same_run(*runs)
    sliding = run_policy(w, "paged", make_setup(blocks, 16, dataclasses.replace(steptime, window_kind="sliding"),
                                                seed=5, preempt=preempt))
    assert runs[0].end_s < sliding.end_s  # a chunk attends no more than a window of the same size, often less


def test_llama4_scout_sim_fast_forward_on_and_off(run_cli, tmp_path):
    folder = write_config(tmp_path, "LLAMA4_SCOUT")
    cmd = ("sim", "--config", str(folder), "--gpu", "H200", "--tp", "4", "--requests", "40", "--rate", "2",
           "--prompt-dist", "uniform:low=5000,high=20000", "--max-model-len", "131072", "--json")  # 10M: no start
    fast, slow = run_cli(*cmd), run_cli(*cmd, "--no-fast-forward")
    assert fast.exit_code == 0 and slow.exit_code == 0, fast.stderr + slow.stderr
    assert fast.stdout == slow.stdout
    table = run_cli(*cmd[:-1]).stdout
    assert "chunked local attention 8,192 on 36 of 48 layers" in table and "current chunk" in table
