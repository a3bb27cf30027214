// Launchers and the extern "C" ABI of the decode-attention extension (loaded with ctypes by build.py).
// The ABI takes raw device pointers, sizes, the softmax scale, the split count and a cudaStream_t, and
// returns a cudaError_t (0 = success) or a negative kvcalc error code from make_decode_params.
#include <cuda_runtime.h>

#include "intrinsics_cuda.cuh"
#include "decode_attention.cuh"

namespace kvcalc {

constexpr int kThreads = 128;

template <typename Traits, int HEAD_DIM, bool PAGED>
__global__ void __launch_bounds__(kThreads) decode_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) char smem[];
  const int seq = blockIdx.x / p.num_kv_heads;
  const int kv_head = blockIdx.x % p.num_kv_heads;
  decode_attention_cta<Traits, HEAD_DIM, kThreads, PAGED>(p, smem, threadIdx.x, seq, kv_head, blockIdx.y);
}

template <typename Traits>
__global__ void __launch_bounds__(32) merge_kernel(const DecodeParams p) {
  merge_splits_cta<Traits>(p, threadIdx.x, blockDim.x, blockIdx.x);
}

template <typename Traits, int HEAD_DIM, bool PAGED>
cudaError_t launch(const DecodeParams& p, cudaStream_t stream) {
  constexpr int kSmem = DecodeConfig<HEAD_DIM, kThreads>::kSmemBytes;
  static bool configured = false;  // the attribute is per kernel and per device; setting it again is harmless
  if (!configured) {
    const cudaError_t err =
        cudaFuncSetAttribute(decode_kernel<Traits, HEAD_DIM, PAGED>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err != cudaSuccess) return err;
    configured = true;
  }
  if (p.batch == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.batch) * static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(p.num_splits));
  decode_kernel<Traits, HEAD_DIM, PAGED><<<grid, kThreads, kSmem, stream>>>(p);
  if (p.num_splits > 1) {
    merge_kernel<Traits><<<static_cast<unsigned>(p.batch) * static_cast<unsigned>(p.num_q_heads), 32, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <bool PAGED>
int dispatch(const DecodeParams& p, int dtype, cudaStream_t stream) {
  const bool bf16 = dtype == 1;
  switch (p.head_dim) {
    case 64:
      return bf16 ? launch<Bf16Traits, 64, PAGED>(p, stream) : launch<Fp16Traits, 64, PAGED>(p, stream);
    case 128:
      return bf16 ? launch<Bf16Traits, 128, PAGED>(p, stream) : launch<Fp16Traits, 128, PAGED>(p, stream);
    default:
      return bf16 ? launch<Bf16Traits, 256, PAGED>(p, stream) : launch<Fp16Traits, 256, PAGED>(p, stream);
  }
}

}  // namespace kvcalc

extern "C" {

int kvcalc_abi_version() { return 1; }

// Number of visible CUDA devices, or a negative cudaError_t (no driver, no device) as -code.
int kvcalc_device_count() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  return err == cudaSuccess ? count : -static_cast<int>(err);
}

const char* kvcalc_error_string(int code) {
  switch (code) {
    case -1: return "head_dim must be 64, 128 or 256";
    case -2: return "num_q_heads must be a multiple of num_kv_heads with a group size of 1..16";
    case -3: return "block_size must be a power of two in 1..256";
    case -4: return "num_splits must be at least 1";
    case -5: return "sizes must not be negative";
    case -6: return "dtype must be 0 (fp16) or 1 (bf16)";
    default: return cudaGetErrorString(static_cast<cudaError_t>(code));
  }
}

// dtype: 0 = fp16, 1 = bf16. Workspace (num_splits > 1): partial_o and partial_lse as in decode_params.h.
int kvcalc_decode_paged(const void* q, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                        const int32_t* seq_lens, void* out, float* partial_o, float* partial_lse, int dtype,
                        int batch, int num_q_heads, int num_kv_heads, int head_dim, int block_size,
                        int max_blocks_per_seq, float scale, int num_splits, void* stream) {
  if (dtype != 0 && dtype != 1) return -6;
  kvcalc::DecodeParams p;
  const int rc = kvcalc::make_decode_params(p, true, q, k_cache, v_cache, out, block_tables, seq_lens, partial_o,
                                            partial_lse, batch, num_q_heads, num_kv_heads, head_dim, block_size,
                                            max_blocks_per_seq, 0, scale, num_splits);
  if (rc != 0) return rc;
  return kvcalc::dispatch<true>(p, dtype, static_cast<cudaStream_t>(stream));
}

int kvcalc_decode_contiguous(const void* q, const void* k, const void* v, const int32_t* seq_lens, void* out,
                             float* partial_o, float* partial_lse, int dtype, int batch, int num_q_heads,
                             int num_kv_heads, int head_dim, int max_len, float scale, int num_splits,
                             void* stream) {
  if (dtype != 0 && dtype != 1) return -6;
  kvcalc::DecodeParams p;
  const int rc = kvcalc::make_decode_params(p, false, q, k, v, out, nullptr, seq_lens, partial_o, partial_lse, batch,
                                            num_q_heads, num_kv_heads, head_dim, 1, 0, max_len, scale, num_splits);
  if (rc != 0) return rc;
  return kvcalc::dispatch<false>(p, dtype, static_cast<cudaStream_t>(stream));
}

}  // extern "C"
