"""Built-in model presets, each with the numbers of its published config.json, and lookup by name.

Each entry cites its config (huggingface.co/<repo>/blob/main/config.json). `num_params` is the total
parameter count of the language model from those dimensions (embeddings, attention or mixer, MLP or
experts, norms, biases, an untied lm_head where the model has one); each equals the total that the model
card or the safetensors index reports (for multimodal checkpoints: without the vision tower).
`num_active_params` (MoE only) counts what one token passes through, input embedding included.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import ParameterError
from .layers import LayerGroup
from .model_spec import ModelSpec
from .state import RecurrentState

# Built-in presets by lower-case name.
PRESETS: dict[str, ModelSpec] = {}


def _preset(spec: ModelSpec) -> None:
    PRESETS[spec.name.lower()] = spec


def _with_mtp(spec: ModelSpec, count: int) -> ModelSpec:
    """`spec` with its config's `num_nextn_predict_layers` MTP layers as drafter layers, as the config reader
    (hf_config.drafter_groups) gives them: the model's own attention layer, kept out of `layer_groups` (they
    keep KV only when speculative decoding drafts with them: size --spec-method mtp)."""
    main = next(g for g in spec.layer_groups if g.kind in ("full", "mla"))
    drafter = dataclasses.replace(main, count=count, note="MTP drafter (num_nextn_predict_layers)")
    return dataclasses.replace(spec, drafter_groups=(drafter,), drafter_field="num_nextn_predict_layers")


# facebook/opt-13b: num_hidden_layers 40, num_attention_heads 40 (MHA), hidden_size 5120 (head_dim 128),
# ffn_dim 20480, vocab_size 50272, max_position_embeddings 2048. Params 12,853,473,280: layers
# 40 x 314,639,360 (q/k/v/out and fc1/fc2 with biases, 2 LayerNorms) + tokens 50272x5120 + 2050 learned
# positions x5120 + final LayerNorm; lm_head tied. vLLM paper: 800 KiB of KV per token at fp16.
_preset(ModelSpec(
    name="OPT-13B", layers=40, num_attention_heads=40, kv_heads=40, head_dim=128, hidden_size=5120,
    intermediate_size=20480, vocab_size=50272, max_position_embeddings=2048, num_params=12_853_473_280,
    source="facebook/opt-13b config.json",
))
# meta-llama/Llama-2-7b-hf: 32 layers, 32 heads, num_key_value_heads 32 (MHA), hidden 4096 (head_dim 128),
# intermediate 11008, vocab 32000, max_position_embeddings 4096. Params 6,738,415,616 (6.74B).
_preset(ModelSpec(
    name="Llama-2-7B", layers=32, num_attention_heads=32, kv_heads=32, head_dim=128, hidden_size=4096,
    intermediate_size=11008, vocab_size=32000, max_position_embeddings=4096, num_params=6_738_415_616,
    source="meta-llama/Llama-2-7b-hf config.json",
))
# meta-llama/Llama-2-70b-hf: 80 layers, 64 heads, 8 KV heads, hidden 8192 (head_dim 128), intermediate 28672,
# vocab 32000, max_position_embeddings 4096. Params 68,976,648,192 (69.0B).
_preset(ModelSpec(
    name="Llama-2-70B", layers=80, num_attention_heads=64, kv_heads=8, head_dim=128, hidden_size=8192,
    intermediate_size=28672, vocab_size=32000, max_position_embeddings=4096, num_params=68_976_648_192,
    source="meta-llama/Llama-2-70b-hf config.json",
))
# meta-llama/Meta-Llama-3-8B: 32 layers, 32 heads, 8 KV heads, hidden 4096 (head_dim 128), intermediate
# 14336, vocab 128256, max_position_embeddings 8192. Params 8,030,261,248 (8.03B). 128 KiB per token at bf16.
_preset(ModelSpec(
    name="Llama-3-8B", layers=32, num_attention_heads=32, kv_heads=8, head_dim=128, hidden_size=4096,
    intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192, num_params=8_030_261_248,
    source="meta-llama/Meta-Llama-3-8B config.json",
))
# meta-llama/Meta-Llama-3-70B: 80 layers, 64 heads, 8 KV heads, hidden 8192 (head_dim 128), intermediate
# 28672, vocab 128256, max_position_embeddings 8192. Params 70,553,706,496 (70.6B).
_preset(ModelSpec(
    name="Llama-3-70B", layers=80, num_attention_heads=64, kv_heads=8, head_dim=128, hidden_size=8192,
    intermediate_size=28672, vocab_size=128256, max_position_embeddings=8192, num_params=70_553_706_496,
    source="meta-llama/Meta-Llama-3-70B config.json",
))
# meta-llama/Llama-3.1-405B: 126 layers, 128 heads, 8 KV heads, hidden 16384 (head_dim 128), intermediate
# 53248, vocab 128256, max_position_embeddings 131072. Params 405,853,388,800 (405.9B).
_preset(ModelSpec(
    name="Llama-3.1-405B", layers=126, num_attention_heads=128, kv_heads=8, head_dim=128, hidden_size=16384,
    intermediate_size=53248, vocab_size=128256, max_position_embeddings=131072, num_params=405_853_388_800,
    source="meta-llama/Llama-3.1-405B config.json",
))
# mistralai/Mistral-7B-v0.1: 32 layers, 32 heads, 8 KV heads, hidden 4096 (head_dim 128), intermediate 14336,
# vocab 32000, max_position_embeddings 32768, sliding_window 4096 on every layer. Params 7,241,732,096.
_preset(ModelSpec(
    name="Mistral-7B-v0.1", layers=32, num_attention_heads=32, kv_heads=8, head_dim=128, hidden_size=4096,
    intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768, num_params=7_241_732_096,
    sliding_window=4096, num_sliding_layers=32, source="mistralai/Mistral-7B-v0.1 config.json",
))
# mistralai/Mixtral-8x7B-v0.1: 32 layers, 32 heads, 8 KV heads, hidden 4096 (head_dim 128), 8 experts of
# intermediate 14336, 2 per token (num_local_experts 8, num_experts_per_tok 2), vocab 32000,
# max_position_embeddings 32768, sliding_window null (no window; the first release said 4096, Mistral
# corrected it). Params 46,702,792,704 (46.7B); active
# 12,879,925,248 (12.9B: attention, 2 experts, router, norms, embeddings and lm_head).
_preset(ModelSpec(
    name="Mixtral-8x7B", layers=32, num_attention_heads=32, kv_heads=8, head_dim=128, hidden_size=4096,
    intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768, num_params=46_702_792_704,
    num_active_params=12_879_925_248, num_experts=8, experts_per_token=2,
    source="mistralai/Mixtral-8x7B-v0.1 config.json",
))
# Qwen/Qwen2.5-7B: 28 layers, 28 heads, 4 KV heads, hidden 3584 (head_dim 128), intermediate 18944, vocab
# 152064, max_position_embeddings 131072, sliding_window 131072 with use_sliding_window false (no window).
# Params 7,615,616,512 (7.61B; q/k/v biases, untied lm_head).
_preset(ModelSpec(
    name="Qwen2.5-7B", layers=28, num_attention_heads=28, kv_heads=4, head_dim=128, hidden_size=3584,
    intermediate_size=18944, vocab_size=152064, max_position_embeddings=131072, num_params=7_615_616_512,
    source="Qwen/Qwen2.5-7B config.json",
))
# Qwen/Qwen2.5-72B: 80 layers, 64 heads, 8 KV heads, hidden 8192 (head_dim 128), intermediate 29568, vocab
# 152064, max_position_embeddings 131072, use_sliding_window false. Params 72,706,203,648 (72.7B).
_preset(ModelSpec(
    name="Qwen2.5-72B", layers=80, num_attention_heads=64, kv_heads=8, head_dim=128, hidden_size=8192,
    intermediate_size=29568, vocab_size=152064, max_position_embeddings=131072, num_params=72_706_203_648,
    source="Qwen/Qwen2.5-72B config.json",
))
# Qwen/Qwen3-8B: 36 layers, 32 heads, 8 KV heads, head_dim 128, hidden 4096, intermediate 12288, vocab
# 151936, max_position_embeddings 40960, use_sliding_window false. Params 8,190,735,360 (8.19B).
_preset(ModelSpec(
    name="Qwen3-8B", layers=36, num_attention_heads=32, kv_heads=8, head_dim=128, hidden_size=4096,
    intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960, num_params=8_190_735_360,
    source="Qwen/Qwen3-8B config.json",
))
# Qwen/Qwen3-32B: 64 layers, 64 heads, 8 KV heads, head_dim 128 (not hidden/heads = 80), hidden 5120,
# intermediate 25600, vocab 151936, max_position_embeddings 40960. Params 32,762,123,264 (32.8B).
_preset(ModelSpec(
    name="Qwen3-32B", layers=64, num_attention_heads=64, kv_heads=8, head_dim=128, hidden_size=5120,
    intermediate_size=25600, vocab_size=151936, max_position_embeddings=40960, num_params=32_762_123_264,
    source="Qwen/Qwen3-32B config.json",
))
# tiiuae/falcon-7b: 32 layers, 71 heads, multi_query true (1 KV head), hidden 4544 (head_dim 64), MLP 4 x
# hidden = 18176, vocab 65024; the config gives no max_position_embeddings, the model card trains at 2048.
# Params 6,921,720,704 (6.92B; lm_head tied).
_preset(ModelSpec(
    name="Falcon-7B", layers=32, num_attention_heads=71, kv_heads=1, head_dim=64, hidden_size=4544,
    intermediate_size=18176, vocab_size=65024, max_position_embeddings=2048, num_params=6_921_720_704,
    source="tiiuae/falcon-7b config.json",
))
# google/gemma-2-9b: 42 layers, 16 heads, 8 KV heads, head_dim 256, hidden 3584, intermediate 14336, vocab
# 256000, max_position_embeddings 8192, sliding_window 4096 on every other layer (transformers' Gemma2
# slides on even layer indices: 21 of 42). Params 9,241,705,984 (9.24B; lm_head tied).
_preset(ModelSpec(
    name="Gemma-2-9B", layers=42, num_attention_heads=16, kv_heads=8, head_dim=256, hidden_size=3584,
    intermediate_size=14336, vocab_size=256000, max_position_embeddings=8192, num_params=9_241_705_984,
    sliding_window=4096, num_sliding_layers=21, source="google/gemma-2-9b config.json",
))
# deepseek-ai/DeepSeek-V3: 61 layers (first 3 dense, intermediate 18432; then MoE: 256 routed experts of
# 2048 + 1 shared, 8 per token: n_routed_experts 256, n_shared_experts 1, num_experts_per_tok 8), 128 heads,
# MLA with kv_lora_rank 512 + qk_rope_head_dim 64 (576 cached scalars per token per layer), qk_nope_head_dim
# 128 (q/k heads are 192 wide), hidden 7168, vocab 129280,
# max_position_embeddings 163840. The config's num_key_value_heads 128 is not the cache: like vLLM we
# count one cached "head" (the latent). Params 671,026,419,200 (671B, without the 14B multi-token-prediction
# module that the 685B checkpoint adds); active 37,552,297,472 (counted like num_params, i.e. with the
# 0.93B input embedding; DeepSeek's report says 36.6B, which leaves the embedding out). The checkpoint stores
# the weights in fp8 (quantization_config: fp8, e4m3). num_nextn_predict_layers 1: one MTP layer (MLA like the
# others), whose KV counts only with --spec-method mtp.
_preset(_with_mtp(ModelSpec(
    name="DeepSeek-V3", layers=61, num_attention_heads=128, kv_heads=1, head_dim=192, hidden_size=7168,
    intermediate_size=18432, vocab_size=129280, max_position_embeddings=163840, num_params=671_026_419_200,
    num_active_params=37_552_297_472, kv_lora_rank=512, qk_rope_head_dim=64, num_experts=256, experts_per_token=8,
    weight_dtype="fp8", source="deepseek-ai/DeepSeek-V3 config.json",
), 1))


# meta-llama/Llama-3.1-8B: the Llama-3-8B dimensions (32 layers, 32 heads, 8 KV heads, head_dim 128, hidden
# 4096, intermediate 14336, vocab 128256) with max_position_embeddings 131072. Params 8,030,261,248.
_preset(ModelSpec(
    name="Llama-3.1-8B", layers=32, num_attention_heads=32, kv_heads=8, head_dim=128, hidden_size=4096,
    intermediate_size=14336, vocab_size=128256, max_position_embeddings=131072, num_params=8_030_261_248,
    source="meta-llama/Llama-3.1-8B config.json",
))
# meta-llama/Llama-3.1-70B: 80 layers, 64 heads, 8 KV heads, hidden 8192 (head_dim 128), intermediate 28672,
# vocab 128256, max_position_embeddings 131072. Params 70,553,706,496.
_preset(ModelSpec(
    name="Llama-3.1-70B", layers=80, num_attention_heads=64, kv_heads=8, head_dim=128, hidden_size=8192,
    intermediate_size=28672, vocab_size=128256, max_position_embeddings=131072, num_params=70_553_706_496,
    source="meta-llama/Llama-3.1-70B config.json",
))
# meta-llama/Llama-3.3-70B-Instruct: the same dimensions as Llama-3.1-70B. Params 70,553,706,496.
_preset(ModelSpec(
    name="Llama-3.3-70B", layers=80, num_attention_heads=64, kv_heads=8, head_dim=128, hidden_size=8192,
    intermediate_size=28672, vocab_size=128256, max_position_embeddings=131072, num_params=70_553_706_496,
    source="meta-llama/Llama-3.3-70B-Instruct config.json",
))
# openai/gpt-oss-20b: 24 layers alternating sliding (window 128) and full attention (layer_types, sliding
# first), 64 heads, 8 KV heads, head_dim 64, hidden 2880, 32 experts of intermediate 2880, 4 per token
# (num_local_experts, num_experts_per_tok), vocab 201088, max_position_embeddings 131072, untied.
# Params 20,914,757,184 (20.91B); active 4,187,440,704: 24 layers · 28 unpicked experts · 24,891,840 fewer
# (OpenAI's 3.61B leaves out the 579M input embedding).
_preset(ModelSpec(
    name="gpt-oss-20b", layers=24, num_attention_heads=64, kv_heads=8, head_dim=64, hidden_size=2880,
    intermediate_size=2880, vocab_size=201088, max_position_embeddings=131072, num_params=20_914_757_184,
    num_active_params=4_187_440_704, sliding_window=128, num_sliding_layers=12, num_experts=32, experts_per_token=4,
    weight_dtype="bf16", source="openai/gpt-oss-20b config.json",
))
# openai/gpt-oss-120b: as gpt-oss-20b with 36 layers and 128 experts. Params 116,829,156,672 (116.83B);
# active 5,715,982,912 (36 · 124 · 24,891,840 fewer; OpenAI's 5.13B leaves out the input embedding).
_preset(ModelSpec(
    name="gpt-oss-120b", layers=36, num_attention_heads=64, kv_heads=8, head_dim=64, hidden_size=2880,
    intermediate_size=2880, vocab_size=201088, max_position_embeddings=131072, num_params=116_829_156_672,
    num_active_params=5_715_982_912, sliding_window=128, num_sliding_layers=18, num_experts=128,
    experts_per_token=4, weight_dtype="bf16", source="openai/gpt-oss-120b config.json",
))
# How a preset's checkpoint stores its weights when not at one precision (config.json's quantization_config):
# openai/gpt-oss-20b and -120b quantize the routed experts to MXFP4 (quant_method mxfp4), which vLLM loads as
# such (13.64 GiB of weights for gpt-oss-20b on an H100, ../shared/vllm_startup/startup.csv), not as bf16.
PRESET_CHECKPOINT_QUANTIZATION = {"gpt-oss-20b": "mxfp4", "gpt-oss-120b": "mxfp4"}
# google/gemma-3-12b-it (text_config): 48 layers, 16 heads, 8 KV heads, head_dim 256, hidden 3840,
# intermediate 15360, vocab 262208, max_position_embeddings 131072, sliding_window 1024 on 5 of every 6
# layers (sliding_window_pattern 6: 40 sliding, 8 global). Params 11,766,034,176 (the language model;
# the vision tower adds 0.42B); tied embeddings.
_preset(ModelSpec(
    name="Gemma-3-12B", layers=48, num_attention_heads=16, kv_heads=8, head_dim=256, hidden_size=3840,
    intermediate_size=15360, vocab_size=262208, max_position_embeddings=131072, num_params=11_766_034_176,
    sliding_window=1024, num_sliding_layers=40, tie_word_embeddings=True, source="google/gemma-3-12b-it config.json",
))
# google/gemma-3-27b-it (text_config): 62 layers, 32 heads, 16 KV heads, head_dim 128, hidden 5376,
# intermediate 21504, vocab 262208, max_position_embeddings 131072, sliding_window 1024 with pattern 6
# (52 sliding, 10 global). Params 27,009,346,304 (the language model); tied embeddings.
_preset(ModelSpec(
    name="Gemma-3-27B", layers=62, num_attention_heads=32, kv_heads=16, head_dim=128, hidden_size=5376,
    intermediate_size=21504, vocab_size=262208, max_position_embeddings=131072, num_params=27_009_346_304,
    sliding_window=1024, num_sliding_layers=52, tie_word_embeddings=True, source="google/gemma-3-27b-it config.json",
))
# Qwen/Qwen3-30B-A3B: 48 layers, 32 heads, 4 KV heads, head_dim 128, hidden 2048, every layer MoE with 128
# experts of moe_intermediate_size 768, 8 per token, vocab 151936, max_position_embeddings 40960, untied.
# Params 30,532,122,624 (30.5B); active 3,353,032,704 (48 · 120 unpicked experts · 3 · 2048 · 768 fewer).
_preset(ModelSpec(
    name="Qwen3-30B-A3B", layers=48, num_attention_heads=32, kv_heads=4, head_dim=128, hidden_size=2048,
    intermediate_size=768, vocab_size=151936, max_position_embeddings=40960, num_params=30_532_122_624,
    num_active_params=3_353_032_704, num_experts=128, experts_per_token=8, source="Qwen/Qwen3-30B-A3B config.json",
))
# meta-llama/Llama-4-Scout-17B-16E (text_config): 48 layers, 40 heads, 8 KV heads, head_dim 128, hidden
# 5120; attention_chunk_size 8192 on the RoPE layers and full attention on the NoPE ones (no_rope_layers
# [1, 1, 1, 0] · 12: 36 chunked, 12 global); every layer MoE (interleave_moe_layer_step 1) with 16 experts
# of 8192 plus one shared expert, 1 per token; vocab 202048, max_position_embeddings 10485760.
# Params 107,769,861,120 (the language model); active 17,172,894,720 (48 · 15 unpicked experts · 125,829,120).
_LLAMA4_ATTENTION: dict[str, Any] = {"kv_heads": 8, "k_head_dim": 128, "v_head_dim": 128, "q_heads": 40}
_preset(ModelSpec.from_groups(
    "Llama-4-Scout",
    (LayerGroup("chunked", 36, window=8192, **_LLAMA4_ATTENTION), LayerGroup("full", 12, **_LLAMA4_ATTENTION)),
    num_attention_heads=40, hidden_size=5120, intermediate_size=8192, vocab_size=202048,
    max_position_embeddings=10_485_760, num_params=107_769_861_120, num_active_params=17_172_894_720, num_experts=16,
    experts_per_token=1, source="meta-llama/Llama-4-Scout-17B-16E config.json",
))
# nvidia/Nemotron-H-56B-Base-8K: 118 layers by hybrid_override_pattern, 10 attention ("*", 64 heads, 8 KV
# heads, head_dim 128), 54 Mamba-2 ("M": 256 heads of 64, n_groups 8, ssm_state_size 256, conv_kernel 4,
# expand 2 -> d_inner 16384) and 54 MLP ("-", relu2, intermediate 32768); hidden 8192, vocab 131072,
# max_position_embeddings 8192. The conv state is bf16 (torch_dtype), the SSM state float32 (the
# mamba_ssm_cache_dtype default of transformers' NemotronHConfig). Params 56,324,350,464.
_preset(ModelSpec.from_groups(
    "Nemotron-H-56B",
    (LayerGroup("full", 10, kv_heads=8, k_head_dim=128, v_head_dim=128, q_heads=64),
     LayerGroup("none", 54, note="mamba2", state=RecurrentState(
         "mamba2", conv_dtype="bf16", ssm_dtype="fp32", d_inner=16384, d_conv=4, d_state=256, heads=256,
         head_dim=64, n_groups=8)),
     LayerGroup("none", 54, note="MLP only")),
    num_attention_heads=64, hidden_size=8192, intermediate_size=32768, vocab_size=131072,
    max_position_embeddings=8192, num_params=56_324_350_464, source="nvidia/Nemotron-H-56B-Base-8K config.json",
))


def _key(name: str) -> str:
    """Lookup key: lower case, letters and digits only ('llama3-8b' and 'Llama-3-8B' meet)."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def get_preset(name: str) -> ModelSpec:
    """Case-insensitive lookup (punctuation ignored); an unknown name raises ValueError naming the closest."""
    spec = PRESETS.get(name.strip().lower())
    if spec is None:
        matches = [s for s in PRESETS.values() if _key(s.name) == _key(name)]
        if len(matches) == 1:
            return matches[0]
        import difflib

        by_key = {_key(s.name): s.name for s in PRESETS.values()}
        close = [by_key[k] for k in difflib.get_close_matches(_key(name), list(by_key), n=3, cutoff=0.5)]
        hint = f"did you mean {', '.join(close)}?" if close else f"choose one of {', '.join(by_key.values())}"
        raise ParameterError(f"unknown model {name!r}: {hint} (kvcalc size lists them all; a Hugging Face model is "
                             "{model} org/name from the local hub cache, or {config} DIR)", "model", "config")
    return spec
