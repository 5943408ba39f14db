// Shared by the EP tests: poisoned device buffers, a dispatch's outputs in them, and the all-gather of a vector over
// the Context's bootstrap.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gdx/context.hpp"
#include "gdx/ep/buffer.hpp"
#include "gdx/error.hpp"

namespace gdx::test::ep {

// Device memory of `bytes` (at least 16), filled with 0xEE so that rows nobody wrote are seen.
struct Dev {
  void* p = nullptr;
  size_t bytes;
  explicit Dev(size_t n) : bytes(std::max<size_t>(n, 16)) {
    // Synchronised: the poison is on the legacy stream, the calls under test on a non-blocking one.
    if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemset(p, 0xEE, bytes) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
      ADD_FAILURE() << "cudaMalloc";
  }
  ~Dev() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> get(size_t count) const {
    std::vector<T> v(count);
    if (count) EXPECT_EQ(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  /// Synchronised too: a cudaMemcpy from pageable memory returns once the bytes are staged, before its DMA has
  /// landed, and a call under test on a non-blocking stream right after could read the memory first.
  void put(const void* src, size_t n) {
    EXPECT_EQ(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  /// `count` values from any device pointer (outputs a library call owns, such as a handle's arrays).
  template <typename T>
  static std::vector<T> getFrom(const T* src, size_t count) {
    std::vector<T> v(count);
    if (count) EXPECT_EQ(cudaMemcpy(v.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

/// The outputs of a dispatch that receives at most `rows` rows of `hidden` values (FP8 with scales, or BF16), in
/// poisoned device memory with `spareRows` more rows allocated past the capacity, which no call may write.
struct DispatchBuffers {
  std::unique_ptr<Dev> x, scales, idx, weights, src, perExpert, numRecv;
  ::gdx::ep::DispatchOutputs out;
  size_t xb, ns;  ///< bytes of a row, scales of a row
  int rows, topk;
  DispatchBuffers(int hidden, bool fp8, int rows_, int localExperts, int topk_, int spareRows = 0)
      : xb(size_t(hidden) * (fp8 ? 1 : 2)), ns(size_t(hidden) / 128), rows(rows_), topk(std::max(topk_, 1)) {
    const size_t all = size_t(rows) + size_t(spareRows);
    x = std::make_unique<Dev>(all * xb);
    scales = std::make_unique<Dev>(all * ns * 4);
    idx = std::make_unique<Dev>(all * topk * 8);
    weights = std::make_unique<Dev>(all * topk * 4);
    src = std::make_unique<Dev>(all * 4);
    perExpert = std::make_unique<Dev>(size_t(localExperts) * 4);
    numRecv = std::make_unique<Dev>(4);
    out.recvX = x->p;
    out.recvXScales = fp8 ? scales->as<float>() : nullptr;
    out.recvTopkIdx = idx->as<int64_t>();
    out.recvTopkWeights = weights->as<float>();
    out.recvSrcIdx = src->as<int32_t>();
    out.numRecvTokensPerExpert = perExpert->as<int32_t>();
    out.numRecvTokens = numRecv->as<int32_t>();
    out.capacity = rows;
  }
};

inline std::vector<std::vector<int64_t>> allGather(Context& ctx, const std::vector<int64_t>& mine) {
  std::vector<std::string> all =
      ctx.allGather(std::string(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(int64_t)));
  std::vector<std::vector<int64_t>> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    out[r].resize(all[r].size() / sizeof(int64_t));
    std::memcpy(out[r].data(), all[r].data(), all[r].size());
  }
  return out;
}

/// Runs f and expects a gdx::Error whose message contains `text`.
template <typename F>
inline void expectThrowContaining(F&& f, const std::string& text, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << what << ": " << e.what();
  }
}

}  // namespace gdx::test::ep
