// TEST-ONLY: runs cuda_ext/csrc/decode_attention.cuh on the CPU through shim.h.
//
// Usage: shim_main CASE_FILE OUT_FILE
// CASE_FILE: 16 little-endian int32 (magic 0x6b766331, dtype 0=fp16/1=bf16, paged, head_dim, batch,
// num_q_heads, num_kv_heads, block_size, max_blocks_per_seq, num_blocks, max_len, num_splits, 0, 0, 0, 0),
// one float32 scale, then q, k, v (16-bit patterns), block_tables (int32, paged only), seq_lens (int32).
// OUT_FILE: out [batch, num_q_heads, head_dim] as 16-bit patterns. Output and workspace start poisoned
// (all-ones bytes: NaN), and so does shared memory before every CTA, so a missed write shows up as NaN.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>

#include "shim.h"
#include "decode_attention.cuh"

#ifndef SHIM_THREADS
#define SHIM_THREADS 64
#endif

namespace {

using kvcalc::DecodeParams;

template <typename Traits, int HEAD_DIM, bool PAGED>
void run_grid(const DecodeParams& p) {
  constexpr int kSmem = kvcalc::DecodeConfig<HEAD_DIM, SHIM_THREADS>::kSmemBytes;
  std::vector<char> smem(kSmem);
  kvcalc::ShimBlock block(SHIM_THREADS);
  const int num_ctas = p.batch * p.num_kv_heads * p.num_splits;
  auto body = [&](int tid) {
    kvcalc::shim_thread.block = &block;
    kvcalc::shim_thread.lane = tid % 32;
    kvcalc::shim_thread.warp = tid / 32;
    for (int cta = 0; cta < num_ctas; ++cta) {
      if (tid == 0) std::memset(smem.data(), 0xff, smem.size());
      kvcalc::kv_sync();
      const int x = cta % (p.batch * p.num_kv_heads);  // blockIdx.x, as in decode_attention.cu
      const int split = cta / (p.batch * p.num_kv_heads);
      kvcalc::decode_attention_cta<Traits, HEAD_DIM, SHIM_THREADS, PAGED>(p, smem.data(), tid, x / p.num_kv_heads,
                                                                          x % p.num_kv_heads, split);
      kvcalc::kv_sync();
    }
    if (p.num_splits > 1) {
      for (long long bh = 0; bh < static_cast<long long>(p.batch) * p.num_q_heads; ++bh) {
        kvcalc::merge_splits_cta<Traits>(p, tid, SHIM_THREADS, bh);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int tid = 0; tid < SHIM_THREADS; ++tid) threads.emplace_back(body, tid);
  for (auto& t : threads) t.join();
}

template <typename Traits, bool PAGED>
void dispatch_dim(const DecodeParams& p) {
  if (p.head_dim == 64) run_grid<Traits, 64, PAGED>(p);
  else if (p.head_dim == 128) run_grid<Traits, 128, PAGED>(p);
  else run_grid<Traits, 256, PAGED>(p);
}

template <typename T>
std::vector<T> take(const std::vector<char>& bytes, size_t& offset, size_t count) {
  std::vector<T> out(count);
  if (offset + count * sizeof(T) > bytes.size()) throw std::runtime_error("case file too short");
  std::memcpy(out.data(), bytes.data() + offset, count * sizeof(T));
  offset += count * sizeof(T);
  return out;
}

}  // namespace

// `shim_main --convert IN OUT`: float32 values in, their fp16 then bf16 16-bit patterns out (checks the
// shim's rounding against torch's).
int convert(const char* in_path, const char* out_path) {
  std::ifstream in(in_path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t offset = 0;
  const auto values = take<float>(bytes, offset, bytes.size() / 4);
  std::vector<uint16_t> out;
  for (float f : values) out.push_back(kvcalc::float_to_half(f));
  for (float f : values) out.push_back(kvcalc::float_to_bf16(f));
  std::ofstream(out_path, std::ios::binary).write(reinterpret_cast<const char*>(out.data()), out.size() * 2);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--convert") return convert(argv[2], argv[3]);
  if (argc != 3) {
    std::fprintf(stderr, "usage: shim_main CASE_FILE OUT_FILE\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t offset = 0;
  const auto h = take<int32_t>(bytes, offset, 16);
  const float scale = take<float>(bytes, offset, 1)[0];
  if (h[0] != 0x6b766331) {
    std::fprintf(stderr, "bad magic\n");
    return 2;
  }
  const int dtype = h[1], paged = h[2], head_dim = h[3], batch = h[4], num_q_heads = h[5], num_kv_heads = h[6];
  const int block_size = h[7], max_blocks = h[8], num_blocks = h[9], max_len = h[10], num_splits = h[11];
  const size_t kv_rows = paged ? static_cast<size_t>(num_blocks) * block_size : static_cast<size_t>(batch) * max_len;
  const auto q = take<uint16_t>(bytes, offset, static_cast<size_t>(batch) * num_q_heads * head_dim);
  const auto k = take<uint16_t>(bytes, offset, kv_rows * num_kv_heads * head_dim);
  const auto v = take<uint16_t>(bytes, offset, kv_rows * num_kv_heads * head_dim);
  const auto tables = take<int32_t>(bytes, offset, paged ? static_cast<size_t>(batch) * max_blocks : 0);
  const auto lens = take<int32_t>(bytes, offset, batch);

  std::vector<uint16_t> out(q.size(), 0xffff);
  std::vector<float> partial_o(static_cast<size_t>(batch) * num_q_heads * num_splits * head_dim);
  std::vector<float> partial_lse(static_cast<size_t>(batch) * num_q_heads * num_splits);
  std::memset(partial_o.data(), 0xff, partial_o.size() * 4);
  std::memset(partial_lse.data(), 0xff, partial_lse.size() * 4);

  DecodeParams p;
  const int rc = kvcalc::make_decode_params(p, paged != 0, q.data(), k.data(), v.data(), out.data(),
                                            paged ? tables.data() : nullptr, lens.data(), partial_o.data(),
                                            partial_lse.data(), batch, num_q_heads, num_kv_heads, head_dim,
                                            block_size, max_blocks, max_len, scale, num_splits);
  if (rc != 0) {
    std::fprintf(stderr, "make_decode_params: %d\n", rc);
    return 3;
  }
  if (dtype == 1) {
    paged ? dispatch_dim<kvcalc::Bf16Traits, true>(p) : dispatch_dim<kvcalc::Bf16Traits, false>(p);
  } else {
    paged ? dispatch_dim<kvcalc::Fp16Traits, true>(p) : dispatch_dim<kvcalc::Fp16Traits, false>(p);
  }
  std::ofstream(argv[2], std::ios::binary).write(reinterpret_cast<const char*>(out.data()), out.size() * 2);
  return 0;
}
