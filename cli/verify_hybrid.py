"""`kvcalc verify --model hybrid-tiny`: the hybrid model's run (cuda_ext/verify/hybrid_suite.py), reported by
verify's own table and exit codes, with a note on the layer groups and the hybrid events."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import ParameterError
from .output import Format, emit
from .progress import progress_bar
from .verify_report import build_report


def run_hybrid_command(device: str, dtype: str, scenarios: list[str] | None, inject: str | None, seed: int,
                       hf_model: Path | None, output_format: Format) -> int:
    from ..cuda_ext.verify.hybrid_scenarios import HYBRID_SCENARIOS
    from ..cuda_ext.verify.hybrid_suite import check_hybrid_options, run_hybrid_verify

    if hf_model is not None:
        raise ParameterError("--model hybrid-tiny and --hf-model both name the weights; give one of them", "model")
    names = tuple(scenarios or HYBRID_SCENARIOS)
    check_hybrid_options(names, inject, dtype, device)
    with progress_bar("kvcalc verify (scenarios)", total=len(names)) as advance:
        run = run_hybrid_verify(device=device, dtype=dtype, scenarios=names, inject=inject, seed=seed,
                                progress=advance)
    report = build_report(run)
    hybrid = run.model.hybrid
    assert hybrid is not None, "a hybrid run describes its layers"
    report.notes.insert(0, (
        f"hybrid model: layers {' · '.join(hybrid.layer_kinds)} (window {hybrid.window}, a gated linear "
        f"recurrence of {hybrid.state_size} channels); pool groups {', '.join(hybrid.groups)}, each layer "
        f"reading only through its group's block table; state mode {hybrid.state_mode} (a state page saved at "
        "every block boundary), except hybrid-no-saved-state (align: a state saved only where a step ends)"))
    report.notes.insert(1, (
        "hybrid events: window frees = sliding-table blocks freed as the window moved on, state restores = requests "
        "resuming from a cached state page, state copies = copies of a state page the pool reported (a fork's own "
        "state; the running state carried into the next block's page), swapped state pages = state pages brought "
        "back from the host, accepted drafts / state rewinds = drafts verification kept / states moved back to the "
        "last accepted position"))
    emit(report, output_format)
    return run.exit_code
