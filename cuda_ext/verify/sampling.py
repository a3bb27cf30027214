"""Token sampling whose randomness depends on (request seed, position) alone, so batching cannot change it.

Greedy (temperature 0) takes the arg-max (the lowest id among equal maxima). Seeded sampling scales the
logits by 1/temperature, keeps the top_k (0 = all; ties at the k-th value are kept), and inverts the
cumulative distribution, in token-id order and float64, at one uniform number u(seed, position).

u is counter-based: splitmix64 of the seed, mixed with the position, mixed again, top 53 bits. No
generator state is carried between steps or shared between requests, so a request draws the same u at a
position whether it runs alone or in any batch, after a preemption or a recompute. `position` is the
index the sampled token will occupy in its sequence (the prompt length for the first output token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = the whole vocabulary
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature {self.temperature} must be >= 0 (0 is greedy)")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k {self.top_k!r} must be an integer >= 0 (0 keeps every token)")
        if not isinstance(self.seed, int) or not 0 <= self.seed <= _MASK64:
            raise ValueError(f"seed {self.seed!r} must be an integer in 0..2^64-1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform_draw(seed: int, position: int) -> float:
    """A uniform number in [0, 1) that is a pure function of (seed, position)."""
    if position < 0:
        raise ValueError(f"position {position} must be >= 0")
    return (_splitmix64(_splitmix64(seed) ^ position) >> 11) * 2.0**-53


def sample_token(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    """logits [vocab] -> the token id drawn for `position`."""
    assert logits.dim() == 1, f"logits {tuple(logits.shape)}, expected [vocab]"
    if params.greedy:
        return int(torch.argmax(logits))
    scaled = logits.detach().to("cpu", torch.float64) / params.temperature  # [vocab]
    if 0 < params.top_k < scaled.shape[0]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=0)  # [vocab], zero outside the top k
    cdf = torch.cumsum(probs, dim=0)
    target = uniform_draw(params.seed, position) * float(cdf[-1])
    token = int(torch.searchsorted(cdf, torch.tensor([target], dtype=torch.float64), right=True))
    last_kept = int(torch.nonzero(probs).max())  # target can round up to cdf[-1]; never pick a dropped id
    return min(token, last_kept)


def sample_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int]
) -> list[int]:
    """logits [S, vocab], one SamplingParams and one position per row -> S token ids (rows independent)."""
    assert logits.dim() == 2 and logits.shape[0] == len(params) == len(positions), (
        f"logits {tuple(logits.shape)} with {len(params)} params and {len(positions)} positions"
    )
    return [sample_token(row, p, pos) for row, p, pos in zip(logits, params, positions, strict=True)]
