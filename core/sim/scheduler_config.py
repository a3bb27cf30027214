"""The scheduler's settings (scheduler.Scheduler reads them; `kvcalc sim` sets them from its options): the token
budget and sequence limit of a step, the longest request, how a request is preempted, the timeout of a request
without a first token, and whether the engine may take runs of steps at once (fastforward.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ParameterError
from ..model.gpu_plan import DEFAULT_MAX_NUM_SEQS
from ..model.vllm_memory import DEFAULT_MAX_NUM_BATCHED_TOKENS


@dataclass(frozen=True)
class SchedulerConfig:
    max_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_seqs: int = DEFAULT_MAX_NUM_SEQS  # `kvcalc sim` passes vLLM's default by GPU (hardware.default_max_seqs)
    max_model_len: int = 8192
    preempt: str = "recompute"
    timeout_s: float | None = None
    fast_forward: bool = True

    def __post_init__(self) -> None:
        if self.max_batched_tokens < 1:
            raise ParameterError(f"max_batched_tokens {self.max_batched_tokens} must be at least 1",
                                 "max_batched_tokens")
        if self.max_seqs < 1:
            raise ParameterError(f"max_seqs {self.max_seqs} must be at least 1", "max_seqs")
        if self.preempt not in ("recompute", "swap"):
            raise ParameterError(f"preempt {self.preempt!r} must be recompute or swap", "preempt")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ParameterError(f"timeout_s {self.timeout_s:g} must be a positive number of seconds", "timeout_s")
