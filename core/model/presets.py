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


def _from_row(name: str, layers: int, num_attention_heads: int, kv_heads: int, head_dim: int, hidden_size: int,
              intermediate_size: int, vocab_size: int, max_position_embeddings: int, num_params: int, repo: str,
              extra: dict[str, Any] | None = None) -> ModelSpec:
    """The spec of one row of `_UNIFORM`; `extra` holds the fields only some models have (ModelSpec's
    keywords) and `num_nextn_predict_layers`, the config's MTP layer count (_with_mtp)."""
    fields = dict(extra or {})
    mtp_layers = fields.pop("num_nextn_predict_layers", 0)
    spec = ModelSpec(
        name=name, layers=layers, num_attention_heads=num_attention_heads, kv_heads=kv_heads, head_dim=head_dim,
        hidden_size=hidden_size, intermediate_size=intermediate_size, vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings, num_params=num_params, source=f"{repo} config.json",
        **fields)
    return _with_mtp(spec, mtp_layers) if mtp_layers else spec


def _with_mtp(spec: ModelSpec, count: int) -> ModelSpec:
    """`spec` with its config's `num_nextn_predict_layers` MTP layers as drafter layers, as the config reader
    (hf_config.drafter_groups) gives them: the model's own attention layer, kept out of `layer_groups` (they
    keep KV only when speculative decoding drafts with them: size --spec-method mtp)."""
    main = next(g for g in spec.layer_groups if g.kind in ("full", "mla"))
    drafter = dataclasses.replace(main, count=count, note="MTP drafter (num_nextn_predict_layers)")
    return dataclasses.replace(spec, drafter_groups=(drafter,), drafter_field="num_nextn_predict_layers")


# The presets given by uniform dimensions, one row each: name, layers, num_attention_heads, kv_heads, head_dim,
# hidden_size, intermediate_size, vocab_size, max_position_embeddings, num_params, the Hugging Face repo whose
# config.json gives them (the spec's source), then the fields only some models have (see _from_row).
_UNIFORM: tuple[tuple[Any, ...], ...] = (
    # facebook/opt-13b: num_hidden_layers 40, num_attention_heads 40 (MHA), hidden_size 5120 (head_dim 128),
    # ffn_dim 20480, vocab_size 50272, max_position_embeddings 2048. Params 12,853,473,280: layers
    # 40 x 314,639,360 (q/k/v/out and fc1/fc2 with biases, 2 LayerNorms) + tokens 50272x5120 + 2050 learned
    # positions x5120 + final LayerNorm; lm_head tied. vLLM paper: 800 KiB of KV per token at fp16.
    ("OPT-13B", 40, 40, 40, 128, 5120, 20480, 50272, 2048, 12_853_473_280, "facebook/opt-13b"),
    # meta-llama/Llama-2-7b-hf: 32 layers, 32 heads, num_key_value_heads 32 (MHA), hidden 4096 (head_dim 128),
    # intermediate 11008, vocab 32000, max_position_embeddings 4096. Params 6,738,415,616 (6.74B).
    ("Llama-2-7B", 32, 32, 32, 128, 4096, 11008, 32000, 4096, 6_738_415_616, "meta-llama/Llama-2-7b-hf"),
    # meta-llama/Llama-2-70b-hf: 80 layers, 64 heads, 8 KV heads, hidden 8192 (head_dim 128), intermediate 28672,
    # vocab 32000, max_position_embeddings 4096. Params 68,976,648,192 (69.0B).
    ("Llama-2-70B", 80, 64, 8, 128, 8192, 28672, 32000, 4096, 68_976_648_192, "meta-llama/Llama-2-70b-hf"),
    # meta-llama/Meta-Llama-3-8B: 32 layers, 32 heads, 8 KV heads, hidden 4096 (head_dim 128), intermediate
    # 14336, vocab 128256, max_position_embeddings 8192. Params 8,030,261,248 (8.03B). 128 KiB per token at bf16.
    ("Llama-3-8B", 32, 32, 8, 128, 4096, 14336, 128256, 8192, 8_030_261_248, "meta-llama/Meta-Llama-3-8B"),
    # meta-llama/Meta-Llama-3-70B: 80 layers, 64 heads, 8 KV heads, hidden 8192 (head_dim 128), intermediate
    # 28672, vocab 128256, max_position_embeddings 8192. Params 70,553,706,496 (70.6B).
    ("Llama-3-70B", 80, 64, 8, 128, 8192, 28672, 128256, 8192, 70_553_706_496, "meta-llama/Meta-Llama-3-70B"),
    # meta-llama/Llama-3.1-405B: 126 layers, 128 heads, 8 KV heads, hidden 16384 (head_dim 128), intermediate
    # 53248, vocab 128256, max_position_embeddings 131072. Params 405,853,388,800 (405.9B).
    ("Llama-3.1-405B", 126, 128, 8, 128, 16384, 53248, 128256, 131072, 405_853_388_800, "meta-llama/Llama-3.1-405B"),
    # mistralai/Mistral-7B-v0.1: 32 layers, 32 heads, 8 KV heads, hidden 4096 (head_dim 128), intermediate 14336,
    # vocab 32000, max_position_embeddings 32768, sliding_window 4096 on every layer. Params 7,241,732,096.
    ("Mistral-7B-v0.1", 32, 32, 8, 128, 4096, 14336, 32000, 32768, 7_241_732_096, "mistralai/Mistral-7B-v0.1",
     {"sliding_window": 4096, "num_sliding_layers": 32}),
    # mistralai/Mixtral-8x7B-v0.1: 32 layers, 32 heads, 8 KV heads, hidden 4096 (head_dim 128), 8 experts of
    # intermediate 14336, 2 per token (num_local_experts 8, num_experts_per_tok 2), vocab 32000,
    # max_position_embeddings 32768, sliding_window null (no window; the first release said 4096, Mistral
    # corrected it). Params 46,702,792,704 (46.7B); active
    # 12,879,925,248 (12.9B: attention, 2 experts, router, norms, embeddings and lm_head).
    ("Mixtral-8x7B", 32, 32, 8, 128, 4096, 14336, 32000, 32768, 46_702_792_704, "mistralai/Mixtral-8x7B-v0.1",
     {"num_active_params": 12_879_925_248, "num_experts": 8, "experts_per_token": 2}),
    # Qwen/Qwen2.5-7B: 28 layers, 28 heads, 4 KV heads, hidden 3584 (head_dim 128), intermediate 18944, vocab
    # 152064, max_position_embeddings 131072, sliding_window 131072 with use_sliding_window false (no window).
    # Params 7,615,616,512 (7.61B; q/k/v biases, untied lm_head).
    ("Qwen2.5-7B", 28, 28, 4, 128, 3584, 18944, 152064, 131072, 7_615_616_512, "Qwen/Qwen2.5-7B"),
    # Qwen/Qwen2.5-72B: 80 layers, 64 heads, 8 KV heads, hidden 8192 (head_dim 128), intermediate 29568, vocab
    # 152064, max_position_embeddings 131072, use_sliding_window false. Params 72,706,203,648 (72.7B).
    ("Qwen2.5-72B", 80, 64, 8, 128, 8192, 29568, 152064, 131072, 72_706_203_648, "Qwen/Qwen2.5-72B"),
    # Qwen/Qwen3-8B: 36 layers, 32 heads, 8 KV heads, head_dim 128, hidden 4096, intermediate 12288, vocab
    # 151936, max_position_embeddings 40960, use_sliding_window false. Params 8,190,735,360 (8.19B).
    ("Qwen3-8B", 36, 32, 8, 128, 4096, 12288, 151936, 40960, 8_190_735_360, "Qwen/Qwen3-8B"),
    # Qwen/Qwen3-32B: 64 layers, 64 heads, 8 KV heads, head_dim 128 (not hidden/heads = 80), hidden 5120,
    # intermediate 25600, vocab 151936, max_position_embeddings 40960. Params 32,762,123,264 (32.8B).
    ("Qwen3-32B", 64, 64, 8, 128, 5120, 25600, 151936, 40960, 32_762_123_264, "Qwen/Qwen3-32B"),
    # tiiuae/falcon-7b: 32 layers, 71 heads, multi_query true (1 KV head), hidden 4544 (head_dim 64), MLP 4 x
    # hidden = 18176, vocab 65024; the config gives no max_position_embeddings, the model card trains at 2048.
    # Params 6,921,720,704 (6.92B; lm_head tied).
    ("Falcon-7B", 32, 71, 1, 64, 4544, 18176, 65024, 2048, 6_921_720_704, "tiiuae/falcon-7b"),
    # google/gemma-2-9b: 42 layers, 16 heads, 8 KV heads, head_dim 256, hidden 3584, intermediate 14336, vocab
    # 256000, max_position_embeddings 8192, sliding_window 4096 on every other layer (transformers' Gemma2
    # slides on even layer indices: 21 of 42). Params 9,241,705,984 (9.24B; lm_head tied).
    ("Gemma-2-9B", 42, 16, 8, 256, 3584, 14336, 256000, 8192, 9_241_705_984, "google/gemma-2-9b",
     {"sliding_window": 4096, "num_sliding_layers": 21}),
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
    ("DeepSeek-V3", 61, 128, 1, 192, 7168, 18432, 129280, 163840, 671_026_419_200, "deepseek-ai/DeepSeek-V3",
     {"num_active_params": 37_552_297_472, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_experts": 256,
      "experts_per_token": 8, "weight_dtype": "fp8", "num_nextn_predict_layers": 1}),
    # meta-llama/Llama-3.1-8B: the Llama-3-8B dimensions (32 layers, 32 heads, 8 KV heads, head_dim 128, hidden
    # 4096, intermediate 14336, vocab 128256) with max_position_embeddings 131072. Params 8,030,261,248.
    ("Llama-3.1-8B", 32, 32, 8, 128, 4096, 14336, 128256, 131072, 8_030_261_248, "meta-llama/Llama-3.1-8B"),
    # meta-llama/Llama-3.1-70B: 80 layers, 64 heads, 8 KV heads, hidden 8192 (head_dim 128), intermediate 28672,
    # vocab 128256, max_position_embeddings 131072. Params 70,553,706,496.
    ("Llama-3.1-70B", 80, 64, 8, 128, 8192, 28672, 128256, 131072, 70_553_706_496, "meta-llama/Llama-3.1-70B"),
    # meta-llama/Llama-3.3-70B-Instruct: the same dimensions as Llama-3.1-70B. Params 70,553,706,496.
    ("Llama-3.3-70B", 80, 64, 8, 128, 8192, 28672, 128256, 131072, 70_553_706_496, "meta-llama/Llama-3.3-70B-Instruct"),
    # openai/gpt-oss-20b: 24 layers alternating sliding (window 128) and full attention (layer_types, sliding
    # first), 64 heads, 8 KV heads, head_dim 64, hidden 2880, 32 experts of intermediate 2880, 4 per token
    # (num_local_experts, num_experts_per_tok), vocab 201088, max_position_embeddings 131072, untied.
    # Params 20,914,757,184 (20.91B); active 4,187,440,704: 24 layers · 28 unpicked experts · 24,891,840 fewer
    # (OpenAI's 3.61B leaves out the 579M input embedding).
    ("gpt-oss-20b", 24, 64, 8, 64, 2880, 2880, 201088, 131072, 20_914_757_184, "openai/gpt-oss-20b",
     {"num_active_params": 4_187_440_704, "sliding_window": 128, "num_sliding_layers": 12, "num_experts": 32,
      "experts_per_token": 4, "weight_dtype": "bf16"}),
    # openai/gpt-oss-120b: as gpt-oss-20b with 36 layers and 128 experts. Params 116,829,156,672 (116.83B);
    # active 5,715,982,912 (36 · 124 · 24,891,840 fewer; OpenAI's 5.13B leaves out the input embedding).
    ("gpt-oss-120b", 36, 64, 8, 64, 2880, 2880, 201088, 131072, 116_829_156_672, "openai/gpt-oss-120b",
     {"num_active_params": 5_715_982_912, "sliding_window": 128, "num_sliding_layers": 18, "num_experts": 128,
      "experts_per_token": 4, "weight_dtype": "bf16"}),
    # google/gemma-3-12b-it (text_config): 48 layers, 16 heads, 8 KV heads, head_dim 256, hidden 3840,
    # intermediate 15360, vocab 262208, max_position_embeddings 131072, sliding_window 1024 on 5 of every 6
    # layers (sliding_window_pattern 6: 40 sliding, 8 global). Params 11,766,034,176 (the language model;
    # the vision tower adds 0.42B); tied embeddings.
    ("Gemma-3-12B", 48, 16, 8, 256, 3840, 15360, 262208, 131072, 11_766_034_176, "google/gemma-3-12b-it",
     {"sliding_window": 1024, "num_sliding_layers": 40, "tie_word_embeddings": True}),
    # google/gemma-3-27b-it (text_config): 62 layers, 32 heads, 16 KV heads, head_dim 128, hidden 5376,
    # intermediate 21504, vocab 262208, max_position_embeddings 131072, sliding_window 1024 with pattern 6
    # (52 sliding, 10 global). Params 27,009,346,304 (the language model); tied embeddings.
    ("Gemma-3-27B", 62, 32, 16, 128, 5376, 21504, 262208, 131072, 27_009_346_304, "google/gemma-3-27b-it",
     {"sliding_window": 1024, "num_sliding_layers": 52, "tie_word_embeddings": True}),
    # Qwen/Qwen3-30B-A3B: 48 layers, 32 heads, 4 KV heads, head_dim 128, hidden 2048, every layer MoE with 128
    # experts of moe_intermediate_size 768, 8 per token, vocab 151936, max_position_embeddings 40960, untied.
    # Params 30,532,122,624 (30.5B); active 3,353,032,704 (48 · 120 unpicked experts · 3 · 2048 · 768 fewer).
    ("Qwen3-30B-A3B", 48, 32, 4, 128, 2048, 768, 151936, 40960, 30_532_122_624, "Qwen/Qwen3-30B-A3B",
     {"num_active_params": 3_353_032_704, "num_experts": 128, "experts_per_token": 8}),

)
for _row in _UNIFORM:
    _preset(_from_row(*_row))
# How a preset's checkpoint stores its weights when not at one precision (config.json's quantization_config):
# openai/gpt-oss-20b and -120b quantize the routed experts to MXFP4 (quant_method mxfp4), which vLLM loads as
# such (13.64 GiB of weights for gpt-oss-20b on an H100, ../shared/vllm_startup/startup.csv), not as bf16.
PRESET_CHECKPOINT_QUANTIZATION = {"gpt-oss-20b": "mxfp4", "gpt-oss-120b": "mxfp4"}
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
         head_dim=64, n_groups=8, chunk=128)),  # chunk_size 128: the scan kernel's (mamba_cache_mode all)
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
