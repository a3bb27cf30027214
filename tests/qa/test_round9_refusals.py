"""Round-9 QA: real configs whose cache kvcalc cannot model are refused by every command, in one `error:` line
that names what it does not understand (never a number that looks right).

* Ring-mini-linear-2.0 (bailing_moe_linear): of each group of layer_group_size = 5 layers the last is softmax
  attention and the other four linear attention with a state (vLLM's bailing_moe_linear, is_linear_layer), so 4
  of its 20 layers keep KV. It was read as a plain decoder of 20 attention layers: 2 · 20 · 4 · 128 · 2 =
  40,960 B a token, 5× the 4 · 2,048 = 8,192 B it keeps, and no state. Fixed: core/model/hf_fields.py's
  STRUCTURAL now takes `layer_group`, so the unread field refuses the unknown architecture by name.
* Ouro-1.4B (ouro): vLLM's OuroAttention keeps an Attention (a KV cache) per layer and ut step, 24 · 4 = 96 caches
  of 2 · 16 · 128 · 2 = 8,192 B a token: 786,432 B; it was read as a plain decoder of 24 layers, 196,608 B (4× too
  little). Fixed: hf_families.UNSUPPORTED names it, and hf_fields.STRUCTURAL takes `ut_steps` (another model_type
  with total_ut_steps is refused naming the field).
* MiniCPM3-4B (minicpm3): MLA fields, but vLLM caches decompressed K and V (see tests/round9_configs.py): read as
  DeepSeek's latent it was 35,712 B a token, vLLM holds 952,320. Fixed: hf_families.UNSUPPORTED names it and why.
* DBRX (dbrx): its 8 KV heads sit in attn_config.kv_n_heads; read as a plain decoder it had n_heads = 48 (6× the
  KV). Fixed: an unknown architecture's unread attn_config / attention_config object is searched one level down
  (hf_fields.unread_nested; kv_n_heads is now STRUCTURAL), and the field is named.
* Tencent-Hunyuan-Large (hunyuan): cross-layer attention (use_cla, cla_share_factor 2) halves the KV.
* Step-3 (step3_text): experts per token under a name kvcalc does not read (moe_top_k).
* A linear-attention hybrid whose state fields are absent: the KV alone is exact (size), but a paged pool pages
  the state beside the attention (vLLM), so every pool (size --gpu, frag, share, sim) is refused; it printed
  123.13 GiB of KV blocks as if the 6 state layers did not exist. Fixed in core/model/kv_groups.py layer_types.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from round9_configs import DBRX, GLM47_FLASH, HUNYUAN_LARGE, MINICPM3_4B, OURO_14B, RING_MINI_LINEAR_2, STEP3, write

COMMANDS = {
    "size": ("size", "--tokens", "4096"),
    "size --gpu": ("size", "--gpu", "H200"),
    "frag": ("frag", "--lengths", "100,2000"),
    "share": ("share", "--prefix", "1000", "--branches", "2"),
    "sim": ("sim", "--gpu", "H200", "--requests", "5"),
    "plan": ("plan", "--gpu-cost", "H200=3", "--slo", "ttft=5", "--requests", "5", "--replicas", "1", "--tp", "1",
             "--jobs", "1", "--no-cache"),
}

# The Olmo-Hybrid layout of transformers' docs (3 linear attention + 1 full, twice) with its linear_* fields gone
UNKNOWN_STATE = {
    "model_type": "olmo_hybrid", "architectures": ["OlmoHybridForCausalLM"], "vocab_size": 49152, "hidden_size": 512,
    "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
    "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
}


def _refused(run_cli, command: tuple[str, ...], folder: Path) -> str:
    result = run_cli(command[0], "--config", str(folder), *command[1:])
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2, (result.exit_code, result.stdout[-300:], result.stderr[-600:])
    assert len(lines) == 1 and "Traceback" not in result.stderr and result.stdout == ""
    return lines[0]


@pytest.mark.parametrize("command", list(COMMANDS.values()), ids=list(COMMANDS))
def test_ring_linear_refused_naming_layer_group_size(run_cli, tmp_path: Path, command: tuple[str, ...]) -> None:
    line = _refused(run_cli, command, write(tmp_path / "ring", RING_MINI_LINEAR_2))
    assert "'bailing_moe_linear' is not an architecture kvcalc knows" in line and "layer_group_size" in line


@pytest.mark.parametrize("command", [COMMANDS["size"], COMMANDS["sim"]], ids=["size", "sim"])
def test_cross_layer_attention_refused(run_cli, tmp_path: Path, command: tuple[str, ...]) -> None:
    line = _refused(run_cli, command, write(tmp_path / "hunyuan", HUNYUAN_LARGE))
    assert "use_cla" in line and "cla_share_factor" in line and "cross-layer attention" in line


@pytest.mark.parametrize("command", list(COMMANDS.values()), ids=list(COMMANDS))
def test_looped_ouro_refused(run_cli, tmp_path: Path, command: tuple[str, ...]) -> None:
    line = _refused(run_cli, command, write(tmp_path / "ouro", OURO_14B))
    assert "'ouro'" in line and "total_ut_steps" in line and "looped" in line
    other = _refused(run_cli, command, write(tmp_path / "loop", {**OURO_14B, "model_type": "looped_lm"}))
    assert "'looped_lm' is not an architecture kvcalc knows" in other and "total_ut_steps" in other


@pytest.mark.parametrize("command", [COMMANDS["size"], COMMANDS["size --gpu"], COMMANDS["sim"]],
                         ids=["size", "size --gpu", "sim"])
def test_decompressed_mla_and_nested_kv_heads_refused(run_cli, tmp_path: Path, command: tuple[str, ...]) -> None:
    line = _refused(run_cli, command, write(tmp_path / "minicpm3", MINICPM3_4B))
    assert "'minicpm3'" in line and "caches K and V of every head" in line and "kv_lora_rank" in line
    line = _refused(run_cli, command, write(tmp_path / "dbrx", DBRX))
    assert "'dbrx' is not an architecture kvcalc knows" in line and "attn_config.kv_n_heads" in line


# https://huggingface.co/xai-org/grok-2/blob/main/config.json (trimmed): model_type "git", sliding_window_size -1 for
# "no window". It was refused naming num_key_value_heads, a field it reads, because the read stopped at the window
# before reaching it; the refusal now says the field that stopped it (core/model/hf_config.py).
GROK2 = {
    "architectures": ["Grok1ForCausalLM"], "model_type": "git", "hidden_size": 8192, "intermediate_size": 32768,
    "moe_intermediate_size": 16384, "num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 64,
    "head_dim": 128, "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 131072,
    "vocab_size": 131072, "sliding_window_size": -1, "attn_logit_softcapping": 30.0, "torch_dtype": "bfloat16",
}


def test_refusal_names_the_field_that_stopped_the_read(run_cli, tmp_path: Path) -> None:
    line = _refused(run_cli, COMMANDS["size"], write(tmp_path / "grok2", GROK2))
    assert "'git' is not an architecture kvcalc knows (field 'sliding_window_size' must be a positive integer" in line


def test_mla_fields_on_an_unknown_architecture_refused(run_cli, tmp_path: Path) -> None:
    # vLLM keeps one MLA latent only for the model_types it lists as DeepSeek-style MLA (ModelConfig.is_deepseek_mla;
    # GLM-4.7-Flash's glm4_moe_lite is one), else K and V of every head: GLM-4.7-Flash renamed (as a fine-tune might)
    # was read as the latent, 47 · 576 · 2 = 54,144 B a token, where vLLM would hold 47 · 2 · 20 · 256 · 2 =
    # 962,560. Fixed: core/model/hf_families.judge_unread refuses kv_lora_rank on an unknown model_type.
    line = _refused(run_cli, COMMANDS["size"], write(tmp_path / "renamed", {**GLM47_FLASH, "model_type": "glm_fork"}))
    assert "'glm_fork' is not an architecture kvcalc knows" in line and "kv_lora_rank is MLA" in line
    ok = run_cli("size", "--config", str(write(tmp_path / "glm47", GLM47_FLASH)), "--tokens", "16", "--json")
    assert ok.exit_code == 0 and ok.json()["bytes_per_token"] == 47 * (512 + 64) * 2 == 54_144


def test_step3_refused_naming_the_expert_fields(run_cli, tmp_path: Path) -> None:
    line = _refused(run_cli, COMMANDS["size"], write(tmp_path / "step3", STEP3))
    assert "'step3_text' is not an architecture kvcalc knows" in line and "num_experts_per_tok" in line


@pytest.mark.parametrize("name", ["size --gpu", "frag", "share", "sim", "plan"])
def test_unknown_state_refused_by_every_pool(run_cli, tmp_path: Path, name: str) -> None:
    line = _refused(run_cli, COMMANDS[name], write(tmp_path / "hybrid", UNKNOWN_STATE))
    assert "the recurrent state of 6 linear-attention / state-space layers is not known" in line


def test_trace_replays_refused(run_cli, tmp_path: Path, hand_trace: Path) -> None:
    trace = ("--trace", "mooncake", str(hand_trace))
    line = _refused(run_cli, ("share", *trace, "--memory", "1GiB"), write(tmp_path / "hybrid", UNKNOWN_STATE))
    assert "is not known" in line
    line = _refused(run_cli, ("share", *trace, "--capacity", "1GiB"), write(tmp_path / "ring", RING_MINI_LINEAR_2))
    assert "layer_group_size" in line


def test_unknown_state_kv_alone_is_exact(run_cli, tmp_path: Path) -> None:
    result = run_cli("size", "--config", str(write(tmp_path / "hybrid", UNKNOWN_STATE)), "--tokens", "4096", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    # 2 full layers · 2 · 8 KV heads · (512 / 8 = 64) · 2 B = 4,096 B a token; the state is said to be missing
    assert doc["bytes_per_token"] == 2 * 2 * 8 * 64 * 2 == 4096 and doc["state_bytes_per_seq"] == 0
    assert "is not known" in result.stderr
