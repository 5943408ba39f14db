// Bandwidth of back-to-back GPU work on the default stream, timed with CUDA events: shared by the benchmarks that
// put gdx beside cudaMemcpy*Async in the same run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/cuda_check.hpp"

namespace gdx::bench {

/// Milliseconds the GPU spends on what `work` enqueues on the default stream, between two CUDA events.
template <typename F>
float eventMs(F&& work) {
  cudaEvent_t a, b;
  GDX_CUDA_CHECK(cudaEventCreate(&a));
  GDX_CUDA_CHECK(cudaEventCreate(&b));
  GDX_CUDA_CHECK(cudaEventRecord(a));
  work();
  GDX_CUDA_CHECK(cudaEventRecord(b));
  GDX_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  GDX_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

/// GB/s (1e9 B/s) of moving `bytes` `iters` times in `ms` milliseconds.
inline double gbps(uint64_t bytes, int iters, float ms) {
  return double(bytes) * iters / (ms * 1e-3) / 1e9;
}

/// GB/s of `iters` calls of `launch`, each moving `bytes`, after 3 warm-up calls.
template <typename F>
double eventGBps(uint64_t bytes, int iters, F&& launch) {
  for (int i = 0; i < 3; ++i) launch();
  const float ms = eventMs([&] {
    for (int i = 0; i < iters; ++i) launch();
  });
  return gbps(bytes, iters, ms);
}

}  // namespace gdx::bench
