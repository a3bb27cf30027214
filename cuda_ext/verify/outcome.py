"""What a `kvcalc verify` run found, typed: the CLI reads these fields; `to_dict()` is the JSON document.

    VerifyRun.to_dict() -> {"device", "device_name", "dtype", "attention_backend", "model": {dims..., "seed",
        "weights"}, "block_size", "inject", "pass_rule": {...}, "scenarios": [ScenarioResult.to_dict(), ...],
        "passed", "status", "wall_s", ["texts"], [inject_fired, inject_caught_by, inject_undetected_in,
        inject_not_exercised_in, inject_status]}

`model.seed` seeds the prompts, and the weights unless they come from a checkpoint (`model.weights` says
which). `passed` is True only when every scenario passed; `status` is passed, failed (a check failed
somewhere) or not exercised (no check failed, but a scenario missed an event its name promises). With a
fault injected the document also says how often it acted (`inject_fired`), which scenarios it acted in
caught it (`inject_caught_by`), in which it acted unnoticed (`inject_undetected_in`: a hole in the checks),
in which it never acted (`inject_not_exercised_in`), and the whole control's `inject_status`; `exit_code`
is the command's exit code. A real model's run has `texts`: a few requests' questions and both paths' answers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .config import ModelConfig
from .result import ScenarioResult
from .verdict import FP32_ULPS_PER_LAYER, TOP_K


@dataclass(frozen=True)
class PassRule:
    """The pass rule of a dtype, in words: fp32 identical tokens and a logit bound, else the top-k rule."""

    tokens: str
    fp32_logit_tolerance: str | None = None
    top_k: int | None = None

    @classmethod
    def of(cls, dtype: str) -> PassRule:
        if dtype == "fp32":
            return cls("identical", fp32_logit_tolerance=f"{FP32_ULPS_PER_LAYER} x layers x 2^-23 x max|reference "
                       "logit|")
        return cls(f"at the first mismatch each side's token is in the other's top {TOP_K} (seeded sampling: in "
                   "the other's sampling top_k)", top_k=TOP_K)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class HybridModelInfo:
    """What a hybrid model adds to the model's description (hybrid_suite.py)."""

    layer_kinds: tuple[str, ...]
    window: int
    state_size: int
    name: str
    state_mode: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class ModelInfo:
    config: ModelConfig  # the transformer's dimensions (a hybrid model's: its base)
    seed: int  # seeds the prompts, and the weights when `weights` is "seeded"
    weights: str  # "seeded", a model name or a checkpoint folder
    hybrid: HybridModelInfo | None = None

    def to_dict(self) -> dict[str, Any]:
        doc = self.config.to_dict()
        h = self.hybrid
        if h is None:
            return {**doc, "seed": self.seed, "weights": self.weights}
        return {**doc, "layer_kinds": list(h.layer_kinds), "window": h.window, "state_size": h.state_size,
                "seed": self.seed, "weights": self.weights, "name": h.name, "state_mode": h.state_mode,
                "groups": list(h.groups)}


@dataclass(frozen=True)
class DecodedText:
    """One request of a real model's run as text: the user's question and both paths' answers."""

    scenario: str
    request: int
    user: str
    reference: str
    paged: str
    identical: bool


@dataclass
class VerifyRun:
    device: str
    device_name: str
    dtype: str
    attention_backend: str
    model: ModelInfo
    block_size: int
    inject: str | None
    scenarios: list[ScenarioResult]
    wall_s: float
    texts: list[DecodedText] | None = None  # a real model's run only

    @property
    def pass_rule(self) -> PassRule:
        return PassRule.of(self.dtype)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.scenarios)

    @property
    def status(self) -> str:
        """failed if any scenario failed, else not exercised if any missed an event it names, else passed."""
        return run_status([r.status for r in self.scenarios])

    @property
    def inject_status(self) -> str | None:
        return None if self.inject is None else inject_status(self.scenarios)

    @property
    def exit_code(self) -> int:
        """0 passed, 1 failed, 4 not exercised (a scenario missed an event it names). With a fault planted: 1 it
        was caught wherever it acted (the run fails, as a negative control must), 5 it went unnoticed somewhere or
        a scenario it never acted in failed, 4 it never acted."""
        return EXIT_CODES[self.status] if self.inject_status is None else INJECT_EXIT_CODES[self.inject_status]

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "device": self.device, "device_name": self.device_name, "dtype": self.dtype,
            "attention_backend": self.attention_backend, "model": self.model.to_dict(), "block_size": self.block_size,
            "inject": self.inject, "pass_rule": self.pass_rule.to_dict(),
            "scenarios": [r.to_dict() for r in self.scenarios], "passed": self.passed, "status": self.status,
            "wall_s": self.wall_s,
        }
        if self.texts is not None:
            doc["texts"] = [asdict(t) for t in self.texts]
        if self.inject is not None:
            doc.update(inject_summary(self.scenarios))
        return doc


def run_status(statuses: list[str]) -> str:
    """failed if any scenario failed, else not exercised if any missed an event it names, else passed."""
    return next((s for s in ("failed", "not exercised") if s in statuses), "passed")


def inject_summary(results: list[ScenarioResult]) -> dict[str, Any]:
    """The JSON keys that say where a planted fault acted and whether each scenario caught it."""
    return {
        "inject_fired": sum(r.fault_fired or 0 for r in results),
        "inject_caught_by": [r.name for r in results if r.fault == "caught"],
        "inject_undetected_in": [r.name for r in results if r.fault == "undetected"],
        "inject_not_exercised_in": [r.name for r in results if r.fault == "not exercised"],
        "inject_status": inject_status(results),
    }


def inject_status(results: list[ScenarioResult]) -> str:
    """The negative control as a whole:

        caught         the fault acted, and every scenario it acted in failed a check
        undetected     it acted in a scenario whose checks all passed (a hole in the checks)
        failed         a scenario it never acted in failed (a failure the fault cannot explain)
        not exercised  it never acted in any scenario run (nothing to catch)
    """
    if any(r.fault == "undetected" for r in results):
        return "undetected"
    if any(r.fault == "not exercised" and r.status == "failed" for r in results):
        return "failed"
    return "caught" if any(r.fault == "caught" for r in results) else "not exercised"


# the exit code of each outcome of a plain run, and of a negative control (a caught fault fails the run: 1)
EXIT_CODES = {"passed": 0, "failed": 1, "not exercised": 4}
INJECT_EXIT_CODES = {"caught": 1, "undetected": 5, "failed": 5, "not exercised": 4}
