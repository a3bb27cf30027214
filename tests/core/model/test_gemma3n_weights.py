"""Gemma-3n's towers and per-layer embeddings in the weights (core/model/gemma3n_weights.py): each closed form
against transformers' own modules (built on the meta device, so nothing is allocated; skipped without
transformers), the whole against the model card's "raw parameter count ... 8B", and the CLI planning the GPU
without --weights-bytes / --kv-memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from real_configs import real_config

from kvcalc.core.model.gemma3n_weights import TIMM_ENCODERS, gemma3n_params
from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.weights import config_vision_params, estimate_params

# google/gemma-3n-E4B-it's vision_config and audio_config (config.json)
VISION = {"architecture": "mobilenetv5_300m_enc", "do_pooling": False, "hidden_size": 2048,
          "model_type": "gemma3n_vision", "num_classes": 2, "rms_norm_eps": 1e-06, "vocab_offset": 262144,
          "vocab_size": 128}
AUDIO = {"conf_attention_chunk_size": 12, "conf_attention_context_left": 13, "conf_attention_context_right": 0,
         "conf_attention_logit_cap": 50.0, "conf_conv_kernel_size": 5, "conf_num_attention_heads": 8,
         "conf_num_hidden_layers": 12, "conf_reduction_factor": 4, "conf_residual_weight": 0.5,
         "gradient_clipping": 10000000000.0, "hidden_size": 1536, "input_feat_size": 128,
         "model_type": "gemma3n_audio", "rms_norm_eps": 1e-06, "sscp_conv_channel_size": [128, 32],
         "sscp_conv_group_norm_eps": 0.001, "sscp_conv_kernel_size": [[3, 3], [3, 3]],
         "sscp_conv_stride_size": [[2, 2], [2, 2]], "vocab_offset": 262272, "vocab_size": 128}
E4B = {**real_config("GEMMA3N_E4B"), "vision_config": VISION, "audio_config": AUDIO}

# By hand, E4B (text hidden 2,048):
# audio: sscp conv 128·1·3·3 + 128 = 1,280; 32·128·3·3 + 32 = 36,896; frequencies 128 → (128 + 2 − 3) // 2 + 1 = 64
#   → 32: projection 1,536 · 32 · 32 = 1,572,864; sscp 1,611,040. A block 24 · 1,536² + 5 · 1,536 + 9 · 1,536 +
#   1,536 / 8 = 56,623,104 + 7,680 + 13,824 + 192 = 56,644,800; 12 blocks 679,737,600. Tower 681,348,640.
# embedders: audio 128 · 1,536 + 2 · 1,536 + 1,536 · 2,048 = 3,345,408; vision 128 · 2,048 + 2 · 2,048 + 2,048² =
#   4,460,544
# text: per-layer embeddings 262,144 · 35 · 256 = 2,348,810,240, projection 35 · 256 · 2,048 = 18,350,080, its norm
#   256; AltUp projections 2 · 3 · 2,048² = 25,165,824; a layer (4 + 4 + 2 · 64 + 2 · 256) · 2,048 + 16 + 64 =
#   1,327,184, 35 of them 46,451,440: 2,438,777,840
AUDIO_TOWER, AUDIO_EMBED, VISION_EMBED, TEXT_EXTRAS = 681_348_640, 3_345_408, 4_460_544, 2_438_777_840


def _write(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_hand_counts() -> None:
    assert gemma3n_params(E4B, 2048, "weights_bytes") == (
        AUDIO_TOWER + AUDIO_EMBED + TIMM_ENCODERS["mobilenetv5_300m_enc"] + VISION_EMBED + TEXT_EXTRAS)
    assert config_vision_params(E4B, 2048) == 3_422_059_344


def test_against_transformers_modules() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma3n import modeling_gemma3n as m

    def count(module) -> int:
        return sum(p.numel() for p in module.parameters())

    text_fields = {k: v for k, v in real_config("GEMMA3N_E4B")["text_config"].items()
                   if k not in ("model_type", "torch_dtype")}
    text = transformers.Gemma3nTextConfig(**text_fields)
    audio = transformers.Gemma3nAudioConfig(**{k: v for k, v in AUDIO.items() if k != "model_type"})
    vision = transformers.Gemma3nVisionConfig(**{k: v for k, v in VISION.items() if k != "model_type"})
    with torch.device("meta"):
        assert count(m.Gemma3nAudioEncoder(audio)) == AUDIO_TOWER
        assert count(m.Gemma3nMultimodalEmbedder(audio, text)) == AUDIO_EMBED
        assert count(m.Gemma3nMultimodalEmbedder(vision, text)) == VISION_EMBED
        model = m.Gemma3nTextModel(text)
    extras = ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm", "altup_",
              ".altup.", ".laurel.", "per_layer_input_gate", "per_layer_projection.", "post_per_layer_input_norm")
    ours = sum(p.numel() for name, p in model.named_parameters() if any(e in name for e in extras))
    assert ours == TEXT_EXTRAS
    # the rest of transformers' text model is the dimension estimate plus its norms (which the estimate leaves out):
    # 35 layers' 4 RMSNorms of 2,048, q/k norms of 256 (20 layers; 15 KV-shared layers have no K), the final norm
    spec = load_config(_write_dir(E4B))
    norms = 35 * 4 * 2048 + 35 * 256 + 20 * 256 + 2048
    assert count(model) == estimate_params(spec).total + TEXT_EXTRAS + norms


def _write_dir(config: dict) -> Path:
    import tempfile

    return _write(Path(tempfile.mkdtemp()), config)


def test_vision_encoder_count_is_timms() -> None:
    timm = pytest.importorskip("timm")
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        encoder = timm.create_model("mobilenetv5_300m_enc", pretrained=False, num_classes=0)
    assert sum(p.numel() for p in encoder.parameters()) == TIMM_ENCODERS["mobilenetv5_300m_enc"]


def test_whole_model_is_the_model_cards_8b(tmp_path) -> None:
    spec = load_config(_write(tmp_path, E4B))
    # decoder estimate: embeddings 262,400 · 2,048 (tied) = 537,395,200; 35 layers' Q and O 2 · 2,048² and MLP
    # 3 · 2,048 · 16,384; K and V 2 · 2,048 · 512 in the 20 layers that keep KV: 4,396,154,880
    assert estimate_params(spec).total == 537_395_200 + 35 * (2 * 2048**2 + 3 * 2048 * 16384) + 20 * 2 * 2048 * 512
    total = estimate_params(spec).total + config_vision_params(E4B, spec.hidden_size)
    assert total == 7_818_214_224
    assert 7.5e9 <= total < 8.5e9  # "the raw parameter count of this model is 8B": 8B to one significant digit


def test_unknown_parts_are_refused_by_name() -> None:
    with pytest.raises(Exception, match=r"vision_config architecture 'other_net'.*give weights_bytes"):
        gemma3n_params({**E4B, "vision_config": {**VISION, "architecture": "other_net"}}, 2048, "weights_bytes")
    with pytest.raises(Exception, match=r"audio_config has no conf_num_hidden_layers"):
        gemma3n_params({**E4B, "audio_config": {k: v for k, v in AUDIO.items() if k != "conf_num_hidden_layers"}},
                       2048, "weights_bytes")


def test_size_gpu_plans_gemma3n_without_weights_bytes(run_cli, tmp_path) -> None:
    folder = _write(tmp_path, E4B)
    result = run_cli("size", "--config", str(folder), "--gpu", "H100-SXM", "--json")
    assert result.exit_code == 0, result.stderr
    weights = result.json()["gpu_plan"]["weights_bytes"]
    # 7,818,214,224 parameters at 2 B = 14.56 GiB, plus vLLM's rotary cache and allocator rounding (under 1 %)
    assert 7_818_214_224 * 2 <= weights <= 7_818_214_224 * 2 * 1.01
