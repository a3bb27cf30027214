"""A tier block's bytes in `kvcalc sim --host-cache/--disk-cache` as the pool pages it (core/sim/tiers_options.py):
under vLLM's layout (the default) every KV cache group's block ids with their padding, under `--layout ideal`
kvcalc's own pool; the same function as `share --gpu-cache/--host-cache` (core/share/cache_bytes), so the same
inputs give the same tier blocks in both commands. By hand from config fields and vLLM v1's rules
(kv_cache_utils: one page size for every group, group size = the smallest layer type's count, a Mamba state page
padded to the attention page, _align_hybrid_block_size).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from real_configs import write_config

from kvcalc.cli.sim_tiers_report import _reads, _tier_block_note
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.tiers import HOST

GIB = 1 << 30


def _trace(tmp_path: Path, rows) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": p, "output_length": 1, "hash_ids": ids})
                            + "\n" for t, p, ids in rows))
    return path


def _tiers(tmp_path: Path, host="1GiB", disk="2GiB", rows=((0, 1025, [1, 2, 3]),), **o):
    options = SimOptions(gpu="H200", trace=("mooncake", str(_trace(tmp_path, rows))), max_model_len=8192,
                         host_cache=host, disk_cache=disk, **o)
    return build(options)


# Gemma-3-27B bf16: 16 KV heads x 128 x 2 (K, V) x 2 B = 8,192 B a token a layer; block 16: a page of 131,072 B.
# vLLM: 10 full layers and 52 sliding (window 1,024); group size 10 -> 1 full table + ceil(52 / 10) = 6 sliding
# tables (8 padding slots), each block id 10 slots: a position costs 7 x 10 x 131,072 = 9,175,040 B (8.75 MiB):
# full 1,310,720 + sliding 6 x 1,310,720 = 7,864,320, of it 8 x 131,072 = 1,048,576 padding. Ideal: 62 x 131,072
# = 8,126,464 B (7.75 MiB). Host 1 GiB = 1,073,741,824 B: // 9,175,040 = 117 (117.03), // 8,126,464 = 132 (132.1);
# disk 2 GiB: 234 (234.06) and 264 (264.3).
GEMMA = {"vllm": (9_175_040, 1_048_576, 117, 234), "ideal": (8_126_464, 0, 132, 264)}


@pytest.mark.parametrize("layout", ["vllm", "ideal"])
def test_gemma3_tier_blocks_as_share_counts_them(tmp_path, run_cli, layout):
    per_block, padding, host, disk = GEMMA[layout]
    tiers = _tiers(tmp_path, model="gemma-3-27b", block_size=16, layout=layout).sim.tiers
    cbb = tiers.block_bytes
    assert (tiers.bytes_per_block, cbb.padding_bytes, cbb.layout) == (per_block, padding, layout)
    assert (tiers.host_blocks, tiers.disk_blocks) == (host, disk)
    sliding = 7_864_320 if layout == "vllm" else 52 * 131_072
    assert {g.label: g.bytes_per_block for g in cbb.groups} == {"full": 1_310_720, "sliding_1024": sliding}
    # share's tiers on the same inputs: the same blocks per tier
    doc = run_cli("share", "--trace", "mooncake", str(tmp_path / "trace.jsonl"), "--model", "Gemma-3-27B", "--block",
                  "16", "--layout", layout, "--gpu-cache", "0", "--host-cache", "1GiB", "--disk-cache", "2GiB",
                  "--json").json()
    assert [t["capacity_blocks"] for t in doc["tiers"]["by_tier"]] == [0, host, disk]
    note = _tier_block_note(cbb)
    if layout == "vllm":
        assert "8.75 MiB per GPU" in note and "1.00 MiB of it padding" in note and "ideal holds 7.75 MiB" in note
    else:
        assert "7.75 MiB per GPU, ideal layout" in note


def test_gemma3_load_reads_the_padded_blocks(tmp_path):
    # r0 (ids 1, 2, 3: 64 full blocks + 1 token), r1 (new ids) takes a pool of 455 ids = one request's 65 blocks x 7
    # tables, evicting every block r0 left cached; a host of 2 GiB (234 positions) holds both requests' 64 stored
    # positions (written through); r2 repeats r0's 1,024-token prefix (64 blocks). Which
    # k of them the load-or-recompute rule loads is its business; whatever k, the load reads k x 9,175,040 B
    # (k x 1,310,720 full + k x 7,864,320 sliding) and, alone on an idle 25 GB/s link, waits k x 9,175,040 / 25e9 s.
    rows = [(0, 1025, [1, 2, 3]), (1000, 1025, [5, 6, 7]), (2000, 1025, [1, 2, 4])]
    setup = _tiers(tmp_path, host="2GiB", disk=None, rows=rows, model="gemma-3-27b", block_size=16)
    t = run_policy(setup.workload, "paged", replace(setup.sim, capacity_blocks=455)).tiers
    k = int(t.host_hit_blocks[2])
    assert k > 0 and t.read_blocks == [k, 0] and t.gpu_hit_blocks[2] + k + t.recomputed_blocks[2] == 64
    assert t.wait_s[2] == pytest.approx(k * 9_175_040 / 25e9, rel=1e-12)
    assert _reads(setup.sim.tiers, t, HOST) == {"full": k * 1_310_720, "sliding_1024": k * 7_864_320}


@pytest.mark.parametrize("layout", ["vllm", "ideal"])
def test_gpt_oss_and_a_plain_model_have_no_padding(tmp_path, layout):
    # gpt-oss-20b: 8 KV heads x 64 x 2 x 2 = 2,048 B a token a layer, 12 full + 12 sliding (window 128): group size
    # 12, 2 tables, no padding slot: 2 x 12 x 16 x 2,048 = 786,432 B either way; 1 GiB // 786,432 = 1,365 (1,365.3).
    tiers = _tiers(tmp_path, model="gpt-oss-20b", block_size=16, layout=layout).sim.tiers
    assert (tiers.bytes_per_block, tiers.block_bytes.padding_bytes, tiers.host_blocks) == (786_432, 0, 1365)
    # Llama-3.1-8B: one group, 32 layers x 8 x 128 x 2 x 2 = 131,072 B a token; block 16: 2,097,152 B; 1 GiB = 512
    tiers = _tiers(tmp_path, model="llama-3.1-8b", block_size=16, layout=layout).sim.tiers
    assert (tiers.bytes_per_block, tiers.block_bytes.padding_bytes, tiers.host_blocks) == (2_097_152, 0, 512)


# Falcon-H1-0.5B (config.json): 36 layers, each attention (2 KV heads x 64 x 2 x 2 = 512 B a token) and Mamba-2 in
# parallel; the state: conv (1,536 + 2 x 1 x 128) x (4 - 1) = 5,376 + ssm 24 x 64 x 128 = 196,608 elements, x 2 B
# = 403,968 B a layer. vLLM (align): block 16 x ceil(403,968 / (16 x 512)) = 16 x 50 = 800, page 800 x 512 =
# 409,600 B (the state padded by 5,632 B); group size 36: 1 attention + 1 state table of 36 slots, no padding slot.
# A tier block is a position's attention block and its state page: 2 x 36 x 409,600 = 29,491,200 B, of it
# 36 x 5,632 = 202,752 padding; 10 GiB = 10,737,418,240 // 29,491,200 = 364 (364.09). Under all the block is
# lcm(128, 16) x ceil(789 / 128) = 896 (the Mamba chunk 128): page 458,752, 72 x 458,752 = 33,030,144 B (padding
# 36 x 54,784 = 1,972,224), 10 GiB // it = 325 (325.07). Ideal at 800: 36 x 409,600 + 36 x 403,968 = 29,288,448 B,
# 366 blocks (366.6).
@pytest.mark.parametrize(("mode", "layout", "block", "expected"), [
    ("align", "vllm", 16, (800, 29_491_200, 202_752, 364)),
    ("all", "vllm", 16, (896, 33_030_144, 1_972_224, 325)),
    ("all", "ideal", 800, (800, 29_288_448, 0, 366)),
])
def test_falcon_h1_tier_block_is_the_forced_block(tmp_path, mode, layout, block, expected):
    config = write_config(tmp_path, "FALCON_H1_05B", "test_architecture_configs")
    setup = _tiers(tmp_path, host="10GiB", disk=None, config=str(config), mamba_cache_mode=mode, layout=layout,
                   block_size=block)
    cbb = setup.sim.tiers.block_bytes
    assert (setup.plan.block_size, cbb.bytes_per_block, cbb.padding_bytes, setup.sim.tiers.host_blocks) == expected
    assert [g.label for g in cbb.groups] == ["full", "state_mamba2"]
    assert cbb.state_bytes == (cbb.bytes_per_block // 2 if layout == "vllm" else 36 * 403_968)
    if layout == "vllm":
        assert "and state pages padded to the attention page" in _tier_block_note(cbb)
