// Decode attention (one query token per sequence) over a paged or a contiguous KV cache.
//
// This header holds the device code only. It is compiled twice: by nvcc through decode_attention.cu
// (after intrinsics_cuda.cuh), and by g++ in the tests through tests/cuda_shim (after the host shim),
// which runs every CUDA thread of a block as a host thread. It therefore uses no CUDA built-in directly:
// everything CUDA-specific goes through the helpers that both of those headers define:
//   KV_DEVICE, KV_UNROLL, uint4, kv_sync(), kv_shfl_xor(float, int), kv_exp2, kv_log2, kv_neg_inf(),
//   kv_load16(const void*), kv_store16(void*, uint4), kv_cp_async16(void* smem, const void* gmem),
//   kv_cp_async_commit(), kv_cp_async_wait<N>(), and dtype traits with unpack8 / pack8.
//
// Work split. One CTA handles one (sequence, KV head, split): all `group` query heads of that KV head,
// so each K/V byte is read from memory once per group. The CTA walks its token range in tiles of kTile
// tokens; K and V tiles are copied to shared memory with 16-byte cp.async, double-buffered, so the next
// tile is in flight while this one is computed. Per tile:
//   1. scores: thread (row, lane) holds 8 elements (16 bytes) of one token's K; rows take tokens, the
//      kLanes lanes of a row split head_dim; a shuffle reduction over the row's lanes gives q.k for each
//      query head of the group; scores[h][t] go to shared memory (base 2: q is pre-scaled by scale*log2 e).
//   2. softmax: one warp per head takes the tile maximum, updates the running maximum m[h], turns scores
//      into p = exp2(s - m) and keeps the running sum l[h] and the rescale factor alpha[h].
//   3. values: thread (row, lane) accumulates o[h][8 dims] += p[h][t] * V[t]; rows are (head slot, token
//      subset) pairs, so small groups still keep every thread busy; the subsets are summed at the end.
// Split-KV (flash-decoding) gives each CTA a tile-aligned slice of the sequence and writes the normalised
// partial output and its log-sum-exp; merge_splits_cta combines the slices.
#pragma once

#include "decode_params.h"

namespace kvcalc {

template <int HEAD_DIM, int NUM_THREADS>
struct DecodeConfig {
  static constexpr int kVec = 8;                                // elements per 16-byte chunk
  static constexpr int kLanes = HEAD_DIM / kVec;                // threads sharing one token row
  static constexpr int kRows = NUM_THREADS / kLanes;            // token rows processed at once
  static constexpr int kWarps = NUM_THREADS / 32;
  static constexpr int kTileBase = 4096 / HEAD_DIM;             // 8 KiB of K (and of V) per tile
  static constexpr int kTile = kTileBase > kRows ? kTileBase : kRows;
  static constexpr int kHeadsPerRow = (kMaxGroup + kRows - 1) / kRows;
  static constexpr int kBlockWindow = 256;                      // block-table entries staged at once
  // Shared memory layout (bytes); every section starts 16-byte aligned.
  static constexpr int kTileBytes = kTile * HEAD_DIM * 2;
  static constexpr int kKvBytes = 2 * 2 * kTileBytes;           // 2 stages x (K, V)
  static constexpr int kQOffset = kKvBytes;
  static constexpr int kScoreOffset = kQOffset + kMaxGroup * HEAD_DIM * 4;
  static constexpr int kStatOffset = kScoreOffset + kMaxGroup * kTile * 4;
  static constexpr int kTableOffset = kStatOffset + 3 * kMaxGroup * 4;
  static constexpr int kSmemBytes = kTableOffset + kBlockWindow * 4;

  static_assert(HEAD_DIM % (kVec * 8) == 0, "head_dim must be a multiple of 64");
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a token row must fit in one warp");
  static_assert(NUM_THREADS % 32 == 0 && kRows >= 1, "whole warps only");
  static_assert(kTile % kRows == 0, "every row gets the same number of tokens per tile");
  // The end-of-CTA reduction reuses the K/V tiles: it needs (token subsets x group) rows of head_dim floats.
  static_assert(kRows * HEAD_DIM * 4 <= kKvBytes && kMaxGroup * HEAD_DIM * 4 <= kKvBytes, "scratch fits");
};

KV_DEVICE int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Sum over the kLanes lanes of one token row (rows are aligned groups of lanes inside a warp).
template <int LANES>
KV_DEVICE float row_sum(float x) {
  KV_UNROLL
  for (int offset = LANES / 2; offset >= 1; offset >>= 1) x += kv_shfl_xor(x, offset);
  return x;
}

KV_DEVICE float warp_max(float x) {
  KV_UNROLL
  for (int offset = 16; offset >= 1; offset >>= 1) {
    const float other = kv_shfl_xor(x, offset);
    x = other > x ? other : x;
  }
  return x;
}

KV_DEVICE float warp_sum(float x) {
  KV_UNROLL
  for (int offset = 16; offset >= 1; offset >>= 1) x += kv_shfl_xor(x, offset);
  return x;
}

// Index of the first element of token `slot`'s row for `kv_head` in a [.., kv_heads, head_dim] cache.
KV_DEVICE long long kv_row_offset(long long slot, int num_kv_heads, int kv_head, int head_dim) {
  return (slot * num_kv_heads + kv_head) * head_dim;
}

template <int HEAD_DIM, int NUM_THREADS>
KV_DEVICE void stage_block_window(const DecodeParams& p, int* table_s, int seq, int window, int tid) {
  using Cfg = DecodeConfig<HEAD_DIM, NUM_THREADS>;
  const int first = window * Cfg::kBlockWindow;
  const int32_t* row = p.block_tables + static_cast<long long>(seq) * p.max_blocks_per_seq;
  for (int i = tid; i < Cfg::kBlockWindow; i += NUM_THREADS) {
    const int logical = first + i;
    table_s[i] = logical < p.max_blocks_per_seq ? row[logical] : 0;
  }
}

// Issues the cp.async copies of one K/V tile (tokens [tile_start, tile_start + n)) into one stage.
template <int HEAD_DIM, int NUM_THREADS, bool PAGED>
KV_DEVICE void issue_tile(const DecodeParams& p, char* k_stage, char* v_stage, const int* table_s, int seq,
                          int kv_head, int tile_start, int n, int window_first_block, int tid) {
  using Cfg = DecodeConfig<HEAD_DIM, NUM_THREADS>;
  const char* k = static_cast<const char*>(p.k);
  const char* v = static_cast<const char*>(p.v);
  for (int c = tid; c < n * Cfg::kLanes; c += NUM_THREADS) {
    const int t = c / Cfg::kLanes;
    const int part = c % Cfg::kLanes;
    const int token = tile_start + t;
    long long slot;
    if constexpr (PAGED) {
      const int physical = table_s[(token >> p.log2_block_size) - window_first_block];
      slot = static_cast<long long>(physical) * p.block_size + (token & (p.block_size - 1));
    } else {
      slot = static_cast<long long>(seq) * p.max_len + token;
    }
    const long long byte = (kv_row_offset(slot, p.num_kv_heads, kv_head, HEAD_DIM) + part * Cfg::kVec) * 2;
    kv_cp_async16(k_stage + c * 16, k + byte);
    kv_cp_async16(v_stage + c * 16, v + byte);
  }
}

// One CTA of the decode kernel. Every thread of the CTA must call it (it contains barriers).
template <typename Traits, int HEAD_DIM, int NUM_THREADS, bool PAGED>
KV_DEVICE void decode_attention_cta(const DecodeParams& p, char* smem, int tid, int seq, int kv_head, int split) {
  using Cfg = DecodeConfig<HEAD_DIM, NUM_THREADS>;
  constexpr int kLanes = Cfg::kLanes;
  constexpr int kRows = Cfg::kRows;
  constexpr int kTile = Cfg::kTile;
  constexpr int kVec = Cfg::kVec;
  const int group = p.group;
  const int lane_in_row = tid % kLanes;
  const int row = tid / kLanes;
  const int warp = tid / 32;
  const int lane = tid % 32;

  float* q_s = reinterpret_cast<float*>(smem + Cfg::kQOffset);          // [group][HEAD_DIM]
  float* score_s = reinterpret_cast<float*>(smem + Cfg::kScoreOffset);  // [group][kTile]
  float* m_s = reinterpret_cast<float*>(smem + Cfg::kStatOffset);       // running max (base 2)
  float* l_s = m_s + kMaxGroup;                                         // running sum of exp2
  float* alpha_s = l_s + kMaxGroup;                                     // this tile's rescale factor
  int* table_s = reinterpret_cast<int*>(smem + Cfg::kTableOffset);

  // This CTA's slice of the sequence, tile-aligned so that a tile never straddles a staged table window.
  const int seq_len = p.seq_lens[seq];
  const int tiles_per_split = ceil_div(ceil_div(seq_len, kTile), p.num_splits);
  const int tok_begin = split * tiles_per_split * kTile < seq_len ? split * tiles_per_split * kTile : seq_len;
  const int tok_end = tok_begin + tiles_per_split * kTile < seq_len ? tok_begin + tiles_per_split * kTile : seq_len;
  const int num_tiles = ceil_div(tok_end - tok_begin, kTile);
  const int window_shift = 8 + p.log2_block_size;  // log2(kBlockWindow * block_size) tokens per window

  const int q_head0 = kv_head * group;
  const char* q = static_cast<const char*>(p.q);
  for (int c = tid; c < group * kLanes; c += NUM_THREADS) {
    const int h = c / kLanes;
    const int part = c % kLanes;
    const long long elem = (static_cast<long long>(seq) * p.num_q_heads + q_head0 + h) * HEAD_DIM + part * kVec;
    float f[kVec];
    Traits::unpack8(kv_load16(q + elem * 2), f);
    KV_UNROLL
    for (int e = 0; e < kVec; ++e) q_s[h * HEAD_DIM + part * kVec + e] = f[e] * p.scale_log2;
  }
  for (int h = tid; h < group; h += NUM_THREADS) {
    m_s[h] = kv_neg_inf();
    l_s[h] = 0.f;
  }

  // Accumulator rows: (head slot, token subset). Small groups split the tile's tokens between rows;
  // groups larger than the row count give each row several heads.
  const int head_slots = group <= kRows ? group : kRows;
  const int subsets = group <= kRows ? kRows / group : 1;
  const bool row_active = row < head_slots * subsets;
  const int head_slot = row % head_slots;
  const int subset = row / head_slots;
  float acc[Cfg::kHeadsPerRow][kVec];
  KV_UNROLL
  for (int i = 0; i < Cfg::kHeadsPerRow; ++i) {
    KV_UNROLL
    for (int e = 0; e < kVec; ++e) acc[i][e] = 0.f;
  }

  int window = -1;
  if (num_tiles > 0) {
    if constexpr (PAGED) {
      window = tok_begin >> window_shift;
      stage_block_window<HEAD_DIM, NUM_THREADS>(p, table_s, seq, window, tid);
    }
  }
  kv_sync();  // q_s, m_s, l_s and the first table window are visible to all
  if (num_tiles > 0) {
    issue_tile<HEAD_DIM, NUM_THREADS, PAGED>(p, smem, smem + Cfg::kTileBytes, table_s, seq, kv_head, tok_begin,
                                             tok_end - tok_begin < kTile ? tok_end - tok_begin : kTile,
                                             window * Cfg::kBlockWindow, tid);
  }
  kv_cp_async_commit();

  for (int i = 0; i < num_tiles; ++i) {
    const int tile_start = tok_begin + i * kTile;
    if (i + 1 < num_tiles) {
      const int next_start = tile_start + kTile;
      if constexpr (PAGED) {
        if ((next_start >> window_shift) != window) {  // uniform across the CTA
          window = next_start >> window_shift;
          kv_sync();
          stage_block_window<HEAD_DIM, NUM_THREADS>(p, table_s, seq, window, tid);
          kv_sync();
        }
      }
      char* next_stage = smem + ((i + 1) & 1) * 2 * Cfg::kTileBytes;
      issue_tile<HEAD_DIM, NUM_THREADS, PAGED>(p, next_stage, next_stage + Cfg::kTileBytes, table_s, seq, kv_head,
                                               next_start, tok_end - next_start < kTile ? tok_end - next_start : kTile,
                                               window * Cfg::kBlockWindow, tid);
    }
    kv_cp_async_commit();
    kv_cp_async_wait<1>();  // everything but the newest group (the next tile) has landed
    kv_sync();

    const uint4* k_tile = reinterpret_cast<const uint4*>(smem + (i & 1) * 2 * Cfg::kTileBytes);
    const uint4* v_tile = k_tile + kTile * kLanes;
    const int n_valid = tok_end - tile_start < kTile ? tok_end - tile_start : kTile;

    // 1. scores. The loop bounds are uniform across each warp because row_sum shuffles.
    KV_UNROLL
    for (int j = 0; j < kTile / kRows; ++j) {
      const int t = row + j * kRows;
      const bool valid = t < n_valid;
      float kf[kVec];
      if (valid) {
        Traits::unpack8(k_tile[t * kLanes + lane_in_row], kf);
      } else {
        KV_UNROLL
        for (int e = 0; e < kVec; ++e) kf[e] = 0.f;
      }
      for (int h = 0; h < group; ++h) {
        const float* qh = q_s + h * HEAD_DIM + lane_in_row * kVec;
        float dot = 0.f;
        KV_UNROLL
        for (int e = 0; e < kVec; ++e) dot += qh[e] * kf[e];
        dot = row_sum<kLanes>(dot);
        if (valid && lane_in_row == 0) score_s[h * kTile + t] = dot;
      }
    }
    kv_sync();

    // 2. online softmax, one warp per head.
    for (int h = warp; h < group; h += Cfg::kWarps) {
      float* s = score_s + h * kTile;
      float tile_max = kv_neg_inf();
      for (int t = lane; t < n_valid; t += 32) tile_max = s[t] > tile_max ? s[t] : tile_max;
      tile_max = warp_max(tile_max);
      const float m_old = m_s[h];
      const float m_new = m_old > tile_max ? m_old : tile_max;
      float sum = 0.f;
      for (int t = lane; t < n_valid; t += 32) {
        const float prob = kv_exp2(s[t] - m_new);
        s[t] = prob;
        sum += prob;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = kv_exp2(m_old - m_new);  // 0 on the first tile (m_old = -inf)
        alpha_s[h] = alpha;
        l_s[h] = l_s[h] * alpha + sum;
        m_s[h] = m_new;
      }
    }
    kv_sync();

    // 3. values.
    if (row_active) {
      KV_UNROLL
      for (int r = 0; r < Cfg::kHeadsPerRow; ++r) {
        const int h = head_slot + r * head_slots;
        if (h < group) {
          const float alpha = alpha_s[h];
          KV_UNROLL
          for (int e = 0; e < kVec; ++e) acc[r][e] *= alpha;
        }
      }
      for (int t = subset; t < n_valid; t += subsets) {
        float vf[kVec];
        Traits::unpack8(v_tile[t * kLanes + lane_in_row], vf);
        KV_UNROLL
        for (int r = 0; r < Cfg::kHeadsPerRow; ++r) {
          const int h = head_slot + r * head_slots;
          if (h < group) {
            const float prob = score_s[h * kTile + t];
            KV_UNROLL
            for (int e = 0; e < kVec; ++e) acc[r][e] += prob * vf[e];
          }
        }
      }
    }
    kv_sync();  // the stage and the scores are free for the next tile
  }

  // Sum the token subsets through shared memory (the K/V tiles are free now), normalise, store.
  float* partial_s = reinterpret_cast<float*>(smem);  // [subsets][group][HEAD_DIM]
  if (row_active) {
    KV_UNROLL
    for (int r = 0; r < Cfg::kHeadsPerRow; ++r) {
      const int h = head_slot + r * head_slots;
      if (h < group) {
        KV_UNROLL
        for (int e = 0; e < kVec; ++e) partial_s[(subset * group + h) * HEAD_DIM + lane_in_row * kVec + e] = acc[r][e];
      }
    }
  }
  kv_sync();
  for (int c = tid; c < group * kLanes; c += NUM_THREADS) {
    const int h = c / kLanes;
    const int part = c % kLanes;
    float o[kVec];
    KV_UNROLL
    for (int e = 0; e < kVec; ++e) o[e] = 0.f;
    for (int z = 0; z < subsets; ++z) {
      KV_UNROLL
      for (int e = 0; e < kVec; ++e) o[e] += partial_s[(z * group + h) * HEAD_DIM + part * kVec + e];
    }
    const float l = l_s[h];
    const float inv = l > 0.f ? 1.f / l : 0.f;  // an empty slice (or length 0) gives zeros
    KV_UNROLL
    for (int e = 0; e < kVec; ++e) o[e] *= inv;
    const long long bh = static_cast<long long>(seq) * p.num_q_heads + q_head0 + h;
    if (p.num_splits == 1) {
      kv_store16(static_cast<char*>(p.out) + (bh * HEAD_DIM + part * kVec) * 2, Traits::pack8(o));
    } else {
      float* dst = p.partial_o + (bh * p.num_splits + split) * HEAD_DIM + part * kVec;
      KV_UNROLL
      for (int e = 0; e < kVec; ++e) dst[e] = o[e];
      if (part == 0) p.partial_lse[bh * p.num_splits + split] = l > 0.f ? m_s[h] + kv_log2(l) : kv_neg_inf();
    }
  }
}

// Combines the split-KV slices of one (sequence, query head): out = sum_s w_s o_s / sum_s w_s with
// w_s = exp2(lse_s - max lse). Slices with no tokens have lse = -inf and weight 0; all empty gives zeros.
template <typename Traits>
KV_DEVICE void merge_splits_cta(const DecodeParams& p, int tid, int num_threads, long long bh) {
  constexpr int kVec = 8;
  const float* lse = p.partial_lse + bh * p.num_splits;
  float max_lse = kv_neg_inf();
  for (int s = 0; s < p.num_splits; ++s) max_lse = lse[s] > max_lse ? lse[s] : max_lse;
  for (int part = tid; part < p.head_dim / kVec; part += num_threads) {
    float o[kVec];
    KV_UNROLL
    for (int e = 0; e < kVec; ++e) o[e] = 0.f;
    float weight_sum = 0.f;
    if (max_lse != kv_neg_inf()) {
      for (int s = 0; s < p.num_splits; ++s) {
        const float w = kv_exp2(lse[s] - max_lse);
        const float* src = p.partial_o + (bh * p.num_splits + s) * p.head_dim + part * kVec;
        weight_sum += w;
        KV_UNROLL
        for (int e = 0; e < kVec; ++e) o[e] += w * src[e];
      }
    }
    const float inv = weight_sum > 0.f ? 1.f / weight_sum : 0.f;
    KV_UNROLL
    for (int e = 0; e < kVec; ++e) o[e] *= inv;
    kv_store16(static_cast<char*>(p.out) + (bh * p.head_dim + part * kVec) * 2, Traits::pack8(o));
  }
}

}  // namespace kvcalc
