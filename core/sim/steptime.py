"""The roofline step-time model: how long one engine step takes on the simulated GPU(s).

    t = max(FLOPs / (tp · peak · compute_eff),  weights / (tp · bw · weight_eff) + KV / (tp · bw · attn_eff))
        + overhead + swap bytes / swap bandwidth

FLOPs = 2 · active params · (prefill + decode tokens) + attention FLOPs, where one query token that
attends to c context tokens costs 4 · layers · heads · head_dim · c (QKᵀ and PV, a multiply-add each);
a causal prefill chunk of m tokens after s cached ones attends to s·m + m(m+1)/2 positions.
Bytes = the weights once per step + the KV read (every context token each step) and written (the new
tokens) + a recurrent model's state, read and written once by each sequence of the step (Mamba, linear
attention: 2 · state bytes per sequence). Tensor-parallel communication is not modelled.

MoE weights: a step reads the dense part (attention, shared experts, router, embeddings) and only the routed
experts that its T tokens touch. With E routed experts per layer, k per token, and p_e = (total − active) /
(E − k) parameters per expert (summed over the MoE layers), dense = active − k · p_e, and, ASSUMING UNIFORM
ROUTING (each token picks k distinct experts uniformly at random, independently of the other tokens), the
expected number of distinct experts a layer touches is E · (1 − (1 − k/E)^T). So

    weights read = (dense + p_e · E · (1 − (1 − k/E)^T)) / total  × the weights on one GPU

which is `active` at T = 1 and tends to every weight as T grows. Real routers are skewed (hot experts), so
real steps touch fewer experts than this: the model is an upper bound on the expert reads for a given T.

Windowed layers: a sliding layer's query at position q (Mistral, Gemma-2/3, gpt-oss) attends and reads at most
the last W positions, min(q, W); a chunked local layer's (Llama-4, chunk C) only its own chunk, (q − 1) mod C + 1.
So a fraction `sliding_share` = windowed layers / layers of the attention FLOPs and KV reads is cut by the
positions beyond them ("excess"): for a chunk of m tokens after s cached ones,

    sliding:  excess positions = Σ_{q=s+1}^{s+m} max(q − W, 0)      excess reads = max(s + 1 − W, 0)
    chunked:  excess positions = Σ_{q=s+1}^{s+m} C·floor((q − 1)/C)  excess reads = C·floor(s/C)

(a decode step, m = 1 at context c = s + 1: both are max(c − W, 0), or C·floor((c − 1)/C)); the closed forms
are in step_sums.py. The pool side is the hybrid pool's: a windowed group frees the blocks that left the window
or the chunk (core/pool/groups.py), so here only the time is windowed.

Default efficiencies (`--compute-eff 0.6 --weight-eff 0.8 --attn-eff 0.8 --step-overhead-ms 0.5`): dense
bf16 GEMMs of serving-sized batches reach 60–75 % of datasheet peak on A100/H100; weight streaming in
decode reaches ~80 % of HBM bandwidth; FlashInfer's decode attention ~88 % and vLLM's paged kernel 83–85 %
at large batch × context; 0.5 ms covers scheduling and launch overhead with CUDA
graphs. `--calibrate bench.json` replaces attn_eff by the median measured `achieved_tbps` of a `kvcalc
bench` run divided by this GPU's datasheet bandwidth.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ParameterError
from ..model.layers import bits_to_bytes
from ..model.models import ModelSpec
from ..model.vllm_memory import DEFAULT_MAX_NUM_BATCHED_TOKENS
from ..model.weights import estimate_params
from .hardware import GpuSpec, MemoryPlan, active_params
from .options import DEFAULT_SWAP_BANDWIDTH_BYTES_PER_S
from .plan import NO_EVENTS, Preemption, StepOutcome, StepPlan, SwapIn
from .step_sums import chunked_chunk_excess, chunked_decode_excess, sliding_chunk_excess, sliding_decode_excess

SANE_STEP_S = 86_400.0  # one engine step longer than a day means the GPU figures are wrong


@dataclass(frozen=True)
class Efficiencies:
    """Shares of the datasheet figures reached (compute: peak FLOP/s; weights and attention: bandwidth) and
    the fixed time of a step."""

    compute_eff: float = 0.6
    weight_eff: float = 0.8
    attn_eff: float = 0.8
    step_overhead_s: float = 0.5e-3

    def __post_init__(self) -> None:
        for name, value in (("compute_eff", self.compute_eff), ("weight_eff", self.weight_eff),
                            ("attn_eff", self.attn_eff)):
            if not 0 < value <= 1:
                raise ParameterError(f"{name} {value:g} must be in (0, 1]", name)
        if not 0 <= self.step_overhead_s < SANE_STEP_S:
            raise ParameterError(f"step_overhead_s {self.step_overhead_s:g} must be >= 0 and below a day",
                                 "step_overhead_s")


@dataclass(frozen=True)
class StepTimeModel:
    """Coefficients of the roofline for one replica; every method is vectorised over numpy arrays."""

    flops_per_token: float  # 2 · active params
    attn_flops_per_position: float  # 4 · layers · heads · head_dim
    kv_bytes_per_token: int  # per GPU
    compute_s_per_flop: float
    weights_s: float
    kv_s_per_byte: float
    overhead_s: float
    swap_bandwidth_bytes_per_s: float
    moe_dense_share: float = 1.0  # MoE: dense params / all params (1 for a dense model)
    moe_expert_share: float = 0.0  # MoE: params of one routed expert (all MoE layers) / all params
    num_experts: int = 0  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0
    window_tokens: int = 0  # sliding window W or chunk C (0: no windowed layer)
    sliding_share: float = 0.0  # windowed (sliding or chunked) layers / layers
    window_kind: str = "sliding"  # what window_tokens is: "sliding" (min(q, W)) or "chunked" ((q − 1) mod C + 1)
    state_bytes_per_seq: int = 0  # per GPU: a sequence's recurrent state, read and written by every step it is in

    def weights_read_share(self, tokens: np.ndarray | float) -> np.ndarray | float:
        """Share of the weights that a step of `tokens` tokens reads: 1 for a dense model; for MoE the dense
        part plus the expected distinct experts under uniform routing, E · (1 − (1 − k/E)^T) (module docstring)."""
        if not self.num_experts:
            return 1.0
        miss = 1.0 - self.experts_per_token / self.num_experts
        return self.moe_dense_share + self.moe_expert_share * self.num_experts * (1.0 - miss**tokens)

    def step_s(self, tokens: np.ndarray | float, attn_positions: np.ndarray | float,
               kv_tokens_moved: np.ndarray | float, swap_bytes: float = 0.0,
               excess_positions: np.ndarray | float = 0.0, excess_reads: np.ndarray | float = 0.0,
               num_seqs: np.ndarray | float = 0.0) -> np.ndarray | float:
        """Step time for `tokens` computed tokens attending `attn_positions` positions, moving
        `kv_tokens_moved` KV tokens (read + written), all counted as if every layer held every token;
        `excess_*` (see the module docstring) are what sliding layers skip; a recurrent model's `num_seqs`
        sequences each read and write their state once."""
        if self.sliding_share:
            attn_positions = attn_positions - self.sliding_share * excess_positions
            kv_tokens_moved = kv_tokens_moved - self.sliding_share * excess_reads
        flops = self.flops_per_token * tokens + self.attn_flops_per_position * attn_positions
        compute = flops * self.compute_s_per_flop
        weights = self.weights_s if not self.num_experts else self.weights_s * self.weights_read_share(tokens)
        moved_bytes = kv_tokens_moved * self.kv_bytes_per_token
        if self.state_bytes_per_seq:
            moved_bytes = moved_bytes + 2.0 * self.state_bytes_per_seq * num_seqs
        memory = weights + moved_bytes * self.kv_s_per_byte
        step: np.ndarray | float
        if isinstance(compute, float) and isinstance(memory, float):  # one step: skip numpy's call overhead
            step = max(compute, memory) + self.overhead_s
        else:
            step = np.maximum(compute, memory) + self.overhead_s
        return step + swap_bytes / self.swap_bandwidth_bytes_per_s if swap_bytes else step

    def decode_steps_s(self, num_seqs: int, context_sum: np.ndarray | float,
                       excess: np.ndarray | float = 0.0) -> np.ndarray | float:
        """Decode-only steps: `num_seqs` tokens, each attending its context (Σ = context_sum, the new
        token included) and writing one KV token; `excess` = Σ max(context − W, 0) (sliding windows)."""
        return self.step_s(float(num_seqs), context_sum, context_sum + float(num_seqs), 0.0, excess, excess,
                           float(num_seqs))

    def step_fn(self) -> Callable[[float, float, float, float], float]:
        """step_s(tokens, attn_positions, kv_tokens_moved, 0.0, 0.0, 0.0, num_seqs) of plain floats without a sliding
        window, as a function over the coefficients read once: step_s's operations in the same order."""
        assert not self.sliding_share, "a sliding window's excess needs the chunks (chunk_excess)"
        fpt, afp, cspf, kvb, kvs, over = (self.flops_per_token, self.attn_flops_per_position, self.compute_s_per_flop,
                                          self.kv_bytes_per_token, self.kv_s_per_byte, self.overhead_s)
        weights_s, moe, share = self.weights_s, bool(self.num_experts), self.weights_read_share
        state = 2.0 * self.state_bytes_per_seq

        def step(tokens: float, positions: float, moved: float, num_seqs: float) -> float:
            compute = (fpt * tokens + afp * positions) * cspf
            weights = weights_s * float(share(tokens)) if moe else weights_s
            moved_bytes = moved * kvb + state * num_seqs if state else moved * kvb
            return max(compute, weights + moved_bytes * kvs) + over

        return step

    def decode_run_s(self, num_seqs: int, context0: int, k: int) -> list[float]:
        """decode_steps_s(num_seqs, context0 + num_seqs·j) for steps j = 0 .. k−1 without a sliding window, as a list:
        step_s's operations in the same order on each step's plain floats (numpy's elementwise float64 operations
        give the same bits), which for a few dozen steps costs less than numpy's calls."""
        assert not self.sliding_share, "a sliding window's excess needs the requests' tokens (decode_excess)"
        n = float(num_seqs)
        base = self.flops_per_token * n
        weights = self.weights_s if not self.num_experts else self.weights_s * float(self.weights_read_share(n))
        state = 2.0 * self.state_bytes_per_seq * n if self.state_bytes_per_seq else 0.0
        afp, cspf, kvb, kvs, over = (self.attn_flops_per_position, self.compute_s_per_flop, self.kv_bytes_per_token,
                                     self.kv_s_per_byte, self.overhead_s)
        # step j attends c = context0 + n·j positions, an integer < 2^53: exact, as numpy's context0 + n·j in floats;
        # compute = (base + afp·c)·cspf, memory = weights + ((c + n)·kvb [+ state])·kvs, then np.maximum (no NaN)
        contexts = map(float, range(context0, context0 + num_seqs * k, num_seqs))
        if state:
            return [(flop_s if (flop_s := (base + afp * c) * cspf) > (byte_s := weights + ((c + n) * kvb + state) * kvs)
                     else byte_s) + over for c in contexts]
        return [(flop_s if (flop_s := (base + afp * c) * cspf) > (byte_s := weights + (c + n) * kvb * kvs)
                else byte_s) + over for c in contexts]

    def chunk_excess(self, start: np.ndarray, count: np.ndarray) -> tuple[float, float]:
        """(excess positions, excess reads) summed over chunks of `count` tokens after `start` cached ones
        [m] int64 (module docstring); (0, 0) without a window. Exact integers, returned as floats."""
        if not self.sliding_share:
            return 0.0, 0.0
        excess = chunked_chunk_excess if self.window_kind == "chunked" else sliding_chunk_excess
        positions, reads = excess(start, count, self.window_tokens)
        return float(positions), float(reads)

    def decode_excess(self, contexts: np.ndarray, k: int, alive_steps: np.ndarray | None = None) -> np.ndarray:
        """The excess positions (= reads) of decode steps j = 0 .. k−1 [k] float64 from requests at `contexts` in
        step 0 (contexts[i] + j in step j), over those still running in step j (j < alive_steps[i]; all when None):
        Σ_i max(contexts[i] + j − W, 0), or Σ_i C·floor((contexts[i] + j − 1)/C) for chunks."""
        hi = np.full(len(contexts), k, np.int64) if alive_steps is None else np.minimum(alive_steps, k)
        excess = chunked_decode_excess if self.window_kind == "chunked" else sliding_decode_excess
        return excess(contexts, k, hi, self.window_tokens)


class StepTimeExecutor:
    """The step-time model as an executor (plan.Executor): a plan's duration from its token counts and swaps.
    It produces no tokens."""

    def __init__(self, model: StepTimeModel) -> None:
        self.model = model

    def execute(self, plan: StepPlan) -> StepOutcome:
        return StepOutcome(self.duration_s(plan))

    def duration_s(self, plan: StepPlan) -> float:
        model = self.model
        start, new = plan.num_computed_tokens, plan.num_new_tokens
        tokens = int(new.sum())
        if tokens == len(new):  # every request decodes one token: the sums below with m = 1, in fewer numpy calls
            positions = int(start.sum()) + tokens
            moved = positions + tokens
        else:
            positions = int((start * new + new * (new + 1) // 2).sum())  # causal chunks: s·m + m(m+1)/2 each
            moved = int((start + new).sum()) + tokens  # every context token read, every new one written
        events = plan.events
        swapped = 0.0 if events is NO_EVENTS else swap_bytes(events.preempted, events.swapped_in,
                                                             model.kv_bytes_per_token)
        return float(model.step_s(float(tokens), float(positions), float(moved), swapped,
                                  *model.chunk_excess(start, new), float(len(new))))


def swap_bytes(preempted: tuple[Preemption, ...] | list[Preemption], swapped_in: tuple[SwapIn, ...] | list[SwapIn],
               kv_bytes_per_token: int) -> float:
    """Bytes over the host link in one step: the KV swapped out, then the KV swapped back in (tokens × bytes per
    token, or the bytes the pool says a swap moves: a hybrid pool's pages per group, its state included)."""
    out = 0.0
    for p in preempted:
        if p.mode == "swap":
            out += float(p.num_tokens * kv_bytes_per_token if p.num_bytes is None else p.num_bytes)
    back = 0.0
    for s in swapped_in:
        back += float(s.num_tokens * kv_bytes_per_token if s.num_bytes is None else s.num_bytes)
    return out + back


def prefill_positions(start: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Positions attended by causal chunks of `count` tokens after `start` cached ones: s·m + m(m+1)/2."""
    return start * count + count * (count + 1) / 2


def build_model(spec: ModelSpec, plan: MemoryPlan, eff: Efficiencies, *,
                swap_bandwidth_bytes_per_s: float = DEFAULT_SWAP_BANDWIDTH_BYTES_PER_S,
                weight_bytes_total: int | None = None) -> StepTimeModel:
    """The step-time model of `spec` served with `plan` (tp GPUs share FLOPs and bytes evenly)."""
    if not swap_bandwidth_bytes_per_s > 0:
        raise ParameterError(f"swap_bandwidth_bytes_per_s {swap_bandwidth_bytes_per_s:g} must be positive",
                             "swap_bandwidth_bytes_per_s")
    gpu: GpuSpec = plan.gpu
    tp = plan.tp
    model = StepTimeModel(
        **moe_shares(spec),
        window_tokens=(spec.sliding_window or 0) if spec.num_sliding_layers else 0,  # set with windowed layers
        sliding_share=spec.num_sliding_layers / spec.layers,
        window_kind=window_kind(spec),
        state_bytes_per_seq=bits_to_bytes(spec.state_bits(tp)),
        flops_per_token=2.0 * active_params(spec),
        attn_flops_per_position=4.0 * spec.layers * spec.num_attention_heads * spec.head_dim,
        kv_bytes_per_token=plan.kv_bytes_per_token,
        compute_s_per_flop=1.0 / (tp * gpu.peak_flops * eff.compute_eff),
        weights_s=plan.weights_bytes / (gpu.bandwidth_bytes_per_s * eff.weight_eff),
        kv_s_per_byte=1.0 / (gpu.bandwidth_bytes_per_s * eff.attn_eff),
        overhead_s=eff.step_overhead_s,
        swap_bandwidth_bytes_per_s=swap_bandwidth_bytes_per_s,
    )
    # Figures that are positive and finite can still be absurd (1e-300 FLOP/s): a full prefill step of the default
    # budget (8,192 tokens) that overflows, or takes more than a day, would turn every time sum into inf/nan.
    full = float(DEFAULT_MAX_NUM_BATCHED_TOKENS)
    probe_s = model.step_s(full, float(prefill_positions(np.array(0.0), np.array(full))), full)
    if not np.isfinite(probe_s) or probe_s > SANE_STEP_S:
        raise ParameterError(
            f"{gpu.name} GPU figures (memory {gpu.memory_bytes:g} B, {gpu.bandwidth_bytes_per_s:g} B/s, "
            f"{gpu.peak_flops:g} FLOP/s) make one {full:,.0f}-token step take {probe_s:g} s; give real bandwidth/flops",
            "bandwidth", "flops")
    return model


def window_kind(spec: ModelSpec) -> str:
    """"chunked" when `spec`'s windowed layers are chunked local attention (Llama-4), else "sliding"; not both."""
    kinds = {g.kind for g in spec.layer_groups if g.kind in ("sliding", "chunked")}
    if len(kinds) > 1:
        raise ParameterError(f"{spec.name} has both sliding-window and chunked local attention layers; sim's step "
                             "time models one kind of window: give a config with one of them", "model")
    return "chunked" if kinds == {"chunked"} else "sliding"


def moe_shares(spec: ModelSpec) -> dict[str, Any]:  # floats and ints, each for its own StepTimeModel field
    """The MoE fields of StepTimeModel for `spec` ({} for a dense model, or a MoE model whose parameter counts
    are neither given nor countable from its dimensions: then every step reads every weight, the worst case).
    A config-read spec has no counts: they are estimated from its dimensions (weights.estimate_params, gpt-oss-120b
    116,788,838,400 total / 5,710,233,600 active against the preset's published 116,829,156,672 / 5,715,982,912)."""
    experts, per_token = spec.num_experts, spec.experts_per_token
    if not experts or not per_token or per_token == experts:
        return {}
    total, active = spec.num_params, spec.num_active_params
    if not total or not active:
        if spec.vocab_size is None:
            return {}
        counted = estimate_params(spec)
        total, active = counted.total, counted.active
    per_expert = (total - active) / (experts - per_token)
    dense = active - per_token * per_expert
    return {"moe_dense_share": dense / total, "moe_expert_share": per_expert / total,
            "num_experts": experts, "experts_per_token": per_token}


def calibrated_attention_eff(path: str | Path, gpu: GpuSpec) -> tuple[float, str]:
    """Attention efficiency from a `kvcalc bench --json` result: median achieved_tbps / datasheet bandwidth.

    Returns (efficiency, a sentence saying where it came from).
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ParameterError(f"calibrate {path}: not a JSON file ({exc}); give kvcalc bench --json output",
                             "calibrate") from None
    device = doc.get("device") if isinstance(doc, dict) else None
    if isinstance(device, dict) and device.get("type") not in (None, "cuda"):
        raise ParameterError(f"calibrate {path}: that bench ran on {device.get('type')}, not a GPU; "
                             "give a kvcalc bench --json run on the GPU you simulate", "calibrate")
    rows = doc.get("timing") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise ParameterError(f"calibrate {path}: no 'timing' list; give the output of kvcalc bench --json",
                             "calibrate")
    achieved = [float(r["achieved_tbps"]) for r in rows if isinstance(r, dict) and r.get("achieved_tbps")]
    if not achieved:
        raise ParameterError(f"calibrate {path}: no timing entry has achieved_tbps; run kvcalc bench on a GPU",
                             "calibrate")
    tbps = float(np.median(achieved))
    eff = tbps * 1e12 / gpu.bandwidth_bytes_per_s
    name = device.get("name") if isinstance(device, dict) else None
    if not 0 < eff <= 1:
        raise ParameterError(
            f"calibrate {path}: median achieved {tbps:.3f} TB/s is {eff:.2f} of {gpu.name}'s "
            f"{gpu.bandwidth_bytes_per_s / 1e12:.2f} TB/s; was the bench run on another GPU? choose the matching gpu",
            "calibrate", "gpu")
    source = (f"attention efficiency {eff:.3f} = median achieved {tbps:.3f} TB/s over {len(achieved)} bench cases "
              f"/ {gpu.name} datasheet {gpu.bandwidth_bytes_per_s / 1e12:.2f} TB/s ({path.name}"
              + (f", measured on {name})" if name else ")"))
    return eff, source
