"""KV cache groups and the one memory plan (core/model/kv_groups.py) for the eight models of issue 19 and a
Llama-class model, every figure worked by hand from the configs (bf16 KV, block 16 asked for, 40 GiB of KV)."""

from __future__ import annotations

import pytest
from hand_specs import ATTN_8x128, granite_h_small, jamba, qwen3_next
from hypothesis import given, settings
from hypothesis import strategies as st
from real_configs import write_config

from kvcalc.core.errors import ParameterError
from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.kv_groups import blocks_held, kv_layout, plan_blocks, request_blocks
from kvcalc.core.model.layers import LayerGroup
from kvcalc.core.model.models import ModelSpec, get_preset

GIB = 2**30
KV = 40 * GIB  # 42,949,672,960 B


def summary(layout):
    return [(g.kind, g.window, g.layers, g.padded_layers, g.block_tokens, g.tables, g.block_bytes)
            for g in layout.groups]


def test_llama_class_is_one_group_unchanged():
    # Llama-3-8B: 32 layers · 4,096 B per token each; a block id = 32 pages of 16 · 4,096 = 65,536 B = 2 MiB.
    spec = get_preset("Llama-3-8B")
    for name in ("vllm", "ideal"):
        layout = kv_layout(spec, 16, 16, layout=name)
        assert summary(layout) == [("full", None, 32, 32, 16, 1, 2 * 2**20)]
        assert layout.page_bytes == 2 * 2**20 and layout.groups[0].pages_per_block == 1
        assert plan_blocks(layout, KV) == 20_480  # 40 GiB / 2 MiB
    # the same blocks as equation 1's capacity: budget // (bytes per token · block)
    assert plan_blocks(kv_layout(spec, 16, 16), KV) == KV // (spec.bytes_per_token(16) * 16)


def test_gemma3_27b():
    # 52 sliding (W 1024) + 10 full, 16 KV heads of 128: 8,192 B per token per layer, a page of 16 tokens 131,072 B.
    # G = 10 (52 ≥ 1.5 · 10): full 1 table; sliding ceil(52 / 10) = 6 tables, padded to 60 layers (8 padding).
    layout = kv_layout(get_preset("Gemma-3-27B"), 16)
    assert layout.group_size == 10 and layout.page_bytes == 10 * 131_072 == 1_310_720
    assert summary(layout) == [("full", None, 10, 10, 16, 1, 1_310_720), ("sliding", 1024, 52, 60, 16, 6, 7_864_320)]
    assert layout.num_tables == 7
    assert plan_blocks(layout, KV) == 32_768  # 42,949,672,960 / 1,310,720
    # ideal: full 10 · 131,072 = 1,310,720 B, sliding 52 · 131,072 = 6,815,744 B; gcd 262,144 -> 5 and 26 units
    ideal = kv_layout(get_preset("Gemma-3-27B"), 16, layout="ideal")
    assert ideal.page_bytes == 262_144 and [g.pages_per_block for g in ideal.groups] == [5, 26]
    assert plan_blocks(ideal, KV) == 163_840
    # one sequence of 32,768 tokens: full ceil(32768/16) = 2,048; sliding 2,048 − floor((32768 − 1024)/16) = 64 per
    # table: vllm 2,048 + 6 · 64 = 2,432 block ids; ideal 5 · 2,048 + 26 · 64 = 11,904 units of 262,144 B
    full, sliding = layout.groups
    assert blocks_held(full, 32_768) == 2048 and blocks_held(sliding, 32_768) == 64
    assert sum(g.pages_per_block * blocks_held(g, 32_768) for g in layout.groups) == 2_432
    assert sum(g.pages_per_block * blocks_held(g, 32_768) for g in ideal.groups) == 11_904
    # the padding costs 8 / 60 of the sliding bytes: 2,432 · 1,310,720 vs 11,904 · 262,144
    assert 2_432 * 1_310_720 - 11_904 * 262_144 == 8 * 64 * 131_072


def test_gpt_oss_120b():
    # 18 full + 18 sliding (W 128), 8 KV heads of 64: 2,048 B per token per layer, page 32,768 B; G = 18, 2 tables.
    layout = kv_layout(get_preset("gpt-oss-120b"), 16)
    assert layout.page_bytes == 18 * 32_768 == 589_824
    assert summary(layout) == [("full", None, 18, 18, 16, 1, 589_824), ("sliding", 128, 18, 18, 16, 1, 589_824)]
    assert plan_blocks(layout, KV) == 72_817  # 42,949,672,960 / 589,824 = 72,817.8
    # no padding: the ideal layout pages the same bytes
    assert plan_blocks(kv_layout(get_preset("gpt-oss-120b"), 16, layout="ideal"), KV) == 72_817


def test_llama4_scout_chunked():
    # 36 chunked (C 8192) + 12 full, 8 KV heads of 128: page 65,536 B; G = 12, chunked 3 tables.
    layout = kv_layout(get_preset("Llama-4-Scout"), 16)
    assert summary(layout) == [("chunked", 8192, 36, 36, 16, 3, 3 * 786_432), ("full", None, 12, 12, 16, 1, 786_432)]
    assert plan_blocks(layout, KV) == 54_613  # 42,949,672,960 / 786,432 = 54,613.3
    chunked = layout.groups[0]
    # the current chunk only: n = 20,000 -> chunk start 8192 · floor(19,999 / 8192) = 16,384; blocks
    # ceil(20000/16) − 16384/16 = 1,250 − 1,024 = 226 (the last C tokens would be 512)
    assert blocks_held(chunked, 20_000) == 226
    assert blocks_held(chunked, 8192) == 512 and blocks_held(chunked, 8193) == 1


@pytest.mark.parametrize(("spec", "block", "state_bytes", "group_size", "state_tables", "padded", "blocks"), [
    # Jamba: state conv 8192 · 3 · 2 = 49,152 + ssm 8192 · 16 · 2 = 262,144 -> 311,296 B; 16 · ceil(311,296 / 65,536)
    # = 16 · 5 = 80; page 80 · 4,096 = 327,680; G = 4, 7 state tables; block id 1,310,720 -> 32,768 blocks
    (jamba, 80, 311_296, 4, 7, 28, 32_768),
    # Granite-4-H-Small: conv 3 · (8192 + 2 · 128) · 2 = 50,688 + ssm 128 · 64 · 128 · 2 = 2,097,152 -> 2,147,840 B;
    # 16 · ceil(2,147,840 / 65,536) = 16 · 33 = 528; page 2,162,688; G = 4, 9 tables; id 8,650,752 -> 4,964
    (granite_h_small, 528, 2_147_840, 4, 9, 36, 4_964),
    # Nemotron-H-56B: conv 3 · (16384 + 2 · 8 · 256) · 2 = 122,880 + ssm 256 · 64 · 256 · 4 (fp32) = 16,777,216
    # -> 16,900,096 B; 16 · ceil(16,900,096 / 65,536) = 16 · 258 = 4,128; page 16,908,288; G = 10 (54 ≥ 15),
    # 6 state tables padded to 60 layers; id 169,082,880 -> 254 blocks
    (lambda: get_preset("Nemotron-H-56B"), 4128, 16_900_096, 10, 6, 60, 254),
])
def test_mamba_hybrids_raise_the_block(spec, block, state_bytes, group_size, state_tables, padded, blocks):
    layout = kv_layout(spec(), 16)
    page = block * 4096
    assert (layout.block_size, layout.group_size, layout.page_bytes) == (block, group_size, page * group_size)
    attention, state = layout.groups
    assert (attention.kind, attention.block_tokens, attention.tables) == ("full", block, 1)
    assert (state.kind, state.tables, state.padded_layers) == ("state", state_tables, padded)
    assert (state.layer_page_bytes, state.layer_used_bytes) == (page, state_bytes)
    assert f"block {block}: the" in layout.reason and "_align_hybrid_block_size" in layout.reason
    assert plan_blocks(layout, KV) == blocks
    # the ideal layout keeps the block asked for
    assert kv_layout(spec(), 16, layout="ideal").block_size == 16


def test_qwen3_next():
    # attention 2 · 2 · 256 · 2 = 2,048 B per token; state conv 3 · (2·16·128 + 32·128) · 2 = 49,152 + recurrent
    # 32 · 128 · 128 · 2 = 1,048,576 -> 1,097,728 B; 16 · ceil(1,097,728 / 32,768) = 16 · 34 = 544; page
    # 544 · 2,048 = 1,114,112 (state padded 1.49 %); G = 12, 3 state tables; id 13,369,344 -> 3,212 blocks
    layout = kv_layout(qwen3_next(), 16)
    assert layout.block_size == 544 and layout.page_bytes == 13_369_344
    assert "padded by 1.49 %" in layout.reason
    assert [(g.kind, g.tables) for g in layout.groups] == [("full", 1), ("state", 3)]
    assert plan_blocks(layout, KV) == 3_212
    # a block of 32 asked for: alignment 32, 32 · ceil(1,097,728 / 65,536) = 32 · 17 = 544 again; a block of 1024
    # already holds the state: kept, the state padded to 1024 · 2,048
    assert kv_layout(qwen3_next(), 16, 32).block_size == 544
    big = kv_layout(qwen3_next(), 16, 1024)
    assert big.block_size == 1024 and big.groups[1].layer_page_bytes == 1024 * 2048
    # state pages per sequence: none 1, align 2 (the running state and the last saved), all one per block
    state = layout.groups[1]
    assert [blocks_held(state, 5000, mode) for mode in ("none", "align", "all")] == [1, 2, 10]  # ceil(5000/544)


def test_request_blocks_vllm_worst_case():
    # Gemma-3-27B at max_model_len 131,072, 8,192 batched tokens: full cdiv(131072, 16) = 8,192; sliding
    # cdiv(min(1023 + 8192, 131072), 16) + 1 = 576 + 1 = 577 per table
    full, sliding = kv_layout(get_preset("Gemma-3-27B"), 16).groups
    assert request_blocks(full, 131_072, 8192) == 8192 and request_blocks(sliding, 131_072, 8192) == 577
    # Llama-4-Scout chunked: cdiv(min(8192 + 8192, L), 16) = 1,024
    chunked = kv_layout(get_preset("Llama-4-Scout"), 16).groups[0]
    assert request_blocks(chunked, 131_072, 8192) == 1024


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ParameterError, match="layout 'best'"):
        kv_layout(get_preset("Llama-3-8B"), 16, layout="best")
    with pytest.raises(ParameterError, match="block_size 0"):
        kv_layout(get_preset("Llama-3-8B"), 16, 0)
    with pytest.raises(ParameterError, match="mamba_cache_mode"):
        kv_layout(get_preset("Llama-3-8B"), 16, mamba_cache_mode="some")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12_000), st.sampled_from([1, 8, 16, 32, 64, 128, 256]))
def test_blocks_held_cover_exactly_what_is_kept(tokens, block):
    """Independent check by enumeration: the blocks held are those with at least one kept token position."""
    for spec in (get_preset("Gemma-3-27B"), get_preset("Llama-4-Scout")):
        for g in kv_layout(spec, 16, block, layout="ideal").groups:
            if g.kind == "sliding":
                kept = range(max(tokens - g.window, 0), tokens)  # the last W positions
            elif g.kind == "chunked":
                kept = range(g.window * ((tokens - 1) // g.window), tokens)  # the last token's chunk
            else:
                kept = range(tokens)
            assert blocks_held(g, tokens) == len({p // block for p in kept})


EIGHT = {
    "Gemma-3-27B": lambda: get_preset("Gemma-3-27B"), "gpt-oss-120b": lambda: get_preset("gpt-oss-120b"),
    "Llama-4-Scout": lambda: get_preset("Llama-4-Scout"), "Granite-4.0-H-Small": granite_h_small,
    "Qwen3-Next": qwen3_next, "Jamba": jamba, "Nemotron-H-56B": lambda: get_preset("Nemotron-H-56B"),
    "Llama-3-8B": lambda: get_preset("Llama-3-8B"),
}


@pytest.mark.parametrize("name", list(EIGHT))
def test_one_memory_plan_for_size_and_frag(name):
    """size --kv-memory (gpu_plan), size --memory's vLLM row (sizing) and frag's layout count the same blocks."""
    from kvcalc.core.model.gpu_plan import plan_gpu
    from kvcalc.core.model.sizing import compute_size

    spec = EIGHT[name]()
    layout = kv_layout(spec, 16, 16)
    plan = plan_gpu(spec, kv_dtype_bits=16, block_size=16, max_model_len=8192, kv_memory_bytes=KV)
    capacity = compute_size(spec, "bf16", tokens=8192, block_size=16, memory_bytes=KV).capacity
    assert plan.num_blocks == capacity.layout_blocks == plan_blocks(layout, KV)
    assert plan.block_size == layout.block_size
    # every group's block is a whole number of the layout's units, and the padding never negative
    for g in layout.groups:
        assert g.block_bytes == g.pages_per_block * layout.page_bytes and g.padding_bytes_per_block >= 0


def test_tensor_parallel_halves_the_pages():
    # Gemma-3-27B at tp 2: 8 of the 16 KV heads per GPU, 4,096 B per token per layer: the same groups, half pages
    one, two = kv_layout(get_preset("Gemma-3-27B"), 16, 16), kv_layout(get_preset("Gemma-3-27B"), 16, 16, tp=2)
    assert two.page_bytes * 2 == one.page_bytes and summary(two)[1][:6] == summary(one)[1][:6]


def test_unequal_pages_are_unified_by_growing_the_block():
    # sliding layers of 2 KV heads (2 · 2 · 64 · 2 = 512 B per token) beside full layers of 1 head (256 B): the
    # full page of 16 tokens (4,096 B) is half the sliding one (8,192 B), so full blocks hold 32 tokens
    spec = ModelSpec.from_groups("m", (LayerGroup("full", 4, kv_heads=1, k_head_dim=64, v_head_dim=64),
                                      LayerGroup("sliding", 4, window=128, kv_heads=2, k_head_dim=64,
                                                 v_head_dim=64)), num_attention_heads=2, hidden_size=128,
                                 max_position_embeddings=4096)
    layout = kv_layout(spec, 16, 16)
    assert [(g.kind, g.block_tokens) for g in layout.groups] == [("full", 32), ("sliding", 16)]
    assert layout.page_bytes == 4 * 8192 and "pages unified" in layout.reason
    # a ratio that is not whole is refused by name, with the layout that pages it
    odd = ModelSpec.from_groups("odd", (LayerGroup("full", 4, kv_heads=2, k_head_dim=64, v_head_dim=64),
                                       LayerGroup("sliding", 4, window=128, kv_heads=3, k_head_dim=64,
                                                  v_head_dim=64)), num_attention_heads=6, hidden_size=384,
                                max_position_embeddings=4096)
    with pytest.raises(ParameterError, match="use layout 'ideal'"):
        kv_layout(odd, 16, 16)
    assert kv_layout(odd, 16, 16, layout="ideal").block_size == 16


GEMMA2 = {  # 21/13/23 sliding (W 4096) + as many full layers; KV heads × head dim from the configs
    "google/gemma-2-2b-it": ModelSpec(name="Gemma-2-2B", layers=26, num_attention_heads=8, kv_heads=4, head_dim=256,
                                      hidden_size=2304, max_position_embeddings=8192, sliding_window=4096,
                                      num_sliding_layers=13),
    "google/gemma-2-9b-it": get_preset("Gemma-2-9B"),
    "google/gemma-2-27b-it": ModelSpec(name="Gemma-2-27B", layers=46, num_attention_heads=32, kv_heads=16,
                                       head_dim=128, hidden_size=4608, max_position_embeddings=8192,
                                       sliding_window=4096, num_sliding_layers=23),
}


def test_two_groups_against_real_vllm_logs():
    """vLLM 0.19.0 on an H100 (../shared/vllm_startup, llm-d planner, Apache-2.0): Gemma-2's sliding and full
    layers are 2 groups of L/2 layers; it prints "GPU KV cache size" as blocks // 2 groups × 16. From the
    logged GiB (two decimals: ± 0.005 GiB) our blocks must reach the logged token count. Gemma-2-2B: a block id
    is 13 pages of 16 · 2 · 4 · 256 · 2 B = 851,968 B; 66.47 GiB / 851,968 B = 83,772 blocks; the logged
    670,160 tokens = 41,885 · 16 are 83,770 or 83,771 blocks: 1.6 MiB under the printed GiB, within ± 5.1 MiB."""
    import csv
    from pathlib import Path

    table = Path(__file__).resolve().parents[3] / ".." / "shared" / "vllm_startup" / "startup.csv"
    if not table.exists():
        pytest.skip(f"{table} is absent (the shared vLLM start-up logs)")
    rows = [r for r in csv.DictReader(table.open()) if r["model"] in GEMMA2 and r["status"] == "ok"]
    assert len(rows) == 3
    for row in rows:
        layout = kv_layout(GEMMA2[row["model"]], 16, 16)
        assert layout.num_tables == 2 and int(row["block_size"] or 16) == 16
        gib = float(row["available_kv_gib"])
        low, high = (plan_blocks(layout, int((gib + d) * GIB)) for d in (-0.005, 0.005))
        logged = int(row["kv_cache_tokens"])
        assert any(blocks // 2 * 16 == logged for blocks in range(low, high + 1)), (row["model"], low, high)
    two_b = next(r for r in rows if r["model"] == "google/gemma-2-2b-it")
    assert plan_blocks(kv_layout(GEMMA2["google/gemma-2-2b-it"], 16, 16), int(66.47 * GIB)) == 83_772
    assert int(two_b["kv_cache_tokens"]) == 670_160


@pytest.mark.parametrize(("config", "block"), [("QWEN3_NEXT", 544), ("JAMBA_15_MINI", 80), ("NEMOTRON_H_56B", 4128)])
def test_real_configs_give_the_engine_block(tmp_path, config, block):
    """The public config.json files of test_real_configs.py, read by kvcalc's own reader, give the block sizes
    vLLM logs for them (issue 19: 544 / 80 / 4,128)."""
    assert kv_layout(load_config(write_config(tmp_path, config)), 16, 16).block_size == block


def test_a_vllm_layout_with_mixed_tokens_per_block_pages_each_group_at_its_own_block():
    # full layers of 8 KV heads (4,096 B a token), sliding ones of 4 (2,048 B): at block 16 the pages are 65,536
    # and 32,768 B; vLLM unifies them to the larger, so a sliding block holds 32 tokens (hits aligned to
    # lcm(32, 16) = 32 tokens, core/pool/group_blocks.py). The pool's groups say their own tokens per block; the
    # ideal layout keeps one block size for all.
    from kvcalc.core.pool.groups import PoolGroup, pool_groups

    spec = ModelSpec.from_groups("mixed-pages", (
        LayerGroup("full", 4, **ATTN_8x128),
        LayerGroup("sliding", 4, window=1024, kv_heads=4, k_head_dim=128, v_head_dim=128, q_heads=32)),
        num_attention_heads=32, hidden_size=4096, max_position_embeddings=32_768)
    layout = kv_layout(spec, 16, 16, "vllm")
    assert [(g.kind, g.block_tokens) for g in layout.groups] == [("full", 16), ("sliding", 32)]
    groups = pool_groups(layout)
    assert groups is not None and [(g.kind, g.window, g.block_tokens) for g in groups] == [
        ("full", None, 16), ("sliding", 1024, 32)]
    assert [g.tokens_per_block(16) for g in groups] == [16, 32]
    ideal = pool_groups(kv_layout(spec, 16, 16, "ideal"))
    assert ideal is not None and [(g.kind, g.block_tokens) for g in ideal] == [("full", None)] * 2 + [
        ("sliding", None)]
    assert PoolGroup("full").tokens_per_block(16) == 16


def test_mixed_tokens_per_block_with_a_recurrent_state_is_still_refused_naming_why():
    # Jamba's attention plus a second attention type of half the heads: the Mamba page forces block 80 (Jamba's) and
    # the half-size type's pages then hold 160 tokens. The pool anchors windows to the full group at mixed sizes,
    # not yet a state page saved at a step end: refused by name, ideal named
    from kvcalc.core.pool.groups import pool_groups

    base = jamba()
    spec = ModelSpec.from_groups("jamba-mixed", (
        *base.layer_groups,
        LayerGroup("sliding", 4, window=1024, kv_heads=4, k_head_dim=128, v_head_dim=128, q_heads=32)),
        num_attention_heads=32, hidden_size=4096, max_position_embeddings=32_768)
    layout = kv_layout(spec, 16, 16, "vllm")
    assert {(g.kind, g.block_tokens) for g in layout.groups} == {("full", 80), ("state", 80), ("sliding", 160)}
    with pytest.raises(ParameterError, match=r"sliding layers' blocks hold 160 tokens.*recurrent state.*ideal"):
        pool_groups(layout)


def test_ideal_granite_h_is_refused_naming_the_cause():
    # ideal layout, block 16, bf16: the 4 attention layers' block 4 · 16 · 4,096 B = 262,144 B = 2^18; the 36 states
    # 36 · 2,147,840 = 77,322,240 B = 2^11 · 37,755. Their gcd, the unit, is 2,048 B: 128 + 37,755 = 37,883 units of
    # a sequence's blocks, each a block table of the pool (its limit 256): refused, saying why
    from kvcalc.core.pool.groups import pool_groups

    layout = kv_layout(granite_h_small(), 16, 16, "ideal")
    assert layout.page_bytes == 2_048 and [g.pages_per_block for g in layout.groups] == [128, 37_755]
    with pytest.raises(ParameterError, match=r"2,048 B \(their gcd\).*37,755 units.*37,883 block tables"):
        pool_groups(layout)


def test_mamba_cache_mode_all_aligns_the_block_to_the_kernel_chunk(tmp_path):
    # Nemotron-H-56B: a Mamba-2 state of 16,900,096 B per layer, an attention token 2 · 8 · 128 · 2 = 4,096 B per
    # layer: 16,900,096 / 4,096 = 4,126 tokens hold one state. align: 16 · ceil(4,126 / 16) = 16 · 258 = 4,128.
    # all (vLLM: the block a multiple of lcm(chunk, 16), the config's chunk_size 128): 128 · ceil(4,126 / 128) =
    # 128 · 33 = 4,224; the state page 4,224 · 4,096 = 17,301,504 B, padded by 401,408 / 16,900,096 = 2.38 %
    for spec in (get_preset("Nemotron-H-56B"), load_config(write_config(tmp_path, "NEMOTRON_H_56B"))):
        assert kv_layout(spec, 16, 16, "vllm", 1, "align").block_size == 4_128
        layout = kv_layout(spec, 16, 16, "vllm", 1, "all")
        assert layout.block_size == 4_224 and layout.mamba_cache_mode == "all"
        assert "lcm(128, 16) · ceil(4126 tokens / 128)" in layout.reason and "padded by 2.38 %" in layout.reason
        assert layout.page_bytes == 10 * 4_224 * 4_096
        state = layout.state_groups[0]
        assert blocks_held(state, 10_000, "all") == 3 and blocks_held(state, 10_000, "align") == 2
    # an explicit chunk still wins (vLLM's mamba_block_size)
    assert kv_layout(get_preset("Nemotron-H-56B"), 16, 16, "vllm", 1, "all", mamba_chunk_size=256).block_size == 4_352


def test_mamba_cache_mode_all_is_refused_where_vllm_does_not_run_it(tmp_path):
    # Qwen3-Next's gated DeltaNet: vLLM raises NotImplementedError for 'all' (Mamba-2 only); a Mamba-2 model whose
    # config gives no chunk (the hand-made Granite-4.0-H-Small here) cannot align its block: both refused by name
    with pytest.raises(ParameterError, match="Mamba-2 layers only, not gated_deltanet: use none or align"):
        kv_layout(qwen3_next(), 16, 16, "vllm", 1, "all")
    with pytest.raises(ParameterError, match="chunk_size or mamba_chunk_size"):
        kv_layout(granite_h_small(), 16, 16, "vllm", 1, "all")
    with pytest.raises(ParameterError, match="Mamba-2 layers only, not mamba1"):
        kv_layout(jamba(), 16, 16, "vllm", 1, "all")
    # the pool's mode check takes all now; a mode it does not know is still refused by name
    from kvcalc.core.pool.groups import check_state_mode_given

    check_state_mode_given("all")
    with pytest.raises(ParameterError, match="mamba_cache_mode 'every'"):
        check_state_mode_given("every")
