"""The caching allocator's charge for weight tensors (core/model/weight_tensors.py), by hand and against vLLM 0.19's
logged "Model loading took X GiB" (../shared/vllm_startup, llm-d planner's accuracy study, Apache-2.0)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcalc.core.model.models import get_preset
from kvcalc.core.model.vllm_memory import GIB, stage_weights
from kvcalc.core.model.weight_tensors import charged_bytes, layer_rounding, table_rounding

MIB = 2**20
DATA = Path(__file__).resolve().parents[4] / "shared" / "vllm_startup"


@pytest.mark.parametrize(("size", "charged"), [
    (1000, 1024),  # small pool: rounded up to 512 B
    (8_257_536, 8_257_536),  # 1-10 MiB: carved from a 20 MiB segment, split to the request
    (25_690_112, 25_690_112),  # 12.25 × 2 MiB: 1.5 MiB would remain in its 13 × 2 MiB segment (> 1 MiB): split
    (135_790_592, 65 * 2 * MIB),  # 64.75 × 2 MiB: 0.5 MiB would remain (≤ 1 MiB): the whole segment is charged
    (271_581_184, 130 * 2 * MIB),  # 129.5 × 2 MiB: exactly 1 MiB would remain, not more: the whole segment
    (50_331_648, 50_331_648),  # 24 × 2 MiB: nothing remains
])
def test_charged_bytes_by_hand(size, charged):
    assert charged_bytes(size) == charged


@given(st.integers(min_value=1, max_value=2**40))
def test_charged_bytes_properties(size):
    rounded = -(-size // 512) * 512
    charged = charged_bytes(size)
    assert rounded <= charged <= rounded + MIB  # never more than 1 MiB over the 512-B rounding
    assert charged == rounded or charged % (2 * MIB) == 0  # else the request took a whole 2-MiB segment


def test_qwen25_7b_by_hand():
    """Qwen2.5-7B (hidden 3,584, 28 heads and 4 KV heads of 128, intermediate 18,944, vocab 152,064), bf16."""
    spec = get_preset("Qwen2.5-7B")
    # tp 1, per layer: QKV (3,584 + 2 · 512) × 3,584 × 2 B = 33,030,144 = 15.75 × 2 MiB → +0.5 MiB; O 3,584² × 2 B
    # = 12.25 × 2 MiB (1.5 MiB left: split); gate_up 2 · 18,944 × 3,584 × 2 B = 129.5 × 2 MiB → +1 MiB; down
    # 64.75 × 2 MiB → +0.5 MiB: 2 MiB a layer, 56 MiB over 28 layers
    assert layer_rounding(spec, 1, 16, 16, _ffn(spec)) == 28 * 2 * MIB
    # each vocabulary table 152,064 × 3,584 × 2 B = 519.75 × 2 MiB → +0.5 MiB
    assert table_rounding(152_064, 3584, 1, 2) == MIB // 2
    # tp 2: QKV 7.875 × 2 MiB → +0.25 MiB, O 6.125 (split), gate_up 64.75 → +0.5 MiB, down 32.375 (split):
    # 0.75 MiB a layer; each half table 259.875 × 2 MiB → +0.25 MiB
    assert layer_rounding(spec, 2, 16, 16, _ffn(spec)) == 28 * 3 * MIB // 4
    assert table_rounding(152_064, 3584, 2, 2) == MIB // 4


def test_llama_tensors_are_whole_segments():
    """Llama-3-8B's tensors are multiples of 2 MiB at tp 1 (nothing added); at tp 2 each half table is 250.5 × 2 MiB."""
    spec = get_preset("Llama-3-8B")
    assert layer_rounding(spec, 1, 16, 16, _ffn(spec)) == 0
    assert table_rounding(128_256, 4096, 1, 2) == 0
    assert table_rounding(128_256, 4096, 2, 2) == MIB


def _ffn(spec):
    from kvcalc.core.model.vllm_memory import _ffn as ffn

    return ffn(spec)


def _rows() -> list[dict[str, str]]:
    if not (DATA / "startup.csv").exists():
        return []
    with open(DATA / "startup.csv", newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if r["weights_gib"]]


@pytest.mark.skipif(not (DATA / "startup.csv").exists(), reason=f"{DATA} is absent (the shared logs)")
@pytest.mark.parametrize(("model", "tp", "weights"), [
    # params 7,615,616,512 × 2 B / tp + the allocator's rounding + rotary 32,768 × 128 × 2 B
    ("Qwen/Qwen2.5-7B-Instruct", 1, 15_231_233_024 + 57 * MIB + 8 * MIB),  # 14.248 GiB, logged 14.25
    ("Qwen/Qwen2.5-7B-Instruct", 2, 7_615_616_512 + 21 * MIB + MIB // 2 + 8 * MIB),  # 7.121, logged 7.12
    # Qwen2.5-72B-Instruct: params 72,706,203,648 × 2 B / 2; down_proj 8,192 × 14,784 × 2 B = 115.5 × 2 MiB → +1
    # MiB in each of 80 layers (QKV 40, O 32, gate_up 231 × 2 MiB and the half tables 594 × 2 MiB exactly); the
    # instruct checkpoint's rotary cache 32,768 × 128 × 2 B: 67.799 GiB, logged 67.80 (0.06-0.08 GiB short before)
    ("Qwen/Qwen2.5-72B-Instruct", 2, 72_706_203_648 + 80 * MIB + 8 * MIB),
])
def test_weights_against_the_logs(model, tp, weights):
    import dataclasses

    row = next(r for r in _rows() if r["model"] == model and r["tp"] == str(tp) and r["dtype"] == "torch.bfloat16")
    spec = get_preset(model.split("/")[1].removesuffix("-Instruct"))
    spec = dataclasses.replace(spec, max_position_embeddings=32768)  # the instruct checkpoints' config.json
    (got,) = stage_weights(spec, tp, 1)
    assert got == weights
    assert f"{got / GIB:.2f}" == f"{float(row['weights_gib']):.2f}"
