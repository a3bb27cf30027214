"""What PyTorch's CUDA caching allocator charges for a model's weight tensors on one GPU, beyond their bytes.

vLLM's "Model loading took X GiB" (the weights term of its memory profile) is `torch.cuda.memory_allocated()`
after loading the model minus before (`DeviceMemoryProfiler`, `get_current_memory_usage`). The caching
allocator (c10/cuda/CUDACachingAllocator.cpp, without expandable segments, as vLLM runs it) counts as allocated
the whole block it hands out, and a block is not always cut to the request:

* a request is rounded up to a multiple of 512 B;
* up to 1 MiB it is carved from 2 MiB segments, and from 1 MiB to 10 MiB from 20 MiB ones; both are split
  to the request (the tail the last block of a 20 MiB segment may take is left out here);
* from 10 MiB on it gets a segment of its own rounded up to a multiple of 2 MiB, and that segment is split
  only when more than 1 MiB would remain (`should_split`: remaining > kSmallSize); otherwise the request is
  charged the whole segment, up to 1 MiB more than its bytes.

So a weight tensor 1 MiB or less short of a multiple of 2 MiB costs the multiple. Qwen2.5-7B at tp 1, per
layer: the fused QKV weight 4,608 × 3,584 × 2 B = 15.75 × 2 MiB (+0.5 MiB), gate_up 2 · 18,944 × 3,584 × 2 B
= 129.5 × 2 MiB (+1 MiB), down 64.75 × 2 MiB (+0.5 MiB): 2 MiB × 28 layers + 0.5 MiB for each of the two
vocabulary tables = 57 MiB, which is what vLLM 0.19 logs above the parameters' bytes and the rotary cache
(14.25 GiB); Qwen2.5-72B at tp 2: down_proj 8,192 × 14,784 × 2 B = 115.5 × 2 MiB (+1 MiB) × 80 layers = 80 MiB
(67.80 GiB logged). Llama-3.1-8B's tensors are whole multiples of 2 MiB: nothing is added.

The tensors, per GPU of tp, as vLLM lays them out: attention a fused QKV [(h_q·d_K·(2 if gated) + h_KV·(d_K
+ d_V)) / tp, hidden] (h_KV / tp at least one head: replicated heads) and O [hidden, h_q·d_V / tp]; MLA its
q_a/kv_a projections replicated, q_b, kv_b and O split; a dense MLP gate_up [2I / tp, hidden] (up alone when
not gated) and down [hidden, I / tp]; MoE experts w13 [E, 2N / tp, hidden] and w2 [E, hidden, N / tp] (one
tensor each), the router [E, hidden]; the embedding and LM head [vocab padded / tp, hidden]. Recurrent mixers,
norms, biases, quantization scales and a vision tower are not enumerated (their bytes are counted, their
rounding is not); neither are an MLA layer whose V width and query LoRA the spec does not state (a preset made
from uniform dimensions) and MoE experts whose width it does not state (no explicit FFN groups).
"""

from __future__ import annotations

from ..blocks import ceil_div
from .layers import FfnGroup, LayerGroup
from .model_spec import ModelSpec

MIB = 2**20
BLOCK_ROUND = 512  # kMinBlockSize: every request is rounded up to a multiple of 512 B
SMALL_SIZE = MIB  # kSmallSize: a large block is split only when more than this would remain
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: from this size on, a request gets a segment of its own
ROUND_LARGE = 2 * MIB  # kRoundLarge: such segments are multiples of 2 MiB


def charged_bytes(size: int) -> int:
    """Bytes the caching allocator counts as allocated for one request of `size` bytes (module docstring)."""
    rounded = ceil_div(size, BLOCK_ROUND) * BLOCK_ROUND
    if rounded < MIN_LARGE_ALLOC:
        return rounded
    segment = ceil_div(rounded, ROUND_LARGE) * ROUND_LARGE
    return segment if segment - rounded <= SMALL_SIZE else rounded


def rounding(sizes: list[int]) -> int:
    """What the allocator charges for tensors of `sizes` bytes beyond those bytes."""
    return sum(charged_bytes(s) - s for s in sizes)


def _attention(g: LayerGroup, spec: ModelSpec, tp: int, bits: int) -> list[int]:
    hidden = spec.hidden_size
    heads = ceil_div(g.q_heads or spec.num_attention_heads, tp)
    if g.kind == "mla":
        if not g.q_lora_rank and g.v_head_dim == g.k_head_dim:
            return []  # MLA from uniform dimensions (a preset): its V width and query LoRA are not stated
        q = [(g.q_lora_rank + g.kv_lora_rank + g.rope_dim) * hidden, heads * g.k_head_dim * g.q_lora_rank] \
            if g.q_lora_rank else [heads * g.k_head_dim * hidden, (g.kv_lora_rank + g.rope_dim) * hidden]
        kv_b = heads * (g.k_head_dim - g.rope_dim + g.v_head_dim) * g.kv_lora_rank
        return [n * bits // 8 for n in (*q, kv_b, hidden * heads * g.v_head_dim)]
    kv = max(1, g.kv_heads // tp)
    rows = heads * g.k_head_dim * (2 if g.gated_query else 1) + kv * g.k_head_dim + (0 if g.k_eq_v else
                                                                                    kv * g.v_head_dim)
    return [rows * hidden * bits // 8, hidden * heads * g.v_head_dim * bits // 8]


def _ffn(f: FfnGroup, hidden: int, tp: int, bits: int, table_bits: int) -> list[int]:
    out = []
    if f.dense_intermediate:
        width = ceil_div(f.dense_intermediate, tp)
        out += [(2 if f.gated else 1) * width * hidden * bits // 8, hidden * width * bits // 8]
    if f.experts:
        width = ceil_div(f.expert_intermediate, tp)
        out += [f.experts * (2 if f.gated else 1) * width * hidden * bits // 8,
                f.experts * hidden * width * bits // 8, f.experts * hidden * table_bits // 8]
    return out


def layer_rounding(spec: ModelSpec, tp: int, bits: int, table_bits: int, ffn: tuple[FfnGroup, ...]) -> int:
    """The allocator's rounding over every decoder layer's linear weights on one GPU (`bits` per weight; MoE
    routers at `table_bits`). `ffn`: the model's FFN groups. Layers whose shapes are not enumerated add 0."""
    total = 0
    for g in spec.layer_groups:
        if g.keeps_kv and (g.q_heads or spec.num_attention_heads):
            total += g.count * rounding(_attention(g, spec, tp, bits))
    for f in ffn:
        total += f.count * rounding(_ffn(f, spec.hidden_size, tp, bits, table_bits))
    return total


def table_rounding(padded_vocab: int, hidden: int, tp: int, table_bytes_per_entry: int) -> int:
    """The allocator's rounding of one vocabulary table (embedding or LM head) on one GPU."""
    return rounding([ceil_div(padded_vocab, tp) * hidden * table_bytes_per_entry])
