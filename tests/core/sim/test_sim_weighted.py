"""`sim --layout ideal` on a Mamba hybrid whose state is thousands of the layout's units: the pool runs weighted
tables (core/pool/weighted.py), the state of each running request from the same units as the attention blocks."""

from __future__ import annotations

import json

import pytest
from real_configs import real_config

from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.record import COMPLETED
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.setup import build

GRANITE_4_H_SMALL = real_config("GRANITE_4_H_SMALL")  # tests/core/model/test_real_configs.py


def granite_40_gib(tmp_path, **kw) -> SimOptions:
    # a custom GPU with exactly 40 GiB − 1 B for KV (41 GiB + vLLM 0.21's non-torch 256 MiB and CUDA graphs 860 MiB,
    # 1 GiB of weights, a 1-byte workspace, utilisation 1), rate inf
    folder = tmp_path / "granite"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GRANITE_4_H_SMALL))
    base = dict(config=str(folder), layout="ideal", gpu_memory=f"{41 * 1024 + 256 + 860}MiB", bandwidth="4.8e12",
                flops=989e12, weights_bytes="1GiB", workspace_bytes="1", memory_utilization=1.0, rate="inf")
    return SimOptions(**{**base, **kw})


def test_granite_concurrency_from_units(tmp_path):
    # ideal, block 16: unit = gcd(262,144 B attention block, 77,322,240 B state) = 2,048 B: a block 128 units, a
    # state 37,755; (40 GiB − 1 B) // 2,048 = 20,971,519 units. Rate inf, prompts 32,768, outputs 1,024, chunks
    # 8,192: one request prefills at a time; its first chunk holds 512 blocks and one state: 65,536 + 37,755 =
    # 103,291 units (a later chunk still one state: the state group jumps over the pages it does not keep). A
    # request decoding (32,769..33,792 tokens) holds 2,049..2,112 blocks and 1..2 states (2 while it crosses a
    # page): 300,027..345,846 units. So k running: (k − 1) decoding + 1 prefilling <= 20,971,519: k − 1 <=
    # floor(20,868,228 / 300,027) = 69, and k − 1 >= floor(20,868,228 / 345,846) = 60 -> peak in 61..70
    setup = build(granite_40_gib(tmp_path, requests=80, prompt_dist="uniform:low=32768,high=32768",
                                 output_dist="uniform:low=1024,high=1024"))
    assert setup.plan.num_blocks == 20_971_519 and setup.plan.block_size == 16
    assert [(g.kind, g.weight) for g in setup.sim.groups] == [("state", 37_755), ("full", 128)]  # config order
    record = run_policy(setup.workload, "paged", setup.sim, record_timeline=True)
    assert 61 <= record.peak_running <= 70
    assert (record.status == COMPLETED).all()
    # the groups' units add up to the pool's used slots at every moment, so their time integrals do too: a block of
    # weight w is w units of 16 slots
    used_slot_s = record.memory_slot_s[0] + record.memory_slot_s[1]  # useful + tail fragmentation
    units_s = float(record.group_block_s[0]) * 37_755 + float(record.group_block_s[1]) * 128
    assert units_s * 16 == pytest.approx(used_slot_s, rel=1e-12)


def test_what_weighted_tables_do_not_run_yet_is_refused(tmp_path):  # (align runs: test_sim_align_weighted.py)
    with pytest.raises(ValueError, match="preempt swap on weighted tables"):
        build(granite_40_gib(tmp_path, requests=2, preempt="swap"))
