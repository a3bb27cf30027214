"""Hybrid models in the pool that `kvcalc sim` runs on (issue 19): 40 GiB of KV, contexts of 32,768 tokens.

Every expected figure is worked by hand below from the models' layers (bf16 KV, block 16 asked for, vLLM's
layout: groups of G layer slots, one block id = one page in each slot), independently of kv_groups.py and of
the pool. One block id of a group of G layers holds B tokens of each of them.

A sequence of n = 32,769 tokens (32,768 written, the next being computed) holds, per block table:
    full      ceil(n / B)
    sliding   ceil(n / B) − floor((32,768 − W + 1) / B)      (the next token reads the last W)
    chunked   ceil(n / B) − floor(32,768 / C) · C / B        (its chunk starts at 32,768)
    state     1 (mamba_cache_mode none)
"""

from __future__ import annotations

import pytest
from hand_specs import granite_h_small, jamba, qwen3_next
from real_configs import write_config

from kvcalc.core.model.kv_groups import kv_layout, plan_blocks
from kvcalc.core.model.models import get_preset
from kvcalc.core.pool.hybrid import HybridPool
from kvcalc.core.pool.store import PoolExhaustedError
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.paged_groups import pool_groups
from kvcalc.core.sim.record import COMPLETED
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.setup import build

KV = 40 * 2**30  # 42,949,672,960 B


# (model, block ids in 40 GiB, blocks one 32,769-token sequence holds, concurrency = floor(ids / held))
CASES = [
    # Gemma-3-27B: 10 full + 52 sliding (W 1,024), 16 KV heads of 128: 8,192 B per token per layer. G = 10: full 1
    # table, sliding ceil(52/10) = 6 tables. Block id = 10 · 16 · 8,192 = 1,310,720 B -> 32,768 ids.
    # held: full ceil(32,769/16) = 2,049; sliding 2,049 − floor(31,745/16) = 2,049 − 1,984 = 65, x6 = 390 -> 2,439
    # (issue 19: 13 vs kvcalc's 3)
    (lambda: get_preset("Gemma-3-27B"), 32_768, 2_439, 13),
    # gpt-oss-120b: 18 full + 18 sliding (W 128), 8 KV heads of 64: 2,048 B; G = 18, 2 tables. Id 18 · 16 · 2,048 =
    # 589,824 B -> 72,817 ids. held: 2,049 + (2,049 − floor(32,641/16) = 2,049 − 2,040 = 9) = 2,058 -> 35
    (lambda: get_preset("gpt-oss-120b"), 72_817, 2_058, 35),
    # Llama-4-Scout: 12 full + 36 chunked (C 8,192), 8 KV heads of 128: 4,096 B; G = 12: full 1, chunked 3 tables.
    # Id 12 · 16 · 4,096 = 786,432 B -> 54,613 ids. held: 2,049 + 3 · (2,049 − 32,768/16 = 1) = 2,052 -> 26
    (lambda: get_preset("Llama-4-Scout"), 54_613, 2_052, 26),
    # Granite-4.0-H-Small: state 50,688 + 2,097,152 = 2,147,840 B per layer forces block 528 (16 · ceil(2,147,840 /
    # (16 · 4,096))); page 528 · 4,096 = 2,162,688; G = 4: 9 state tables; id 4 · 2,162,688 = 8,650,752 -> 4,964.
    # held: ceil(32,769/528) = 63 (62 · 528 = 32,736) + 9 state pages = 72 -> 68 (issue 19: 68)
    (granite_h_small, 4_964, 72, 68),
    # Qwen3-Next: attention 2 · 2 · 256 · 2 = 2,048 B; state 49,152 + 1,048,576 = 1,097,728 B -> block 16 ·
    # ceil(1,097,728 / 32,768) = 544; page 1,114,112; G = 12: 3 state tables; id 13,369,344 B -> 3,212 ids.
    # held: ceil(32,769/544) = 61 (60 · 544 = 32,640) + 3 = 64 -> 50 (issue 19: 50)
    (qwen3_next, 3_212, 64, 50),
    # Jamba: state 49,152 + 262,144 = 311,296 B -> block 16 · ceil(311,296 / 65,536) = 80; page 327,680; G = 4:
    # 7 state tables; id 1,310,720 B -> 32,768 ids. held: ceil(32,769/80) = 410 (409 · 80 = 32,720) + 7 = 417 -> 78
    (jamba, 32_768, 417, 78),
    # Nemotron-H-56B: state 16,900,096 B (fp32 SSM) -> block 4,128; page 16,908,288; G = 10: 6 state tables; id
    # 169,082,880 B -> 254 ids. held: ceil(32,769/4,128) = 8 (7 · 4,128 = 28,896) + 6 = 14 -> 18
    (lambda: get_preset("Nemotron-H-56B"), 254, 14, 18),
]


@pytest.mark.parametrize(("spec", "ids", "held", "concurrency"), CASES)
def test_concurrency_of_32k_contexts_in_40_gib(spec, ids, held, concurrency):
    layout = kv_layout(spec(), 16)
    assert plan_blocks(layout, KV) == ids
    pool = HybridPool(ids, layout.block_size, pool_groups(layout), state_mode="none")
    # each sequence: 32,768 tokens written (as KV swapped back in: no prefix keys) and the next one's slot
    count = 0
    while pool.can_allocate(32_769, computed_tokens=32_768):
        pool.allocate(count, 32_769, computed_tokens=32_768)
        count += 1
        assert pool.num_used == count * held
    assert count == concurrency == ids // held
    with pytest.raises(PoolExhaustedError):
        pool.allocate("one more", 32_769, computed_tokens=32_768)
    # decoding on: the next token of every sequence fits until the blocks run out, never sooner
    pool.check_invariants()


def small_gpu(**kw) -> SimOptions:
    # a custom GPU with exactly 40 GiB for KV: 41 GiB + vLLM 0.21's non-torch 256 MiB and CUDA graphs 860 MiB,
    # 1 GiB of weights, a 1-byte workspace, utilisation 1
    base = dict(gpu_memory=f"{41 * 1024 + 256 + 860}MiB", bandwidth="4.8e12", flops=989e12, weights_bytes="1GiB",
                workspace_bytes="1", memory_utilization=1.0, rate="inf", prompt_dist="uniform:low=32768,high=32768")
    return SimOptions(**{**base, **kw})


def test_sim_gemma3_concurrency_is_the_pools():
    # rate inf, 16 requests of 32,768 + 1,024 tokens, chunks of 8,192. At most one request prefills at a time
    # (one chunk fills the step); its first chunk takes 8,192/16 = 512 ids in the full table and 512 in each of
    # the 6 sliding ones: 3,584. Requests decoding hold 2,439 (at 32,769 tokens) to 2,112 + 6 · 65 = 2,502 (at
    # 33,792). So k running: (k − 1) decoding + 1 starting, (k − 1) · 2,439..2,502 + 3,584 <= 32,767 ids
    # (40 GiB − 1 B of workspace): k − 1 = floor(29,183 / 2,439) = 11 = floor(29,183 / 2,502) -> peak 12
    setup = build(small_gpu(model="Gemma-3-27B", requests=16, output_dist="uniform:low=1024,high=1024"))
    assert setup.plan.num_blocks == 32_767 and setup.plan.block_size == 16 and setup.plan.state_bytes == 0
    record = run_policy(setup.workload, "paged", setup.sim, record_timeline=True)
    assert record.peak_running == 12
    assert (record.status == COMPLETED).all()
    # the memory over time per group: the first step (one request's first chunk) holds 512 ids in every table;
    # the groups' blocks add up to the used slots of the pool at every moment, so their time integrals do too
    assert record.timeline[0][-7:] == (512,) * 7
    used_slot_s = record.memory_slot_s[0] + record.memory_slot_s[1]  # useful + tail fragmentation
    assert float(record.group_block_s.sum()) * 16 == pytest.approx(used_slot_s, rel=1e-12)


def test_nemotron_h_runs_at_the_default_max_seqs():
    # issue 19: Nemotron-H-56B at --max-seqs 256 was refused ("weights 0.00 GiB and workspace ... leave no room"):
    # the cause was 256 reserved states of 16,900,096 B x 54 layers. The states now come from the pool per
    # running request: on an H200 it runs with the default max_seqs.
    setup = build(SimOptions(model="Nemotron-H-56B", gpu="H200", requests=8))
    assert setup.plan.state_bytes == 0 and setup.plan.block_size == 4128
    assert setup.sim.groups is not None and len(setup.sim.groups) == 7  # 1 attention table + 6 state tables
    record = run_policy(setup.workload, "paged", setup.sim)
    assert record.peak_running >= 1


def test_a_pool_below_one_block_names_the_layout_block():
    # Nemotron-H-56B's block id is 169,082,880 B (161.25 MiB): a KV budget of 100 MiB holds none, and the
    # refusal names the forced block, not the weights or the batch size
    with pytest.raises(ValueError, match="less than one block of its vllm layout") as error:
        build(small_gpu(model="Nemotron-H-56B", gpu_memory=str(2**30 + (256 + 860 + 100) * 2**20), requests=1))
    assert "block 4128" in str(error.value) and "max_batched_tokens" not in str(error.value)


def test_a_decode_step_reads_and_writes_the_state():
    # Nemotron-H-56B's state is 54 layers x 16,900,096 B = 912,605,184 B per sequence on one GPU; a decode step of
    # n sequences moves 2 · n of them on top of the KV, at the attention bandwidth: the step of 4 sequences is
    # 8 · 912,605,184 / (4.8e12 · 0.8) s longer than the same step without a state, when memory-bound
    setup = build(SimOptions(model="Nemotron-H-56B", gpu="H200", requests=1))
    st = setup.sim.steptime
    assert st.state_bytes_per_seq == 54 * 16_900_096
    plain = st.step_s(4.0, 4_000.0, 4_004.0)  # num_seqs 0: no state read
    with_state = st.decode_steps_s(4, 4_000.0)
    assert with_state - plain == pytest.approx(8 * 912_605_184 / (4.8e12 * 0.8), rel=1e-9)


def test_mamba_cache_modes_not_run_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="choose one of none, align, all") as error:
        build(SimOptions(model="Nemotron-H-56B", gpu="H200", requests=1, mamba_cache_mode="bogus"))
    assert error.value.params == ("mamba_cache_mode",)
    # mode all runs on Mamba-2 layers only, as vLLM (Qwen3-Next's gated DeltaNet raises NotImplementedError there)
    write_config(tmp_path, "QWEN3_NEXT")
    with pytest.raises(ValueError, match="Mamba-2 layers only, not gated_deltanet") as error:
        build(SimOptions(config=tmp_path, gpu="H200", requests=1, mamba_cache_mode="all"))
    assert error.value.params == ("mamba_cache_mode",)


def test_mode_all_runs_with_the_block_aligned_to_the_kernel_chunk():
    # Nemotron-H-56B under mamba_cache_mode all: block 128 · ceil(4,126 / 128) = 4,224 (kv_groups), a state page per
    # block of each running request; 8 requests run to the end with the pool whole
    setup = build(SimOptions(model="Nemotron-H-56B", gpu="H200", requests=8, mamba_cache_mode="all"))
    assert setup.plan.block_size == 4_224 and setup.sim.groups is not None
    record = run_policy(setup.workload, "paged", setup.sim)
    assert (record.status == COMPLETED).all()
