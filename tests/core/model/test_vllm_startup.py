"""kvcalc's prediction of vLLM's start-up against real start-up logs: vLLM 0.19.0 on H100 80GB, from the
llm-d planner's accuracy study (llm-d-incubation/llm-d-planner, Apache-2.0), read from ../shared/vllm_startup/.

Every row that logged "Available KV cache memory" and whose model kvcalc can build (a config.json in
configs/, or a built-in preset of the same checkpoint) is checked; the others are skipped naming why. One
model for all rows (core/model/vllm_memory.py): nothing here is tuned per row.
"""

from __future__ import annotations

import csv
import dataclasses
import re
import statistics
from pathlib import Path

import pytest

from kvcalc.core.model.gpu_plan import plan_gpu
from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.models import PRESETS, ModelSpec
from kvcalc.core.model.vllm_memory import GIB, pp_layers, predict_memory

DATA = Path(__file__).resolve().parents[4] / "shared" / "vllm_startup"
pytestmark = pytest.mark.skipif(not (DATA / "startup.csv").exists(), reason=f"{DATA} is absent (the shared logs)")

_DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}
_QUANT = {"None": None, "": None, "fp8": "fp8", "mxfp4": "mxfp4"}  # vLLM's --quantization values kvcalc models


def _rows() -> list[dict[str, str]]:
    if not (DATA / "startup.csv").exists():
        return []
    with open(DATA / "startup.csv", newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if r["available_kv_gib"]]


# Where an -Instruct checkpoint's config.json differs from its base model's (the preset) in a field the start-up
# reads: Qwen2.5-72B-Instruct's config.json has max_position_embeddings 32,768, the base model's 131,072 (the
# rotary cos/sin cache is max positions × 128 × 2 B: 8 MiB, not 32 MiB, on every GPU).
_INSTRUCT_FIELDS = {"Qwen/Qwen2.5-72B-Instruct": {"max_position_embeddings": 32768}}


def _spec(model: str) -> ModelSpec | None:
    base = re.sub(r"-(instruct|it|chat|hf)$", "", model, flags=re.IGNORECASE)
    for name in (model, base):  # an -Instruct / -Chat checkpoint has its base model's dimensions
        path = DATA / "configs" / name.replace("/", "--") / "config.json"
        if path.exists():
            return load_config(path, name=model)
    base = base.lower()
    for spec in PRESETS.values():
        if spec.source.split()[0].lower() in (model.lower(), base):
            return dataclasses.replace(spec, **_INSTRUCT_FIELDS.get(model, {}))
    return None


def expressed(row: dict[str, str]) -> tuple[ModelSpec, str | None] | str:
    """(spec, quantization) for a row, or the reason kvcalc cannot express it."""
    spec = _spec(row["model"])
    if spec is None:
        return f"{row['model']}: no config.json in {DATA / 'configs'} and no built-in preset"
    if row["quantization"] not in _QUANT:
        return f"{row['model']}: checkpoint quantization {row['quantization']!r} needs its config.json"
    quant = _QUANT[row["quantization"]]
    dtype = _DTYPES[row["dtype"]]
    spec = dataclasses.replace(spec, weight_dtype="fp8" if quant == "fp8" else dtype)
    return spec, quant


def predict(row: dict[str, str]):
    spec, quant = expressed(row)  # type: ignore[misc]
    return spec, predict_memory(
        spec, gpu_memory_bytes=int(float(row["gpu_total_gib"]) * GIB),
        gpu_memory_utilization=float(row["gpu_memory_utilization"]), tp=int(row["tp"]), pp=int(row["pp"]),
        max_num_batched_tokens=int(row["max_num_batched_tokens"]), max_num_seqs=int(row["max_num_seqs"]),
        version=row["vllm_version"], quantization=quant)


def _logged_stage(row: dict[str, str]) -> int:
    """The stage whose worker printed the line (Worker_PP0 / Worker_TP0 / EngineCore: the first)."""
    m = re.search(r"PP(\d+)", row["available_kv_logged_by"])
    return int(m.group(1)) if m else 0


ROWS = _rows()
IDS = [f"{r['model']}-tp{r['tp']}pp{r['pp']}-{r['dtype'][6:]}-{r['quantization']}-kv{r['kv_cache_dtype']}-"
       f"{r['max_model_len']}-{i}" for i, r in enumerate(ROWS)]


def relative_errors() -> list[tuple[str, float]]:
    out = []
    for ident, row in zip(IDS, ROWS, strict=True):
        if isinstance(expressed(row), str):
            continue
        _, m = predict(row)
        logged = float(row["available_kv_gib"])
        out.append((ident, (m.stages[_logged_stage(row)].available / GIB - logged) / logged))
    return out


def test_available_kv_memory_distribution():
    errors = relative_errors()
    assert len(errors) >= 20  # the logs hold 28 expressible rows; fewer means rows stopped being read
    absolute = sorted(abs(e) for _, e in errors)
    assert statistics.median(absolute) <= 0.01, errors
    worst = max(errors, key=lambda e: abs(e[1]))
    # The goal: 3 % worst. The largest misses: Qwen2.5-72B at tp 2 +1.5 % (its weights now match the
    # logged 67.80 GiB; what is left is non-torch memory, 2.09 logged vs 2.07, on a KV budget of only 3.04 GiB)
    # and gpt-oss-20b +0.9 to +1.4 % (its mxfp4 experts are re-laid out after loading: vLLM logs 12.92 GiB at
    # the loader's peak and 13.64 GiB once processed).
    assert abs(worst[1]) <= 0.02, worst


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_each_row(row):
    reason = expressed(row)
    if isinstance(reason, str):
        pytest.skip(reason)
    _, m = predict(row)
    logged = float(row["available_kv_gib"])
    assert m.stages[_logged_stage(row)].available / GIB == pytest.approx(logged, rel=0.02)
    # The term vLLM logs per worker: requested = total × utilization, printed with two decimals.
    assert f"{m.requested / GIB:.2f}" == row["requested_gib"]


# Rows whose logged weights kvcalc does not reproduce to vLLM's two decimals, and why (each within 1.4 % on
# the KV memory): DeepSeek-V2-Lite 29.30 vs 29.43 GiB (MLA: 0.13 GiB above parameters, rotary and rounding
# that kvcalc does not place); gpt-oss-20b 12.83 vs 13.64 (tp 1) and 6.44 vs 7.01 (tp 2): its mxfp4 experts are
# re-laid out after loading (vLLM's own "Peak GPU memory after loading weights" is 12.92 / 6.76 GiB).
_WEIGHTS_NOT_EXACT = ("deepseek-ai/DeepSeek-V2-Lite-Chat", "openai/gpt-oss-20b")


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_weights_line(row):
    """"Model loading took X GiB": parameters, the allocator's rounding of each tensor, the rotary cache."""
    reason = expressed(row)
    if isinstance(reason, str):
        pytest.skip(reason)
    if row["model"] in _WEIGHTS_NOT_EXACT:
        pytest.skip(f"{row['model']}: weights not reproduced exactly (see _WEIGHTS_NOT_EXACT)")
    _, m = predict(row)
    logged = sorted(f"{float(w):.2f}" for w in row["weights_gib_per_worker"].split(";"))  # the workers' order
    stages = sorted(f"{s.weights / GIB:.2f}" for s in m.stages for _ in range(int(row["tp"])))
    assert stages == logged


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_token_and_concurrency_lines(row):
    """From the logged GiB (± 0.005, vLLM's two decimals) kvcalc's blocks must bracket the logged lines: 0.19's
    "GPU KV cache size" (blocks // groups × block size) and "Maximum concurrency" (blocks / blocks per request),
    hybrids (Gemma-2's sliding and full groups, gpt-oss's) included."""
    reason = expressed(row)
    if isinstance(reason, str):
        pytest.skip(reason)
    spec, _ = expressed(row)  # type: ignore[misc]
    tp, pp = int(row["tp"]), int(row["pp"])
    bits = 8 if row["kv_cache_dtype"].startswith("fp8") else (32 if row["dtype"] == "torch.float32" else 16)
    tokens, concurrency = int(row["kv_cache_tokens"]), float(row["max_concurrency"])
    length = int(row["max_concurrency_len"])
    if pp == 1:
        bounds = [plan_gpu(spec, kv_dtype_bits=bits, block_size=16, max_model_len=length, tp=tp,
                           kv_memory_bytes=int((float(row["available_kv_gib"]) + d) * GIB), vllm_version="0.19",
                           max_num_batched_tokens=int(row["max_num_batched_tokens"])) for d in (-0.005, 0.005)]
        assert bounds[0].kv_cache_tokens <= tokens <= bounds[1].kv_cache_tokens
        assert float(bounds[0].max_concurrency) - 0.005 <= concurrency <= float(bounds[1].max_concurrency) + 0.005
        return
    # Pipeline stages: the engine takes the least blocks over the stages; that stage's layers page each block.
    assert len(spec.layer_groups) == 1
    per_layer = spec.layer_groups[0].bits_per_token(bits, tp) * 16 // 8  # one 16-token page of one layer
    per_worker = [float(x) for x in row["available_kv_gib_per_worker"].split(";")]
    least = float(row["available_kv_gib_min_worker"])
    assert least == min(per_worker)
    block = per_layer * max(pp_layers(spec.model_layers, pp))  # Llama's 32 layers split evenly: any stage
    low = int((least - 0.005) * GIB) // block
    high = int((least + 0.005) * GIB) // block
    assert tokens % 16 == 0 and low * 16 <= tokens <= high * 16
    assert low / -(-length // 16) - 0.005 <= concurrency <= high / -(-length // 16) + 0.005


def _row(model: str, **match: str) -> dict[str, str]:
    rows = [r for r in ROWS if r["model"] == model and all(r[k] == v for k, v in match.items())]
    if not rows:
        pytest.skip(f"{model} is not in {DATA / 'startup.csv'}")
    return rows[0]


@pytest.mark.parametrize(("model", "dtype", "scheme"), [
    # RedHat's checkpoints of Llama-3.1-8B: linear layers int8 (w8a8, compressed-tensors) or int4 (w4a16, GPTQ
    # run by Marlin); embeddings and LM head stay 16-bit. vLLM logs the weights it loaded.
    ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", "torch.float16", "int8"),
    ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16", "torch.float16", "int4"),
    ("meta-llama/Llama-3.1-8B-Instruct", "torch.bfloat16", "fp8"),  # vLLM --quantization fp8, online
])
def test_quantized_weights_against_the_logs(model, dtype, scheme):
    from kvcalc.core.model.vllm_memory import stage_weights

    row = _row(model, dtype=dtype, quantization={"int8": "compressed-tensors", "int4": "gptq_marlin",
                                                 "fp8": "fp8"}[scheme])
    base = _spec("meta-llama/Llama-3.1-8B-Instruct")
    assert base is not None
    # body 8,029,995,008 − 2 · 128,256 · 4,096 = 6,979,321,856 parameters; int8: 6,979,321,856 B + two 16-bit
    # tables 2 · 1,050,673,152 B + rotary 131,072 · 128 · 2 B = 9,114,116,096 B = 8.488 GiB (logged 8.49);
    # int4: 6,979,321,856 · (4 + 20/128) / 8 B (a 16-bit scale and a 4-bit zero per 128) + the same = 5.37 GiB
    # (logged 5.38)
    (weights,) = stage_weights(dataclasses.replace(base, weight_dtype=scheme), 1, 1)
    if scheme == "int8":
        assert weights == 6_979_321_856 + 2 * 1_050_673_152 + 131_072 * 128 * 2
    assert weights / GIB == pytest.approx(float(row["weights_gib"]), abs=0.03)


def test_vision_tower_against_the_logs():
    """granite-vision-3.3-2b is granite-3.1-2b plus a SigLIP-so400m tower: vLLM loads 0.80 GiB more for it."""
    from kvcalc.core.model.weights import vision_tower_params

    vision = _row("ibm-granite/granite-vision-3.3-2b")
    text = _row("ibm-granite/granite-3.1-2b-instruct")
    siglip = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "patch_size": 14,
              "image_size": 384, "hidden_act": "gelu_pytorch_tanh"}
    # per layer 4·1152² + 4·1152 + 2·1152·4304 + 4304 + 1152 + 4·1152 = 15,239,504; × 27 = 411,466,608;
    # patches 3·14²·1152 + 1152 = 678,528; positions 27² · 1152 = 839,808; final norm 2,304;
    # projector 1152 · 2048 + 2048² = 6,553,600
    params = vision_tower_params(siglip, 2048)
    assert params == 411_466_608 + 678_528 + 839_808 + 2_304 + 6_553_600
    logged = float(vision["weights_gib"]) - float(text["weights_gib"])
    assert params * 2 / GIB == pytest.approx(logged, abs=0.03)  # 0.78 vs 0.80 GiB (its projector is wider)


@pytest.mark.parametrize(("quantization_config", "expected"), [
    ({"quant_method": "mxfp4"}, "mxfp4"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "int4"),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "int"}, "targets": ["Linear"]}}}, "int8"),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}}}, "fp8"),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}, "targets": ["Linear"]}}}, "int4"),
    ({"quant_method": "bitnet"}, None),
])
def test_checkpoint_quantization(quantization_config, expected):
    from kvcalc.core.model.weights import checkpoint_quantization

    assert checkpoint_quantization({"quantization_config": quantization_config}) == expected
    assert checkpoint_quantization({}) is None


def test_preset_and_its_config_give_one_activation():
    """Qwen3-30B-A3B: the preset's intermediate_size is the experts' (768), the config's the unused dense 6,144;
    both read as 48 MoE layers of 128 experts × 768, so the activation peak is one figure."""
    from kvcalc.core.model.models import get_preset
    from kvcalc.core.model.vllm_memory import forward_peak, moe_workspace

    config = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
              "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
              "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False,
              "torch_dtype": "bfloat16"}
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(config))
        from_config = load_config(Path(d) / "config.json")
    preset = get_preset("Qwen3-30B-A3B")
    for spec in (from_config, preset):
        # no dense MLP: the forward's buffers fall back to 4 · hidden wide, 8,192 · 5 · 8,192 · 2 B = 0.625 GiB;
        # the MoE workspace 8,192 tokens · 8 experts · (max(2 · 768, 2,048) + 768) · 2 B = 0.34375 GiB
        assert forward_peak(spec, 8192, 1) == 8192 * 5 * 8192 * 2
        assert moe_workspace(spec, 8192, 1) == 8192 * 8 * (2048 + 768) * 2
    one = predict_memory(from_config, gpu_memory_bytes=80 * GIB, gpu_memory_utilization=0.9, version="0.19")
    two = predict_memory(preset, gpu_memory_bytes=80 * GIB, gpu_memory_utilization=0.9, version="0.19")
    assert one.stages[0].activation == two.stages[0].activation


def test_cuda_graph_estimate_is_the_logged_median():
    """0.21 subtracts vLLM's CUDA-graph estimate, which 0.19 already logs: kvcalc's flat figure is its median over
    the logged runs (0.84 GiB; the runs range 0.49-1.82 GiB, so for one model it may be off by 1 GiB)."""
    from kvcalc.core.model.vllm_memory import CUDA_GRAPH_ESTIMATE

    logged = [float(r["cuda_graph_estimated_gib"]) for r in ROWS if r["cuda_graph_estimated_gib"]]
    assert len(logged) >= 40
    assert f"{CUDA_GRAPH_ESTIMATE / GIB:.2f}" == f"{statistics.median(logged):.2f}"
