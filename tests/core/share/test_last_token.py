"""The last output token holds no KV: a request that ends after O output tokens has computed P + O − 1 positions
(the O-th token is sampled from the logits of position P + O − 2 and the request ends; vLLM never writes its KV,
and `kvcalc sim` counts it so). Share's replay holds that many on every path — per hash id on lists
(id_replay_lists) and on numpy (id_replay), through the pool (fused `serve` and allocate/append/release), the
contrast without caching, and the hybrid groups' replay — and its scenario mode writes G − 1 of a branch's G
generated tokens. Hand-worked on a full-attention model, a sliding-window one (gpt-oss-20b, W 128), a chunked one
(Llama-4-Scout, C 8,192) and a Mamba hybrid (Nemotron-H-56B)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvcalc.core.inputs.trace_text import read_mooncake_lines
from kvcalc.core.inputs.traces import Trace
from kvcalc.core.model.models import resolve_model
from kvcalc.core.share.forks import ScenarioSpec, closed_form_physical_blocks, run_scenario
from kvcalc.core.share.id_replay_lists import share_trace_lists
from kvcalc.core.share.memory import model_groups
from kvcalc.core.share.replay import replay, share_trace, uncached_replay
from kvcalc.core.share.replay_groups import largest_request_peak, replay_groups
from kvcalc.core.share.trace_blocks import largest_request_blocks


def _trace(requests: list[tuple[int, int]], path: str = "t.jsonl") -> Trace:
    """Mooncake requests (prompt, output), each with its own hash ids (one per 512 prompt tokens)."""
    ids, offsets = [], [0]
    for r, (prompt, _) in enumerate(requests):
        ids += [1000 * r + j for j in range(-(-prompt // 512))]
        offsets.append(len(ids))
    n = len(requests)
    return Trace("mooncake", path, np.zeros(n), np.array([p for p, _ in requests], dtype=np.int64),
                 np.array([o for _, o in requests], dtype=np.int64), np.array(ids, dtype=np.int64),
                 np.array(offsets, dtype=np.int64))


@pytest.mark.parametrize(("prompt", "output", "blocks"), [
    (1500, 5, 94),  # positions 0..1,503 written (the 5th token ends it unwritten): ceil(1,504 / 16) = 94, not 95
    (1500, 6, 95),  # 1,505 positions: ceil(1,505 / 16) = 95
    (1500, 1, 94),  # the one output token comes from the prefill's logits: 1,500 positions, ceil(93.75) = 94
    (1504, 1, 94),  # 1,504 = 94 · 16: no block for the sampled token
    (1504, 0, 94),  # no output at all: the prompt's 1,504
])
def test_full_attention_every_path_holds_prompt_plus_output_minus_one(tmp_path: Path, prompt: int, output: int,
                                                                       blocks: int) -> None:
    trace = _trace([(prompt, output)])
    assert largest_request_blocks(trace, 16) == blocks
    by_ids = share_trace(trace, 16)  # no capacity: per hash id (numpy)
    pool = replay(trace, 16, blocks, True, by_ids=False)  # the fused serve, at the least capacity
    general = replay(trace, 16, blocks, True, fast=False)  # allocate, append, release
    uncached = uncached_replay(trace, 16, blocks)
    for result in (by_ids.cached, by_ids.uncached, pool, general, uncached):
        assert result.peak_used_blocks == blocks
        assert result.longest_request_tokens == prompt + max(output - 1, 0)
    assert pool == general
    file = tmp_path / "t.jsonl"
    file.write_text(json.dumps({"timestamp": 0, "input_length": prompt, "output_length": output,
                                "hash_ids": [int(i) for i in trace.hash_ids]}) + "\n")
    lists = share_trace_lists(read_mooncake_lines(file.read_text(), str(file)), "mooncake", str(file), 16, None)
    assert lists is not None and (lists.cached.peak_used_blocks, lists.uncached.peak_used_blocks) == (blocks, blocks)
    assert lists.cached == by_ids.cached
    with pytest.raises(ValueError, match=f"which needs {blocks:,} blocks"):
        replay(trace, 16, blocks - 1, True)


def _groups(model: str, block: int = 16):
    layout, groups = model_groups(resolve_model(model, None), 16, block, None, None)
    assert layout is not None and groups is not None
    return layout.block_size, groups


def test_sliding_window_ends_at_the_last_written_position() -> None:
    # gpt-oss-20b: a full table and a sliding one (W 128), B 16. 160 + 33 tokens: the prompt in one chunk holds
    # ceil(160 / 16) = 10 blocks in each table (20); the output's 32 written tokens (positions 160..191) then
    # go on from 160 computed: the sliding table first frees the blocks before (160 − 128 + 1) // 16 = 2, and
    # both grow to ceil(192 / 16) = 12: full 12 + sliding 12 − 2 = 10 = 22 (193 positions would be 13 + 11 = 24)
    B, groups = _groups("gpt-oss-20b")
    assert [(g.kind, g.window) for g in groups] == [("full", None), ("sliding", 128)] and B == 16
    trace = _trace([(160, 33)])
    # the least capacity: every table whole over a chunk (8,192 ≥ 192 tokens): 2 · 12 = 24 (was 2 · 13)
    assert largest_request_peak(trace, groups, B, "none") == 24
    assert replay_groups(trace, groups, B, 24, "none").peak_used_blocks == 22
    with pytest.raises(ValueError, match="the 24 blocks the largest request holds"):
        replay_groups(trace, groups, B, 23, "none")
    # the prompt's own peak counts too: 1,500 + 5 holds 94 + 94 while its one chunk is computed, then the
    # sliding table keeps the blocks from (1,500 − 127) // 16 = 85 to ceil(1,504 / 16) = 94: 94 + 9
    assert replay_groups(_trace([(1500, 5)]), groups, B, 188, "none").peak_used_blocks == 188


def test_chunked_attention_crosses_no_block_for_the_sampled_token() -> None:
    # Llama-4-Scout: 3 chunked tables (C 8,192) and a full one, B 16. 8,000 + 193 tokens write positions
    # 0..8,191: ceil(8,192 / 16) = 512 blocks in each table, all in the first chunk (8,000 // 8,192 = 0 frees
    # nothing): 4 · 512 = 2,048; the sampled token's position 8,192 would open block 513 in every table (2,052)
    B, groups = _groups("llama-4-scout")
    assert sorted(g.kind for g in groups) == ["chunked", "chunked", "chunked", "full"] and B == 16
    trace = _trace([(8000, 193)])
    assert largest_request_peak(trace, groups, B, "none") == 2048
    assert replay_groups(trace, groups, B, 2048, "none").peak_used_blocks == 2048


def test_mamba_hybrid_state_is_unchanged_and_attention_holds_p_plus_o_minus_one() -> None:
    # Nemotron-H-56B, vLLM's layout: blocks of 4,128 tokens, a full table and 6 state tables (mode none: one page
    # each, whatever the length). 4,000 + 129 tokens write 4,128 positions: one full block + 6 pages = 7 (4,129
    # would take a second full block: 8); 4,000 + 130: 4,129 positions, 8
    B, groups = _groups("Nemotron-H-56B")
    assert B == 4128 and [g.kind for g in groups] == ["full"] + ["state"] * 6
    for output, blocks in ((129, 7), (130, 8), (1, 7)):
        trace = _trace([(4000, output)])
        assert largest_request_peak(trace, groups, B, "none") == blocks
        assert replay_groups(trace, groups, B, blocks, "none").peak_used_blocks == blocks


def test_scenario_writes_all_but_the_last_generated_token() -> None:
    # P 1,000 (62 full blocks + 8 tokens), K 4, B 16. G = 9: a branch writes 8 of its tokens (positions
    # 1,000..1,007): its copy of the partial block holds 8 + 8 = 16, one block: 62 + 4 · 1 = 66 physical, 3 copies;
    # logical 4 · ceil(1,008 / 16) = 4 · 63 = 252 (writing all 9 would be 62 + 4 · 2 = 70 and 4 · 64 = 256)
    r = run_scenario(ScenarioSpec(1000, 4, 9, 16), check=True)
    assert (r.physical_blocks, r.logical_blocks, r.cow_copies, r.peak_blocks) == (66, 252, 3, 66)
    assert closed_form_physical_blocks(1000, 4, 9, 16) == 66
    # G = 1: the one token comes from the prefill's logits, nothing is written: the prompt's ceil(1,000 / 16) = 63
    # blocks shared by all, no copy
    r = run_scenario(ScenarioSpec(1000, 4, 1, 16), check=True)
    assert (r.physical_blocks, r.logical_blocks, r.cow_copies) == (63, 4 * 63, 0)
    assert closed_form_physical_blocks(1000, 4, 1, 16) == 63
    assert ScenarioSpec(1000, 4, 9, 16).decode_appends == 4 * 8


def test_hybrid_scenario_window_ends_at_the_last_written_position() -> None:
    # gpt-oss-20b (full + sliding W 128, B 16), 4 branches of 160 shared tokens (10 full blocks, no copy). A step
    # writing position c frees the sliding blocks before (c − 127) // 16 and holds up to block c // 16.
    # G = 49 writes positions 160..207: full 10 shared + 4 · 3 own (blocks 10..12) = 22; sliding from
    # (207 − 127) // 16 = 5: blocks 5..9 shared + 4 · 3 own = 17. Writing position 208 too would open block 13:
    # (26, 21)
    B, groups = _groups("gpt-oss-20b")
    r = run_scenario(ScenarioSpec(160, 4, 49, B), groups=groups, check=True)
    assert r.group_blocks == (22, 17)
    # G = 64 writes 160..222: full 10 + 4 · 4 (blocks 10..13) = 26; sliding from (222 − 127) // 16 = 5: 5 shared
    # + 16 own = 21, where a window ending at 223 would start at block 6 (4 shared: 20)
    r = run_scenario(ScenarioSpec(160, 4, 64, B), groups=groups, check=True)
    assert r.group_blocks == (26, 21)
