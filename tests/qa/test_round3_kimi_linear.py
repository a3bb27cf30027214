"""Round-3 QA: Kimi-Linear's config.json names no context length (no max_position_embeddings). `size` without a
GPU plan must still work; `--gpu` (or `--kv-memory`) needs vLLM's max_model_len, and the error must name that fix
clearly (it said "the GPU plan needs a request length", naming neither --gpu nor an example)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# https://huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct/blob/main/config.json (the fields sizing reads):
# MLA at layers 4, 8, ..., 24 and 27 (numbered from 1), Kimi Delta Attention at the other 20; no length field.
FULL = [4, 8, 12, 16, 20, 24, 27]
KIMI_LINEAR_48B = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_act": "silu", "q_lora_rank": None,
    "mla_use_nope": True, "moe_router_activation_func": "sigmoid", "num_expert_group": 1, "topk_group": 1,
    "moe_layer_freq": 1, "tie_word_embeddings": False, "hidden_size": 2304, "num_hidden_layers": 27,
    "vocab_size": 163840, "rms_norm_eps": 1e-5, "num_attention_heads": 32, "num_key_value_heads": 32,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_experts": 256,
    "num_experts_per_token": 8, "num_shared_experts": 1, "moe_intermediate_size": 1024, "routed_scaling_factor": 2.446,
    "moe_renormalize": True, "first_k_dense_replace": 1, "intermediate_size": 9216, "torch_dtype": "bfloat16",
    "linear_attn_config": {"full_attn_layers": FULL, "kda_layers": [i for i in range(1, 28) if i not in FULL],
                           "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4},
}


@pytest.fixture
def kimi(tmp_path: Path) -> str:
    directory = tmp_path / "Kimi-Linear-48B"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(KIMI_LINEAR_48B))
    return str(directory)


def test_size_without_a_gpu_needs_no_length(run_cli, kimi: str) -> None:
    assert run_cli("size", "--config", kimi).exit_code == 0
    doc = run_cli("size", "--config", kimi, "--tokens", "4096", "--json").json()
    # 7 MLA layers · (512 + 64) · 2 B = 8,064 B a token; 20 KDA layers · (conv 3 · 3 · 32 · 128 · 2 B = 73,728 B
    # + state 32 · 128 · 128 · 4 B = 2,097,152 B) = 43,417,600 B a sequence; at 4,096 tokens 33,030,144 + that
    assert doc["bytes_per_token"] == 8_064 and doc["state_bytes_per_seq"] == 43_417_600
    assert doc["bytes_per_seq"] == 8_064 * 4_096 + 43_417_600 == 76_447_744


@pytest.mark.parametrize(("flags", "flag"), [(("--gpu", "H200"), "--gpu"), (("--kv-memory", "10GiB"), "--kv-memory")])
def test_a_gpu_plan_names_max_model_len_as_the_fix(run_cli, kimi: str, flags: tuple[str, str], flag: str) -> None:
    result = run_cli("size", "--config", kimi, *flags)
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"error: {flag} plans vLLM's memory for a longest request (max_model_len), and Kimi-Linear-48B's config "
        "names none (no max_position_embeddings): give --max-model-len L, e.g. --max-model-len 32768 (without "
        "--gpu or --kv-memory, size needs none)")


def test_the_fix_it_names_works(run_cli, kimi: str) -> None:
    # 48B parameters in bf16 (91.45 GiB) need two H200s; with --max-model-len the plan runs
    result = run_cli("size", "--config", kimi, "--gpu", "H200", "--tp", "2", "--max-model-len", "32768", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["gpu_plan"]["max_model_len"] == 32768
