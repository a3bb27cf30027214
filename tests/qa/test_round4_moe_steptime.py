"""Round-4 QA: sim's step time of a MoE model read from its config.json. A config carries no parameter counts,
so `steptime.moe_shares` (it needs spec.num_params and spec.num_active_params, which only presets set) returned
nothing and every decode step read every expert: gpt-oss-120b from its public config.json (mxfp4) decodes at a
TPOT p50 of 17.5 ms on an H200 at 1 req/s where the built-in preset of the same checkpoint gives 1.34 ms (13x),
and the output only says "is MoE but has no active-parameter count". Every MoE hybrid given by --config is hit
(gpt-oss, Llama-4-Scout, Qwen3-Next, Jamba, Granite-4.0-H-Small, Kimi-Linear). The counts exist:
core/model/weights.param_count estimates them from the dimensions (gpt-oss-120b: 116,788,838,400 total,
5,710,233,600 active; the preset's published 116,829,156,672 / 5,715,982,912).

Fix (helper S, core/sim/steptime.py moe_shares): take (total, active) from `param_count(spec)` when the spec has no
counts, as `active_params` in hardware.py already does for the FLOPs."""

from __future__ import annotations

from pathlib import Path

import pytest
from real_configs import write_config


def _tpot(run_cli, *source: str) -> tuple[float, object]:
    result = run_cli("sim", *source, "--gpu", "H200", "--requests", "50", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    return doc["tpot_s"]["p50"], doc["moe_weight_reads"]


def test_gpt_oss_from_its_config_decodes_as_the_preset(run_cli, tmp_path: Path) -> None:
    folder = str(write_config(tmp_path, "GPT_OSS_120B"))
    config_tpot, config_reads = _tpot(run_cli, "--config", folder, "--quantization", "mxfp4")
    preset_tpot, preset_reads = _tpot(run_cli, "--model", "gpt-oss-120b")
    assert preset_reads == "uniform_routing_expectation"
    assert config_reads == preset_reads
    # the same checkpoint: active parameters within 0.1 % of each other, so the same step times within 2 %
    assert config_tpot == pytest.approx(preset_tpot, rel=0.02)
