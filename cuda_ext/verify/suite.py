"""`kvcalc verify`'s run: the model, the device, the scenarios asked for, one fault maybe -> a VerifyRun
(outcome.py: its fields, and `to_dict()`, the JSON document).

With `model_name` the weights are a real model's (gguf_model), the prompts real chat prompts (chat), and the
run has `texts`: a few requests' questions and both paths' decoded answers.

torch runs on one intra-op thread meanwhile: these are thousands of tiny ops, and on a small CPU a second
thread spins more than it works (the default run on a loaded 2-core machine: 4-8 s with one thread, 94-147 s
with two).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...core.errors import CudaUnavailableError, ParameterError
from .attention import default_attention_backend
from .bpe import ByteBPE
from .chat import ChatPrompts
from .config import DTYPE_NAMES, ModelConfig, torch_dtype
from .faults import INJECTIONS, Fault
from .gguf_model import GGUF_MODELS, find_gguf, load_gguf_model
from .hf_checkpoint import load_llama_weights
from .outcome import DecodedText, ModelInfo, VerifyRun
from .references import jobs_of, shared_references
from .result import ScenarioResult
from .runner import run_scenario
from .scenarios import BLOCK_SIZE, SCENARIOS, build
from .weights import init_weights

DEVICES = ("auto", "cpu", "cuda")
REAL_MODEL_THREADS = 1


@dataclass(frozen=True)
class VerifyConfig:
    device: str = "auto"
    dtype: str = "fp32"
    scenarios: tuple[str, ...] = SCENARIOS
    inject: str | None = None
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    hf_model: Path | None = None  # a local Llama checkpoint instead of `model` with seeded weights
    model_name: str | None = None  # a real model from its installed GGUF (gguf_model.GGUF_MODELS), real chat prompts
    num_texts: int = 3  # with a real model: requests whose decoded text the document shows

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ParameterError(f"device {self.device!r} is not one of {', '.join(DEVICES)}", "device")
        if self.dtype not in DTYPE_NAMES:
            raise ParameterError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPE_NAMES)}", "dtype")
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        if unknown or not self.scenarios:
            raise ParameterError(f"scenario {', '.join(map(repr, unknown)) or '(none)'} is not known; use one or "
                                 f"more of {', '.join(SCENARIOS)}", "scenario")
        repeated = sorted({s for s in self.scenarios if self.scenarios.count(s) > 1})
        if repeated:
            raise ParameterError(f"scenario {', '.join(repeated)} is given twice; name each scenario once", "scenario")
        if self.model_name is not None and self.model_name not in GGUF_MODELS:
            raise ParameterError(f"model_name {self.model_name!r} is not known; use {', '.join(GGUF_MODELS)}",
                                 "model_name")
        if self.model_name is not None and self.hf_model is not None:
            raise ParameterError("model_name and hf_model both name the weights; give one of them", "model_name",
                                 "hf_model")
        if self.inject is not None and self.inject not in INJECTIONS:
            raise ParameterError(f"inject {self.inject!r} is not a known fault; use one of {', '.join(INJECTIONS)}",
                                 "inject")


def resolve_device(device: str) -> torch.device:
    """'auto' -> cuda when a GPU is visible, else cpu; 'cuda' without one -> CudaUnavailableError."""
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise CudaUnavailableError("device 'cuda' was asked for, but torch sees no CUDA GPU; use device 'cpu'")
    return torch.device("cuda")


def run_verify(config: VerifyConfig, progress: Callable[[int], None] | None = None) -> VerifyRun:
    """Every scenario of `config` -> what the run found (outcome.VerifyRun); `progress(1)` after each."""
    device = resolve_device(config.device)
    started = time.perf_counter()
    threads = torch.get_num_threads()
    # a real model too: on a loaded 2-core machine a second thread spun (a SmolLM2 decode step: 67 ms of CPU with
    # one thread, 546 ms with two); REAL_MODEL_THREADS is the knob for a machine with idle cores
    torch.set_num_threads(1 if config.model_name is None else min(threads, REAL_MODEL_THREADS))
    tokenizer = None
    try:
        if config.model_name is not None:
            weights, vocab = load_gguf_model(find_gguf(config.model_name), config.dtype, device)
            tokenizer = ByteBPE(vocab)
        elif config.hf_model is None:
            weights = init_weights(config.model, seed=config.seed, dtype=config.dtype, device=device)
        else:
            weights = load_llama_weights(config.hf_model, config.dtype, device)
        model = weights.config
        backend = default_attention_backend(model, torch_dtype(config.dtype), device, BLOCK_SIZE)
        results: list[ScenarioResult] = []
        texts: list[DecodedText] = []
        # the same questions in every scenario: one reference decoding per prompt, all decoded together first
        sources = [None if tokenizer is None else ChatPrompts(tokenizer) for _ in config.scenarios]
        built = [build(name, model.vocab_size, config.seed, src) for name, src in zip(config.scenarios, sources,
                                                                                        strict=True)]
        shared_references(weights).prefetch([job for scenario in built if scenario.requests is not None
                                             for job in jobs_of(scenario.requests, config.seed)])
        for source, scenario in zip(sources, built, strict=True):
            fault = Fault(config.inject) if config.inject else None
            results.append(run_scenario(scenario, weights, seed=config.seed, attention_backend=backend, fault=fault))
            if source is not None:
                texts += _texts(results[-1], source, source.tokenizer, config.num_texts - len(texts))
            if progress is not None:
                progress(1)
    finally:
        torch.set_num_threads(threads)
    weights_name = ("seeded" if config.model_name is None and config.hf_model is None
                    else config.model_name or str(config.hf_model))
    return VerifyRun(
        device=device.type, device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        dtype=config.dtype, attention_backend=backend, model=ModelInfo(model, config.seed, weights_name),
        block_size=BLOCK_SIZE, inject=config.inject, scenarios=results, wall_s=time.perf_counter() - started,
        texts=texts if tokenizer is not None else None,
    )


def _texts(result: ScenarioResult, source: ChatPrompts, tokenizer: ByteBPE, count: int) -> list[DecodedText]:
    """Up to `count` requests of a scenario as text: the user's message, the reference's answer, the paged one's."""
    out = []
    for row, (prompt, reference, paged) in enumerate(result.outputs[: max(count, 0)]):
        text = source.texts.get(prompt, "")
        user = text.split("<|im_start|>user\n")[-1].split("<|im_end|>")[0]
        out.append(DecodedText(result.name, row, user, tokenizer.decode(reference), tokenizer.decode(paged),
                               reference == paged))
    return out
