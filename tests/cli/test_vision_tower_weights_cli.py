"""A vision tower kvcalc cannot count (a vision_config without the fields) is asked for only when the weights are
estimated: `sim --weights-bytes` and `size --gpu --kv-memory` estimate none and run; without them the one-line error
names the flag that replaces the estimate. Gemma-3n's MobileNet-V5 (timm's mobilenetv5_300m_enc) is counted now
(core/model/gemma3n_weights.py; its audio tower too, from the real audio_config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_configs import real_config

# google/gemma-3n-E4B-it's vision_config (timm's MobileNet-V5 encoder): a width, no num_hidden_layers / depth
MOBILENET_V5 = {"architecture": "mobilenetv5_300m_enc", "do_pooling": False, "hidden_size": 2048,
                "model_type": "gemma3n_vision", "num_classes": 2, "rms_norm_eps": 1e-06, "vocab_offset": 262144,
                "vocab_size": 128}
SIM = ("--gpu-memory", "80GiB", "--bandwidth", "3.35e12", "--flops", "989e12", "--rate", "inf", "--requests", "4",
       "--prompt-dist", "uniform:low=100,high=100", "--output-dist", "uniform:low=5,high=5")


def _gemma3n(tmp_path: Path, vision: dict) -> str:
    audio = real_config("AUDIO", "test_gemma3n_weights")  # google/gemma-3n-E4B-it's audio_config
    config = {**real_config("GEMMA3N_E4B"), "vision_config": vision, "audio_config": audio}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_mobilenet_v5_is_counted(run_cli, tmp_path: Path) -> None:
    result = run_cli("sim", "--config", _gemma3n(tmp_path, MOBILENET_V5), *SIM, "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["memory_plan"]["weights_bytes"] > 14 * 2**30  # 7.82 B parameters of 2 B


@pytest.mark.parametrize(("vision", "missing"), [
    ({"model_type": "gemma3n_vision"}, "hidden_size / embed_dim / width"),  # the trimmed config of the tests
])
def test_sim_needs_no_vision_tower_with_weights_bytes(run_cli, tmp_path: Path, vision: dict, missing: str) -> None:
    config = _gemma3n(tmp_path, vision)
    result = run_cli("sim", "--config", config, *SIM, "--weights-bytes", "16GiB", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["memory_plan"]["weights_bytes"] == 16 * 2**30 and doc["completed"] == 4
    refused = run_cli("sim", "--config", config, *SIM)
    assert refused.exit_code == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == (f"error: vision_config (gemma3n_vision) has no {missing} to count the vision "
                                      "tower's weights: give --weights-bytes (the weights are then not estimated)")


@pytest.mark.parametrize("vision", [{"model_type": "gemma3n_vision"}])
def test_size_gpu_needs_no_vision_tower_with_kv_memory(run_cli, tmp_path: Path, vision: dict) -> None:
    config = _gemma3n(tmp_path, vision)
    result = run_cli("size", "--config", config, "--gpu", "H100-SXM", "--kv-memory", "20GiB", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["gpu_plan"]["kv_cache_bytes"] == 20 * 2**30
    refused = run_cli("size", "--config", config, "--gpu", "H100-SXM")
    assert refused.exit_code == 2 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert refused.stderr.startswith("error: vision_config (gemma3n_vision) has no ")
    assert refused.stderr.strip().endswith("to count the vision tower's weights: give --kv-memory (the weights are "
                                           "then not estimated)")


def test_a_countable_vision_tower_is_still_counted(run_cli, tmp_path: Path) -> None:
    # without --weights-bytes the estimate stays: SigLIP-so400m (27 layers, h 1,152, I 4,304, patch 14, image 384)
    # is 412,987,248 tower + 1,152 · 2,048 + 2,048² projector parameters (core/model/weights.py's docstring; 2,048
    # is Gemma-3n-E4B's text width), 2 bytes each on the first GPU, over the same config without a vision_config
    siglip = {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
              "num_hidden_layers": 27, "patch_size": 14, "image_size": 384}
    with_tower = run_cli("sim", "--config", _gemma3n(tmp_path, siglip), *SIM, "--json")
    assert with_tower.exit_code == 0, with_tower.stderr
    text = tmp_path / "text"
    text.mkdir()
    config = json.loads((tmp_path / "config.json").read_text())
    (text / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "vision_config"}))
    without = run_cli("sim", "--config", str(text), *SIM, "--json")
    assert without.exit_code == 0, without.stderr
    tower = 412_987_248 + 1152 * 2048 + 2048 * 2048
    weights = with_tower.json()["memory_plan"]["weights_bytes"] - without.json()["memory_plan"]["weights_bytes"]
    assert weights == 2 * tower
