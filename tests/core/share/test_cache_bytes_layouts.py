"""A cached block's bytes under vLLM's layout (core/share/cache_bytes.py, layout_name "vllm") against kvcalc's ideal
pool and the one memory plan: for every attention-only preset, at every block size vLLM accepts, the vLLM bytes are
the ideal bytes plus the padding, and equal the block ids a token block takes in the memory plan (tables · page)."""

from __future__ import annotations

import pytest

from kvcalc.core.errors import ParameterError
from kvcalc.core.model.kv_groups import VLLM_BLOCK_SIZES, kv_layout
from kvcalc.core.model.presets import PRESETS
from kvcalc.core.share.cache_bytes import cached_block_bytes

ATTENTION_ONLY = [s for s in PRESETS.values() if not any(g.state is not None for g in s.layer_groups)]


@pytest.mark.parametrize("spec", ATTENTION_ONLY, ids=lambda s: s.name)
@pytest.mark.parametrize("block", [b for b in VLLM_BLOCK_SIZES if b >= 16])
def test_vllm_bytes_are_ideal_plus_padding_and_the_plans_ids(spec, block) -> None:
    vllm = cached_block_bytes(spec, "bf16", 16, block, layout_name="vllm")
    ideal = cached_block_bytes(spec, "bf16", 16, block, layout_name="ideal")
    assert vllm.bytes_per_block == ideal.bytes_per_block + vllm.padding_bytes
    assert ideal.padding_bytes == 0 and vllm.layout == "vllm" and ideal.layout == "ideal"
    layout = kv_layout(spec, 16, block, "vllm")
    assert vllm.bytes_per_block == layout.num_tables * layout.page_bytes  # one block id per table, G slots each


def test_gemma3_27b_by_hand() -> None:
    # 10 full layers set G = 10 (52 ≥ 1.5 · 10): sliding spans ceil(52 / 10) = 6 tables, 60 slots, 8 padding. A slot
    # holds 16 tokens · 2 · 16 KV heads · 128 · 2 B = 128 KiB: 70 slots 8.75 MiB, 8 of them 1 MiB padding
    c = cached_block_bytes(PRESETS["gemma-3-27b"], "bf16", 16, 16, layout_name="vllm")
    assert {g.label: g.bytes_per_block for g in c.groups} == {"full": 10 * 2**17, "sliding_1024": 60 * 2**17}
    assert c.bytes_per_block == 70 * 2**17 and c.padding_bytes == 8 * 2**17


def test_a_state_forced_block_is_refused_at_another_size() -> None:
    spec = PRESETS["nemotron-h-56b"]
    with pytest.raises(ParameterError, match="at block 4,128, not 16"):  # 16 · ceil(16,900,096 / (16 · 4,096))
        cached_block_bytes(spec, "bf16", 16, 16, layout_name="vllm")
    at_vllms = cached_block_bytes(spec, "bf16", 16, 4128, layout_name="vllm")
    # at vLLM's own block: 1 full table + ceil(54 / 10) = 6 state tables of 10 slots (the state page padded to the
    # attention page 4,128 · 4,096 B = 16,908,288 B)
    assert at_vllms.bytes_per_block == 7 * 10 * 4128 * 4096


def test_a_pool_in_bytes_leaves_out_vllms_null_block() -> None:
    # gpt-oss-120b bf16, block 16: 18 full + 18 sliding layers, 8 KV heads of 64: a layer's block is
    # 16 · 2 · 8 · 64 · 2 B = 32 KiB; vLLM G = 18: 2 tables of 18 slots, an id 18 · 32 KiB = 589,824 B and a cached
    # block 2 ids = 1,179,648 B (ideal: the same 36 layers, no padding, no null block)
    spec = PRESETS["gpt-oss-120b"]
    vllm = cached_block_bytes(spec, "bf16", 16, 16, layout_name="vllm")
    ideal = cached_block_bytes(spec, "bf16", 16, 16, layout_name="ideal")
    assert (vllm.page_bytes, vllm.bytes_per_block, vllm.null_blocks) == (589_824, 1_179_648, 1)
    assert (ideal.bytes_per_block, ideal.null_blocks) == (1_179_648, 0)
    # 10 ids: (10 − 1) // 2 = 4 blocks under vllm, 10 · 589,824 // 1,179,648 = 5 under ideal; 11 ids: 5 and 5
    assert [vllm.pool_blocks(n * 589_824) for n in (0, 1, 2, 3, 10, 11)] == [0, 0, 0, 1, 4, 5]
    assert [ideal.pool_blocks(n * 589_824) for n in (0, 1, 2, 3, 10, 11)] == [0, 0, 1, 1, 5, 5]
    # the inverse: the smallest pool of k blocks is 2k + 1 ids under vllm (the null block's), 2k under ideal
    assert [vllm.pool_bytes(k) for k in (0, 1, 4)] == [0, 3 * 589_824, 9 * 589_824]
    assert [ideal.pool_bytes(k) for k in (0, 1, 4)] == [0, 2 * 589_824, 8 * 589_824]
    for k in range(1, 40):  # pool_bytes is the least pool that holds k blocks
        assert vllm.pool_blocks(vllm.pool_bytes(k)) == k and vllm.pool_blocks(vllm.pool_bytes(k) - 1) == k - 1
