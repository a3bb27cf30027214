"""Load a cached prefix from a tier, or recompute it? (Mooncake FAST'25, Eq. 2.)

Loading the KV of a prefix segment from a tier of bandwidth BW takes bytes / BW; recomputing it is a prefill
of those tokens after the ones before them, timed by kvcalc's roofline step-time model (core/sim/steptime:
max(FLOPs / compute, bytes / memory bandwidth) + overhead, one step for the segment). Loading pays when
bytes / BW < T_prefill, i.e. above the break-even bandwidth bytes / T_prefill. Bytes are per GPU of the
tensor-parallel group (each GPU loads its shard over its own link), so bandwidths are per GPU too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.kv_groups import kv_layout
from ..model.models import ModelSpec
from ..pool.groups import pool_groups
from ..sim.hardware import GpuSpec, plan_memory
from ..sim.steptime import Efficiencies, StepTimeModel, build_model, prefill_positions


def step_time_model(spec: ModelSpec, gpu: GpuSpec, kv_dtype_bits: int, block_size: int, tp: int,
                    quantization: str | None = None) -> StepTimeModel:
    """kvcalc sim's default step-time model for `spec` on `tp` × `gpu` (default efficiencies; the weights in
    spec's weight_dtype or `quantization`, as hardware.checkpoint_weights gives them: the checkpoint's own).
    A hybrid model's memory is planned as sim plans it (its KV cache groups, the state paged in the pool), not
    with a state reserved up front for every one of max_seqs sequences."""
    layout = kv_layout(spec, kv_dtype_bits, block_size, "vllm", tp, "none")
    plan = plan_memory(spec, gpu, kv_dtype_bits=kv_dtype_bits, block_size=block_size, tp=tp, quantization=quantization,
                       layout=layout if pool_groups(layout) is not None else None)
    return build_model(spec, plan, Efficiencies())


def prefill_s(model: StepTimeModel, start_tokens: np.ndarray, count_tokens: np.ndarray) -> np.ndarray:
    """float64 [N]: seconds to compute `count_tokens` prompt tokens after `start_tokens` cached ones (0 if none)."""
    start = np.asarray(start_tokens, dtype=np.float64)
    count = np.asarray(count_tokens, dtype=np.float64)
    seconds = model.step_s(count, prefill_positions(start, count), start + count)
    return np.where(count > 0, seconds, 0.0)


@dataclass(frozen=True)
class LoadOrRecompute:
    """One tier's hits: their bytes (per GPU), the time to load them at the tier's bandwidth and to recompute
    them instead, and the bandwidth above which loading pays."""

    tier: str
    bytes_per_gpu: int
    bandwidth_bytes_per_s: float
    load_s: float
    recompute_s: float

    @property
    def break_even_bytes_per_s(self) -> float | None:
        return self.bytes_per_gpu / self.recompute_s if self.recompute_s > 0 else None

    @property
    def loading_pays(self) -> bool | None:
        return None if self.recompute_s <= 0 else self.load_s < self.recompute_s


def tier_verdict(model: StepTimeModel, tier: str, start_tokens: np.ndarray, hit_tokens: np.ndarray,
                 num_bytes: int, bandwidth_bytes_per_s: float) -> LoadOrRecompute:
    """Each request's hit segment in `tier`: its `hit_tokens` after `start_tokens` hit in faster tiers, arrays
    over requests; `num_bytes` per GPU of all of them."""
    recompute = float(prefill_s(model, start_tokens, hit_tokens).sum())
    return LoadOrRecompute(tier, num_bytes, bandwidth_bytes_per_s, num_bytes / bandwidth_bytes_per_s, recompute)


def break_even_bandwidth(model: StepTimeModel, prefix_tokens: int, bytes_per_token_gpu: float) -> float:
    """Bytes/s per GPU above which loading a `prefix_tokens` prefix beats prefilling it (Mooncake's Eq. 2)."""
    seconds = float(prefill_s(model, np.array([0]), np.array([prefix_tokens]))[0])
    return prefix_tokens * bytes_per_token_gpu / seconds
