"""Regressions found by QA runs of the commands on real traces, presets and bad inputs (one test per problem)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from lru_reference import HAND
from real_configs import write_config

from kvcalc.core.inputs.traces import Trace
from kvcalc.core.share.stack_distance import stack_distances
from kvcalc.core.share.tiers import simulate_tiers

# Block 512, one hash id a block: the hand-worked trace of tests/core/share/test_capacity.py (5 hit blocks unbounded)




def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize("flag", ["--capacity", "--gpu-cache"])
def test_share_capacity_above_2_62_tokens_is_one_error_line(run_cli, hand_trace: Path, flag: str) -> None:
    # was an OverflowError traceback from numpy (Python int too large to convert to C long)
    for text in ("1e400", "5e18"):  # 5e18 > 2^62 = 4.61e18
        line = _one_error_line(run_cli("share", "--trace", "mooncake", str(hand_trace), flag, text))
        assert f"{flag} '{text}' is more than 2^62 tokens" in line


def test_share_huge_byte_capacity_is_the_unbounded_cache(run_cli, hand_trace: Path) -> None:
    # 1000 YiB (~2^89.97 B) of 64 MiB blocks is ~2^64 blocks, beyond int64: clamped to the trace, hits exact
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "--block", "512", "--model", "Llama-3-8B",
                     "--capacity", "1000YiB", "--gpu-cache", "1000YiB", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    (point,) = doc["curves"][0]["points"]
    assert point["hit_tokens"] == doc["curves"][0]["unbounded_hit_tokens"] == 5 * 512
    # reported as given: 1000 YiB // 64 MiB block ids, less vLLM's null block (--layout vllm, the default)
    assert point["capacity_blocks"] == 1000 * 2**80 // (2 * 32 * 8 * 128 * 2 * 512) - 1
    assert [t["hit_tokens"] for t in doc["tiers"]["by_tier"]] == [5 * 512, 0, 0]


def _hand_trace() -> Trace:
    ids = [h for _, hs in HAND for h in hs]
    offsets = np.cumsum([0] + [len(hs) for _, hs in HAND]).astype(np.int64)
    return Trace("mooncake", "hand", np.arange(len(HAND), dtype=np.float64), np.array([p for p, _ in HAND], np.int64),
                 np.ones(len(HAND), np.int64), np.array(ids, np.int64), offsets)


def test_tiers_of_any_size_match_tiers_as_large_as_the_trace() -> None:
    trace = _hand_trace()
    d = stack_distances(trace, 512)
    small, huge = simulate_tiers(d, (1, 2, 100), None), simulate_tiers(d, (1, 2, 2**100), None)
    assert [(t.hit_blocks, t.write_blocks) for t in small.tiers] == [(t.hit_blocks, t.write_blocks) for t in huge.tiers]
    assert huge.tiers[2].capacity_blocks == 2**100 and huge.dropped_blocks == small.dropped_blocks == 0
    assert d.total_hit_blocks(2**100) == d.total_hit_blocks(None) == 5


def test_plan_tp_error_names_tp_once(run_cli) -> None:
    # was "error: --tp 3: --tp 3 does not divide the 8 KV heads of Llama-3-8B: ..."
    line = _one_error_line(run_cli("plan", "--no-cache", "-m", "Llama-3-8B", "--gpu-cost", "H100-SXM=4",
                                   "--tp", "1,3", "--slo", "ttft=5"))
    assert line.startswith("error: --tp 3 does not divide the 8 KV heads") and line.count("--tp 3") == 1, line


def test_plan_cache_dir_that_is_a_file_names_the_flag(run_cli, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "f"
    not_a_dir.write_text("x")
    line = _one_error_line(run_cli("plan", "--cache-dir", str(not_a_dir), "-m", "Llama-3-8B", "--gpu-cost",
                                   "H100-SXM=4", "--slo", "ttft=5"))
    assert line.startswith(f"error: --cache-dir {not_a_dir} is not a directory"), line


@pytest.mark.parametrize(("model_args", "name", "default_note"), [
    ([], "OPT-13B", True),  # sim's default model, never named before (only implied by the sim command)
    (["-m", "Llama-3-8B"], "Llama-3-8B", False),
])
def test_plan_names_the_model_it_plans(run_cli, model_args: list[str], name: str, default_note: bool) -> None:
    args = ["plan", "--no-cache", "--jobs", "1", *model_args, "--gpu-cost", "H100-SXM=4", "--slo", "ttft=5",
            "--tp", "1", "--replicas", "1", "--requests", "10"]
    doc = run_cli(*args, "--json").json()
    assert doc["model"] == name
    table = run_cli(*args)
    assert table.exit_code == 0, table.stderr
    first = table.stdout.splitlines()[0]
    assert first.startswith(f"model: {name}") and ("sim's default" in first) == default_note, first


def test_share_tiers_plan_a_hybrid_gpu_as_sim_does(run_cli, hand_trace: Path) -> None:
    # Nemotron-H-56B on H200 x2: sim's memory plan pages the Mamba states in the pool (a 72 GiB KV pool); the
    # tiers' load-or-recompute model reserved 256 states up front (256 x 912,605,184 B / 2 = 108.8 GiB) and refused
    # with "leave no room for one KV block (36.52 GiB short)"
    args = ["--model", "Nemotron-H-56B", "--gpu", "H200", "--tp", "2", "--block", "512"]
    # (sim at a block vLLM takes: under vLLM's layout it refuses 512; the Mamba state forces 4,128 either way)
    sim = run_cli("sim", *args[:-1], "16", "--requests", "5", "--json")
    assert sim.exit_code == 0, sim.stderr
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "--gpu-cache", "1GiB", "--host-cache", "10GiB",
                     *args, "--layout", "ideal", "--json")  # block 512: kvcalc's own pool (vLLM's forces 4,608)
    assert result.exit_code == 0, result.stderr
    assert result.json()["tiers"]["gpu"] == "H200"


@pytest.mark.parametrize("model", ["Gemma-3-27B", "gpt-oss-20b", "Llama-4-Scout", "Nemotron-H-56B"])
def test_size_pp_on_a_hybrid_says_the_fix(run_cli, model: str) -> None:
    # the refusal named no fix ("... splits only one group's layers across pipeline stages")
    line = _one_error_line(run_cli("size", "--model", model, "--gpu", "H200", "--tp", "8", "--pp", "2"))
    assert line.startswith(f"error: --pp 2: {model} has several KV-cache groups") and line.endswith("use --pp 1")


def test_frag_mamba_cache_mode_on_a_model_without_state_is_refused(run_cli) -> None:
    # frag ran silently with the option ignored; sim and share refuse it the same way
    line = _one_error_line(run_cli("frag", "--lengths", "5", "--model", "Llama-3-8B", "--mamba-cache-mode", "align"))
    assert "Llama-3-8B has none: drop --mamba-cache-mode" in line
    assert run_cli("frag", "--lengths", "5", "--model", "Nemotron-H-56B", "--mamba-cache-mode", "align").exit_code == 0


def test_frag_warns_when_a_length_is_above_the_models_max_length(run_cli) -> None:
    # size warns for --tokens above max_position_embeddings; frag took 200,000 tokens for Llama-3-8B silently
    above = run_cli("frag", "--lengths", "100,200000", "--model", "Llama-3-8B", "--json")
    assert above.exit_code == 0 and json.loads(above.stdout)
    assert above.stderr.strip() == ("warning: the longest length, 200,000, is above Llama-3-8B's "
                                    "max_position_embeddings 8,192")
    at_limit = run_cli("frag", "--lengths", "100,8192", "--model", "Llama-3-8B", "--json")
    assert at_limit.exit_code == 0 and "warning" not in at_limit.stderr


def test_size_empty_vllm_version_is_an_error_not_the_default(run_cli) -> None:
    # --vllm-version "" silently meant 0.21; every other empty option value (--dtype "", --gpu "") is refused
    line = _one_error_line(run_cli("size", "--model", "Llama-3-8B", "--gpu", "H100-SXM", "--vllm-version", ""))
    assert line.startswith("error: --vllm-version '' is not modelled: choose one of 0.19, 0.21")


def test_size_gpt_oss_presets_load_mxfp4_weights_as_their_checkpoints(run_cli) -> None:
    # the presets were sized as bf16 (gpt-oss-20b 38.97 GiB, gpt-oss-120b 217.63 GiB: "no KV memory" on one H100,
    # the GPU gpt-oss-120b is made for); vLLM loads gpt-oss-20b in 13.64 GiB (../shared/vllm_startup/startup.csv).
    # A preset now weighs what --config of its config.json (quant_method mxfp4) weighs: the same estimate, the
    # routed experts at 4.25 bits, the rest 16-bit.
    preset = run_cli("size", "--model", "gpt-oss-20b", "--gpu", "H100-SXM", "--json")
    assert preset.exit_code == 0, preset.stderr
    stated = preset.json()["gpu_plan"]["weights_bytes"]
    as_bf16 = run_cli("size", "--model", "gpt-oss-20b", "--gpu", "H100-SXM", "--weight-dtype", "bf16", "--json")
    assert as_bf16.json()["gpu_plan"]["weights_bytes"] > 2.5 * stated
    assert 12.5 * 2**30 < stated < 13.64 * 2**30
    big = run_cli("size", "--model", "gpt-oss-120b", "--gpu", "H100-SXM", "--json")
    assert big.exit_code == 0, big.stderr  # it fits one H100 80GB
    assert 60 * 2**30 < big.json()["gpu_plan"]["weights_bytes"] < 62 * 2**30


@pytest.mark.parametrize(("model", "gpu", "tp"), [("DeepSeek-V3", "H200", "8"), ("gpt-oss-20b", "H100-SXM", "1"),
                                                   ("Llama-3-8B", "H100-SXM", "1")])
def test_sim_loads_the_weights_size_gpu_loads(run_cli, model: str, gpu: str, tp: str) -> None:
    # was bf16 for every model: DeepSeek-V3 (an fp8 checkpoint) "weights need 156.24 GiB per GPU" on H200 x8, while
    # size --gpu loads 78.39 GiB; gpt-oss's mxfp4 experts were counted at 16 bits (38.97 GiB for gpt-oss-20b)
    size = json.loads(run_cli("size", "-m", model, "--gpu", gpu, "--tp", tp, "--json").stdout)["gpu_plan"]
    result = run_cli("sim", "-m", model, "--gpu", gpu, "--tp", tp, "--requests", "3", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["memory_plan"]["weights_bytes"] == size["weights_bytes"]
    if model == "DeepSeek-V3":
        assert 78 * 2**30 < size["weights_bytes"] < 79 * 2**30  # 78.39 GiB: fp8 body, 16-bit embeddings and head


def test_sim_weight_dtype_still_overrides_the_checkpoint(run_cli) -> None:
    fp8 = run_cli("sim", "-m", "Llama-3-8B", "--gpu", "H100-SXM", "--requests", "3", "--weight-dtype", "fp8", "--json")
    bf16 = run_cli("sim", "-m", "Llama-3-8B", "--gpu", "H100-SXM", "--requests", "3", "--json")
    size = run_cli("size", "-m", "Llama-3-8B", "--gpu", "H100-SXM", "--weight-dtype", "fp8", "--json")
    fp8_w = json.loads(fp8.stdout)["memory_plan"]["weights_bytes"]
    assert fp8_w == json.loads(size.stdout)["gpu_plan"]["weights_bytes"]
    assert fp8_w < json.loads(bf16.stdout)["memory_plan"]["weights_bytes"]


def test_share_tiers_time_deepseek_v3_with_its_fp8_weights(run_cli, hand_trace: Path) -> None:
    # was "weights need 156.24 GiB per GPU" (bf16) for the load-or-recompute step-time model on H200 x8
    result = run_cli("share", "--trace", "mooncake", str(hand_trace), "-m", "DeepSeek-V3", "--gpu", "H200", "--tp", "8",
                     "--gpu-cache", "2", "--block", "512", "--json")
    assert result.exit_code == 0, result.stderr


def test_sim_calibrate_binary_file_names_the_flag(run_cli, tmp_path: Path) -> None:
    # was "error: 'utf-8' codec can't decode byte 0xff …", naming neither --calibrate nor the fix
    path = tmp_path / "bench.bin"
    path.write_bytes(b"\xff\xfe\x00binary")
    line = _one_error_line(run_cli("sim", "--requests", "3", "--calibrate", str(path)))
    assert line.startswith(f"error: --calibrate {path}: not a JSON file") and "kvcalc bench --json" in line


@pytest.mark.parametrize("value", ["nan", "4Gb"])
def test_share_memory_errors_name_the_flag(run_cli, hand_trace: Path, value: str) -> None:
    # was "error: cannot read the memory size 'nan' …" / "error: '4Gb' is how bits are written …" without --memory
    line = _one_error_line(run_cli("share", "--trace", "mooncake", str(hand_trace), "-m", "Llama-3-8B", "--memory",
                                   value))
    assert line.startswith(f"error: --memory '{value}': ")


CUSTOM_GPU = ["sim", "--requests", "3", "--gpu-memory", "80GiB"]


def test_sim_bandwidth_error_does_not_call_it_a_memory_size(run_cli) -> None:
    # was "--bandwidth nan: cannot read the memory size 'nan'"
    line = _one_error_line(run_cli(*CUSTOM_GPU, "--bandwidth", "nan", "--flops", "1e15"))
    assert line.startswith("error: --bandwidth nan: cannot read the bytes/s figure 'nan'")
    assert "memory size" not in line


@pytest.mark.parametrize(("value", "hint"), [("1e400", "1e400 overflows a float"), ("nan", "give a finite number"),
                                             ("inf", "give a finite number")])
def test_sim_flops_that_are_not_finite_are_refused_as_typed(run_cli, value: str, hint: str) -> None:
    # --flops 1e400 was echoed as "--flops inf" (typer had already read it as a float)
    line = _one_error_line(run_cli(*CUSTOM_GPU, "--bandwidth", "3e12", "--flops", value))
    assert line.startswith(f"error: --flops {value}: ") and hint in line


@pytest.mark.parametrize("command", ["sim", "share"])
def test_mamba_cache_mode_help_lists_only_what_runs(run_cli, monkeypatch, tmp_path, command: str) -> None:
    # the help lists `all` now that it runs (the block aligned to the config's Mamba chunk); a model it does not
    # run on (Qwen3-Next's gated DeltaNet: vLLM runs all on Mamba-2 only) is refused by name
    write_config(tmp_path, "QWEN3_NEXT")
    monkeypatch.setenv("COLUMNS", "250")  # wide enough that rich folds no help text
    help_text = " ".join(run_cli(command, "--help").stdout.split())
    assert "none|align|all" in help_text
    extra = ("--gpu", "H200", "--requests", "4") if command == "sim" else ()
    assert run_cli(command, "-m", "Nemotron-H-56B", "--mamba-cache-mode", "all", *extra, "--json").exit_code == 0
    line = _one_error_line(run_cli(command, "--config", str(tmp_path), "--mamba-cache-mode", "all"))
    assert "--mamba-cache-mode all" in line and "use none or align" in line


def test_share_block_beside_blocks_is_refused(run_cli, hand_trace: Path) -> None:
    # --block 64 was silently ignored beside --blocks 16 (its default of 16 hid whether it was given)
    line = _one_error_line(run_cli("share", "--trace", "mooncake", str(hand_trace), "--capacity", "1M", "--blocks",
                                   "16", "--block", "64"))
    assert "--block 64 and --blocks 16" in line
    assert run_cli("share", "--trace", "mooncake", str(hand_trace), "--capacity", "1M", "--blocks", "512",
                   "--json").exit_code == 0


def test_deepseek_v3_preset_has_its_mtp_layer(run_cli) -> None:
    # the preset lacked num_nextn_predict_layers 1: size --spec-method mtp said it had no MTP layers
    result = run_cli("size", "-m", "deepseek-v3", "--spec-method", "mtp", "--spec-tokens", "1", "--dtype", "bf16",
                     "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["bytes_per_token"] == 62 * 576 * 2 == 71_424  # 61 + 1 MLA layers, bf16
