"""Speculative decoding's KV slots: what one step reserves, and the most blocks a request can hold.

A step of speculative decoding for a sequence whose cache holds L committed tokens (vLLM's
`num_computed_tokens`) computes 1 + K positions — its last sampled token and K drafts — and a drafter
that keeps KV of its own (a draft model, EAGLE, MTP) is given λ = K lookahead positions more, for the
drafts of the next step. vLLM's scheduler asks `allocate_slots` for exactly that many:

    slots(L) = L + (1 + K) + λ          draft model, EAGLE, MTP: λ = K  ->  L + 1 + 2K
                                        n-gram drafting (no drafter KV): λ = 0  ->  L + 1 + K

then rolls `num_computed_tokens` back by the rejected drafts (the blocks stay the request's). A request
that ends with n tokens in the cache (equation 2's n) runs its last step from some L <= n − 1 — from
exactly n − 1 when the step before accepted just enough — so it can hold, at most,

    peak(n) = ceil((n + K + λ) / B) blocks      against ceil(n / B) without speculation

K + λ more slots, so floor((K + λ)/B) or ceil((K + λ)/B) more blocks. vLLM schedules no position at or past
`max_model_len`: `peak_slots(n, max_model_len)` trims there (a request of max_model_len tokens holds no
more blocks with speculation than without).

Pure Python (no numpy): `kvcalc size` uses it; frag applies it to arrays of lengths (core/frag.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .blocks import ceil_div
from .errors import ParameterError
from .model.layers import LayerGroup, bits_to_bytes, state_bits
from .model.model_spec import ModelSpec
from .notes import Note

SPEC_METHODS = {"draft": "a draft model", "eagle": "an EAGLE head", "mtp": "multi-token-prediction layers",
                "ngram": "n-gram drafting"}  # method: its drafters (all but ngram keep KV: K lookahead slots)
DEFAULT_SPEC_METHOD = "draft"


@dataclass(frozen=True)
class Speculation:
    """K drafts per step with `method`'s lookahead (see the module docstring); K = 0 is plain decoding."""

    spec_tokens: int
    method: str = DEFAULT_SPEC_METHOD

    def __post_init__(self) -> None:
        if isinstance(self.spec_tokens, bool) or not isinstance(self.spec_tokens, int) or self.spec_tokens < 0:
            raise ParameterError(
                f"spec_tokens {self.spec_tokens!r} is not a number of drafts: give a whole number, 0 or more "
                "(e.g. 4)", "spec_tokens",
            )
        if self.method not in SPEC_METHODS:
            raise ParameterError(
                f"spec_method {self.method!r} is not a drafting method: use draft, eagle or mtp (a drafter with KV "
                f"of its own: K lookahead slots) or ngram ({SPEC_METHODS['ngram']}: none)", "spec_method",
            )

    @property
    def lookahead_slots(self) -> int:
        """λ: vLLM's num_lookahead_tokens (K for a drafter with its own KV, 0 for n-gram)."""
        return 0 if self.method == "ngram" else self.spec_tokens

    @property
    def slots_per_step(self) -> int:
        """Slots one step reserves past the committed tokens: 1 + K + λ."""
        return 1 + self.spec_tokens + self.lookahead_slots

    @property
    def extra_slots(self) -> int:
        """K + λ: slots past what plain decoding reserves (its one token)."""
        return self.spec_tokens + self.lookahead_slots

    @property
    def formula(self) -> str:
        """The peak in blocks, e.g. 'ceil((n + 2·4) / B)'."""
        if self.method != "ngram":
            return f"ceil((n + 2·{self.spec_tokens}) / B)"
        return f"ceil((n + {self.spec_tokens}) / B)"

    def peak_slots(self, num_tokens: int, max_model_len: int | None = None) -> int:
        """Slots a request of `num_tokens` can hold at its last step: n + K + λ, trimmed at max_model_len
        (never below n itself)."""
        slots = num_tokens + self.extra_slots
        return slots if max_model_len is None else max(num_tokens, min(slots, max_model_len))

    def peak_blocks(self, num_tokens: int, block_size: int, max_model_len: int | None = None) -> int:
        return ceil_div(self.peak_slots(num_tokens, max_model_len), block_size)


def speculation_from(spec_tokens: int | None, spec_method: str | None = None) -> Speculation | None:
    """The speculation a command's options ask for: None without spec_tokens (a spec_method alone is refused)."""
    if spec_tokens is None:
        if spec_method is not None:
            raise ParameterError(f"spec_method {spec_method!r} applies to speculative decoding: give spec_tokens K "
                                 "too", "spec_method", "spec_tokens")
        return None
    return Speculation(spec_tokens, DEFAULT_SPEC_METHOD if spec_method is None else spec_method)


def paged_bits_per_seq(groups: tuple[LayerGroup, ...], num_tokens: int, end: int, block_size: int,
                       dtype_bits: int, tp: int = 1) -> int:
    """Bits the blocks of one sequence take (on one of `tp` GPUs) when it holds `num_tokens` committed and
    its table reaches slot `end` (>= num_tokens): a full-attention layer ceil(end/B) blocks; a sliding window
    W the blocks from the one holding position n − W on, a chunked layer (chunk C) those from the one holding
    the current chunk's start C · floor((n − 1)/C) on (engines free those before it, counted on the committed
    tokens); plus the recurrent state. With end = n: equation 2 in bits, windows and chunks applied."""
    bits = 0
    for g in groups:
        if not g.keeps_kv:
            continue
        blocks = ceil_div(end, block_size)
        if g.kind == "sliding":
            assert g.window is not None
            blocks -= max(num_tokens - g.window, 0) // block_size
        elif g.kind == "chunked" and num_tokens > 0:
            assert g.window is not None
            blocks -= g.window * ((num_tokens - 1) // g.window) // block_size
        bits += g.count * g.bits_per_token(dtype_bits, tp) * block_size * blocks
    return bits + state_bits(groups, tp)


@dataclass(frozen=True)
class SpeculativeSize:
    """One sequence of `tokens` in blocks of `block_size`, without speculation and at its speculative peak
    (bits on one of `tp` GPUs, windows and recurrent state included); with a KV budget (per GPU), how many
    such sequences fit each way."""

    speculation: Speculation
    tokens: int
    block_size: int
    tp: int
    max_model_len: int | None
    plain_bits_per_seq: int
    peak_bits_per_seq: int
    memory_bytes: int | None = None

    @property
    def peak_slots(self) -> int:
        return self.speculation.peak_slots(self.tokens, self.max_model_len)

    @property
    def trimmed(self) -> bool:
        """max_model_len cut the peak short of n + K + λ."""
        return self.peak_slots < self.tokens + self.speculation.extra_slots

    @property
    def plain_blocks(self) -> int:
        return ceil_div(self.tokens, self.block_size)

    @property
    def peak_blocks(self) -> int:
        return ceil_div(self.peak_slots, self.block_size)

    @property
    def extra_blocks(self) -> int:
        return self.peak_blocks - self.plain_blocks

    @property
    def plain_bytes_per_seq(self) -> int:
        return bits_to_bytes(self.plain_bits_per_seq)

    @property
    def peak_bytes_per_seq(self) -> int:
        return bits_to_bytes(self.peak_bits_per_seq)

    @property
    def plain_max_seqs(self) -> int | None:
        return None if self.memory_bytes is None else self.memory_bytes * 8 // self.plain_bits_per_seq

    @property
    def peak_max_seqs(self) -> int | None:
        return None if self.memory_bytes is None else self.memory_bytes * 8 // self.peak_bits_per_seq


def speculative_size(
    groups: tuple[LayerGroup, ...], speculation: Speculation, tokens: int, block_size: int, dtype_bits: int,
    tp: int = 1, max_model_len: int | None = None, memory_bytes: int | None = None,
) -> SpeculativeSize:
    """`SpeculativeSize` of a model's layer groups (`tp` GPUs; `memory_bytes` per GPU when tp > 1)."""
    peak = speculation.peak_slots(tokens, max_model_len)
    return SpeculativeSize(
        speculation, tokens, block_size, tp, max_model_len,
        paged_bits_per_seq(groups, tokens, tokens, block_size, dtype_bits, tp),
        # + K states: vLLM keeps the state after each draft position (MambaSpec.num_speculative_blocks = K)
        paged_bits_per_seq(groups, tokens, peak, block_size, dtype_bits, tp) + speculation.spec_tokens * state_bits(
            groups, tp),
        memory_bytes,
    )


def with_config_drafter(spec: ModelSpec, spec_tokens: int | None, method: str | None,
                        command: str) -> tuple[ModelSpec, str | None]:
    """`spec` with the KV its drafter keeps in the same pool, as `kvcalc size` counts it (models.with_drafter),
    for a `command` that reads no drafter config (sim, frag): spec_method mtp or eagle adds the config's MTP
    layers (refused when it has none); draft's own model is not read, and the note says its KV is left out;
    ngram adds none. Without speculation the note says that the config's MTP layers exist and are not counted.
    An unknown method is left to `Speculation`, which refuses it by name."""
    from .model.models import with_drafter

    name = None if spec_tokens is None else DEFAULT_SPEC_METHOD if method is None else method.strip().lower()
    if name == "draft":
        return spec, Note(f"{{spec_method}} draft: the draft model's own KV is not counted ({command} reads no "
                          "drafter config; kvcalc size --draft-config counts it)", "spec_method")
    if name in ("mtp", "eagle") and not spec.drafter_layers:
        raise ParameterError(
            f"spec_method {name}: {spec.name}'s config has no MTP layers (num_nextn_predict_layers, "
            f"mtp_num_hidden_layers) to draft with, and {command} reads no drafter config: use spec_method draft (a "
            "draft model, its KV not counted) or ngram (kvcalc size --draft-config counts an EAGLE head's KV)",
            "spec_method")
    if name is not None and name not in SPEC_METHODS:
        return spec, None
    return with_drafter(spec, name)
