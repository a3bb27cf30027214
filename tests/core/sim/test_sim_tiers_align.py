"""Host tier below a Mamba hybrid's pool in mamba_cache_mode align (core/sim/tiers.py, tiers_run.py), hand-worked.

Nemotron-H-56B on an H200: block 4,128 tokens (one full-attention table, six state tables), each block keyed by
the Mooncake id holding its last token (ids[8], ids[16], ids[24] = 9, 17, 25 for ids 1..26). A tier block is
paged as the pool pages it (vLLM's layout, the default): a layer slot's page is 4,128 tokens x 8 KV heads x 128 x
2 (K, V) x 2 B = 16,908,288 B, the mamba2 state (16,900,096 B a layer) padded up to it; 10 slots a table. So per
block a tier holds the full table's 10 x 16,908,288 = 169,082,880 B and a state page of 6 tables x 10 slots x
16,908,288 = 1,014,497,280 B (54 mamba2 layers + 6 padding slots; kvcalc's ideal pool: 54 x 16,900,096 =
912,605,184 B). Under align a state is saved only where a step ends on a block boundary, and a hit resumes from
the state at its last block: a load must end at a position whose state is in the tier, and reads k blocks of the
full layers plus that one state page.

The trace: r0 (13,000 tokens, ids 1..26) at 0; r1 and r2 (16,000 tokens each, new ids) at 1,000 s and 2,000 s
take the pool (28 blocks, the least a 16,000-token request may need) in turn, so that every block r0 left cached
is evicted to the host (100 GiB: 99 blocks, nothing dropped) before r3 comes at 3,000 s.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvcalc.cli.sim_tiers_report import _reads
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.record import COMPLETED
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.setup import build
from kvcalc.core.sim.tiers import HOST

FULL, STATE = 169_082_880, 1_014_497_280  # bytes per block (vLLM's layout): the full table, one state page
STATE_IDEAL = 912_605_184  # 54 x 16,900,096: kvcalc's ideal pool, no padding
LINK = 25e9  # the host link's default, bytes/s


def run(tmp_path, r3: tuple[int, list[int]], budget: int):
    path = tmp_path / "trace.jsonl"
    rows = [(0, 13000, list(range(1, 27))), (1_000_000, 16000, list(range(201, 233))),
            (2_000_000, 16000, list(range(301, 333))), (3_000_000, *r3)]
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": p, "output_length": 4, "hash_ids": ids})
                            + "\n" for t, p, ids in rows))
    setup = build(SimOptions(model="nemotron-h-56b", gpu="H200", trace=("mooncake", str(path)),
                             mamba_cache_mode="align", max_batched_tokens=budget, max_model_len=16384,
                             host_cache="100GiB"))
    assert setup.plan.block_size == 4128 and setup.sim.tiers.block_bytes.state_bytes == STATE
    # 100 GiB = 107,374,182,400 B // 1,183,580,160 B = 90 blocks (90.7; 99 of ideal's 1,081,688,064 B)
    assert setup.sim.tiers.bytes_per_block == FULL + STATE and setup.sim.tiers.host_blocks == 90
    record = run_policy(setup.workload, "paged", replace(setup.sim, capacity_blocks=28))
    assert (record.status == COMPLETED).all() and record.tiers.dropped_blocks == 0
    return setup, record


def test_a_load_reads_one_state_page(tmp_path):
    # budget 16,384: r0's prefill is one chunk cut at its last boundary 12,384, so its only state is saved there
    # (key 25). r3 repeats r0: no GPU hit; the host holds 9, 17, 25 and 25's state: it loads all three blocks
    # (far less than prefilling 12,384 tokens), reading 3 x 169,082,880 + 1,014,497,280 = 1,521,745,920 B:
    # 60.870 ms on an idle 25 GB/s link (3 whole blocks, states included, 3 x 1,183,580,160 B, would be 142.0 ms).
    setup, record = run(tmp_path, (13000, list(range(1, 27))), 16384)
    t = record.tiers
    assert (t.gpu_hit_blocks[3], t.host_hit_blocks[3], t.recomputed_blocks[3]) == (0, 3, 0)
    assert t.read_blocks == [3, 0] and t.read_state_pages == [1, 0]
    assert t.wait_s[3] == pytest.approx((3 * FULL + STATE) / LINK, rel=1e-12)
    assert t.link_busy_s[HOST] == pytest.approx((3 * FULL + STATE) / LINK, rel=1e-12)
    assert record.prefix.hit_tokens == 3 * 4128  # a loaded prefix is a hit of the admission
    assert _reads(setup.sim.tiers, t, HOST) == {"full": 3 * FULL, "state_mamba2": STATE}


def test_no_load_ends_where_no_state_was_saved(tmp_path):
    # r3 shares r0's first 18 ids (9,000 tokens: at most 2 blocks, keys 9 and 17): the host holds both blocks but
    # no state at 4,128 or 8,256 (r0 saved none there), so no load can end on them: both are recomputed
    _, record = run(tmp_path, (9000, list(range(1, 19))), 16384)
    t = record.tiers
    assert (t.gpu_hit_blocks[3], t.host_hit_blocks[3], t.recomputed_blocks[3]) == (0, 0, 2)
    assert t.read_blocks == [0, 0] and t.read_state_pages == [0, 0] and t.wait_s[3] == 0
    assert record.prefix.hit_tokens == 0


def test_a_load_under_the_aligned_split_is_admitted(tmp_path):
    # budget 8,192: r0's chunks end at 4,128, 8,256, 12,384 and 13,000: states at keys 9, 17 and 25. r3 (ids 1..18)
    # loads 2 blocks and the state at 8,256: (2 x 169,082,880 + 1,014,497,280) B / 25 GB/s = 54.107 ms. A loading
    # request is admitted with no chunk (it is parked until its blocks land): the aligned split's "no chunk this
    # step" had held it back for ever ("a step with nothing scheduled").
    _, record = run(tmp_path, (9000, list(range(1, 19))), 8192)
    t = record.tiers
    assert (t.gpu_hit_blocks[3], t.host_hit_blocks[3], t.recomputed_blocks[3]) == (0, 2, 0)
    assert t.read_blocks == [2, 0] and t.read_state_pages == [1, 0]
    assert t.wait_s[3] == pytest.approx((2 * FULL + STATE) / LINK, rel=1e-12)
    assert record.prefix.hit_tokens == 2 * 4128


def test_ideal_layout_tier_blocks_hold_no_padding(tmp_path):
    # --layout ideal at the same block (mamba_cache_mode all: ideal's weighted tables take no align yet): kvcalc's own
    # pool, each layer type on its own: the full layers' 169,082,880 B
    # and 54 x 16,900,096 = 912,605,184 B of state a block; 100 GiB // 1,081,688,064 B = 99 host blocks (99.3)
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 9000, "output_length": 4,
                                "hash_ids": list(range(1, 19))}) + "\n")
    tiers = build(SimOptions(model="nemotron-h-56b", gpu="H200", trace=("mooncake", str(path)), layout="ideal",
                             block_size=4128, mamba_cache_mode="all", max_model_len=16384,
                             host_cache="100GiB")).sim.tiers
    assert tiers.block_bytes.layout == "ideal" and tiers.block_bytes.padding_bytes == 0
    assert tiers.block_bytes.state_bytes == STATE_IDEAL and tiers.bytes_per_block == FULL + STATE_IDEAL
    assert tiers.host_blocks == 99
