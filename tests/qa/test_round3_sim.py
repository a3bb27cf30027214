"""Round-3 QA of `kvcalc sim`: each test one defect found by running it on real configs and bad inputs."""

from __future__ import annotations

import json

import pytest


def _one_error_line(result) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, lines
    return lines[0]


@pytest.mark.parametrize(("flag", "value"), [("--compare", "paged,reserve-max"), ("--policy", "reserve-max")])
def test_a_reservation_policy_on_a_hybrid_names_the_flag_given(run_cli, flag: str, value: str) -> None:
    # was "--policy reserve-max: ..." also when the user gave --compare paged,reserve-max
    line = _one_error_line(run_cli("sim", "--model", "gemma-3-27b", "--gpu", "H200", "--requests", "5", flag, value))
    assert line.startswith(f"error: {flag} reserve-max: the reservation policies reserve one region")


def test_sim_prints_the_models_notes_as_size_does(run_cli, tmp_path) -> None:
    # a config whose text_config leaves out vocab_size and max_position_embeddings (google/gemma-3-27b-it's): size
    # says they are transformers' defaults; sim ran on them without a word (one added line in cli/sim.py, E's file)
    text = {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
            "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16, "sliding_window": 1024}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text,
                                                      "torch_dtype": "bfloat16"}))
    size = run_cli("size", "--config", str(tmp_path), "--tokens", "1024")
    sim = run_cli("sim", "--config", str(tmp_path), "--gpu", "H200", "--requests", "5", "--json")
    assert size.exit_code == sim.exit_code == 0, sim.stderr
    warning = "warning: gemma3_text: vocab_size 262,208 and max_position_embeddings 131,072 from transformers'"
    assert warning in size.stderr and warning in sim.stderr
    assert isinstance(sim.json(), dict)  # stdout stays one JSON document
