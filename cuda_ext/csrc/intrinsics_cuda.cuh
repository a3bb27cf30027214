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

struct Fp16Traits {
  static KV_DEVICE void unpack8(uint4 raw, float (&f)[8]) {
    const __half2* h = reinterpret_cast<const __half2*>(&raw);
    KV_UNROLL
    for (int i = 0; i < 4; ++i) {
      const float2 x = __half22float2(h[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
  static KV_DEVICE uint4 pack8(const float (&f)[8]) {
    uint4 raw;
    __half2* h = reinterpret_cast<__half2*>(&raw);
    KV_UNROLL
    for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
    return raw;
  }
};

struct Bf16Traits {
  static KV_DEVICE void unpack8(uint4 raw, float (&f)[8]) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    KV_UNROLL
    for (int i = 0; i < 4; ++i) {
      const float2 x = __bfloat1622float2(h[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
  static KV_DEVICE uint4 pack8(const float (&f)[8]) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
    KV_UNROLL
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return raw;
  }
};

}  // namespace kvcalc
