"""One memory plan: `kvcalc sim` plans a GPU as `kvcalc size --gpu` does (core/model/vllm_memory.py's
`predict_memory`, core/model/kv_groups.py's `plan_blocks`), so the same options give the same KV blocks.

Checked three ways: one plan by hand; the two commands' JSON over models of every kind (dense, sliding
window, Mamba hybrid, MoE, MLA) on several GPUs and under each option both take; and the two core functions
over random options (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcalc.core.dtypes import DTYPE_BITS
from kvcalc.core.errors import ParameterError
from kvcalc.core.model.gpu_plan import plan_gpu
from kvcalc.core.model.kv_groups import kv_layout
from kvcalc.core.model.models import get_preset
from kvcalc.core.model.vllm_memory import stage_weights
from kvcalc.core.pool.groups import pool_groups
from kvcalc.core.sim.hardware import checkpoint_weights, get_gpu, plan_memory
from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.setup import build


def test_opt13b_on_a100_40gb_by_hand():
    plan = plan_memory(get_preset("OPT-13B"), get_gpu("A100-40GB"), kv_dtype_bits=16, block_size=16)
    # vLLM 0.21's defaults: utilisation 0.92 of the 42,298,834,944 B CUDA shows (core/gpus.py: 39.39 GiB, not
    # the nominal 40,960 MiB) = 42,298,834,944 − 0.08 · 42,298,834,944 = int(38,914,928,148.48); 256 sequences
    assert (plan.vllm_version, plan.memory_utilization, plan.max_num_seqs) == ("0.21", 0.92, 256)
    assert plan.gpu.memory_bytes == 42_298_834_944
    assert plan.budget_bytes == 38_914_928_148
    # weights: as size --gpu loads them (vllm_memory.stage_weights, tested in tests/core/model): at least the
    # 12,853,473,280 params in bf16, the two 50,272 × 5,120 tables padded to 50,304 rows and the rotary cache
    weights = stage_weights(get_preset("OPT-13B"), 1, 1)[0]
    assert plan.weights_bytes == weights >= 12_853_473_280 * 2 + 2 * 32 * 5120 * 2 + 2048 * 128 * 2
    # activation peak: the forward pass, 8,192 tokens · 5 buffers · 20,480 · 2 B = 1,677,721,600, beats the
    # sampler, ceil(14.4 · 256 · 50,272) + 8,192 · 5,120 · 2 + 64 MiB = 336,317,645; no MoE workspace
    assert plan.workspace_bytes == 8192 * 5 * 20480 * 2 == 1_677_721_600
    assert (plan.non_torch_bytes, plan.cuda_graph_bytes) == (256 * 2**20, 860 * 2**20)
    assert plan.kv_bytes_per_token == 40 * 2 * 40 * 128 * 2 == 819_200  # 40 layers, K and V, 40 heads of 128
    # pool 38,914,928,148 − weights − 1,677,721,600 − 268,435,456 − 901,775,360; // (16 · 819,200) blocks
    # (790 with the weights at their bytes, 25,709,699,072: a pool of 10,357,296,660 B; 790 · 13,107,200 =
    # 10,354,688,000 fits, 791 · 13,107,200 = 10,367,795,200 does not; 835 at the nominal 40,960 MiB)
    assert plan.pool_bytes == 38_914_928_148 - weights - 1_677_721_600 - 268_435_456 - 901_775_360
    assert plan.num_blocks == plan.pool_bytes // (16 * 819_200) == 790
    # vLLM 0.19: utilisation 0.9, the CUDA graphs logged but not subtracted:
    # int(42,298,834,944 · 0.9) = int(38,068,951,449.6) = 38,068,951,449 − weights − 1,677,721,600 − 268,435,456
    old = plan_memory(get_preset("OPT-13B"), get_gpu("A100-40GB"), kv_dtype_bits=16, block_size=16,
                      vllm_version="0.19")
    assert old.pool_bytes == 38_068_951_449 - weights - 1_677_721_600 - 268_435_456
    assert old.num_blocks == old.pool_bytes // (16 * 819_200)


def test_the_default_max_seqs_follows_the_gpu():
    spec = get_preset("Llama-3-8B")
    assert plan_memory(spec, get_gpu("H100-SXM"), kv_dtype_bits=16, block_size=16).max_num_seqs == 1024
    a100 = plan_memory(spec, get_gpu("A100-80GB"), kv_dtype_bits=16, block_size=16)
    # CUDA shows 84,987,740,160 B (79.15 GiB, core/gpus.py): over 70 GiB, but an A100 keeps 256 sequences; the
    # budget is 84,987,740,160 − 0.08 · 84,987,740,160 = int(78,188,720,947.2)
    assert (a100.max_num_seqs, a100.budget_bytes) == (256, 78_188_720_947)
    setup = build(SimOptions(model="Llama-3-8B", gpu="H100-SXM", requests=1))
    assert setup.sim.scheduler.max_seqs == setup.plan.max_num_seqs == 1024  # the scheduler's limit is the same


# (model, gpu, size's options, sim's options): the same setting under each command's flag names
CASES = [
    ("Llama-3-8B", "H100-SXM", [], []),
    ("OPT-13B", "A100-40GB", [], []),
    ("Llama-3-8B", "A100-80GB", ["--gpu-memory-utilization", "0.8", "--max-num-seqs", "64",
                                 "--max-num-batched-tokens", "2048"],
     ["--memory-utilization", "0.8", "--max-seqs", "64", "--max-batched-tokens", "2048"]),
    ("Llama-3-8B", "H200", ["--vllm-version", "0.19", "--dtype", "fp8", "--block", "32"],
     ["--vllm-version", "0.19", "--dtype", "fp8", "--block", "32"]),
    ("Qwen2.5-72B", "H100-SXM", ["--tp", "4", "--quantization", "fp8"], ["--tp", "4", "--quantization", "fp8"]),
    ("Mistral-7B-v0.1", "A100-40GB", ["--tp", "2"], ["--tp", "2"]),  # sliding window on every layer
    ("Gemma-3-27B", "H100-SXM", [], []),  # 5 sliding : 1 full, padded groups
    ("Nemotron-H-56B", "H200", [], []),  # Mamba hybrid: block 4,128
    ("gpt-oss-120b", "H200", [], []),  # MoE, mxfp4 experts, sliding
    ("Mixtral-8x7B", "H200", ["--max-num-seqs", "512"], ["--max-seqs", "512"]),  # MoE: fused-MoE workspace
    ("Qwen3-30B-A3B", "A100-80GB", [], []),  # MoE on an A100: 256 sequences
    ("DeepSeek-V3", "H200", ["--tp", "8"], ["--tp", "8"]),  # MLA, fp8 checkpoint
    ("DeepSeek-V3", "H200", ["--tp", "8", "--spec-tokens", "2", "--spec-method", "mtp"],  # + its MTP layer's KV
     ["--tp", "8", "--spec-tokens", "2", "--spec-method", "mtp", "--spec-acceptance", "0.7"]),
]


@pytest.mark.parametrize(("model", "gpu", "size_args", "sim_args"), CASES, ids=[f"{c[0]}-{c[1]}-{i}"
                                                                                 for i, c in enumerate(CASES)])
def test_size_and_sim_give_the_same_blocks(run_cli, model, gpu, size_args, sim_args):
    size = run_cli("size", "--model", model, "--gpu", gpu, *size_args, "--json")
    assert size.exit_code == 0, size.stderr
    sim = run_cli("sim", "--model", model, "--gpu", gpu, *sim_args, "--requests", "1", "--json")
    assert sim.exit_code == 0, sim.stderr
    plan, memory = size.json()["gpu_plan"], sim.json()["memory_plan"]
    assert memory["num_blocks"] == plan["num_blocks"] > 0
    assert memory["kv_pool_bytes"] == plan["kv_cache_bytes"]
    assert (memory["weights_bytes"], memory["workspace_bytes"], memory["non_torch_bytes"]) == (
        plan["weights_bytes"], plan["activation_bytes"], plan["non_torch_bytes"])
    assert memory["memory_utilization"] == plan["gpu_memory_utilization"]
    assert memory["block_size"] == plan["block_size"]


MODELS = ["Llama-3-8B", "OPT-13B", "Mistral-7B-v0.1", "Gemma-3-27B", "Nemotron-H-56B", "gpt-oss-20b", "Mixtral-8x7B",
          "Qwen3-30B-A3B", "Qwen2.5-72B"]


@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(["A100-40GB", "A100-80GB", "H100-SXM", "H200"]),
       tp=st.sampled_from([1, 2, 4]), utilization=st.sampled_from([None, 0.5, 0.85, 0.95]),
       seqs=st.sampled_from([None, 1, 100, 1024]), tokens=st.sampled_from([512, 8192, 16384]),
       version=st.sampled_from(["0.19", "0.21"]), dtype=st.sampled_from(["bf16", "fp8"]),
       block=st.sampled_from([16, 32]), quantization=st.sampled_from([None, "fp8"]))
def test_the_two_plans_agree_on_random_options(model, gpu, tp, utilization, seqs, tokens, version, dtype, block,
                                               quantization):
    spec, quant = checkpoint_weights(get_preset(model), model, None, None, quantization)
    device = get_gpu(gpu)
    bits = DTYPE_BITS[dtype]
    try:
        layout = kv_layout(spec, bits, block, "vllm", tp)
        size = plan_gpu(spec, kv_dtype_bits=bits, block_size=block, max_model_len=4096, tp=tp, gpu_name=device.name,
                        gpu_memory_bytes=device.memory_bytes, quantization=quant, vllm_version=version,
                        gpu_memory_utilization=(device_default := {"0.19": 0.9, "0.21": 0.92}[version])
                        if utilization is None else utilization, max_num_batched_tokens=tokens,
                        max_num_seqs=(1024 if device.memory_bytes >= 70 * 2**30 and "A100" not in gpu else 256)
                        if seqs is None else seqs)
    except ParameterError:
        return  # tp does not split the heads, or the weights leave no KV memory: nothing to compare
    try:
        sim = plan_memory(spec, device, kv_dtype_bits=bits, block_size=block, tp=tp, memory_utilization=utilization,
                          quantization=quant, max_batched_tokens=tokens, max_seqs=seqs, vllm_version=version,
                          layout=layout if pool_groups(layout) is not None else None)
    except ParameterError:
        assert size.num_blocks < 1  # sim refuses only a plan without one block
        return
    assert sim.memory_utilization == (device_default if utilization is None else utilization)
    assert sim.num_blocks == size.num_blocks
    assert sim.pool_bytes == size.kv_cache_bytes
