"""`share` on the ideal layout of Mamba hybrids whose state is thousands of units: weighted tables (one table a
layer type, core/pool/weighted.py) where a table per unit was refused. Bytes worked by hand from the configs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hand_specs import granite_h_small

from kvcalc.core.errors import ParameterError
from kvcalc.core.model.kv_groups import kv_layout
from kvcalc.core.pool.groups import pool_groups
from kvcalc.core.share.forks import ScenarioSpec, run_scenario
from kvcalc.core.share.memory import group_doc, model_groups

# Granite-4.0-H-Small, bf16, block 16, ideal: attention 4 layers · 8 KV heads · 128 · 2 (K, V) · 2 B = 16,384 B a
# token -> a block 262,144 B; Mamba-2 state per layer: conv (8,192 + 2 · 128) · 3 · 2 B = 50,688 B + SSM 128 heads
# · 64 · 128 · 2 B = 2,097,152 B = 2,147,840 B, · 36 layers = 77,322,240 B. Unit = gcd = 2,048 B: a block costs
# 128 units, a state 37,755.
BLOCK, STATE, UNIT = 262_144, 77_322_240, 2_048


def granite():
    layout, groups = model_groups(granite_h_small(), 16, 16, "ideal", None)
    assert layout is not None and groups is not None
    return layout, groups


def test_granite_layout_is_two_weighted_tables():
    layout, groups = granite()
    assert layout.page_bytes == UNIT and [g.block_bytes for g in layout.groups] == [BLOCK, STATE]
    assert [(g.kind, g.weight) for g in groups] == [("full", 128), ("state", 37_755)]
    with pytest.raises(ParameterError, match="37,883 block tables"):  # a table per unit stays refused
        pool_groups(kv_layout(granite_h_small(), 16, 16, "ideal"))


@pytest.mark.parametrize(("prefix", "branches", "gen", "full_blocks", "copies", "peak_states"), [
    # G generated tokens write G − 1 (the last is sampled, never written).
    # P = 32,768 = 2,048 · 16: 2,048 shared blocks + 4 · ceil(2,047 / 16) = 4 · 128 own -> 2,560; no partial
    # attention block, no copy of one; the one state page (mode none: vLLM's one state block a request, moved in
    # place) is shared by the 4 branches and copied by 3 of them as each first writes it: 3 copies; one state a
    # branch at every step: peak 4 states with all 2,560 blocks
    (32_768, 4, 2_048, 2_560, 3, 4),
    # P = 1,000 = 62 · 16 + 8: 62 shared + 3 · ceil((8 + 99) / 16) = 3 · 7 -> 83; the partial block 62 and the
    # state page it ends in are copied by 2 of the 3 branches: 4 copies; peak 3 states, one a branch
    (1_000, 3, 100, 83, 4, 3),
])
def test_granite_scenario_bytes(prefix, branches, gen, full_blocks, copies, peak_states):
    layout, groups = granite()
    scenario = ScenarioSpec(prefix_tokens=prefix, branches=branches, gen_tokens=gen, block_size=16)
    result = run_scenario(scenario, groups=groups, state_mode="none")
    # each branch its own state (mode none): one state page each at the end
    assert result.group_blocks == (full_blocks, branches) and result.cow_copies == copies
    doc = group_doc(layout, result.group_blocks, UNIT)
    assert [g["physical_bytes"] for g in doc["groups"]] == [full_blocks * BLOCK, branches * STATE]
    assert [g["block_tables"] for g in doc["groups"]] == [1, 1]
    assert result.physical_blocks == full_blocks * 128 + branches * 37_755  # units
    assert result.physical_blocks * UNIT == full_blocks * BLOCK + branches * STATE
    # logical: every branch's own table, ceil((P + G − 1) / 16) blocks and one state
    assert result.logical_blocks == branches * (-(-(prefix + gen - 1) // 16) * 128 + 37_755)
    assert result.peak_blocks == full_blocks * 128 + peak_states * 37_755


def test_granite_beam_search_checks_every_step():
    _, groups = granite()
    scenario = ScenarioSpec(prefix_tokens=100, branches=3, gen_tokens=40, block_size=16, mode="beam", seed=3)
    result = run_scenario(scenario, groups=groups, check=True)  # check_invariants() after every step
    # three live beams; the last step selects them and writes nothing (the 40th token is never written), so a beam
    # forked there still shares its parent's state page: one state per parent that the last selection picked
    # (selections at steps 1..39, each K = 3 draws of a parent from the seeded generator, as forks.py draws them)
    rng = np.random.default_rng(3)
    last = [np.bincount(rng.integers(0, 3, size=3), minlength=3) for _ in range(39)][-1]
    assert result.group_blocks[1] == int(np.count_nonzero(last)) == 2  # a state page each, a weighted block


def test_nemotron_h_cli(run_cli):
    # Nemotron-H-56B, ideal, block 16: attention 10 layers · 8 · 128 · 2 · 2 B · 16 = 655,360 B; state 54 layers
    # 16,900,096 B = 912,605,184 B; unit gcd 16,384 B: 40 and 55,701 units. P 1,000, K 3, G 100: 83 blocks (as
    # Granite's), 3 states
    result = run_cli("share", "--prefix", "1000", "--branches", "3", "--gen", "100", "--model", "Nemotron-H-56B",
                     "--layout", "ideal", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    rows = doc["kv_cache_groups"]["groups"]
    assert [(r["block_tables"], r["physical_bytes"]) for r in rows] == [(1, 83 * 655_360), (1, 3 * 912_605_184)]
    assert doc["physical_bytes"] == 83 * 655_360 + 3 * 912_605_184 and doc["block_bytes"] == 16_384
    assert doc["physical_blocks"] == 83 * 40 + 3 * 55_701
    table = run_cli("share", "--prefix", "1000", "--branches", "3", "--gen", "100", "--model", "Nemotron-H-56B",
                    "--layout", "ideal")
    assert table.exit_code == 0 and "(full 40, state 55,701), one table of such blocks" in table.stdout


def test_nemotron_h_trace_replay(run_cli, tmp_path):
    # Nemotron-H-56B, ideal, block 16, --memory 40GiB = 2,621,440 units of 16 KiB; mode none (no state saved, no
    # hits); prompt and output 8,192 tokens a chunk. Units: an attention block 40, a state 55,701.
    # mode none holds one state page a request, moved in place as it grows (state_pages.roll_page):
    # 1,000 + 10: ceil(1,010 / 16) = 64 blocks and one state: 64 · 40 + 55,701 = 58,261
    # 1,100 + 10: ceil(1,110 / 16) = 70 blocks and one state: 70 · 40 + 55,701 = 58,501 (the peak); 600 + 10:
    #   39 · 40 + 55,701 = 57,261
    trace = tmp_path / "m.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]}\n'
                     '{"timestamp": 5, "input_length": 1100, "output_length": 10, "hash_ids": [0, 1, 2]}\n'
                     '{"timestamp": 9, "input_length": 600, "output_length": 10, "hash_ids": [0, 3]}\n')
    args = ("share", "--trace", "mooncake", str(trace), "--model", "Nemotron-H-56B", "--layout", "ideal", "--memory",
            "40GiB", "--json")
    doc = run_cli(*args).json()
    assert (doc["capacity_blocks"], doc["peak_used_blocks"], doc["hit_tokens"]) == (2_621_440, 58_501, 0)
    assert doc["largest_request_blocks"] == 58_501 and [g["block_tables"] for g in doc["groups"]] == [1, 1]


def test_a_long_prompt_takes_one_state_a_chunk(run_cli, tmp_path):
    # 20,000 + 4 tokens: chunks 8,192, 8,192, 3,620 (to 20,004). Each chunk after the first would take a state page
    # per 16 tokens (512 states = 28.5 M units, over the 2.6 M of 40 GiB); a weighted state group jumps: it keeps only
    # the page of the chunk's last token. Peak: after the last chunk, ceil(20,004 / 16) = 1,251 blocks · 40 + one
    # state 55,701 = 105,741; the admission bound counts one state too (mode none: one page a request, moved in
    # place): 1,251 · 40 + 55,701 = 105,741
    trace = tmp_path / "m.jsonl"
    record = {"timestamp": 0, "input_length": 20_000, "output_length": 4, "hash_ids": list(range(100, 140))}
    trace.write_text(json.dumps(record) + "\n")
    doc = run_cli("share", "--trace", "mooncake", str(trace), "--model", "Nemotron-H-56B", "--layout", "ideal",
                  "--memory", "40GiB", "--json").json()
    assert (doc["peak_used_blocks"], doc["largest_request_blocks"]) == (105_741, 105_741)


def test_align_holds_the_page_a_jump_resumes_from_and_the_last(run_cli, tmp_path):
    # Nemotron-H-56B, ideal, B 16 (above: a block 40 units, a state 55,701), mamba_cache_mode align, 40 GiB =
    # 2,621,440 units. Request 1: 20,000 tokens (ids 100..139), 1 output token (never written). vLLM's aligned split
    # (L = 20,000, a multiple of 16): 0 -> 8,192 (512 blocks), 8,192 -> 16,384, 16,384 -> 20,000 (passes L: ends on
    # it). MambaManager: step 2 keeps page 511 (last_state_block_idx) beside page 1,023; step 3 frees 511 at
    # remove_skipped_blocks(16,384) and holds 1,023 and 1,249: at most 2 states. Peak at the last step: ceil(20,000 /
    # 16) = 1,250 blocks · 40 + 2 · 55,701 = 161,402 units (the admission bound counts 2 states too).
    # Request 2 shares ids 100..115 (8,192 tokens): its full group hits 512 blocks, the state saved at 8,192 (request
    # 1's step end) serves: hit 8,192; its first chunk 8,192 -> 16,384 holds the hit page and page 1,023, then as
    # request 1: peak 161,402 again
    trace = tmp_path / "m.jsonl"
    rows = [{"timestamp": 0, "input_length": 20_000, "output_length": 1, "hash_ids": list(range(100, 140))},
            {"timestamp": 9, "input_length": 20_000, "output_length": 1,
             "hash_ids": list(range(100, 116)) + list(range(200, 224))}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = run_cli("share", "--trace", "mooncake", str(trace), "--model", "Nemotron-H-56B", "--layout", "ideal",
                  "--memory", "40GiB", "--mamba-cache-mode", "align", "--json").json()
    assert (doc["capacity_blocks"], doc["mamba_cache_mode"], doc["hit_tokens"]) == (2_621_440, "align", 8_192)
    assert (doc["peak_used_blocks"], doc["largest_request_blocks"]) == (1_250 * 40 + 2 * 55_701, 161_402)


@pytest.mark.parametrize("command", [("sim", "--requests", "2", "--gpu", "H200", "--preempt", "swap")])
def test_what_weighted_tables_do_not_run_yet_says_so(run_cli, tmp_path, command):
    trace = tmp_path / "m.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": 4, "hash_ids": [0]}\n')
    args = [str(trace) if a == "MOONCAKE" else a for a in command]
    result = run_cli(*args, "--model", "Nemotron-H-56B", "--layout", "ideal")
    assert result.exit_code == 2 and "not" in result.stderr and "--layout vllm" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["jamba", "qwen3_next"])
@pytest.mark.parametrize(("prefix", "branches", "gen", "mode"), [(1_000, 3, 40, "parallel"), (777, 4, 30, "beam")])
def test_weighted_tables_hold_the_bytes_of_unit_tables(name, prefix, branches, gen, mode):
    # Jamba (4 attention + 133 state units) and Qwen3-Next (2 + 201) run on unit tables today (under 256): the same
    # scenario on one weighted table a type holds the same units, peak and logical units included (decode steps of
    # one token: no chunk, so no state jump), and so the same bytes
    import hand_specs

    from kvcalc.core.pool.groups import PoolGroup
    layout, unit_tables = model_groups(getattr(hand_specs, name)(), 16, 16, "ideal", None)
    assert layout is not None and unit_tables is not None and len(unit_tables) <= 256
    weighted = tuple(PoolGroup(g.kind, g.window, weight=g.pages_per_block) for g in layout.groups)
    scenario = ScenarioSpec(prefix_tokens=prefix, branches=branches, gen_tokens=gen, block_size=16, mode=mode, seed=5)
    a, b = (run_scenario(scenario, groups=groups, state_mode="none") for groups in (unit_tables, weighted))
    assert (a.physical_blocks, a.logical_blocks, a.peak_blocks) == (b.physical_blocks, b.logical_blocks, b.peak_blocks)
    docs = [group_doc(layout, r.group_blocks, layout.page_bytes) for r in (a, b)]
    assert [g["physical_bytes"] for g in docs[0]["groups"]] == [g["physical_bytes"] for g in docs[1]["groups"]]
