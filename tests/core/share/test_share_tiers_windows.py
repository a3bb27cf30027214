"""What `kvcalc share --gpu-cache/--host-cache/--disk-cache` reads back per KV cache group on a hybrid
(core/share/tiers.py through CachedBlockBytes.read_bytes, the rule sim's tiers read through too), by hand.

vLLM allocates, for a prefix hit of n blocks of B tokens, only the blocks from get_num_skipped_tokens(n·B) // B on
in each group (single_type_kv_cache_manager.py; the blocks before are null entries, never loaded): full attention
0, sliding window max(0, n·B − W + 1), chunked local attention n·B // C · C, Mamba n·B − 1. A request's hit is its
GPU blocks first, then the host's, then the disk's (exclusive tiers): a tier reads, per group, the needed blocks
that fall in its range of the hit.

Each trace: one prompt, then the same prompt again; block 16 (Mooncake ids of 512 tokens = 32 blocks each). The
second's hit: (prompt − 1) // 16 blocks, served from the tiers as their capacities split it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.share.cache_bytes import CachedBlockBytes, GroupBytes
from kvcalc.core.sim.tiers import DISK, HOST
from kvcalc.core.sim.tiers_groups import read_counts

GEMMA_FULL, GEMMA_SLIDING = 1_310_720, 7_864_320  # Gemma-3-27B, vLLM's layout at block 16 (10 and 60 pages of 128 KiB)


def _tiers(run_cli, tmp_path: Path, prompt: int, *args: str) -> list[dict]:
    path = tmp_path / "t.jsonl"
    ids = list(range(-(-prompt // 512)))
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": prompt, "output_length": 2, "hash_ids": ids})
                            + "\n" for t in (0, 1000)))
    result = run_cli("share", "--trace", "mooncake", str(path), "--block", "16", "--gpu", "H200", *args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["tiers"]["by_tier"]


def test_first_needed_is_vllms_skipped_blocks():
    n = np.array([0, 1, 63, 64, 65, 255, 512, 640])
    # sliding W = 1,024, B = 16: max(0, 16n − 1,023) // 16 → n − 64 from n = 64 on; the window's 64 blocks
    sliding = GroupBytes("sliding_1024", 52, 1, "sliding", 1024).first_needed(n, 16)
    assert (n - sliding).tolist() == [0, 1, 63, 64, 64, 64, 64, 64]
    # gpt-oss W = 128: ceil(127 / 16) = 8 blocks
    assert (n - GroupBytes("sliding_128", 12, 1, "sliding", 128).first_needed(n, 16)).tolist() == [0, 1, *[8] * 6]
    # chunked C = 8,192 = 512 blocks: the current chunk's n mod 512 blocks (0 at a chunk's end)
    chunked = GroupBytes("chunked_8192", 36, 1, "chunked", 8192).first_needed(n, 16)
    assert (n - chunked).tolist() == [0, 1, 63, 64, 65, 255, 0, 128]
    # a state group: the one state at the hit's boundary (block n − 1); full: every block
    assert (n - GroupBytes("state_mamba2", 54, 1, "state").first_needed(n, 16)).tolist() == [0, *[1] * 7]
    assert GroupBytes("full", 10, 1).first_needed(n, 16).tolist() == [0] * 8


@pytest.mark.parametrize(("gpu", "host", "disk", "expected"), [
    # hit (4,096 − 1) // 16 = 255 blocks, all on the host: full 255 blocks; sliding from (4,080 − 1,023) // 16 =
    # 191: the window's 64 (255 x 9,175,040 B before the rule)
    ("0", "64GiB", None, [(255, 64), (0, 0)]),
    # GPU 3,200 tokens = 200 blocks (0..199), host 200..254: sliding blocks 191..254, of them 200..254 = 55 on
    # the host (the GPU holds the other 9)
    ("3200", "64GiB", None, [(55, 55), (0, 0)]),
    # host 200 blocks (0..199), disk 200..254: the host reads 200 full and 191..199 = 9 sliding, the disk 55 of each
    ("0", "3200", "64GiB", [(200, 9), (55, 55)]),
])
def test_gemma3_sliding_group_reads_its_window_only(run_cli, tmp_path, gpu, host, disk, expected):
    args = ["--model", "gemma-3-27b", "--gpu-cache", gpu, "--host-cache", host]
    tiers = _tiers(run_cli, tmp_path, 4096, *args, *(["--disk-cache", disk] if disk else []))
    for tier, (full, sliding) in zip(tiers[1:], expected, strict=True):
        read = {"full": full * GEMMA_FULL, "sliding_1024": sliding * GEMMA_SLIDING}
        assert tier["read_blocks"] == full and tier["read_bytes_by_group"] == read
        assert tier["read_bytes"] == sum(read.values())
        if full:  # load_s: the bytes over the link (host 25 GB/s, disk 5 GB/s by default)
            assert tier["load_s"] == pytest.approx(sum(read.values()) / tier["bandwidth_bytes_per_s"], rel=1e-12)


def test_gpt_oss_sliding_group_reads_eight_blocks(run_cli, tmp_path):
    # gpt-oss-20b block 16: 12 layers x 16 x 2,048 B = 393,216 B a table; hit 255 blocks: full 255, sliding
    # (W = 128) 255 − (4,080 − 127) // 16 = 255 − 247 = 8
    host = _tiers(run_cli, tmp_path, 4096, "--model", "gpt-oss-20b", "--gpu-cache", "0", "--host-cache", "64GiB")[1]
    assert host["read_bytes_by_group"] == {"full": 255 * 393_216, "sliding_128": 8 * 393_216}


@pytest.mark.parametrize(("prompt", "hit", "chunked"), [
    (10241, 640, 128),  # hit 10,240 tokens: skipped 8,192 = 512 blocks, the current chunk's 128
    (8193, 512, 0),  # hit 8,192 tokens, a chunk's end: the next token starts a new chunk, no chunked block read
])
def test_llama4_scout_chunked_group_reads_the_current_chunk(run_cli, tmp_path, prompt, hit, chunked):
    # Llama-4-Scout tp 2, block 16: 2,048 B a token a layer per GPU, 32,768 B a block a layer: 36 chunked layers
    # (C = 8,192) 1,179,648 B, 12 full layers 393,216 B
    host = _tiers(run_cli, tmp_path, prompt, "--model", "llama-4-scout", "--tp", "2", "--gpu-cache", "0",
                  "--host-cache", "64GiB")[1]
    assert host["read_blocks"] == hit
    assert host["read_bytes_by_group"] == {"chunked_8192": chunked * 1_179_648, "full": hit * 393_216}


def test_nemotron_h_state_is_read_from_the_tier_holding_the_hits_last_block(run_cli, tmp_path):
    # Nemotron-H-56B, --layout ideal at block 16: a cached block is 16 x 40,960 = 655,360 B of attention KV and one
    # saved state of 54 x 16,900,096 = 912,605,184 B: 913,260,544 B. Host 4 GiB // it = 4 blocks, disk 64 GiB // it
    # = 75. The first 10,240-token prompt leaves its blocks block 0 most recent: the host keeps blocks 0..3, the
    # disk 4..78, the rest are dropped; the repeat hits the chain 0..78 (79 blocks): the host reads 4 blocks'
    # attention and no state, the disk 75 blocks' attention and the one state at the hit's boundary (block 78's)
    tiers = _tiers(run_cli, tmp_path, 10240, "--model", "nemotron-h-56b", "--layout", "ideal", "--gpu-cache", "0",
                   "--host-cache", "4GiB", "--disk-cache", "64GiB")
    assert [t["read_blocks"] for t in tiers] == [0, 4, 75]
    assert tiers[1]["read_bytes_by_group"] == {"full": 4 * 655_360, "state_mamba2": 0}
    assert tiers[2]["read_bytes_by_group"] == {"full": 75 * 655_360, "state_mamba2": 912_605_184}


def test_a_plain_model_reads_every_block(run_cli, tmp_path):
    # Llama-3.1-8B: 131,072 B a token, 2,097,152 B a block of 16: 255 hit blocks read whole
    host = _tiers(run_cli, tmp_path, 4096, "--model", "llama-3.1-8b", "--gpu-cache", "0", "--host-cache", "64GiB")[1]
    assert host["read_bytes_by_group"] == {"full": 255 * 2_097_152} and host["read_bytes"] == 255 * 2_097_152


def _needed_by_positions(kind: str, window: int, B: int, n: int, i: int) -> bool:
    """Independent of first_needed's arithmetic: block i (positions iB .. iB + B − 1) of a hit of n blocks is
    needed when the next token (position nB) reads a position in it: full any before nB, sliding the last W
    positions up to nB (nB − W + 1 ..), chunked its own chunk's (nB // C · C ..); a state group only the state
    saved after the hit's last token, block n − 1's."""
    if kind == "state":
        return i == n - 1
    low = {"full": 0, "sliding": n * B - window + 1, "chunked": n * B // window * window}[kind]
    return any(low <= p < n * B for p in range(i * B, (i + 1) * B))


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(["full", "sliding", "chunked", "state"]), B=st.sampled_from([1, 4, 16]),
       window=st.integers(1, 200), n=st.integers(0, 40), tiers=st.lists(st.sampled_from([HOST, DISK]), max_size=40),
       data=st.data())
def test_share_and_sim_read_the_blocks_the_next_token_needs(kind, B, window, n, tiers, data):
    if kind == "chunked":
        window = B * max(1, window // B)  # vLLM's chunk is a multiple of the block
    group = GroupBytes("g", 1, 7, kind, window)
    cbb = CachedBlockBytes("m", "bf16", B, 1, (group,))
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    needed = [_needed_by_positions(kind, window, B, n, i) for i in range(n)]
    # share: a tier holding the hit's blocks [lo, hi)
    assert int(cbb.read_bytes(np.array([lo]), np.array([hi]), np.array([n]))["g"][0]) == 7 * sum(needed[lo:hi])
    # sim: a load of k = n − g blocks after g GPU hits, `tiers` giving each loaded block's tier
    g = lo
    tier_of = (tiers * (n + 1))[: n - g] if tiers else [HOST] * (n - g)
    found = np.array(tier_of, dtype=np.int8).reshape(1, n - g)  # the one group's block of each loaded position
    reads = read_counts(found, cbb.groups, g, B, np.array([n - g])) * group.bytes_per_block  # sim's per-group rule
    for t in (HOST, DISK):
        expect = sum(needed[g + j] for j, tier in enumerate(tier_of) if tier == t)
        assert int(reads[0, t, 0]) == 7 * expect
