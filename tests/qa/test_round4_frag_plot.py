"""Round-4 QA: `frag --plot` with a model. The figure drew tail-block waste in token positions at the block size
asked for, while under the vllm layout a Mamba hybrid pages at another: Nemotron-H-56B at B = 1 … 32 is paged at
4,128 tokens, so the figure showed B = 1 wasting nothing where the text (and vLLM) hold 2.16 TiB of tail blocks
on the Azure trace. With a model the figure now draws the bytes held (the quantity the sweep's "best block size"
is chosen on), each point marked with the block it is paged at, and the useful share of those bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from real_configs import write_config

import kvcalc.cli.frag as frag_cli


@pytest.fixture
def captured(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(frag_cli, "write_waste_plot", lambda *args: calls.append(args))
    return calls


def test_a_mamba_hybrid_plots_the_bytes_held(run_cli, tmp_path: Path, captured: list[tuple]) -> None:
    folder = str(write_config(tmp_path, "NEMOTRON_H_56B"))
    args = ("frag", "--config", folder, "--lengths", "1000,5000", "--block", "16", "--block", "256")
    doc = run_cli(*args, "--json").json()
    assert run_cli(*args, "--plot", str(tmp_path / "waste.png")).exit_code == 0
    (_, _, blocks, _, utilization, held) = captured[0]
    name, held_bytes, used = held
    assert blocks == [16, 256] and name == Path(folder).name  # the model is named after its folder
    # 16 -> 16 · ceil(16,900,096 / 65,536) = 4,128; 256 -> 256 · ceil(16,900,096 / (256 · 4,096)) = 4,352
    assert used == [4128, 4352] == [p["used_block_size"] for p in doc["paged"]]
    assert held_bytes == [p["held_bytes"] for p in doc["paged"]]
    # at 4,128: 3 full blocks of 169,082,880 B + 2 · 6 state pages of the same, 60 B of block tables
    assert held_bytes[0] == 15 * 169_082_880 + 60 == 2_536_243_260
    # useful: 6,000 tokens · 40,960 B + 2 states of 912,605,184 B
    assert utilization[0] == pytest.approx((6000 * 40960 + 2 * 912_605_184) / 2_536_243_260)


def test_without_a_model_the_token_positions(run_cli, tmp_path: Path, captured: list[tuple]) -> None:
    assert run_cli("frag", "--plot", str(tmp_path / "waste.png")).exit_code == 0
    (_, _, blocks, waste, utilization, held) = captured[0]
    # the worked example: 37, 91, 128, 201, 511 at B = 16 (992 allocated) and 32 (1,024), 968 useful
    assert blocks == [16, 32] and waste == [24, 56] and held is None
    assert utilization == pytest.approx([968 / 992, 968 / 1024])
