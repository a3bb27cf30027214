"""What a load from `kvcalc sim`'s host tier reads per KV cache group on a hybrid (core/sim/tiers.py), by hand.

vLLM allocates, for a prefix hit of n blocks of B tokens, only the blocks from get_num_skipped_tokens(n·B) // B
on in each group (single_type_kv_cache_manager.py; the ones before are null entries a connector never fills):
full attention 0 (every block), sliding window max(0, n·B − W + 1) (the window's last ceil((W − 1) / B) blocks),
chunked local attention n·B // C · C (the current chunk's blocks), Mamba n·B − 1 (the one state at the hit's
boundary). A load of k lower-tier blocks after g GPU hits (n = g + k) reads each group's blocks among those k.

Each trace: r0 is cached, r1 (other ids) takes the pool and evicts r0's blocks to the host, r2 repeats r0's prefix.
Which k the load-or-recompute rule loads is its own business; whatever k, the bytes are asserted from it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from real_configs import write_config

from kvcalc.cli.sim_tiers_report import _reads
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.tiers import HOST

LINK = 25e9  # the host link's default, bytes/s


def _run(tmp_path: Path, rows, capacity_blocks: int, **o):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": p, "output_length": 1, "hash_ids": ids})
                            + "\n" for t, p, ids in rows))
    setup = build(SimOptions(gpu="H200", trace=("mooncake", str(path)), **o))
    return setup, run_policy(setup.workload, "paged", replace(setup.sim, capacity_blocks=capacity_blocks)).tiers


def test_gemma3_sliding_group_reads_its_window_only(tmp_path):
    # Gemma-3-27B, vLLM's layout at block 16: a position is the full table's 10 pages of 131,072 B (1,310,720 B)
    # and the sliding tables' 60 (52 layers + 8 padding slots: 7,864,320 B). W = 1,024: the window's
    # ceil(1,023 / 16) = 64 blocks. r2 shares r0's 4 ids = 2,048 tokens = 128 blocks (eligible (2,049 − 1) // 16 =
    # 128), none on the GPU (a pool of 903 ids), k loaded from the host: k x 1,310,720 full, min(k, 64) x
    # 7,864,320 sliding (n = k >= 64: skipped (16k − 1,023) // 16 = k − 64), never k x 9,175,040
    rows = [(0, 2049, [1, 2, 3, 4, 5]), (1000, 2049, [11, 12, 13, 14, 15]), (2000, 2049, [1, 2, 3, 4, 9])]
    setup, t = _run(tmp_path, rows, 903, model="gemma-3-27b", block_size=16, host_cache="4GiB", max_model_len=8192)
    k = int(t.host_hit_blocks[2])
    assert t.gpu_hit_blocks[2] == 0 and k > 64 and k + t.recomputed_blocks[2] == 128
    read = {"full": k * 1_310_720, "sliding_1024": 64 * 7_864_320}
    assert _reads(setup.sim.tiers, t, HOST) == read
    assert t.wait_s[2] == pytest.approx(sum(read.values()) / LINK, rel=1e-12)  # alone on an idle link
    assert t.link_busy_s[HOST] == pytest.approx(sum(read.values()) / LINK, rel=1e-12)


@pytest.mark.parametrize(("prompt", "ids", "hit", "chunked", "capacity", "max_len"), [
    # 10,241 tokens (21 ids): hit (10,241 − 1) // 16 = 640 blocks = 10,240 tokens; skipped 10,240 // 8,192 x 8,192
    # = 8,192 tokens = 512 blocks: the current chunk's 640 − 512 = 128 blocks
    (10241, 20, 640, 128, 2564, 16384),
    # a hit ending on a chunk boundary: 8,193 tokens (17 ids), hit 8,192 // 16 = 512 blocks; skipped 8,192 // 8,192
    # x 8,192 = 8,192 tokens = 512 blocks: the chunked group reads none (its next token starts a chunk), and needs
    # none in the tier either (tiers_groups.lookup_first = first_needed)
    (8193, 16, 512, 0, 2052, 8208),
])
def test_llama4_scout_chunked_group_reads_the_current_chunk(tmp_path, prompt, ids, hit, chunked, capacity, max_len):
    # Llama-4-Scout tp 2, block 16: 8 KV heads / 2 x 128 x 2 (K, V) x 2 B = 2,048 B a token a layer per GPU, a
    # block 32,768 B a layer: 36 chunked layers (C = 8,192) 1,179,648 B, 12 full layers 393,216 B. A pool about one
    # max-length request large: r1's hand-outs pop the whole free queue, so every block r0 cached is evicted to
    # the host, each group's on its own (asserted: r2 gets no GPU hit), and r2 loads all `hit` blocks
    first = list(range(1, ids + 1))
    rows = [(0, prompt, [*first, 21]), (1000, prompt, list(range(101, 102 + ids))), (2000, prompt, [*first, 99])]
    setup, t = _run(tmp_path, rows, capacity, model="llama-4-scout", tp=2, block_size=16, host_cache="40GiB",
                    max_model_len=max_len)
    assert (t.gpu_hit_blocks[2], t.host_hit_blocks[2], t.recomputed_blocks[2]) == (0, hit, 0)
    read = {"chunked_8192": chunked * 1_179_648, "full": hit * 393_216}
    assert _reads(setup.sim.tiers, t, HOST) == read
    assert t.wait_s[2] == pytest.approx(sum(read.values()) / LINK, rel=1e-12)


@pytest.mark.parametrize(("capacity", "gpu", "host"), [(12, 0, 5), (20, 2, 3)])
def test_falcon_h1_all_mode_reads_one_state_per_load(tmp_path, capacity, gpu, host):
    # Falcon-H1-0.5B under mamba_cache_mode all: block lcm(128, 16) x ceil(789 / 128) = 896, a page 896 x 512 =
    # 458,752 B: the attention table 36 x 458,752 = 16,515,072 B a block, the state table (36 states padded to the
    # page) 16,515,072 B. Every cached block holds a state, but a hit of n blocks resumes from block n − 1's only:
    # r2 (r0's 9 ids, 4,481 tokens: hit (4,481 − 1) // 896 = 5 blocks) loads `host` blocks after `gpu` GPU hits
    # and reads host x 16,515,072 B of attention plus ONE state (16,515,072 B), not host states. At 20 ids r1
    # evicts r0's attention blocks 2..4 but not yet its state pages (each group's block leaves on its own): the
    # state at block 4, still cached on the GPU past the hit, is read as from the host (vLLM's write-through copy)
    config = write_config(tmp_path, "FALCON_H1_05B", "test_architecture_configs")
    ids = list(range(1, 10))
    rows = [(0, 4481, ids), (1000, 4481, list(range(101, 110))), (2000, 4481, ids)]
    setup, t = _run(tmp_path, rows, capacity, config=str(config), block_size=16, host_cache="10GiB",
                    mamba_cache_mode="all", max_model_len=8192)
    assert setup.plan.block_size == 896
    assert (t.gpu_hit_blocks[2], t.host_hit_blocks[2], t.recomputed_blocks[2]) == (gpu, host, 0)
    read = {"full": host * 16_515_072, "state_mamba2": 16_515_072}
    assert _reads(setup.sim.tiers, t, HOST) == read
    assert t.wait_s[2] == pytest.approx(sum(read.values()) / LINK, rel=1e-12)


def test_a_plain_model_reads_every_loaded_block(tmp_path):
    # Llama-3.1-8B: one full group, 32 layers x 8 x 128 x 2 x 2 B = 131,072 B a token, block 16: 2,097,152 B a block;
    # r2 loads k blocks and reads k x 2,097,152 B, as before the per-group rule
    rows = [(0, 2049, [1, 2, 3, 4, 5]), (1000, 2049, [11, 12, 13, 14, 15]), (2000, 2049, [1, 2, 3, 4, 9])]
    setup, t = _run(tmp_path, rows, 140, model="llama-3.1-8b", block_size=16, host_cache="4GiB", max_model_len=8192)
    k = int(t.host_hit_blocks[2])
    assert k > 0 and _reads(setup.sim.tiers, t, HOST) == {"full": k * 2_097_152}
    assert t.wait_s[2] == pytest.approx(k * 2_097_152 / LINK, rel=1e-12)
