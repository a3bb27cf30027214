// The CUDA side of the helpers that decode_attention.cuh uses (tests/cuda_shim/shim.h is the host side).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#define KV_DEVICE __device__ __forceinline__
#define KV_UNROLL _Pragma("unroll")

namespace kvcalc {

KV_DEVICE void kv_sync() { __syncthreads(); }
KV_DEVICE float kv_shfl_xor(float x, int lane_mask) { return __shfl_xor_sync(0xffffffffu, x, lane_mask); }
KV_DEVICE float kv_exp2(float x) { return exp2f(x); }
KV_DEVICE float kv_log2(float x) { return log2f(x); }
KV_DEVICE float kv_neg_inf() { return -CUDART_INF_F; }

KV_DEVICE uint4 kv_load16(const void* src) { return __ldg(static_cast<const uint4*>(src)); }
KV_DEVICE void kv_store16(void* dst, uint4 value) { *static_cast<uint4*>(dst) = value; }

// 16-byte global -> shared copy that bypasses L1 (.cg): K and V are streamed once per CTA.
KV_DEVICE void kv_cp_async16(void* smem_dst, const void* gmem_src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem_src) : "memory");
}
KV_DEVICE void kv_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
KV_DEVICE void kv_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// One 16-bit pair type's conversions to and from two floats, an overload per type (half, bfloat16).
KV_DEVICE float2 kv_pair_to_float2(__half2 x) { return __half22float2(x); }
KV_DEVICE float2 kv_pair_to_float2(__nv_bfloat162 x) { return __bfloat1622float2(x); }
KV_DEVICE void kv_float2_to_pair(float lo, float hi, __half2& out) { out = __floats2half2_rn(lo, hi); }
KV_DEVICE void kv_float2_to_pair(float lo, float hi, __nv_bfloat162& out) { out = __floats2bfloat162_rn(lo, hi); }

// Eight 16-bit floats in 16 bytes (four pairs of type Pair) to and from float; the host shim's ShimTraits
// (tests/cuda_ext/cuda_shim/shim.h) has the same interface.
template <typename Pair>
struct PairTraits {
  static KV_DEVICE void unpack8(uint4 raw, float (&f)[8]) {
    const Pair* h = reinterpret_cast<const Pair*>(&raw);
    KV_UNROLL
    for (int i = 0; i < 4; ++i) {
      const float2 x = kv_pair_to_float2(h[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
  static KV_DEVICE uint4 pack8(const float (&f)[8]) {
    uint4 raw;
    Pair* h = reinterpret_cast<Pair*>(&raw);
    KV_UNROLL
    for (int i = 0; i < 4; ++i) kv_float2_to_pair(f[2 * i], f[2 * i + 1], h[i]);
    return raw;
  }
};

using Fp16Traits = PairTraits<__half2>;
using Bf16Traits = PairTraits<__nv_bfloat162>;

}  // namespace kvcalc
