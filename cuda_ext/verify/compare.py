"""How two decodings of the same requests are compared: exact tokens (fp32), or vLLM's top-k rule (bf16/fp16).

Exact tokens cannot be promised below fp32: a cache hit or a different batch runs a GEMM on other rows,
one ULP moves, and a near-tie arg-max flips (vLLM issue #33123). vLLM's tests accept a pair of
decodings when, at the first mismatching token, each side's token is among the other side's top k.
After that point the sequences condition on different tokens and are not compared further.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def top_k_ids(logits: torch.Tensor, k: int) -> frozenset[int]:
    """logits [vocab] -> ids of the k largest logits; ids tied with the k-th value are included too."""
    assert logits.dim() == 1, f"logits {tuple(logits.shape)}, expected [vocab]"
    if k < 1:
        raise ValueError(f"k {k} must be >= 1")
    kth = torch.topk(logits, min(k, logits.shape[0])).values[-1]
    return frozenset(torch.nonzero(logits >= kth).flatten().tolist())


def first_mismatch(reference: Sequence[int], test: Sequence[int]) -> int | None:
    """Index of the first differing token (a length difference counts at the shorter length), or None."""
    for i, (a, b) in enumerate(zip(reference, test, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(test) else min(len(reference), len(test))


@dataclass(frozen=True)
class TopKVerdict:
    first_mismatch: int | None  # None: identical
    reference_token: int | None
    test_token: int | None
    passed: bool


def top_k_rule(
    reference_tokens: Sequence[int],
    reference_logits: torch.Tensor,
    test_tokens: Sequence[int],
    test_logits: torch.Tensor,
    k: int,
) -> TopKVerdict:
    """Both logits are [num_tokens, vocab], row i the distribution token i was drawn from. Passes when the
    tokens are identical, or at the first mismatch i each token is in the other side's top k at row i."""
    i = first_mismatch(reference_tokens, test_tokens)
    if i is None:
        return TopKVerdict(None, None, None, True)
    if i >= min(len(reference_tokens), len(test_tokens)):
        return TopKVerdict(i, None, None, False)
    ref_tok, test_tok = reference_tokens[i], test_tokens[i]
    passed = test_tok in top_k_ids(reference_logits[i], k) and ref_tok in top_k_ids(test_logits[i], k)
    return TopKVerdict(i, ref_tok, test_tok, passed)
