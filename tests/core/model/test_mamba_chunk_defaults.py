"""The Mamba-2 scan chunk as vLLM reads it (ModelConfig.get_mamba_chunk_size): `mamba_chunk_size`, else
`chunk_size`, on the config object transformers built from config.json, so a file without either key takes the
config class's default. `--mamba-cache-mode all` aligns the block to it; Granite-4.0-H-Small's and
Nemotron-3-Nano's configs as quoted here give neither (they were refused)."""

from __future__ import annotations

import json

import pytest
from real_configs import real_config, write_config

from kvcalc.core.errors import ParameterError
from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.hf_state_fields import _CHUNK_DEFAULTS
from kvcalc.core.model.kv_groups import kv_layout


def _state(spec):
    (state,) = {g.state for g in spec.layer_groups if g.state is not None}
    return state


def test_granite_4_h_small_takes_granitemoehybrid_default(tmp_path) -> None:
    spec = load_config(write_config(tmp_path, "GRANITE_4_H_SMALL"))
    assert _state(spec).chunk == 256 and "GraniteMoeHybridConfig" in _state(spec).chunk_from
    kv = kv_layout(spec, 16, 16, "vllm", 1, "all")
    # state per layer: conv (4 − 1) · (128 · 64 + 2 · 1 · 128) = 25,344 bf16 = 50,688 B + SSM 128 · 64 · 128 bf16 =
    # 2,097,152 B = 2,147,840 B; an attention token of one layer 2 · 8 · 128 · 2 B = 4,096 B: ceil(2,147,840 /
    # 4,096) = 525 tokens; the block a multiple of lcm(256, 16) = 256: 256 · ceil(525 / 256) = 768
    assert kv.block_size == 768
    assert kv.reason.endswith("Mamba chunk 256: the config gives neither mamba_chunk_size nor chunk_size: "
                              "transformers' GraniteMoeHybridConfig default mamba_chunk_size 256")


def test_nemotron3_nano_takes_nemotronh_default(tmp_path) -> None:
    spec = load_config(write_config(tmp_path, "NEMOTRON3_NANO", "test_architecture_configs"))
    kv = kv_layout(spec, 16, 16, "vllm", 1, "all")
    # state 2,134,016 B a layer (test_architecture_configs), a token 2 · 2 · 128 · 2 B = 1,024 B: 2,084 tokens;
    # NemotronHConfig's chunk_size 128: lcm(128, 16) = 128, 128 · ceil(2,084 / 128) = 128 · 17 = 2,176
    assert _state(spec).chunk == 128 and kv.block_size == 2_176
    assert "transformers' NemotronHConfig default chunk_size 128" in kv.reason
    # align and none do not read the chunk, and say nothing of it
    assert "Mamba chunk" not in kv_layout(spec, 16, 16, "vllm", 1, "align").reason


def test_given_chunk_wins_and_mamba_chunk_size_first(tmp_path) -> None:
    config = {**real_config("GRANITE_4_H_SMALL"), "chunk_size": 128, "mamba_chunk_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_config(tmp_path)
    assert (_state(spec).chunk, _state(spec).chunk_from) == (64, "")  # vLLM reads mamba_chunk_size first
    kv = kv_layout(spec, 16, 16, "vllm", 1, "all")
    assert kv.block_size == 576 and "Mamba chunk" not in kv.reason  # lcm(64, 16) = 64: 64 · ceil(525 / 64) = 576


def test_unknown_model_type_is_still_refused(tmp_path) -> None:
    # a model type whose transformers class kvcalc does not know: no default taken, mode all refused by name
    config = {**real_config("GRANITE_4_H_SMALL"), "model_type": "some_mamba_hybrid"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_config(tmp_path)
    assert (_state(spec).chunk, _state(spec).chunk_from) == (0, "")
    with pytest.raises(ParameterError, match="aligns the block to the Mamba kernel's chunk"):
        kv_layout(spec, 16, 16, "vllm", 1, "all")


def test_defaults_are_transformers_own() -> None:
    """Each default against the installed transformers' config class (independent of the table's text)."""
    transformers = pytest.importorskip("transformers")
    for model_type, (cls_name, key, value) in _CHUNK_DEFAULTS.items():
        cls = transformers.CONFIG_MAPPING[model_type]
        assert cls.__name__ == cls_name
        config = cls()
        assert getattr(config, key) == value, model_type
        other = "chunk_size" if key == "mamba_chunk_size" else "mamba_chunk_size"
        assert getattr(config, other, None) is None  # so vLLM's first key present is this one


def test_frag_cli_runs_mode_all_and_says_the_default(run_cli, tmp_path) -> None:
    folder = write_config(tmp_path, "GRANITE_4_H_SMALL")
    result = run_cli("frag", "--config", str(folder), "--mamba-cache-mode", "all", "--lengths", "1000")
    assert result.exit_code == 0, result.stderr
    assert "GraniteMoeHybridConfig default mamba_chunk_size 256" in " ".join(result.stdout.split())
