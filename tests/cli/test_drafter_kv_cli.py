"""`frag` and `sim` with `--spec-method mtp|eagle` add the drafter's KV as `size` does (the config's MTP layers
join the pool: core/model/models.with_drafter), or refuse naming why; `draft` says its model's KV is left out."""

from __future__ import annotations

import pytest

SIM = ("--requests", "2", "--spec-tokens", "2", "--spec-acceptance", "0.7", "--json")


def test_frag_counts_deepseek_v3s_mtp_layer(run_cli):
    plain = run_cli("frag", "--model", "deepseek-v3", "--lengths", "100,2000", "--spec-tokens", "2", "--json")
    mtp = run_cli("frag", "--model", "deepseek-v3", "--lengths", "100,2000", "--spec-tokens", "2",
                  "--spec-method", "mtp", "--json")
    assert plain.exit_code == mtp.exit_code == 0, plain.stderr + mtp.stderr
    # MLA: 576 latent + rope scalars · 2 B = 1,152 B per layer and token; 61 layers, 62 with the MTP layer
    assert plain.json()["model"]["bytes_per_token"] == 61 * 1152 == 70_272
    assert mtp.json()["model"]["bytes_per_token"] == 62 * 1152 == 71_424
    assert mtp.json()["model"]["name"] == "DeepSeek-V3 + mtp drafter"


def test_sim_counts_deepseek_v3s_mtp_layer(run_cli):
    args = ("--model", "deepseek-v3", "--gpu", "H200", "--tp", "8")
    plain = run_cli("sim", *args, *SIM)
    mtp = run_cli("sim", *args, *SIM, "--spec-method", "mtp")
    assert plain.exit_code == mtp.exit_code == 0, plain.stderr + mtp.stderr
    assert plain.json()["memory_plan"]["kv_bytes_per_token"] == 61 * 1152
    assert mtp.json()["memory_plan"]["kv_bytes_per_token"] == 62 * 1152
    assert mtp.json()["memory_plan"]["num_blocks"] < plain.json()["memory_plan"]["num_blocks"]
    assert mtp.json()["model"] == "DeepSeek-V3 + mtp drafter"


@pytest.mark.parametrize("command", ["frag", "sim"])
def test_eagle_without_mtp_layers_is_refused_naming_why(run_cli, command):
    extra = ("--lengths", "100") if command == "frag" else ("--spec-acceptance", "0.7", "--requests", "2")
    result = run_cli(command, "--model", "llama-3-8b", "--spec-tokens", "2", "--spec-method", "eagle", *extra)
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert line.startswith("error: --spec-method eagle: Llama-3-8B's config has no MTP layers") and "\n" not in line
    assert f"{command} reads no drafter config" in line


def test_draft_says_its_kv_is_left_out(run_cli):
    result = run_cli("sim", "--model", "llama-3-8b", "--gpu", "H100-SXM", *SIM[:-1])
    assert result.exit_code == 0, result.stderr
    assert "--spec-method draft: the draft model's own KV is not counted" in result.stdout
