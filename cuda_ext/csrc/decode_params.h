// Parameters of one decode-attention launch, shared by the CUDA launcher (decode_attention.cu) and the
// host test shim (tests/cuda_shim). Plain C++: no CUDA types here.
//
// Tensor layouts (all row-major, contiguous; T is fp16 or bf16, i.e. two bytes per element):
//   q             [batch, num_q_heads, head_dim]                       T
//   out           [batch, num_q_heads, head_dim]                       T
//   paged KV:     k, v [num_blocks, block_size, num_kv_heads, head_dim] T   (vLLM's flash layout)
//                 block_tables [batch, max_blocks_per_seq]             int32 (physical block ids)
//   contiguous:   k, v [batch, max_len, num_kv_heads, head_dim]        T   (same inner layout)
//   seq_lens      [batch]                                              int32
//   partial_o     [batch, num_q_heads, num_splits, head_dim]           float32 (split-KV only)
//   partial_lse   [batch, num_q_heads, num_splits]                     float32 (base-2 log-sum-exp)
// Query head h uses KV head h / group (consecutive query heads share a KV head, like repeat_interleave).
#pragma once

#include <cstdint>

namespace kvcalc {

struct DecodeParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  const int32_t* block_tables;  // nullptr for the contiguous layout
  const int32_t* seq_lens;
  float* partial_o;             // nullptr when num_splits == 1
  float* partial_lse;
  int batch;
  int num_q_heads;
  int num_kv_heads;
  int group;                    // num_q_heads / num_kv_heads, 1..16
  int head_dim;
  int block_size;               // paged: a power of two, 1..256
  int log2_block_size;
  int max_blocks_per_seq;       // paged: columns of block_tables
  int max_len;                  // contiguous: the second dimension of k and v
  int num_splits;               // split-KV partitions per sequence (1 = no split)
  float scale_log2;             // softmax scale * log2(e): scores are kept in base 2 (exp2)
};

constexpr int kMaxGroup = 16;

inline int log2_exact(int x) {
  int n = 0;
  while ((1 << n) < x) ++n;
  return (1 << n) == x ? n : -1;
}

// Fills the parameters and checks what the kernel relies on; returns 0 or a negative error code:
//   -1 head_dim not 64/128/256, -2 group size out of 1..16 or heads not a multiple,
//   -3 block size not a power of two in 1..256, -4 num_splits < 1, -5 a size < 0.
inline int make_decode_params(DecodeParams& p, bool paged, const void* q, const void* k, const void* v,
                              void* out, const int32_t* block_tables, const int32_t* seq_lens, float* partial_o,
                              float* partial_lse, int batch, int num_q_heads, int num_kv_heads, int head_dim,
                              int block_size, int max_blocks_per_seq, int max_len, float scale,
                              int num_splits) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return -1;
  if (num_kv_heads < 1 || num_q_heads % num_kv_heads != 0) return -2;
  const int group = num_q_heads / num_kv_heads;
  if (group < 1 || group > kMaxGroup) return -2;
  const int log2_bs = paged ? log2_exact(block_size) : 0;
  if (paged && (log2_bs < 0 || block_size > 256)) return -3;
  if (num_splits < 1) return -4;
  if (batch < 0 || max_blocks_per_seq < 0 || max_len < 0) return -5;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.block_tables = block_tables;
  p.seq_lens = seq_lens;
  p.partial_o = partial_o;
  p.partial_lse = partial_lse;
  p.batch = batch;
  p.num_q_heads = num_q_heads;
  p.num_kv_heads = num_kv_heads;
  p.group = group;
  p.head_dim = head_dim;
  p.block_size = paged ? block_size : 1;
  p.log2_block_size = log2_bs;
  p.max_blocks_per_seq = max_blocks_per_seq;
  p.max_len = max_len;
  p.num_splits = num_splits;
  p.scale_log2 = scale * 1.4426950408889634f;
  return 0;
}

}  // namespace kvcalc
