"""config.json conventions beyond the real files: what is refused (naming the field), what disagrees, how a
file, a folder, a byte-order mark and the local Hugging Face hub cache are read."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcalc.core.model.hf_config import load_config
from kvcalc.core.model.hub import cached_config
from kvcalc.core.model.models import resolve_model

BASE = {"model_type": "llama", "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
        "num_hidden_layers": 4, "vocab_size": 1000, "intermediate_size": 4096, "max_position_embeddings": 4096}


def write(tmp_path, config, folder="model"):
    directory = tmp_path / folder
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


UNKNOWN = {"index_topk": 2048,  # DeepSeek-V3.2's sparse-attention indexer keeps its own cache
           "compress_ratios": [4, 4, 4, 4], "kv_sharing_stride": 2, "linear_attn_beta": 0.5}


def test_an_unknown_architecture_is_refused_in_one_line_naming_every_unread_field(tmp_path):
    config = {**BASE, "model_type": "acme_lm", **UNKNOWN}
    with pytest.raises(ValueError) as refused:
        load_config(write(tmp_path, config))
    message = str(refused.value)
    assert "\n" not in message and "model_type 'acme_lm' is not an architecture kvcalc knows" in message
    assert "does not read its fields index_topk, compress_ratios, kv_sharing_stride, linear_attn_beta," in message
    assert "remove" not in message and "delete" not in message  # never advise deleting a field
    # without a model_type: the same rule
    with pytest.raises(ValueError, match="a config without a model_type is not an architecture kvcalc knows"):
        load_config(write(tmp_path, {k: v for k, v in config.items() if k != "model_type"}, folder="none"))


def test_an_unknown_architecture_with_only_fields_kvcalc_reads_is_a_plain_decoder(tmp_path):
    spec = load_config(write(tmp_path, {**BASE, "model_type": "acme_lm", "rope_theta": 1e6}))
    assert spec.bytes_per_token(16) == 4 * 2 * 2 * 128 * 2  # 4 layers · K, V · 2 KV heads · 128 · 2 B = 4,096


def test_an_unknown_architecture_whose_layers_cannot_be_placed_names_why_and_the_fields(tmp_path):
    # transformers' RWKV-7 style: no num_attention_heads, a head_dim and low-rank fields kvcalc does not read
    config = {"model_type": "rwkv7", "hidden_size": 2048, "num_hidden_layers": 24, "head_dim": 64,
              "a_low_rank_dim": 96, "decay_low_rank_dim": 96, "v_low_rank_dim": 64, "gate_low_rank_dim": 256}
    with pytest.raises(ValueError, match=r"model_type 'rwkv7' is not an architecture kvcalc knows \(missing the "
                                         r"field 'num_attention_heads'.*\), and it does not read its fields head_dim"):
        load_config(write(tmp_path, config))


def test_an_unknown_architecture_that_fails_to_read_names_itself(tmp_path):
    with pytest.raises(ValueError, match=r"model_type 'acme_lm' is not an architecture kvcalc knows, and it cannot be "
                                         r"read as a plain decoder \(missing the field 'num_hidden_layers'"):
        load_config(write(tmp_path, {"model_type": "acme_lm", "hidden_size": 64, "num_attention_heads": 2}))


@pytest.mark.parametrize("field", sorted(UNKNOWN))
def test_a_known_architecture_ignores_fields_it_does_not_read(tmp_path, field):
    # Llama's engines (transformers' LlamaConfig, vLLM's LlamaForCausalLM) read none of these: neither does kvcalc
    spec = load_config(write(tmp_path, {**BASE, field: UNKNOWN[field]}))
    assert spec.bytes_per_token(16) == 4 * 2 * 2 * 128 * 2 == 4_096
    assert f"llama: {field} ignored (not among the fields kvcalc reads for this architecture's KV and state)" \
        in spec.notes


def test_kimi_linear_kda_layers(tmp_path):
    # Kimi-Linear style: layers numbered from 1; MLA full layers, Kimi Delta Attention elsewhere
    config = {**BASE, "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_size": 2304,
              "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
              "torch_dtype": "bfloat16", "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3],
                                                                "head_dim": 128, "num_heads": 32,
                                                                "short_conv_kernel_size": 4}}
    spec = load_config(write(tmp_path, config))
    assert spec.bytes_per_token(16) == 1 * (512 + 64) * 2  # the one MLA layer's latent
    # 3 KDA layers: conv q, k, v 3 · 3 · 32 · 128 bf16 scalars + a 32 · 128 · 128 float32 recurrent state
    assert spec.state_bits() == 3 * (3 * 3 * 4096 * 16 + 32 * 128 * 128 * 32)
    with pytest.raises(ValueError, match="leaves layer 4 out"):
        load_config(write(tmp_path, {**config, "linear_attn_config": {"full_attn_layers": [],
                                                                      "kda_layers": [1, 2, 3]}}, folder="gap"))


def test_fields_that_do_not_touch_the_kv_are_not_refused(tmp_path):
    benign = {"chunk_size_feed_forward": 0, "rope_theta": 1e6, "attention_bias": False, "mtp_num_hidden_layers": 1,
              "swa_rope_theta": 1e4, "layernorm_mlp_alpha": 2.0, "index_topk": None, "sliding_window": None}
    assert load_config(write(tmp_path, {**BASE, **benign})).bytes_per_token(16) == 4 * 2 * 2 * 128 * 2


@pytest.mark.parametrize(("types", "message"), [
    (["full_attention", "compressed_sparse_attention"] * 2, "'compressed_sparse_attention', a layer kind kvcalc"),
    (["deepseek_sparse_attention"] * 4, "'deepseek_sparse_attention'"),
])
def test_unknown_layer_kinds_are_refused(tmp_path, types, message):
    with pytest.raises(ValueError, match=message):
        load_config(write(tmp_path, {**BASE, "layer_types": types}))


def test_two_conventions_must_agree(tmp_path):
    config = {**BASE, "layer_types": ["full_attention", "linear_attention"] * 2, "full_attention_interval": 4,
              "linear_num_value_heads": 2, "linear_value_head_dim": 64, "linear_num_key_heads": 2,
              "linear_key_head_dim": 64, "linear_conv_kernel_dim": 4}
    with pytest.raises(ValueError, match="layer_types and full_attention_interval disagree"):
        load_config(write(tmp_path, config))


def test_a_window_no_layer_can_take_is_refused(tmp_path):
    config = {**BASE, "layer_types": ["full_attention"] * 4, "sliding_window": 4096}
    with pytest.raises(ValueError, match="sliding_window 4096 is set but the layer kinds mark no sliding layer"):
        load_config(write(tmp_path, config))
    with pytest.raises(ValueError, match="attention_chunk_size 8192 is set but no layer is chunked"):
        load_config(write(tmp_path, {**BASE, "attention_chunk_size": 8192}, folder="chunk"))
    with pytest.raises(ValueError, match="no sliding_window"):
        load_config(write(tmp_path, {**BASE, "layer_types": ["sliding_attention"] * 4}, folder="nowindow"))


def test_chunked_layer_types_and_string_pattern(tmp_path):
    chunked = load_config(write(tmp_path, {**BASE, "attention_chunk_size": 100,
                                            "layer_types": ["chunked_attention"] * 3 + ["full_attention"]}))
    # 1,000 tokens: 3 chunked layers hold 100, 1 full layer 1,000; 2 · 2 heads · 128 · 2 B = 1,024 B a token-layer
    assert chunked.kv_bytes(1000, 16) == (3 * 100 + 1000) * 1024
    exaone = load_config(write(tmp_path, {**BASE, "model_type": "exaone4", "sliding_window": 64,
                                           "sliding_window_pattern": "LLLG"}, folder="exaone"))
    assert (exaone.num_sliding_layers, exaone.sliding_window) == (3, 64)


def test_per_layer_config_and_v_head_dim(tmp_path):
    config = {**BASE, "head_dim": 64, "v_head_dim": 32, "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
              "sliding_window": 8, "per_layer_config": {"03": {"head_dim": 256, "num_key_value_heads": 1}}}
    spec = load_config(write(tmp_path, config))
    # sliding layers 2 heads · (64 + 32) each; the full layer its own 1 head · (256 + 256): 3 · 192 + 512 scalars
    assert spec.kv_bits(1, 16) == (3 * 2 * (64 + 32) + 1 * 512) * 16
    with pytest.raises(ValueError, match="per_layer_config"):
        load_config(write(tmp_path, {**config, "per_layer_config": {"1": {"window": 4}}}, folder="bad"))


def test_unknown_recurrent_state_is_said_not_guessed(tmp_path):
    spec = load_config(write(tmp_path, {**BASE, "layer_types": ["linear_attention"] * 3 + ["full_attention"]}))
    assert spec.state_bits() == 0 and any("not known" in note for note in spec.notes)


def test_state_dtype_from_the_config(tmp_path):
    mamba = {**BASE, "model_type": "granitemoehybrid", "layer_types": ["mamba"] * 3 + ["attention"],
             "mamba_n_heads": 16, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4,
             "torch_dtype": "bfloat16"}
    spec = load_config(write(tmp_path, mamba))
    # per layer: conv 3 · (1024 + 2 · 128) bf16 + SSM 16 · 64 · 128 in the model dtype (no SSM dtype named)
    assert spec.state_bits() == 3 * (3 * 1280 * 16 + 16 * 64 * 128 * 16)
    fp32 = load_config(write(tmp_path, {**mamba, "mamba_ssm_cache_dtype": "float32"}, folder="fp32"))
    assert fp32.state_bits() == 3 * (3 * 1280 * 16 + 16 * 64 * 128 * 32)
    with pytest.raises(ValueError, match="'mamba_ssm_cache_dtype'"):
        load_config(write(tmp_path, {**mamba, "mamba_ssm_cache_dtype": "float12"}, folder="bad"))


def test_folder_bom_and_name(tmp_path):
    folder = tmp_path / "My-Model"
    folder.mkdir()
    (folder / "config.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(BASE).encode())
    spec = load_config(folder)
    assert spec.name == "My-Model" and spec.layers == 4  # the folder's name, not the model_type
    assert load_config(folder / "config.json").name == "My-Model"
    with pytest.raises(ValueError, match=r"no config\.json in this folder"):
        load_config(tmp_path)


def test_a_key_given_twice_and_a_huge_integer_are_refused_naming_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "num_hidden_layers": 32, "num_hidden_layers": 16}')
    # JSON keeps the last value silently; which one the author meant is a guess
    with pytest.raises(ValueError, match=r"config\.json: the key 'num_hidden_layers' is given twice \(32 and 16\)"):
        load_config(path)
    path.write_text('{"model_type": "llama", "num_hidden_layers": ' + "9" * 5000 + "}")
    with pytest.raises(ValueError, match=r"config\.json: holds an integer of more than 4,300 digits"):
        load_config(path)


def test_standard_input(monkeypatch):
    import io
    import sys

    stdin = io.TextIOWrapper(io.BytesIO(json.dumps(BASE).encode()))
    monkeypatch.setattr(sys, "stdin", stdin)
    spec = load_config("-")
    assert spec.name == "llama" and spec.bytes_per_token(16) == 4 * 2 * 2 * 128 * 2 and "<stdin>" in spec.source


def test_conventions_transformers_5_writes(tmp_path):
    # MiniMax's residual scales under transformers' names change no KV (were refused as unread)
    minimax = {**BASE, "model_type": "minimax", "layer_types": ["full_attention"] * 4, "full_attn_alpha_factor": 1,
               "full_attn_beta_factor": 1, "linear_attn_alpha_factor": 1, "mlp_beta_factor": 1}
    assert load_config(write(tmp_path, minimax)).bytes_per_token(16) == 4 * 2 * 2 * 128 * 2
    # AFMoE: every n-th layer global, the rest sliding; checked against layer_types when both are given
    afmoe = {**BASE, "model_type": "afmoe", "global_attn_every_n_layers": 2, "sliding_window": 64}
    spec = load_config(write(tmp_path, afmoe, folder="afmoe"))
    assert spec.kv_bytes(1000, 16) == (2 * 1000 + 2 * 64) * 1024  # layers 1, 3 global; 0, 2 hold 64 tokens
    with pytest.raises(ValueError, match="layer_types and global_attn_every_n_layers disagree"):
        load_config(write(tmp_path, {**afmoe, "layer_types": ["full_attention"] * 4}, folder="afmoe2"))
    # DeepSeek sparse attention as transformers 5 writes it: layer_types indexed_attention
    dsa = {**BASE, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
           "layer_types": ["indexed_attention"] * 4, "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}
    assert load_config(write(tmp_path, dsa, folder="dsa")).bytes_per_token(16) == 4 * (576 * 2 + 132)
    with pytest.raises(ValueError, match=r"indexed_attention .* gives no index_head_dim"):
        load_config(write(tmp_path, {**dsa, "index_head_dim": None, "index_topk": None}, folder="dsa2"))
    # Kimi-Linear as transformers 5 writes it: layer_types linear_attention (Kimi Delta Attention), linear_* heads
    kimi = {**BASE, "model_type": "kimi_linear", "num_attention_heads": 32, "num_key_value_heads": 32,
            "hidden_size": 2304, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
            "v_head_dim": 128, "torch_dtype": "bfloat16", "layer_types": ["linear_attention"] * 3 + ["full_attention"],
            "linear_num_heads": 32, "linear_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 8,
            "num_experts_per_token": 2}
    spec = load_config(write(tmp_path, kimi, folder="kimi"))
    assert spec.bytes_per_token(16) == (512 + 64) * 2 and spec.experts_per_token == 2
    assert spec.state_bits() == 3 * (3 * 3 * 4096 * 16 + 32 * 128 * 128 * 32)  # as test_kimi_linear_kda_layers


def test_falcon_h1_d_ssm_overrides_mamba_expand(tmp_path):
    # Falcon-H1 ships both; transformers takes mamba_d_ssm and uses mamba_expand only without it
    falcon = {**BASE, "model_type": "falcon_h1", "torch_dtype": "bfloat16", "mamba_d_ssm": 1536, "mamba_expand": 2,
              "mamba_n_heads": 24, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4}
    spec = load_config(write(tmp_path, falcon))
    # 4 hybrid layers: attention 2 · 2 · 128 · 2 B a token each; Mamba-2 conv 3 · (1536 + 2 · 128), SSM 24 · 64 · 128
    assert spec.bytes_per_token(16) == 4 * 1024
    assert spec.state_bits() == 4 * (3 * 1792 + 24 * 64 * 128) * 16


def hub_layout(root, repo="acme/Tiny-1B", revision="0123abcd", refs=True, config=BASE):
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    if refs:
        (repo_dir / "refs").mkdir()
        (repo_dir / "refs" / "main").write_text(revision)
    return snapshot


def test_hub_cache_lookup(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = hub_layout(tmp_path / "hub")
    assert cached_config("acme/Tiny-1B") == (snapshot / "config.json", "acme/Tiny-1B")
    spec = resolve_model("acme/Tiny-1B", None)
    assert spec.name == "acme/Tiny-1B" and spec.layers == 4
    with pytest.raises(ValueError, match=r"no config\.json in the Hugging Face cache \(looked in .*models--acme--Nope"):
        resolve_model("acme/Nope", None)


def test_hub_cache_roots_and_revisions(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    hub_layout(tmp_path / "home" / "hub", refs=False)  # one snapshot and no refs/main: that one
    assert resolve_model("acme/Tiny-1B", None).layers == 4
    hub_layout(tmp_path / "home" / "hub", revision="ffff0000", refs=False)
    with pytest.raises(ValueError, match="several revisions"):
        resolve_model("acme/Tiny-1B", None)
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    with pytest.raises(ValueError, match=r"user/\.cache/huggingface/hub"):
        resolve_model("acme/Tiny-1B", None)


# Names that look like the cache's (each matches hf_fields.STRUCTURAL) but that no reader of kvcalc reads.
_LOOKALIKES = ["compress_ratios", "kv_sharing_stride", "linear_attn_beta", "mamba_use_mlp", "window_new_thing",
               "ssm_new_flag", "conv_dim_out", "full_attn_mod", "index_new_field", "head_dim_scale_new"]


@given(fields=st.lists(st.sampled_from(_LOOKALIKES), min_size=1, max_size=5, unique=True),
       value=st.one_of(st.integers(1, 10**6), st.floats(0.01, 10), st.just(True), st.just([4, 128])))
@settings(max_examples=40, deadline=None)
def test_lookalike_fields_leave_a_known_architecture_alone_and_stop_an_unknown_one(tmp_path_factory, fields, value):
    """Property: on Llama (known) any set of unread look-alike fields changes no figure and is named in one note;
    on an unknown model_type the same fields are all named, in one line, and nothing is computed."""
    folder = tmp_path_factory.mktemp("cfg")
    extra = dict.fromkeys(fields, value)
    spec = load_config(write(folder, {**BASE, **extra}))
    assert spec.bytes_per_token(16) == 4 * 2 * 2 * 128 * 2  # 4 layers · K, V · 2 KV heads · 128 · 2 B
    assert f"llama: {', '.join(fields)} ignored (not among" in " ".join(spec.notes)
    with pytest.raises(ValueError) as refused:
        load_config(write(folder, {**BASE, "model_type": "acme_lm", **extra}, folder="unknown"))
    message = str(refused.value)
    assert "\n" not in message and f"does not read its fields {', '.join(fields)}," in message
