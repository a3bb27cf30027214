"""`share` on hybrid models (issue 19): --prefix 32768 --branches 4 --gen 2048, bf16, block 16 asked for, vLLM's
layout. Each figure is worked by hand per group (B = the layout's block; one block id = one page in each of the
G layer slots of a group). At the end every branch holds n = 32,768 + 2,047 = 34,815 positions (the 2,048th
generated token is sampled, never written); its last one was written at computed = 34,814, so a sliding table
keeps blocks from floor((34,814 − W + 1) / B) and a chunked one from floor(34,814 / C) · C / B; a state table
holds one page per branch (mode none), copied from the prompt's page before the branch first writes it (K − 1
copies per state table; the last branch writes in place).
"""

from __future__ import annotations

import pytest
from hand_specs import granite_h_small, jamba, qwen3_next
from real_configs import write_config

from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.models import get_preset
from kvcalc.core.share.forks import ScenarioSpec, run_scenario
from kvcalc.core.share.memory import block_bytes, group_doc, model_groups, pool_bytes

# (model, block B, bytes of a block id, physical blocks per layer type in layout order, CoW copies)
CASES = [
    # Gemma-3-27B: id 10 · 16 · 8,192 = 1,310,720 B. full: 2,048 shared + 4 · ceil(2,047 / 16) = 4 · 128 = 2,560;
    # sliding W 1,024, 6 tables: from floor(33,791 / 16) = 2,111 to floor(34,814 / 16) = 2,175: 65 own blocks per
    # branch -> 6 · 4 · 65 = 1,560. 4,120 ids = 5.03 GiB (the single-group pool held 2,560 blocks of 62 layers:
    # 19.38 GiB, 3.9x)
    (lambda: get_preset("Gemma-3-27B"), 16, 1_310_720, [2_560, 1_560], 0),
    # gpt-oss-120b: id 18 · 16 · 2,048 = 589,824 B. full 2,560; sliding W 128: from floor(34,687 / 16) = 2,167 to
    # 2,175: 9 per branch -> 36
    (lambda: get_preset("gpt-oss-120b"), 16, 589_824, [2_560, 36], 0),
    # Llama-4-Scout: id 12 · 16 · 4,096 = 786,432 B. chunked C 8,192, 3 tables: from floor(34,814 / 8,192) · 8,192
    # / 16 = 2,048: 128 own
    # per branch -> 3 · 4 · 128 = 1,536; full 2,560
    (lambda: get_preset("Llama-4-Scout"), 16, 786_432, [1_536, 2_560], 0),
    # Nemotron-H-56B: B 4,128, id 169,082,880 B. full: 32,768 = 7 · 4,128 + 3,872 -> 7 shared + 4 · ceil((3,872 +
    # 2,047) / 4,128) = 8 -> 15, 3 copies of the shared partial block; state: 6 tables · 4 branches = 24 pages,
    # 6 · 3 = 18 copies. (The single-group pool held no state per branch.)
    (lambda: get_preset("Nemotron-H-56B"), 4_128, 169_082_880, [15, 24], 21),
    # Jamba: B 80, id 1,310,720 B. full: 32,768 = 409 · 80 + 48 -> 409 + 4 · ceil(2,095 / 80) = 4 · 27 -> 517;
    # state 7 tables · 4 = 28; copies 3 + 7 · 3 = 24
    (jamba, 80, 1_310_720, [517, 28], 24),
    # Granite-4.0-H-Small: B 528, id 8,650,752 B. full: 32,768 = 62 · 528 + 32 -> 62 + 4 · ceil(2,079 / 528) = 16
    # -> 78; state 9 · 4 = 36; copies 3 + 9 · 3 = 30
    (granite_h_small, 528, 8_650_752, [78, 36], 30),
    # Qwen3-Next: B 544, id 13,369,344 B. full: 32,768 = 60 · 544 + 128 -> 60 + 4 · ceil(2,175 / 544) = 16 -> 76;
    # state 3 · 4 = 12; copies 3 + 3 · 3 = 12
    (qwen3_next, 544, 13_369_344, [76, 12], 12),
]


@pytest.mark.parametrize(("spec", "block", "id_bytes", "per_type", "copies"), CASES)
def test_share_bytes_per_group(spec, block, id_bytes, per_type, copies):
    model = spec()
    layout, groups = model_groups(model, 16, 16, None, None)
    assert groups is not None and layout.block_size == block and layout.page_bytes == id_bytes
    scenario = ScenarioSpec(prefix_tokens=32_768, branches=4, gen_tokens=2_048, block_size=layout.block_size)
    result = run_scenario(scenario, groups=groups, state_mode="none")
    doc = group_doc(layout, result.group_blocks, pool_bytes(model, "bf16", 16, 16, 34_815, layout).bytes_per_block)
    assert [g["physical_blocks"] for g in doc["groups"]] == per_type
    assert result.physical_blocks == sum(per_type)
    assert [g["physical_bytes"] for g in doc["groups"]] == [b * id_bytes for b in per_type]
    assert result.cow_copies == copies


def test_hybrid_scenario_checks_every_step_small():
    # a small run with the pool's invariants after every call: Gemma-3-27B's groups, 40 + 4 branches x 30 tokens
    _, groups = model_groups(get_preset("Gemma-3-27B"), 16, 16, None, None)
    scenario = ScenarioSpec(prefix_tokens=1_100, branches=3, gen_tokens=40, block_size=16, mode="beam", seed=3)
    result = run_scenario(scenario, groups=groups, check=True)
    assert result.physical_blocks == sum(result.group_blocks)


def test_gemma3_against_the_single_group_pool():
    # issue 19: the single-group pool's bytes were ~4x too high for Gemma-3: it holds 2,560 blocks of 16 tokens of
    # all 62 layers (62 · 16 · 8,192 = 8,126,464 B) = 20,803,747,840 B, the groups 4,120 · 1,310,720 (5.03 GiB)
    model = get_preset("Gemma-3-27B")
    scenario = ScenarioSpec(prefix_tokens=32_768, branches=4, gen_tokens=2_048, block_size=16)
    single = run_scenario(scenario)
    assert single.physical_blocks * block_bytes(model, 16, 16) == 2_560 * 8_126_464 == 20_803_747_840
    layout, groups = model_groups(model, 16, 16, None, None)
    grouped = run_scenario(scenario, groups=groups)
    assert grouped.physical_blocks * layout.page_bytes == 4_120 * 1_310_720 == 5_400_166_400


def _trace(requests):
    import numpy as np

    from kvcalc.core.inputs.traces import Trace

    ids = [np.array(i, np.int64) for _, i in requests]
    offsets = np.concatenate(([0], np.cumsum([len(i) for i in ids])))
    return Trace("mooncake", "test", np.arange(len(requests), dtype=np.float64),
                 np.array([p for p, _ in requests], np.int64), np.full(len(requests), 10, np.int64),
                 np.concatenate(ids), offsets.astype(np.int64))


def test_aligned_chunk_end_by_hand():
    from kvcalc.core.share.replay_groups import aligned_chunk_end

    # B 528, 8,192-token budget, a 20,000-token prompt: its last full block ends at 20,000 − 20,000 mod 528 =
    # 19,536. Chunks are whole blocks, 8,192 // 528 = 15 of them (7,920 tokens), until one passes 19,536: it
    # ends there; then the tail
    assert [aligned_chunk_end(c, 20_000, 8_192, 528) for c in (0, 7_920, 15_840)] == [7_920, 15_840, 19_536]
    assert aligned_chunk_end(19_536, 20_000, 8_192, 528) == 27_728  # the caller stops at the prompt
    assert aligned_chunk_end(0, 2_000, 8_192, 528) == 1_584  # 2,000 − 416: the state at 1,584 is saved


def test_trace_replay_align_hits_where_a_state_was_saved():
    from kvcalc.core.pool.groups import PoolGroup
    from kvcalc.core.share.replay_groups import replay_groups

    # B 528 (a Granite-4-H-like vLLM block; it does not tile 512-token ids): block j is keyed by the id holding
    # token (j + 1)·528 − 1, i.e. ids[1], ids[2], ids[3] for j = 0, 1, 2.
    #   r0 2,000 tokens, ids 1 2 3 4: keys 2 3 4; align chunks it 0..1,584 (state saved at 1,584, page 2), then 416
    #   r1 2,000 tokens, ids 1 2 3 5: keys 2 3 5: the full chain serves 2 blocks (1,056), but no state was saved
    #      at 1,056 or 528: align 0 (as vLLM); all 1,056
    #   r2 1,200 tokens, ids 1 2 9: keys 2 9: full serves 1 block; align 0, all 528
    #   r3 2,100 tokens, ids 1 2 3 4 7: keys 2 3 4, at most (2,099) // 528 = 3 blocks: r0's state at 1,584 serves
    #      all 3: 1,584 in align and all
    # none: no state saved, no hit. align 1,584; all 1,056 + 528 + 1,584 = 3,168
    trace = _trace([(2_000, [1, 2, 3, 4]), (2_000, [1, 2, 3, 5]), (1_200, [1, 2, 9]), (2_100, [1, 2, 3, 4, 7])])
    groups = (PoolGroup("full"), PoolGroup("state"))
    results = {mode: replay_groups(trace, groups, 528, 200, mode) for mode in ("none", "align", "all")}
    assert [results[m].hit_tokens for m in ("none", "align", "all")] == [0, 1_584, 3_168]
    align = results["align"]
    assert align.keyed and align.keys_lower_bound
    # each group's own hits: the full chain 0 + 1,056 + 528 + 1,584; the state group's own in align only r3's
    assert align.group_hit_tokens == (3_168, 1_584)
    assert not results["none"].keyed


def test_align_hits_match_the_stack_distance_count_with_one_prefill_chunk():
    # an independent count: capacity.saved_state_hit_blocks walks the trace's ids (a state saved where each prompt's
    # full blocks end, one prefill chunk); the pool replay with prompts in one chunk and room for everything must
    # find exactly those hits. With vLLM's 8,192-token chunks align also saves at every chunk end: more hits, at
    # most the hits of a state at every boundary (mode all)
    from pathlib import Path

    from kvcalc.core.inputs.traces import read_trace
    from kvcalc.core.pool.groups import PoolGroup
    from kvcalc.core.share.capacity import saved_state_hit_blocks
    from kvcalc.core.share.replay_groups import replay_groups

    path = Path(__file__).resolve().parents[4] / "shared" / "traces" / "mooncake_conversation.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is not here (the real traces live beside the repository)")
    trace = read_trace("mooncake", str(path)).head(300)
    groups, B, room = (PoolGroup("full"), PoolGroup("state")), 64, 3_000_000
    one_chunk = replay_groups(trace, groups, B, room, "align", chunk_tokens=10**9)
    assert one_chunk.evictions == 0
    assert one_chunk.hit_tokens == saved_state_hit_blocks(trace, B) * B == 15_680
    chunked = replay_groups(trace, groups, B, room, "align").hit_tokens
    every = replay_groups(trace, groups, B, room, "all").hit_tokens
    assert 15_680 < chunked < every  # 138,560 and 345,920 here


# vLLM's unified pages give these models' layer types different tokens per block (core/pool/group_blocks.py):
# (config, bytes of a block id, [(kind, tokens per block)] in layout order, physical blocks per type at
# --prefix 32768 --gen 2048 (n = 34,815 positions, the last written at 34,814: the last generated token is sampled,
# never written), the same at --prefix 2000 --gen 300 (n = 2,299, the last written at 2,298), copy-on-write copies
# at 2000 + 300)
MIXED = [
    # Gemma-4-31B: a sliding layer 16 heads · 256 · 2 · 2 = 16,384 B a token, a full one 4 · 512 · 2 · 2 = 8,192 B:
    # at 16 tokens their pages are 262,144 and 131,072 B, so full blocks hold 32 tokens. G = 10 (50 vs 10 layers):
    # an id 10 · 262,144 = 2,621,440 B; sliding 5 tables, full 1.
    # 32768: full 32,768 / 32 = 1,024 shared + 4 · (ceil(34,815 / 32) − 1,024 = 64) = 1,280; sliding W 1,024 from
    #   (34,814 − 1,023) // 16 = 2,111 to ceil(34,815 / 16) = 2,176: 65 own per branch, 5 · 4 · 65 = 1,300.
    # 2000: full 2,000 / 32 = 62 whole blocks shared + the half block 62 (3 copies, the last writes in place), each
    #   branch 62..71 (ceil(2,299 / 32) = 72): 62 + 4 · 10 = 102; sliding from (2,298 − 1,023) // 16 = 79 to 144:
    #   79..124 shared (2,000 / 16 = 125 whole), 125..143 own: 5 · (46 + 4 · 19) = 610.
    ("GEMMA4_31B", 2_621_440, [("sliding", 16), ("full", 32)], [1_300, 1_280], [610, 102], 3),
    # Gemma-4-E4B: sliding 2 heads · 256 · 4 = 2,048 B a token, full 2 · 512 · 4 = 4,096 B: sliding blocks hold 32
    # tokens. G = 4 (20 vs 4 layers): an id 4 · 65,536 = 262,144 B; sliding 5 tables, full 1.
    # 32768: full 2,048 shared + 4 · 128 = 2,560; sliding W 512 from (34,814 − 511) // 32 = 1,071 to
    #   ceil(34,815 / 32) = 1,088: 17 own, 5 · 4 · 17 = 340.
    # 2000: full 2,000 / 16 = 125 shared + 4 · (144 − 125) = 201; sliding from (2,298 − 511) // 32 = 55 to 72:
    #   55..61 shared, the half block 62 copied by 3 branches in each of 5 tables (15 copies), 62..71 own:
    #   5 · (7 + 4 · 10) = 235.
    ("GEMMA4_E4B", 262_144, [("sliding", 32), ("full", 16)], [340, 2_560], [235, 201], 15),
    # MiMo-V2-Flash: full 4 heads · (192 + 128) · 2 = 2,560 B a token, sliding 8 heads: 5,120 B; full blocks hold
    # 32 tokens. G = 9 (9 vs 39 layers): an id 9 · 81,920 = 737,280 B; sliding 5 tables (6 padding), full 1.
    # 32768: full 1,280 as Gemma-4-31B; sliding W 128 from (34,814 − 127) // 16 = 2,167: 9 own, 5 · 4 · 9 = 180.
    # 2000: full 102 (3 copies) as Gemma-4-31B; sliding from (2,298 − 127) // 16 = 135 to 144: 9 own, nothing
    #   shared (the prompt's blocks end at 124): 5 · 4 · 9 = 180.
    ("MIMO_V2_FLASH", 737_280, [("full", 32), ("sliding", 16)], [1_280, 180], [102, 180], 3),
]


@pytest.mark.parametrize(("config", "id_bytes", "kinds", "long", "short", "copies"), MIXED)
def test_share_with_mixed_tokens_per_block(tmp_path, config, id_bytes, kinds, long, short, copies):
    model = load_config(write_config(tmp_path, config))
    layout, groups = model_groups(model, 16, 16, None, None)
    assert groups is not None and layout.block_size == 16 and layout.page_bytes == id_bytes
    assert [(g.kind, g.block_tokens) for g in layout.groups] == kinds
    for (prefix, gen), per_type in (((32_768, 2_048), long), ((2_000, 300), short)):
        scenario = ScenarioSpec(prefix_tokens=prefix, branches=4, gen_tokens=gen, block_size=16)
        result = run_scenario(scenario, groups=groups, state_mode="none", check=prefix < 10_000)
        doc = group_doc(layout, result.group_blocks, layout.page_bytes)
        assert [g["physical_blocks"] for g in doc["groups"]] == per_type
        assert result.physical_blocks == sum(per_type)
        assert [g["physical_bytes"] for g in doc["groups"]] == [b * id_bytes for b in per_type]
        assert result.cow_copies == (copies if prefix == 2_000 else 0)


def test_share_nemotron_h_in_mode_all_holds_a_state_page_per_block():
    # Nemotron-H-56B, mamba_cache_mode all: block 128 · ceil(4,126 / 128) = 4,224 (kv_groups: the kernel's chunk 128).
    # 4 branches of 10,000 + 100 tokens: 10,000 = 2 · 4,224 + 1,552, each branch ceil(10,100 / 4,224) = 3 blocks.
    # full: blocks 0, 1 shared + block 2 per branch (the shared partial block copied by 3 branches): 6. A state
    # table (vLLM's MambaManager, get_num_skipped_tokens = computed − 1) frees, at a branch's first step from 10,000,
    # the pages before (10,000 − 1) // 4,224 = 2: pages 0, 1 (the states at 4,224 and 8,448, cached and free) leave
    # every branch; each holds its running page 2 (copied by 3): 4 each, 24. Copies 3 + 6 · 3 = 21. Under align
    # (block 4,128) the prefill holds the page saved at 8,256 (1) and the running one (2); a branch's first step
    # frees the pages before (10,000 − 1) // 4,128 = 2: again 4 each.
    for mode, state_blocks in (("all", 4), ("align", 4)):
        layout, groups = model_groups(get_preset("Nemotron-H-56B"), 16, 16, None, mode)
        assert layout.block_size == (4_224 if mode == "all" else 4_128)
        scenario = ScenarioSpec(prefix_tokens=10_000, branches=4, gen_tokens=100, block_size=layout.block_size)
        result = run_scenario(scenario, groups=groups, state_mode=mode, check=True)
        assert result.group_blocks == (6, *[state_blocks] * 6) and result.cow_copies == 21


def test_too_few_hash_ids_are_named_by_file_line_before_the_replay():
    import numpy as np

    from kvcalc.core.inputs.traces import Trace
    from kvcalc.core.pool.groups import PoolGroup
    from kvcalc.core.share.replay_groups import replay_groups

    # B 4,128 (Nemotron-H's vLLM block: it does not tile 512-token ids): a full block is keyed by the id of its
    # last token, (4,128 − 1) // 512 = id 8, so a prompt of 4,138 tokens needs 9 ids. Line 2 (which arrives
    # first) has 1: named as the file's request 2 before anything is replayed
    trace = Trace("mooncake", "few.jsonl", np.array([50.0, 5.0]), np.array([4_138, 4_138], np.int64),
                  np.array([4, 4], np.int64), np.array([*range(1, 10), 1], np.int64),
                  np.array([0, 9, 10], np.int64))
    with pytest.raises(ValueError, match=r"^few\.jsonl request 2: 4138 prompt tokens need 9 hash_ids"):
        replay_groups(trace, (PoolGroup("full"), PoolGroup("state")), 4_128, 100, "all")
