"""The notes of a `kvcalc sim` run that say what its pool and model are (setup.build adds them): a hybrid model's
KV cache groups, how Mooncake's hash ids key the pool's blocks, and what the step-time model assumes for the model
(windows, chunks, MoE weight reads)."""

from __future__ import annotations

from ..inputs.traces import MOONCAKE_BLOCK_TOKENS, check_mooncake_block_size
from ..model.kv_groups import KVLayout
from ..model.models import ModelSpec
from .steptime import StepTimeModel


def groups_note(layout: KVLayout) -> str:
    """What a hybrid model's pool is: its KV cache groups, and where the state comes from."""
    if not layout.state_groups:
        return f"KV cache groups ({layout.layout} layout): {layout.reason}"
    return (f"KV cache groups ({layout.layout} layout): {layout.reason}; each group paged in one pool, the state "
            f"from it per running request (mamba_cache_mode {layout.mamba_cache_mode}"
            + ("; align keeps two pages, the running state and the last one saved, and a prefix-cache hit restores "
               "a state saved at exactly its block boundary: prefill chunks end on block boundaries, as vLLM's "
               "block-aligned split, and the pool saves the state where each step ends)"
               if layout.mamba_cache_mode == "align" else ")"))


def mooncake_keys_note(block_size: int, hybrid: bool) -> str:
    """How Mooncake's 512-token hash ids key the pool's blocks. A hybrid pool keys them as `kvcalc share` does
    (core/share/replay_groups): a block that does not tile the ids — vLLM's layout forces one on a Mamba
    hybrid — by the id holding its last token, so hits are a lower bound; a single group's block is the one
    typed, refused unless it tiles the ids (as share's replay)."""
    note = "prefix caching on: Mooncake hash_ids give each prompt block's content (paged policy only)"
    if not hybrid:
        check_mooncake_block_size(block_size)
        return note
    if keys_lower_bound(block_size):
        note += (f"; a block of {block_size:,} tokens does not tile the ids' {MOONCAKE_BLOCK_TOKENS} tokens, so each "
                 "block is keyed by the id holding its last token: two prompts that share a block but differ later "
                 "in that id miss, and the hits are a lower bound")
    return note


def keys_lower_bound(block_size: int) -> bool:
    """core/share/replay_groups.keys_lower_bound, imported only by a hybrid run with prefix caching (it brings
    the hybrid pool's modules, ~0.1 s of a plain run's start-up)."""
    from ..share.replay_groups import keys_lower_bound
    return keys_lower_bound(block_size)


def model_notes(spec: ModelSpec, steptime: StepTimeModel) -> list[str]:
    """What the simulation does not model, or models with an assumption, for this model (said, never silent)."""
    notes = []
    if spec.num_sliding_layers:
        kind, pool = (("chunked local attention", "keeps each sequence's current chunk") if steptime.window_kind
                      == "chunked" else ("sliding window", "frees each sequence's blocks that left the window"))
        notes.append(f"{kind} {spec.sliding_window:,} on {spec.num_sliding_layers} of {spec.layers} layers: applied to "
                     f"the attention FLOPs and KV reads of each step; the pool {pool}")
    if steptime.num_experts:
        notes.append(
            f"MoE weight reads: dense part + the experts a step's T tokens touch, {steptime.num_experts}·(1 − (1 − "
            f"{steptime.experts_per_token}/{steptime.num_experts})^T) per layer, assuming uniform routing"
        )
    elif spec.num_experts:
        notes.append(f"{spec.name} is MoE but has no active-parameter count: every step reads every weight "
                     "(a worst case)")
    return notes
