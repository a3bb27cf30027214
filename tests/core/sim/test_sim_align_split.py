"""mamba_cache_mode align as vLLM v1 serves it, beyond the prefix cache's hits:

* vLLM's scheduler splits every prefill at block boundaries under align (Scheduler.need_mamba_block_aligned_split =
  Mamba layers and mode align; _mamba_block_aligned_split), whether or not the prompts' content is known: sim does
  it for a constructed workload too (no prompt keys), not only for a Mooncake trace;
* with prefix caching off vLLM sets mamba_cache_mode to none, whatever was asked (MambaModelConfig.
  verify_and_update_config: "Mamba cache mode is set to 'none' when prefix caching is disabled"): sim simulates none
  and says so in a note.

Nemotron-H-56B on an H200, vLLM's layout: block 4,128 tokens (16 · ceil(16,900,096 B state / (16 · 4,096 B per
token))), one full-attention table and six state tables."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from kvcalc.core.sim.options import SimOptions
from kvcalc.core.sim.record import COMPLETED
from kvcalc.core.sim.run import run_policy
from kvcalc.core.sim.setup import build

B = 4128
NEMOTRON = dict(model="nemotron-h-56b", gpu="H200", max_model_len=32_768)  # its config says 8,192


def mooncake(tmp_path, prompts: list[int], output: int) -> str:
    # every request its own ids (no two share a block: no hit), all at time 0
    path, first = tmp_path / "trace.jsonl", 0
    rows = []
    for p in prompts:
        n = -(-p // 512)
        rows.append({"timestamp": 0, "input_length": p, "output_length": output, "hash_ids": list(range(first, first
                                                                                                         + n))})
        first += n
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def steps_of_one_request(**kw) -> int:
    setup = build(SimOptions(**NEMOTRON, mamba_cache_mode="align", **kw))
    assert setup.plan.block_size == B and setup.sim.state_mode == "align"
    record = run_policy(setup.workload, "paged", setup.sim)
    assert (record.status == COMPLETED).all()
    return record.steps


def test_a_constructed_prompt_is_split_at_block_boundaries(tmp_path):
    # one prompt of 10,000 tokens, 5 output tokens, budget 8,192. vLLM's split: the last boundary of its 10,000
    # tokens is 8,256 = 2 · 4,128; step 1 from 0 would end at 8,192 < 8,256: cut to whole blocks, 4,128; step 2 from
    # 4,128 would end at 10,000, past 8,256: cut there, 4,128; step 3 the tail 1,744, which samples the first token;
    # 4 decode steps: 7 steps. Unsplit (sim before, no prompt keys) 8,192 + 1,808 + 4 decodes: 6
    constructed = steps_of_one_request(requests=1, prompt_dist="uniform:low=10000,high=10000",
                                       output_dist="uniform:low=5,high=5", rate="inf")
    assert constructed == 3 + 4
    # the same prompt from a Mooncake trace (prompt keys, nothing to hit) is split the same way
    assert steps_of_one_request(trace=("mooncake", mooncake(tmp_path, [10_000], 5))) == constructed


def test_constructed_and_keyed_runs_of_the_same_lengths_agree(tmp_path):
    # eight prompts sharing nothing, all at time 0, budget 8,192: with or without prompt keys the scheduler splits
    # alike and nothing hits, so every request's first token and end are at the same times
    prompts = [9_000, 5_000, 12_500, 4_128, 700, 16_000, 8_256, 3_000]
    path = mooncake(tmp_path, prompts, 20)
    job = build(SimOptions(**NEMOTRON, mamba_cache_mode="align", trace=("mooncake", path)))
    # the policy without prompt keys (settings.prompt_block_keys: none with prefix_caching False), still align
    a, b = (run_policy(job.workload, "paged", replace(job.sim, prefix_caching=keys)) for keys in (True, False))
    assert a.prefix.enabled and not b.prefix.enabled and a.prefix.hit_tokens == 0
    assert a.steps == b.steps
    assert np.array_equal(a.first_token_s, b.first_token_s) and np.array_equal(a.finish_s, b.finish_s)


def test_a_budget_under_a_block_is_refused_without_prompt_keys_too():
    # a prefill chunk under one block is cut to nothing by the split, so the request would never be scheduled
    with pytest.raises(ValueError, match="splits prefill at block boundaries"):
        build(SimOptions(**NEMOTRON, mamba_cache_mode="align", requests=2, max_batched_tokens=4096))


@pytest.mark.parametrize("mode", ["align", "all"])
def test_no_prefix_caching_serves_mode_none(tmp_path, mode):
    # vLLM: prefix caching off -> mamba_cache_mode none before the block is chosen, so the block is none's 4,128
    # (mode all would align it to the Mamba kernel's chunk) and a request holds one state page a state table
    path = mooncake(tmp_path, [10_000, 6_000], 5)
    job = build(SimOptions(**NEMOTRON, mamba_cache_mode=mode, trace=("mooncake", path), prefix_caching=False))
    none = build(SimOptions(**NEMOTRON, mamba_cache_mode="none", trace=("mooncake", path), prefix_caching=False))
    assert job.sim.state_mode == "none" and job.plan.layout.mamba_cache_mode == "none"
    assert job.plan.block_size == none.plan.block_size == B and job.plan.num_blocks == none.plan.num_blocks
    assert any(f"mamba_cache_mode {mode} with no_prefix_caching: vLLM sets mamba_cache_mode to none" in n
               for n in job.notes)
    assert not any("vLLM sets mamba_cache_mode to none" in n for n in none.notes)
    a, b = (run_policy(j.workload, "paged", j.sim) for j in (job, none))
    assert a.steps == b.steps and np.array_equal(a.finish_s, b.finish_s)
    # 10,000 tokens unsplit (none): 8,192 then 1,808 with the other's 6,000 -> 1,808 + 6,000 = 7,808 of 8,192
    assert a.steps == 2 + 4


def test_no_prefix_caching_with_align_says_so_on_the_command_line(run_cli, tmp_path):
    path = mooncake(tmp_path, [5_000], 3)
    result = run_cli("sim", "--model", "nemotron-h-56b", "--gpu", "H200", "--mamba-cache-mode", "align",
                     "--max-model-len", "32768", "--no-prefix-caching", "--trace", "mooncake", path)
    assert result.exit_code == 0
    out = result.stdout + result.stderr
    assert "--mamba-cache-mode align with --no-prefix-caching: vLLM sets mamba_cache_mode to none" in out
    assert "(mamba_cache_mode none)" in out  # the KV cache groups' note
