"""Round-4 QA: how the hybrid pool holds and reports a Mamba hybrid's state pages (mamba_cache_mode none).

vLLM without prefix caching keeps one state page per recurrent KV cache group per running request (its
MambaSpec's block size is then max_model_len, so a request of any length needs exactly one page; the state is
updated in place). Two things in kvcalc's pool disagree (helpers H/W: core/pool/groups.py, hybrid.py):
1. crossing a block boundary, the sequence holds two pages in every state group for a step ("the page it resumes
   from"): `share` on Nemotron-H reports a peak of 21 blocks for one request that holds 15;
2. a state page's unused token slots count as tail fragmentation: a 1,000-token request of Nemotron-H (block
   4,128) is reported with 7 · 4,128 − 7 · 1,000 = 21,896 slots of tail waste where only its attention block's
   3,128 are; `sim` on Nemotron-H then shows 66 % of the pool as "tail fragmentation" and 24 % useful while the
   state pages fill it."""

from __future__ import annotations

import json
from pathlib import Path

from real_configs import write_config

from kvcalc.core.pool.groups import PoolGroup
from kvcalc.core.pool.hybrid import HybridPool

NEMOTRON = tuple([PoolGroup("state", None, "state")] * 6 + [PoolGroup("full", None, "full")])  # 54 Mamba-2 in 6


def test_one_state_page_per_group_while_a_sequence_grows() -> None:
    pool = HybridPool(200, 4, NEMOTRON, state_mode="none")
    pool.allocate(0, 7)
    for n in range(8, 40):
        pool.append(0, 1)
        # ceil(n / 4) attention blocks + one state page in each of the 6 state groups, at every step
        assert pool.num_used == -(-n // 4) + 6, n


def test_share_peak_of_one_nemotron_h_request(run_cli, tmp_path: Path) -> None:
    folder = write_config(tmp_path, "NEMOTRON_H_56B")
    doc = run_cli("share", "--config", str(folder), "--prefix", "32768", "--branches", "1", "--gen", "2048",
                  "--json")
    assert doc.exit_code == 0, doc.stderr
    d = doc.json()
    # block 4,128 (16 · ceil(16,900,096 / 65,536)); 32,768 + 2,048 = 34,816 tokens: ceil(34,816 / 4,128) = 9 full
    # blocks + 6 state pages (54 Mamba-2 layers in 6 groups of 10 slots) = 15, at the end and at the peak
    assert d["block_size"] == 4128 and d["physical_blocks"] == 15
    assert d["peak_blocks"] == 15


def test_a_state_page_is_not_tail_fragmentation() -> None:
    pool = HybridPool(100, 4128, NEMOTRON, state_mode="none")
    pool.allocate(0, 1000)
    usage = pool.usage()
    assert usage.used_blocks == 7
    # the attention block holds 1,000 of 4,128 token slots: 3,128 unused; the 6 state pages are whole states
    assert usage.tail_fragmentation_slots == 4128 - 1000 == 3128


def test_nemotron_h_share_bytes_by_hand(run_cli, tmp_path: Path) -> None:
    """What holds today and must keep holding: 4 branches of 32,768 + 2,048 tokens at block 4,128."""
    folder = write_config(tmp_path, "NEMOTRON_H_56B")
    d = run_cli("share", "--config", str(folder), "--prefix", "32768", "--branches", "4", "--gen", "2048",
                "--json").json()
    # 32,768 = 7 · 4,128 + 3,872: 7 shared full blocks; each branch ends at 34,816 tokens in 9 blocks, its last
    # two of its own (the shared partial block is copied on write by 3 of the 4 branches): 7 + 4 · 2 = 15 full
    # blocks; each branch its own 6 state pages (a fork copies the state): 24. Block id 10 slots · 4,128 · 4,096 B
    groups = {g["kind"]: g["physical_blocks"] for g in d["kv_cache_groups"]["groups"]}
    assert groups == {"state": 24, "full": 15} and d["block_bytes"] == 10 * 4128 * 4096 == 169_082_880
    assert d["physical_bytes"] == 39 * 169_082_880 and d["logical_blocks"] == 4 * (9 + 6)
    assert d["cow_copies"] == 3 + 3 * 6  # 3 partial full blocks, 3 forks' state pages in 6 groups
    assert json.dumps(d)  # one JSON document
