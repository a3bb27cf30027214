// TEST-ONLY host shim: lets g++ compile cuda_ext/csrc/decode_attention.cuh unchanged and run it on the CPU.
// Each CUDA thread of a block is a std::thread; __syncthreads is a std::barrier over the block; a warp
// shuffle writes to a per-warp exchange buffer between two warp barriers; shared memory is a per-block
// buffer; cp.async is a plain copy (it completes at once, so waits are no-ops); fp16 and bf16 are stored
// as their 16-bit patterns and converted with round-to-nearest-even. Never a product path.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#define KV_DEVICE inline
#define KV_UNROLL

struct uint4 {
  unsigned x, y, z, w;
};

namespace kvcalc {

struct ShimWarp {
  explicit ShimWarp() : barrier(32) {}
  std::barrier<> barrier;
  float exchange[32] = {};
};

struct ShimBlock {
  explicit ShimBlock(int num_threads) : barrier(num_threads), warps(num_threads / 32) {}
  std::barrier<> barrier;
  std::vector<ShimWarp> warps;
};

struct ShimThread {
  ShimBlock* block = nullptr;
  int lane = 0;
  int warp = 0;
};

inline thread_local ShimThread shim_thread;

inline void kv_sync() { shim_thread.block->barrier.arrive_and_wait(); }

// All 32 lanes must call it, as __shfl_xor_sync with a full mask requires; otherwise the test hangs
// (and the harness's timeout reports it).
inline float kv_shfl_xor(float x, int lane_mask) {
  ShimWarp& w = shim_thread.block->warps[shim_thread.warp];
  w.exchange[shim_thread.lane] = x;
  w.barrier.arrive_and_wait();
  const float other = w.exchange[shim_thread.lane ^ lane_mask];
  w.barrier.arrive_and_wait();
  return other;
}

inline float kv_exp2(float x) { return std::exp2(x); }
inline float kv_log2(float x) { return std::log2(x); }
inline float kv_neg_inf() { return -std::numeric_limits<float>::infinity(); }

inline uint4 kv_load16(const void* src) {
  uint4 v;
  std::memcpy(&v, src, 16);
  return v;
}
inline void kv_store16(void* dst, uint4 value) { std::memcpy(dst, &value, 16); }
inline void kv_cp_async16(void* smem_dst, const void* gmem_src) { std::memcpy(smem_dst, gmem_src, 16); }
inline void kv_cp_async_commit() {}
template <int N>
inline void kv_cp_async_wait() {}

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const int exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return bits_to_float(sign | static_cast<uint32_t>(exponent - 15 + 127) << 23 | (mantissa << 13));
}

// Round to nearest, ties to even, with overflow to infinity and gradual underflow, like __float2half_rn.
inline uint16_t float_to_half(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 65520.f) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds up past the largest half
  if (a < 6.103515625e-05f) {  // subnormal half: a multiple of 2^-24, rounded by nearbyint (ties to even)
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24))));
  }
  const uint32_t au = float_to_bits(a);
  const uint32_t rounded = au + 0xfffu + ((au >> 13) & 1u);  // drop 13 mantissa bits, ties to even
  return static_cast<uint16_t>(sign | (((rounded >> 13) - ((127 - 15) << 10)) & 0x7fffu));
}

inline float bf16_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
struct ShimTraits {
  static void unpack8(uint4 raw, float (&f)[8]) {
    uint16_t h[8];
    std::memcpy(h, &raw, 16);
    for (int i = 0; i < 8; ++i) f[i] = ToFloat(h[i]);
  }
  static uint4 pack8(const float (&f)[8]) {
    uint16_t h[8];
    for (int i = 0; i < 8; ++i) h[i] = FromFloat(f[i]);
    uint4 raw;
    std::memcpy(&raw, h, 16);
    return raw;
  }
};

using Fp16Traits = ShimTraits<half_to_float, float_to_half>;
using Bf16Traits = ShimTraits<bf16_to_float, float_to_bf16>;

}  // namespace kvcalc
