"""Round-3 QA: Falcon-H1 runs attention and Mamba-2 side by side in every layer (FalconH1DecoderLayer holds both
`self_attn` and `mamba`), but kvcalc counted each layer twice: `size` said "36 of 72 layers keep KV (36 mamba2)"
for the 36-layer Falcon-H1-0.5B (Falcon-H1-34B: "72 of 144"), and `model_layers` was 72. Zamba2's hybrid layers
(a shared attention block beside a Mamba-2 layer) were counted twice the same way (63 layers, not 54)."""

from __future__ import annotations

import json
from pathlib import Path

from real_configs import real_config

from kvcalc.core.model.hf_config import load_config

FALCON_H1_05B = real_config("FALCON_H1_05B", "test_architecture_configs")
ZAMBA2_27B = real_config("ZAMBA2_27B")


def _write(tmp_path: Path, config: dict, folder: str) -> Path:
    directory = tmp_path / folder
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_falcon_h1_has_as_many_layers_as_its_config(tmp_path: Path, run_cli) -> None:
    path = _write(tmp_path, FALCON_H1_05B, "Falcon-H1-0.5B")
    spec = load_config(path)
    assert (spec.layers, spec.model_layers) == (36, 36)  # num_hidden_layers 36, each attention + Mamba-2
    result = run_cli("size", "--config", str(path), "--tokens", "8192")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == ("Falcon-H1-0.5B: GQA, 36 layers, each with attention and mamba2 side by "
                                             "side, 2 KV heads × 64 dim; bf16 (16 bits per scalar)")
    doc = run_cli("size", "--config", str(path), "--tokens", "8192", "--json").json()
    assert doc["model"]["model_layers"] == 36
    # the bytes are unchanged: 36 · 512 B of KV a token, 36 · 403,968 B of state a sequence
    assert doc["model"]["state_bytes_per_seq"] == 36 * 403_968
    assert run_cli("size", "--config", str(path), "--layers", "36", "--tokens", "8192").exit_code == 0


def test_falcon_h1_34b_shape_says_72_layers(tmp_path: Path, run_cli) -> None:
    path = _write(tmp_path, {**FALCON_H1_05B, "num_hidden_layers": 72}, "Falcon-H1-72")  # the 34B's layer count
    line = run_cli("size", "--config", str(path), "--tokens", "8192").stdout.splitlines()[0]
    assert "72 layers, each with attention and mamba2 side by side" in line and "144" not in line


def test_zamba2_counts_its_hybrid_layers_once(tmp_path: Path, run_cli) -> None:
    # 54 layers (layers_block_type): 9 hybrid (shared attention beside Mamba-2) and 45 Mamba-2 only
    path = _write(tmp_path, ZAMBA2_27B, "Zamba2-2.7B")
    assert load_config(path).model_layers == 54
    line = run_cli("size", "--config", str(path), "--tokens", "4096").stdout.splitlines()[0]
    assert "9 of 54 layers keep KV (45 mamba2; the 9 KV layers also run mamba2)" in line, line


def test_a_serial_hybrid_still_counts_each_layer(run_cli) -> None:
    line = run_cli("size", "--model", "nemotron-h-56b", "--tokens", "10").stdout.splitlines()[0]
    assert "10 of 118 layers keep KV (54 mamba2, 54 MLP only)" in line


def test_falcon_h1_pipeline_stages_are_refused_naming_the_real_cause(tmp_path: Path, run_cli) -> None:
    # was "give its config.json (--config)" with --config given: the layers' order is known, but each layer holds
    # attention and a Mamba-2 state side by side, whose split into pipeline stages kvcalc does not plan
    path = _write(tmp_path, FALCON_H1_05B, "Falcon-H1-0.5B")
    result = run_cli("size", "--config", str(path), "--gpu", "H100-SXM", "--pp", "2")
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert line.startswith("error: --pp 2: Falcon-H1-0.5B's layers each hold attention and a recurrent state side by")
    assert line.endswith("use --pp 1") and "--config" not in line
    assert run_cli("size", "--config", str(path), "--gpu", "H100-SXM", "--pp", "1").exit_code == 0
