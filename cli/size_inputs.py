"""`kvcalc size`'s flags as given (`SizeOptions`) and the checked inputs its report is computed from
(`SizeInputs`): which flags need a model, a context length or the GPU plan, and the counts kvcalc takes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..core.blocks import DEFAULT_BLOCK_SIZE
from ..core.dtypes import parse_dtype
from ..core.errors import ParameterError
from ..core.model.models import ModelSpec, resolve_model
from ..core.units import format_count_short, parse_bytes
from .output import Format, resolve_format, warn_notes

T = TypeVar("T")

MAX_COUNT = 2**63 - 1  # the largest count option (--seqs, --tokens, --block, ...): a signed 64-bit count


@dataclasses.dataclass(frozen=True)
class SizeOptions:
    """The flags of `kvcalc size` as typed (None: not given)."""

    model: str | None
    config: Path | None
    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    dtype: str
    tokens: int | None
    seqs: int | None
    block: int | None
    tp: int | None
    memory: str | None
    gpu: str | None
    gpu_memory_utilization: float | None
    max_model_len: int | None
    kv_memory: str | None
    max_num_batched_tokens: int | None
    weight_dtype: str | None
    vllm_version: str | None
    pp: int | None
    max_num_seqs: int | None
    quantization: str | None
    spec_tokens: int | None
    spec_method: str | None
    draft_config: str | None
    json_flag: bool
    fmt: Format

    def gpu_options(self) -> dict[str, Any]:
        """The flags that only the GPU plan (--gpu or --kv-memory) reads."""
        return {"--gpu-memory-utilization": self.gpu_memory_utilization, "--max-model-len": self.max_model_len,
                "--max-num-batched-tokens": self.max_num_batched_tokens, "--weight-dtype": self.weight_dtype,
                "--vllm-version": self.vllm_version, "--pp": self.pp, "--max-num-seqs": self.max_num_seqs,
                "--quantization": self.quantization}

    @property
    def gpu_plan(self) -> bool:
        return self.gpu is not None or self.kv_memory is not None


@dataclasses.dataclass(frozen=True)
class SizeInputs:
    """What the report is computed from, every combination of flags checked. `spec` None: no model (the
    presets table); `no_context`: a config that names no context length (what needs none)."""

    opts: SizeOptions
    fmt: Format
    dtype: str
    spec: ModelSpec | None
    speculation: Any = None
    block_size: int = DEFAULT_BLOCK_SIZE
    tokens: int | None = None
    memory_bytes: int | None = None
    no_context: bool = False
    checkpoint: tuple[int, str | None] = (0, None)  # (vision-tower parameters, the weights' quantization)

    @property
    def tp(self) -> int:
        return 1 if self.opts.tp is None else self.opts.tp


def size_inputs(o: SizeOptions) -> SizeInputs:
    """Parse and check the flags in the order the command always has (the first problem is the one named);
    the model's notes go to stderr as warnings."""
    dtype = parse_dtype(o.dtype)
    fmt = resolve_format(o.json_flag, o.fmt)
    spec = resolve_model(o.model, o.config, o.layers, o.kv_heads, o.head_dim, kv_free=True)
    speculation = None
    if o.spec_tokens is not None or o.spec_method is not None:  # imported only then: `size --json` starts lean
        from ..core.spec_decode import speculation_from

        speculation = speculation_from(o.spec_tokens, o.spec_method)
    spec = _with_drafter(spec, speculation, o.draft_config)
    _check_counts(spec, o.tp, {"--seqs": o.seqs, "--tokens": o.tokens, "--block": o.block,
                               "--max-model-len": o.max_model_len, "--max-num-batched-tokens": o.max_num_batched_tokens,
                               "--max-num-seqs": o.max_num_seqs, "--pp": o.pp})
    checkpoint = _checkpoint(o.model, o.config, spec, o.kv_memory) if o.gpu is not None and spec else (0, None)
    if spec is None:
        _check_needs_model(o)
        return SizeInputs(o, fmt, dtype, None)
    _check_needs_gpu(o)
    warn_notes(spec.notes)
    tokens = o.tokens
    if tokens is None and spec.max_position_embeddings is None and o.max_model_len is not None:
        tokens = o.max_model_len  # explicit dimensions name no context: the request length stands in for it
    from_config = o.config is not None or (o.model is not None and "/" in o.model)
    no_context = tokens is None and spec.max_position_embeddings is None and from_config
    if no_context:  # a config that names no context length: what needs none (per token, layer, block; contexts)
        given = [name for name, value in (("--seqs", o.seqs), ("--memory", o.memory),
                                          ("--spec-tokens", o.spec_tokens)) if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} needs a context length: {spec.name}'s config names none "
                             "(max_position_embeddings); give --tokens N")
    memory_bytes = None if o.memory is None or no_context else flagged("--memory", parse_bytes, o.memory)
    return SizeInputs(o, fmt, dtype, spec, speculation, DEFAULT_BLOCK_SIZE if o.block is None else o.block, tokens,
                      memory_bytes, no_context, checkpoint)


def _check_needs_model(o: SizeOptions) -> None:
    given = [name for name, value in (("--seqs", o.seqs), ("--block", o.block), ("--tp", o.tp),
                                      ("--memory", o.memory), ("--gpu", o.gpu), ("--kv-memory", o.kv_memory),
                                      ("--spec-tokens", o.spec_tokens)) if value is not None]
    given += [name for name, value in o.gpu_options().items() if value is not None]
    if given:
        verb = "needs" if len(given) == 1 else "need"
        raise ValueError(
            f"{', '.join(given)} {verb} a model: add --model NAME (or org/name), --config DIR, "
            "or --layers/--kv-heads/--head-dim"
        )


def _check_needs_gpu(o: SizeOptions) -> None:
    if not o.gpu_plan:
        stray = [name for name, value in o.gpu_options().items() if value is not None]
        if stray:
            raise ValueError(f"{', '.join(stray)} applies to the GPU plan: add --gpu NAME (or --kv-memory SIZE)")


def _with_drafter(spec: ModelSpec | None, speculation: Any, draft_config: str | None) -> ModelSpec | None:
    """The model with its drafter's KV under --spec-method eagle|mtp|draft (core/model/models.with_drafter);
    what was added, or that MTP layers exist and are not counted, goes into the spec's notes."""
    if draft_config is not None and (spec is None or speculation is None):
        raise ValueError("--draft-config needs a model and --spec-tokens K --spec-method draft|eagle|mtp")
    if spec is None:
        return None
    from ..core.model.models import with_drafter

    draft = None
    if draft_config is not None:
        from ..core.model.hf_config import load_config

        draft = flagged("--draft-config", load_config, draft_config)
    spec, note = with_drafter(spec, None if speculation is None else speculation.method, draft)
    return spec if note is None else dataclasses.replace(spec, notes=(*spec.notes, note))


def _checkpoint(model: str | None, config: Any, spec: ModelSpec, kv_memory: str | None) -> tuple[int, str | None]:
    """(vision-tower parameters, the weights' quantization) of the config.json behind --config / org/name; no
    tower is counted with --kv-memory (no weight is estimated then)."""
    import json

    from ..core.model.weights import checkpoint_quantization, config_vision_params

    path: Path | None = None
    if config is not None:
        path = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
    elif model is not None and "/" in model:
        from ..core.model.hub import cached_config

        path = Path(cached_config(model)[0])
    if path is None:  # a preset: its checkpoint's quantization as its config.json gives it
        from ..core.model.presets import PRESET_CHECKPOINT_QUANTIZATION

        return 0, PRESET_CHECKPOINT_QUANTIZATION.get(spec.name) if model is not None else None
    raw = json.loads(path.read_text(encoding="utf-8"))
    vision = 0 if kv_memory is not None else config_vision_params(raw, spec.hidden_size, "kv_memory_bytes")
    return vision, checkpoint_quantization(raw)


def _check_counts(spec: ModelSpec | None, tp: int | None, counts: dict[str, int | None]) -> None:
    """One-line refusals for counts beyond what a result can mean (see MAX_COUNT and layers.MAX_TP)."""
    from ..core.model.layers import MAX_TP, check_tp

    for flag, value in counts.items():
        if value is not None and value > MAX_COUNT:
            raise ValueError(f"{flag} {format_count_short(value)} is above 2**63-1, the largest count kvcalc takes; "
                             f"give a smaller {flag}")
    if tp is not None:
        check_tp(tp)
        heads = spec.num_attention_heads if spec is not None else 0
        if heads and tp > heads:
            raise ValueError(f"--tp {tp} is above {heads}: each GPU needs at least one of "
                             f"{spec.name if spec else 'the model'}'s attention heads (kvcalc takes at most "
                             f"{MAX_TP:,} GPUs); give --tp {heads} or fewer")


def flagged(flag: str, parse: Callable[[str], T], text: str) -> T:
    """`parse(text)`, its error prefixed with the flag that gave the text."""
    try:
        return parse(text)
    except ParameterError as exc:  # its parameters still named, for the CLI to write as flags
        raise ParameterError(f"{flag}: {exc.template}", *exc.params) from None
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None
