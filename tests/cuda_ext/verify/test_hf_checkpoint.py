"""--hf-model: a Llama checkpoint that transformers writes (config.json + safetensors, HF's own random
init, no download) read back into verify's model gives transformers' logits, and runs the scenarios;
config fields and tensors the model does not compute are refused by name."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kvcalc.cuda_ext.verify.contiguous import allocate_contiguous_kv, contiguous_forward  # noqa: E402
from kvcalc.cuda_ext.verify.hf_checkpoint import (  # noqa: E402
    load_llama_weights,
    read_llama_config,
    read_safetensors,
)
from kvcalc.cuda_ext.verify.suite import VerifyConfig, run_verify  # noqa: E402

FP32_LOGIT_TOL = 1e-5


def save_checkpoint(directory, *, tied: bool = False, **changes):
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 5e5},
        tie_word_embeddings=tied, **changes,
    )
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    return directory, save_checkpoint(directory)


def test_our_safetensors_reader_agrees_with_the_library(checkpoint):
    from safetensors.torch import load_file

    directory, _ = checkpoint
    ours, theirs = read_safetensors(directory / "model.safetensors"), load_file(directory / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


@pytest.mark.parametrize("tied", [False, True])
def test_loaded_weights_give_transformers_logits(tmp_path, tied):
    model = save_checkpoint(tmp_path, tied=tied)
    weights = load_llama_weights(tmp_path)
    cfg = weights.config
    assert (cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta, cfg.tie_word_embeddings) == (
        4, 2, 16, 5e5, tied)
    tokens = [5, 17, 3, 88, 41, 0, 62]
    cache = allocate_contiguous_kv(cfg, len(tokens))
    ours = contiguous_forward(weights, cache, tokens)
    with torch.no_grad():
        theirs = model(torch.tensor([tokens])).logits[0]
    assert float((ours - theirs).abs().max()) < FP32_LOGIT_TOL


def test_a_sharded_checkpoint_loads_the_same_weights(checkpoint, tmp_path):
    directory, model = checkpoint
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("*.safetensors"))) > 1
    whole, sharded = load_llama_weights(directory), load_llama_weights(tmp_path)
    assert torch.equal(whole.layers[1].w_down, sharded.layers[1].w_down) and torch.equal(whole.lm_head, sharded.lm_head)


def test_a_checkpoint_runs_the_scenarios(checkpoint):
    directory, _ = checkpoint
    doc = run_verify(VerifyConfig(device="cpu", scenarios=("parallel-sampling", "preempt-swap"), hf_model=directory)
                     ).to_dict()
    assert doc["passed"] and doc["model"]["weights"] == str(directory) and doc["model"]["vocab_size"] == 96
    assert all(s["mismatched_tokens"] == 0 and s["tokens_compared"] > 0 for s in doc["scenarios"])


@pytest.mark.parametrize(("field", "value"), [
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}),
    ("rope_parameters", {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
    ("attention_bias", True),
    ("hidden_act", "gelu"),
    ("model_type", "mistral"),
])
def test_fields_the_model_does_not_compute_are_refused(checkpoint, tmp_path, field, value):
    directory, _ = checkpoint
    config = json.loads((directory / "config.json").read_text())
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=field if field != "model_type" else "'mistral' is not 'llama'"):
        read_llama_config(tmp_path)


def test_a_tensor_the_model_would_not_use_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    save_checkpoint(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.layers.0.self_attn.q_proj.bias \(and 0 more\) is not part"):
        load_llama_weights(tmp_path)


def test_cli_reads_a_checkpoint_and_refuses_a_missing_one(run_cli, checkpoint, tmp_path):
    directory, _ = checkpoint
    result = run_cli("verify", "--hf-model", str(directory), "--scenario", "ragged", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["passed"]
    missing = run_cli("verify", "--hf-model", str(tmp_path / "none"))
    assert missing.exit_code == 2 and missing.stderr.startswith("error: ") and "config.json" in missing.stderr


def test_the_config_file_itself_is_refused_with_its_folder(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}")
    with pytest.raises(ValueError, match=r"is a file: give the folder that holds config\.json"):
        read_llama_config(config)
