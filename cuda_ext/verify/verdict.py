"""The pass rule of one scenario's decodings against their references.

    fp32       every generated token identical, for every request, and every logit within the model's
               tolerance of the reference's (the paths reduce in different orders, so not 0):
               fp32_logit_tolerance = FP32_ULPS_PER_LAYER x num_layers x 2^-23 x max |reference logit| —
               rounding is relative (one float32 ulp is 2^-23 of the value), each layer's residual add and
               reductions contribute a few, so the bound grows with depth and with the logits' scale.
               Measured: |Δlogit| / (num_layers x 2^-23 x max|logit|) is 0.1-1 for the built-in 2-layer model
               and SmolLM2-135M (whose paths differ by up to ~1e-4 with logits near 30), so 16 leaves a margin
               of 16x or more and still fails a real error (wrong K/V moves logits by 0.1 and more)
    bf16/fp16  vLLM's rule: at the first mismatching token of a request, each side's token is among the
               other side's top TOP_K (for seeded sampling, among the tokens the other side's sampler
               could draw: its top_k, at least TOP_K); later tokens condition on different text and
               are not compared

Logits are compared up to and including the first mismatch (the row where both sides last saw the same
context). A request whose test decoding is shorter or longer than its reference mismatches at the
shorter length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .compare import first_mismatch, top_k_rule

FP32_ULPS_PER_LAYER = 16
FP32_EPS = 2.0**-23
TOP_K = 5


def fp32_logit_tolerance(num_layers: int, max_abs_logit: float) -> float:
    """The largest |Δlogit| fp32 accepts for a model of `num_layers` whose logits reach `max_abs_logit`."""
    return FP32_ULPS_PER_LAYER * num_layers * FP32_EPS * max(max_abs_logit, 1.0)


@dataclass(frozen=True)
class Decoding:
    """One request's output tokens and the logits rows [num_tokens, vocab] each was drawn from."""

    tokens: tuple[int, ...]
    logits: torch.Tensor
    top_k: int = TOP_K  # how many of the other side's best tokens a mismatching token may be among


@dataclass(frozen=True)
class Comparison:
    tokens_compared: int
    mismatched_tokens: int
    first_mismatch: dict[str, Any] | None  # the first request that mismatches: request, position, tokens
    max_abs_logit_diff: float
    passed: bool
    logit_tolerance: float | None = None  # fp32: the bound max_abs_logit_diff was held to


def _stack(rows: Sequence[torch.Tensor] | torch.Tensor, vocab: int) -> torch.Tensor:
    if isinstance(rows, torch.Tensor):
        return rows.to(torch.float32)
    return torch.stack(list(rows)).to(torch.float32) if len(rows) else torch.zeros(0, vocab)


def compare(references: Sequence[Decoding], tests: Sequence[Decoding], exact: bool, num_layers: int = 2,
            ) -> Comparison:
    """references[i] vs tests[i]; `exact` is the fp32 rule (its logit tolerance from `num_layers` and the
    references' largest logit), else the top-k rule."""
    assert len(references) == len(tests), f"{len(references)} references for {len(tests)} decodings"
    compared = mismatched = 0
    first: dict[str, Any] | None = None
    max_diff = 0.0
    passed = True
    for request, (ref, test) in enumerate(zip(references, tests, strict=True)):
        vocab = ref.logits.shape[-1]
        ref_logits, test_logits = _stack(ref.logits, vocab), _stack(test.logits, vocab)
        compared += len(ref.tokens)
        mismatched += sum(a != b for a, b in zip(ref.tokens, test.tokens, strict=False))
        mismatched += abs(len(ref.tokens) - len(test.tokens))
        at = first_mismatch(ref.tokens, test.tokens)
        rows = min(len(ref.tokens), len(test.tokens)) if at is None else min(at + 1, len(ref.tokens),
                                                                              len(test.tokens))
        if rows:
            max_diff = max(max_diff, float((ref_logits[:rows] - test_logits[:rows].to(ref_logits.device)).abs().max()))
        if exact:
            ok = at is None
        else:
            ok = top_k_rule(ref.tokens, ref_logits, test.tokens, test_logits.to(ref_logits.device), ref.top_k).passed
        passed &= ok
        if at is not None and first is None:
            first = {
                "request": request,
                "position": at,
                "reference_token": ref.tokens[at] if at < len(ref.tokens) else None,
                "test_token": test.tokens[at] if at < len(test.tokens) else None,
                "within_top_k": None if exact else ok,
            }
    tolerance = None
    if exact:
        largest = max((float(_stack(r.logits, 1).abs().max()) for r in references if len(r.tokens)), default=1.0)
        tolerance = fp32_logit_tolerance(num_layers, largest)
        passed &= max_diff <= tolerance
    return Comparison(compared, mismatched, first, max_diff, passed, tolerance)
