"""Round-10 QA: real configs kvcalc cannot model, refused by every command in one `error:` line naming why.

* Phi-4-mini-flash-reasoning (phi4flash, SambaY): configuration_phi4flash puts Mamba on the even layers (mb_per_layer
  2), a 512-token window on the odd layers below the middle (1, 3, .., 15: 8 layers), full attention on layer 17, and
  makes the odd layers above it (19 .. 31) reuse layer 17's KV (YOCO): 9 attention caches of 2 · 20 · 64 · 2 = 5,120 B
  a token, plus 16 Mamba states. It was read as a plain decoder whose 32 layers all slide over 512 tokens: 80 MiB a
  sequence at any length, where the 9 caches hold 8 · 512 · 5,120 + 262,144 · 5,120 = 1,363,148,800 B at the
  262,144-token length (16x more; the full layer's KV grows with the sequence, which kvcalc said it never does).
  vLLM v1 dropped Phi4FlashForCausalLM (V0-only; issue 23957), so there is no engine layout to model either. Fixed:
  core/model/hf_families.UNSUPPORTED names phi4flash and why, and hf_fields.STRUCTURAL takes mb_per_layer / yoco, so
  a renamed copy is refused naming mb_per_layer.
* xLSTM-7b (xlstm): mLSTM blocks with a matrix memory, no KV; refused only because chunkwise_kernel matched "chunk"
  (a trimmed copy without the kernel fields read as a decoder of 32 layers · 8 heads × 512, 16 KiB a token a layer).
  Fixed: UNSUPPORTED names xlstm; STRUCTURAL takes *_dim_factor (qk_dim_factor, v_dim_factor).
* RecurrentGemma-2b (recurrent_gemma, "_block_types"): refused already, naming the fields kvcalc does not read
  (_block_types, attention_window_size); no vLLM model serves it. (PLaMo-2-1B was refused the same way, naming its
  mamba_* fields; vLLM serves it, and kvcalc now reads it: tests/qa/test_round10_configs.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from round10_configs import PHI4_MINI_FLASH, PLAMO2_1B, RECURRENTGEMMA_2B, XLSTM_7B, write

COMMANDS = {
    "size": ("size", "--tokens", "4096"),
    "size --gpu": ("size", "--gpu", "H200"),
    "frag": ("frag", "--lengths", "100,2000"),
    "share": ("share", "--prefix", "1000", "--branches", "2"),
    "sim": ("sim", "--gpu", "H200", "--requests", "5"),
    "plan": ("plan", "--gpu-cost", "H200=3", "--slo", "ttft=5", "--requests", "5", "--replicas", "1", "--tp", "1",
             "--jobs", "1", "--no-cache"),
}


def _refused(run_cli, command: tuple[str, ...], folder: Path) -> str:
    result = run_cli(command[0], "--config", str(folder), *command[1:])
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2, (result.exit_code, result.stdout[-300:], result.stderr[-600:])
    assert len(lines) == 1 and "Traceback" not in result.stderr and result.stdout == ""
    return lines[0]


@pytest.mark.parametrize("command", list(COMMANDS.values()), ids=list(COMMANDS))
def test_phi4_flash_refused(run_cli, tmp_path: Path, command: tuple[str, ...]) -> None:
    line = _refused(run_cli, command, write(tmp_path / "phi4flash", PHI4_MINI_FLASH))
    assert "'phi4flash'" in line and "SambaY" in line and "YOCO" in line and "mb_per_layer" in line


@pytest.mark.parametrize("command", [COMMANDS["size"], COMMANDS["sim"]], ids=["size", "sim"])
def test_renamed_phi4_flash_refused_naming_mb_per_layer(run_cli, tmp_path: Path, command: tuple[str, ...]) -> None:
    renamed = {**PHI4_MINI_FLASH, "model_type": "sambay_fork"}
    line = _refused(run_cli, command, write(tmp_path / "fork", renamed))
    assert "'sambay_fork' is not an architecture kvcalc knows" in line and "mb_per_layer" in line


@pytest.mark.parametrize("command", list(COMMANDS.values()), ids=list(COMMANDS))
def test_xlstm_refused(run_cli, tmp_path: Path, command: tuple[str, ...]) -> None:
    line = _refused(run_cli, command, write(tmp_path / "xlstm", XLSTM_7B))
    assert "'xlstm'" in line and "matrix memory" in line


def test_trimmed_or_renamed_xlstm_refused(run_cli, tmp_path: Path) -> None:
    # without the kernel fields (which matched "chunk") and with the layer fields a plain decoder reads, it was read
    # as 32 layers · 8 heads × 512: 2 · 8 · 512 · 2 = 16,384 B a token a layer
    kept = {k: v for k, v in XLSTM_7B.items() if "chunk" not in k}
    trimmed = {**kept, "model_type": "xlstm_fork", "num_hidden_layers": 32, "hidden_size": 4096,
               "num_attention_heads": 8, "head_dim": 512}
    line = _refused(run_cli, COMMANDS["size"], write(tmp_path / "fork", trimmed))
    assert "'xlstm_fork' is not an architecture kvcalc knows" in line and "qk_dim_factor, v_dim_factor" in line


@pytest.mark.parametrize("command", list(COMMANDS.values()), ids=list(COMMANDS))
def test_griffin_refused_naming_its_fields(run_cli, tmp_path: Path, command: tuple[str, ...]) -> None:
    line = _refused(run_cli, command, write(tmp_path / "rg", RECURRENTGEMMA_2B))
    assert "'recurrent_gemma' is not an architecture kvcalc knows" in line
    assert "_block_types, attention_window_size" in line


def test_a_renamed_plamo2_is_still_refused(run_cli, tmp_path: Path) -> None:
    # kvcalc reads mamba_step only for model_type plamo2: another name keeps the refusal naming the Mamba fields
    line = _refused(run_cli, COMMANDS["size"], write(tmp_path / "fork", {**PLAMO2_1B, "model_type": "plamo2_fork"}))
    assert "'plamo2_fork' is not an architecture kvcalc knows" in line and "mamba_step" in line


def test_refusals_through_trace_replays(run_cli, tmp_path: Path, hand_trace: Path) -> None:
    trace = ("--trace", "mooncake", str(hand_trace))
    line = _refused(run_cli, ("share", *trace, "--memory", "1GiB"), write(tmp_path / "phi", PHI4_MINI_FLASH))
    assert "'phi4flash'" in line
    line = _refused(run_cli, ("sim", "--gpu", "H200", *trace), write(tmp_path / "x", XLSTM_7B))
    assert "'xlstm'" in line
